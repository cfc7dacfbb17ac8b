package vfioholders

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vfnet-io/vfnet/test/lib/simhost"
)

// A real open file descriptor of this process, found through the real
// /proc: the same walk the driver does on a node with hostPID.
func TestHoldersRealProc(t *testing.T) {
	t.Parallel()
	dev := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dev, "vfio"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"17", "18"} {
		if err := os.WriteFile(filepath.Join(dev, "vfio", n), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	s := Scanner{ProcRoot: "/proc", DevRoot: dev}
	if _, err := s.Holders([]string{"17", "19"}); err == nil || !strings.Contains(err.Error(), "--dev-root") {
		t.Fatalf("missing node: %v, want an error naming --dev-root", err)
	}
	got, err := s.Holders([]string{"17", "18"})
	if err != nil {
		t.Fatal(err)
	}
	if len(got["17"]) != 0 || len(got["18"]) != 0 {
		t.Fatalf("holders before open: %v", got)
	}
	f, err := os.Open(filepath.Join(dev, "vfio", "17"))
	if err != nil {
		t.Fatal(err)
	}
	got, err = s.Holders([]string{"17", "18"})
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	me := os.Getpid()
	if len(got["17"]) != 1 || got["17"][0].PID != me || len(got["18"]) != 0 {
		t.Fatalf("holders with 17 open = %v, want pid %d for 17 only", got, me)
	}
	if !strings.Contains(got["17"][0].String(), "pid ") {
		t.Errorf("String() = %q", got["17"][0])
	}
	got, err = s.Holders([]string{"17"})
	if err != nil || len(got["17"]) != 0 {
		t.Fatalf("holders after close = %v, %v", got, err)
	}
	if _, err := s.Holders([]string{"../x"}); err == nil {
		t.Error("a node name with a slash was accepted")
	}
}

// The simulated host's holders (test/lib/simhost HoldVFIOGroup) are found in its
// synthetic /proc.
func TestHoldersSimulated(t *testing.T) {
	t.Parallel()
	h, err := simhost.Build(simhost.TempDir(t), simhost.MixedHost())
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	fn, err := h.Sysfs().Function("0000:3b:02.2") // on vfio-pci
	if err != nil || fn.Driver != "vfio-pci" {
		t.Fatalf("fixture: %+v %v", fn, err)
	}
	release, err := h.HoldVFIOGroup(fn.IOMMUGroup, 4242, "qemu-kvm")
	if err != nil {
		t.Fatal(err)
	}
	s := Scanner{ProcRoot: h.ProcRoot(), DevRoot: h.DevRoot()}
	got, err := s.Holders([]string{fn.IOMMUGroup})
	if err != nil || len(got[fn.IOMMUGroup]) != 1 || got[fn.IOMMUGroup][0].String() != "pid 4242 (qemu-kvm)" {
		t.Fatalf("holders = %v, %v", got, err)
	}
	if err := release(); err != nil {
		t.Fatal(err)
	}
	if got, err := s.Holders([]string{fn.IOMMUGroup}); err != nil || len(got[fn.IOMMUGroup]) != 0 {
		t.Fatalf("after release: %v, %v", got, err)
	}
}
