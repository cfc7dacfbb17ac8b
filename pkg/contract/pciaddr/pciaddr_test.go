package pciaddr_test

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/vfnet-io/vfnet/pkg/contract/pciaddr"
)

func TestParseKernelName(t *testing.T) {
	t.Parallel()
	for s, want := range map[string]pciaddr.Address{
		"0000:3b:02.1": {0, 0x3b, 2, 1}, "ffff:ff:1f.7": {0xffff, 0xff, 0x1f, 7}, "0000:00:00.0": {},
		// The kernel names functions behind Intel VMD in domains from 10000.
		"10000:00:02.0": {0x10000, 0, 2, 0}, "ffffffff:00:00.0": {0xffffffff, 0, 0, 0},
	} {
		got, err := pciaddr.ParseKernelName(s)
		if err != nil || got != want {
			t.Errorf("ParseKernelName(%q) = %v, %v; want %v", s, got, err, want)
		}
		if err == nil && got.String() != s {
			t.Errorf("ParseKernelName(%q).String() = %q", s, got.String())
		}
	}
	for s, msg := range map[string]string{
		"0000:3b:20.1": "slot 20 is beyond 1f", "0000:3b:02.8": "function 8 is beyond 7", "0000:3B:02.1": "lower-case",
		"000:3b:02.1": "lower-case", "100000000:00:00.0": "lower-case", "0000-3b:02.1": "lower-case",
		"0000:3b:02.10": "lower-case", "": "lower-case", "0000:3g:02.1": "lower-case", "00:00:3b:02.1": "lower-case",
		"+000:3b:02.1": "lower-case",
	} {
		if _, err := pciaddr.ParseKernelName(s); err == nil || !strings.Contains(err.Error(), msg) {
			t.Errorf("ParseKernelName(%q) error = %v, want it to contain %q", s, err, msg)
		}
	}
}

// The domain rule: one check, applied by every parser of an address vfnet
// uses, refuses the domains Intel VMD creates.
func TestDomainRule(t *testing.T) {
	t.Parallel()
	for _, s := range []string{"10000:3b:02.1", "ffffffff:00:00.0"} {
		if _, err := pciaddr.ParseKernelName(s); err != nil {
			t.Errorf("ParseKernelName(%q): %v; the kernel names such functions", s, err)
		}
		_, err := pciaddr.Parse(s)
		if !errors.Is(err, pciaddr.ErrDomain) || !strings.Contains(err.Error(), "QEMU's vfio-pci") {
			t.Errorf("Parse(%q) error = %v, want ErrDomain saying why", s, err)
		}
		if _, err := pciaddr.DeviceName(s); !errors.Is(err, pciaddr.ErrDomain) || !strings.Contains(err.Error(), s) {
			t.Errorf("DeviceName(%q) error = %v, want ErrDomain naming the address", s, err)
		}
		if _, err := pciaddr.ParseLoose(s); err == nil {
			t.Errorf("ParseLoose(%q) accepted", s)
		}
	}
	a, _ := pciaddr.ParseKernelName("10000:3b:02.1")
	if err := a.Check(); !errors.Is(err, pciaddr.ErrDomain) {
		t.Errorf("Check(%v) = %v, want ErrDomain", a, err)
	}
	if _, err := pciaddr.ParseDeviceName("vf-10000-3b-02-1"); !errors.Is(err, pciaddr.ErrDomain) || !strings.Contains(err.Error(), "device vf-10000-3b-02-1: ") {
		t.Errorf("ParseDeviceName(vf-10000-3b-02-1) error = %v, want ErrDomain naming the device", err)
	}
	if err := (pciaddr.Address{Domain: pciaddr.MaxDomain, Bus: 0xff, Slot: 0x1f, Function: 7}).Check(); err != nil {
		t.Errorf("Check(ffff:ff:1f.7) = %v", err)
	}
}

func TestParse(t *testing.T) {
	t.Parallel()
	if got, err := pciaddr.Parse("0000:3b:02.1"); err != nil || got != (pciaddr.Address{0, 0x3b, 2, 1}) {
		t.Errorf("Parse = %v, %v", got, err)
	}
	for _, s := range []string{"0000:3B:02.1", "0:3b:02.1", "0000:3b:2.1", " 0000:3b:02.1"} {
		if _, err := pciaddr.Parse(s); err == nil {
			t.Errorf("Parse(%q) accepted: only the kernel's lower-case form is", s)
		}
	}
}

