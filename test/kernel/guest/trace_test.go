//go:build kernelguest

package guest

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"testing"

	"github.com/vfnet-io/vfnet/driver/kernel/sysfs"
	"github.com/vfnet-io/vfnet/test/kernel/layout"
	"github.com/vfnet-io/vfnet/test/kernel/scenario"
)

// The trace case runs test/kernel/scenario on the real kernel and checks it
// against the recorded kernel-trace.json, which test/lib/simhost must follow
// too (scenario.TestSimhostFollowsKernelTrace).
func TestKernelTrace(t *testing.T) {
	m := guest(t)
	pf := m.pf(t, layout.RoleNUMA1)
	got, err := scenario.Run(context.Background(), scenario.Host{
		Sysfs: m.sysfs, Writer: sysfs.RootWriter{Root: "/sys"}, Links: m.links, DevRoot: "/dev",
		PFAddress: pf.Address, VF: 1,
	})
	data, _ := json.Marshal(got)
	// One line the harness saves to .cache/kernel/last-trace.json.
	os.Stdout.Write([]byte(fmt.Sprintf("%s %s\n", layout.MarkTrace, data)))
	if err != nil {
		t.Fatal(err)
	}
	want, err := scenario.KernelTrace()
	if err != nil {
		t.Fatal(err)
	}
	if d := scenario.Diff(got, want); d != "" {
		t.Errorf("the kernel no longer does what test/kernel/scenario/kernel-trace.json recorded (update it from .cache/kernel/last-trace.json if the kernel is right, and make test/lib/simhost follow):\n%s", d)
	}
}
