package pciaddr_test

import (
	"strings"
	"testing"

	"github.com/vfnet-io/vfnet/pkg/contract/pciaddr"
)

func TestValid(t *testing.T) {
	t.Parallel()
	for s, want := range map[string]bool{
		"0000:3b:02.1": true, "ffff:ff:1f.7": true, "0000:00:00.0": true, "10000:00:00.0": true, "ffffffff:00:00.0": true,
		"0000:3b:20.1": false, "0000:3b:02.8": false, "0000:3B:02.1": false, "000:3b:02.1": false, "100000000:00:00.0": false,
		"0000-3b:02.1": false, "0000:3b:02.10": false, "": false, "0000:3g:02.1": false, "00:00:3b:02.1": false,
	} {
		if got := pciaddr.Valid(s); got != want {
			t.Errorf("Valid(%q) = %v, want %v", s, got, want)
		}
	}
}

func TestParse(t *testing.T) {
	t.Parallel()
	for s, want := range map[string]pciaddr.Address{
		"0000:3B:02.1": {0, 0x3b, 2, 1}, "0:0:0.0": {}, "ffff:ff:1f.7": {0xffff, 0xff, 0x1f, 7},
	} {
		got, err := pciaddr.Parse(s)
		if err != nil || got != want {
			t.Errorf("Parse(%q) = %v, %v; want %v", s, got, err, want)
		}
	}
	if got := (pciaddr.Address{0, 0x3b, 2, 1}).String(); got != "0000:3b:02.1" {
		t.Errorf("String() = %q", got)
	}
	for s, msg := range map[string]string{
		"": "of the form", "3b:02.1": "of the form", "0000:3b:02": "of the form", "0000:3b:20.1": `slot "20"`,
		"0000:3b:02.8": `function "8"`, "0000:3b:02.x": `function "x"`, "10000:00:00.0": `domain "10000"`, "0000::02.1": `bus ""`,
	} {
		if _, err := pciaddr.Parse(s); err == nil || !strings.Contains(err.Error(), msg) {
			t.Errorf("Parse(%q) error = %v, want it to contain %q", s, err, msg)
		}
	}
}