func TestParseLoose(t *testing.T) {
	t.Parallel()
	for s, want := range map[string]pciaddr.Address{
		"0000:3B:02.1": {0, 0x3b, 2, 1}, "0:0:0.0": {}, "ffff:ff:1f.7": {0xffff, 0xff, 0x1f, 7},
	} {
		got, err := pciaddr.ParseLoose(s)
		if err != nil || got != want {
			t.Errorf("ParseLoose(%q) = %v, %v; want %v", s, got, err, want)
		}
	}
	for s, msg := range map[string]string{
		"": "of the form", "3b:02.1": "of the form", "0000:3b:02": "of the form", "0000:3b:20.1": "slot 20 is beyond 1f",
		"0000:3b:02.8": "function 8 is beyond 7", "0000:3b:02.x": `function "x"`, "10000:00:00.0": `domain "10000"`,
		"0000::02.1": `bus ""`, "0000:3b:02.1.2": "of the form", "0x00:3b:02.1": `domain "0x00"`, "0000:-3:02.1": `bus "-3"`,
	} {
		if _, err := pciaddr.ParseLoose(s); err == nil || !strings.Contains(err.Error(), msg) {
			t.Errorf("ParseLoose(%q) error = %v, want it to contain %q", s, err, msg)
		}
	}
}

func TestDeviceName(t *testing.T) {
	t.Parallel()
	for _, bdf := range []string{"0000:3b:02.1", "ffff:ff:1f.7", "0000:00:00.0"} {
		name, err := pciaddr.DeviceName(bdf)
		if err != nil || len(name) != 15 || !isDNSLabel(name) {
			t.Errorf("DeviceName(%s) = %q, %v; want a 15-character DNS label", bdf, name, err)
		}
		back, err := pciaddr.ParseDeviceName(name)
		if err != nil || back.String() != bdf {
			t.Errorf("ParseDeviceName(%s) = %v, %v; want %s", name, back, err, bdf)
		}
	}
	if got, _ := pciaddr.DeviceName("0000:3b:02.1"); got != "vf-0000-3b-02-1" {
		t.Errorf("DeviceName(0000:3b:02.1) = %q", got)
	}
	for _, bad := range []string{"", "0000:3B:02.1", "0000:3b:02.8"} {
		if _, err := pciaddr.DeviceName(bad); err == nil {
			t.Errorf("DeviceName(%q) accepted", bad)
		}
	}
	for _, bad := range []string{"", "vf-", "vf-0000-3b-02", "vf-0000-3b-20-1", "vf-0000-3B-02-1", "pf-0000-3b-02-1", "vf-0000-3b-02-1-", "vf-000-03b-02-1"} {
		if _, err := pciaddr.ParseDeviceName(bad); err == nil || !strings.Contains(err.Error(), "vf-0000-3b-02-1") {
			t.Errorf("ParseDeviceName(%q) error = %v, want one showing the form", bad, err)
		}
	}
}

// isDNSLabel is the API server's rule for a DRA device name (RFC 1123 label).
func isDNSLabel(s string) bool {
	if s == "" || len(s) > 63 || s[0] == '-' || s[len(s)-1] == '-' {
		return false
	}
	for _, c := range []byte(s) {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}

func TestCompare(t *testing.T) {
	t.Parallel()
	ordered := []string{"0000:00:1f.7", "0000:3b:00.0", "0000:3b:00.1", "0000:3b:02.0", "0000:d8:00.0", "0001:00:00.0", "ffff:00:00.0", "10000:00:00.0", "0000:3B:00.0", "zzz"}
	for i := range ordered {
		for j := range ordered {
			if got, want := pciaddr.Compare(ordered[i], ordered[j]), cmpInt(i, j); got != want {
				t.Errorf("Compare(%s, %s) = %d, want %d", ordered[i], ordered[j], got, want)
			}
		}
	}
	shuffled := slices.Clone(ordered)
	slices.Reverse(shuffled)
	slices.SortFunc(shuffled, pciaddr.Compare)
	if !slices.Equal(shuffled, ordered) {
		t.Errorf("sorted = %v", shuffled)
	}
}

func cmpInt(a, b int) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
