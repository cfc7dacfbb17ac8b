package scenario

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/vfnet-io/vfnet/test/lib/simhost"
)

// TestSimhostFollowsKernelTrace runs the scenario on the simulated 82576
// and checks it observes what the real kernel did (kernel-trace.json, which
// the real-kernel tier's "trace" case checks against the kernel).
func TestSimhostFollowsKernelTrace(t *testing.T) {
	want, err := KernelTrace()
	if err != nil {
		t.Fatal(err)
	}
	if len(want) == 0 {
		t.Fatal("kernel-trace.json holds no trace: record one with the real-kernel tier (make test-kernel VFNET_KERNEL_CASES=trace)")
	}
	h, err := simhost.Build(filepath.Join(t.TempDir(), "host"), simhost.Spec{PFs: []simhost.PFSpec{simhost.I82576PF("0000:81:00.0", "eth2", 2)}})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	got, err := Run(context.Background(), Host{Sysfs: h.Sysfs(), Writer: h.Kernel(), Links: h.Links(), DevRoot: h.DevRoot(),
		PFAddress: "0000:81:00.0", VF: 1})
	if err != nil {
		t.Fatalf("scenario on simhost: %v (trace so far %+v)", err, got)
	}
	if d := Diff(got, want); d != "" {
		t.Errorf("test/lib/simhost disagrees with the real kernel:\n%s", d)
	}
}
