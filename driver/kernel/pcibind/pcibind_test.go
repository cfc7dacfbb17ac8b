package pcibind

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vfnet-io/vfnet/test/lib/simhost"
)

func newHost(t *testing.T, spec simhost.Spec, opts ...simhost.Option) (*simhost.Host, Binder) {
	t.Helper()
	h, err := simhost.Build(t.TempDir(), spec, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return h, Binder{Sysfs: h.Sysfs(), Writer: h.Kernel(), DevRoot: h.DevRoot(), NodeName: "node-a"}
}

const vf = "0000:3b:02.1"

func TestBindAndRestore(t *testing.T) {
	t.Parallel()
	h, b := newHost(t, simhost.E810Host())
	ctx := context.Background()
	var steps []string
	b.Hook = func(s string) { steps = append(steps, s) }
	bd, err := b.BindVFIO(ctx, vf, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(steps, ",") != "override-set,unbound,vfio-bound,devnode-ready" {
		t.Fatalf("steps %v", steps)
	}
	if d, _ := b.Driver(vf); d != VFIOPCI {
		t.Fatalf("driver %q", d)
	}
	if _, err := os.Stat(filepath.Join(h.DevRoot(), bd.DevNode)); err != nil || bd.DevNode != "vfio/"+bd.IOMMUGroup {
		t.Fatalf("dev node %+v: %v", bd, err)
	}
	// Binding again changes nothing.
	steps = nil
	if bd2, err := b.BindVFIO(ctx, vf, time.Second); err != nil || bd2 != bd || strings.Join(steps, ",") != "devnode-ready" {
		t.Fatalf("rebind: %+v %v %v", bd2, err, steps)
	}
	if err := b.Restore(ctx, vf, "iavf", ""); err != nil {
		t.Fatal(err)
	}
	if d, _ := b.Driver(vf); d != "iavf" {
		t.Fatalf("restored driver %q", d)
	}
	if ov, _ := b.Override(vf); ov != "" {
		t.Fatalf("override left %q", ov)
	}
	if _, err := os.Stat(filepath.Join(h.DevRoot(), bd.DevNode)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("group node still there: %v", err)
	}
	steps = nil
	if err := b.Restore(ctx, vf, "iavf", ""); err != nil || len(steps) != 0 {
		t.Fatalf("second restore: %v %v", err, steps)
	}
}

func TestNoIOMMU(t *testing.T) {
	t.Parallel()
	h, b := newHost(t, simhost.NoIOMMUHost())
	bd, err := b.BindVFIO(context.Background(), vf, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(bd.DevNode, "vfio/noiommu-") {
		t.Fatalf("dev node %q, want vfio/noiommu-N", bd.DevNode)
	}
	if _, err := os.Stat(filepath.Join(h.DevRoot(), bd.DevNode)); err != nil {
		t.Fatal(err)
	}
	if err := b.Restore(context.Background(), vf, "iavf", ""); err != nil {
		t.Fatal(err)
	}
}

func TestDelayedDevNode(t *testing.T) {
	t.Parallel()
	_, b := newHost(t, simhost.E810Host(), simhost.WithVFIODevDelay(30*time.Millisecond))
	if _, err := b.BindVFIO(context.Background(), vf, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	_, b2 := newHost(t, simhost.E810Host(), simhost.WithVFIODevDelay(time.Hour))
	_, err := b2.BindVFIO(context.Background(), vf, 20*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "wait for the VFIO group node of "+vf) {
		t.Fatalf("expected a timeout, got %v", err)
	}
}

func TestVFIONotLoaded(t *testing.T) {
	t.Parallel()
	spec := simhost.E810Host()
	spec.NoVFIOPCI = true
	_, b := newHost(t, spec)
	_, err := b.BindVFIO(context.Background(), vf, time.Second)
	if err == nil || !strings.Contains(err.Error(), "modprobe vfio-pci") || !strings.Contains(err.Error(), "node-a") {
		t.Fatalf("got %v", err)
	}
	if d, _ := b.Driver(vf); d != "iavf" {
		t.Fatalf("driver changed to %q", d)
	}
}

func TestBindFailureAfterUnbind(t *testing.T) {
	t.Parallel()
	h, b := newHost(t, simhost.E810Host())
	h.Kernel().FailWrite("drivers/vfio-pci/bind", syscall.EIO, 1)
	_, err := b.BindVFIO(context.Background(), vf, time.Second)
	if err == nil || !strings.Contains(err.Error(), "bind "+vf+" to vfio-pci") {
		t.Fatalf("got %v", err)
	}
	if d, _ := b.Driver(vf); d != "" {
		t.Fatalf("after failed bind driver is %q, want unbound", d)
	}
	// Restore puts it back from the half-done state.
	if err := b.Restore(context.Background(), vf, "iavf", ""); err != nil {
		t.Fatal(err)
	}
	if d, _ := b.Driver(vf); d != "iavf" {
		t.Fatalf("driver %q", d)
	}
}

func TestRestoreKeepsAdminOverride(t *testing.T) {
	t.Parallel()
	_, b := newHost(t, simhost.E810Host())
	ctx := context.Background()
	if err := b.setOverride(vf, "iavf"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.BindVFIO(ctx, vf, time.Second); err != nil {
		t.Fatal(err)
	}
	if err := b.Restore(ctx, vf, "iavf", "iavf"); err != nil {
		t.Fatal(err)
	}
	if ov, _ := b.Override(vf); ov != "iavf" {
		t.Fatalf("override %q", ov)
	}
}

// On a PF with sriov_drivers_autoprobe=0 the kernel binds a VF only through
// its driver_override (pci_device_can_probe); Restore must still give the VF
// back to its driver and leave no override behind.
func TestRestoreOnPFWithoutAutoprobe(t *testing.T) {
	t.Parallel()
	h, b := newHost(t, simhost.E810Host())
	ctx := context.Background()
	if err := h.Kernel().WriteFile("bus/pci/devices/0000:3b:00.0/sriov_drivers_autoprobe", []byte("0\n")); err != nil {
		t.Fatal(err)
	}
	if _, err := b.BindVFIO(ctx, vf, time.Second); err != nil {
		t.Fatal(err)
	}
	var steps []string
	b.Hook = func(s string) { steps = append(steps, s) }
	if err := b.Restore(ctx, vf, "iavf", ""); err != nil {
		t.Fatal(err)
	}
	if d, _ := b.Driver(vf); d != "iavf" {
		t.Fatalf("restored driver %q, want iavf", d)
	}
	if ov, _ := b.Override(vf); ov != "" {
		t.Fatalf("override left %q", ov)
	}
	if got := strings.Join(steps, ","); got != "override-restored,vfio-unbound,driver-restored,override-cleared" {
		t.Fatalf("steps %s", got)
	}
	// A restore interrupted after the bind (override still iavf) finishes.
	if err := b.setOverride(vf, "iavf"); err != nil {
		t.Fatal(err)
	}
	if err := b.Restore(ctx, vf, "iavf", ""); err != nil {
		t.Fatal(err)
	}
	if ov, _ := b.Override(vf); ov != "" {
		t.Fatalf("override left after re-run: %q", ov)
	}
}
