// Package pcibind moves a PCI function between kernel drivers through sysfs
// (driver_override, unbind, bind) and waits for the VFIO group node, the way
// `driverctl` or a manual rebind does. Every kernel write goes through a
// sysfs.Writer, so the same code runs against the real kernel and the
// simulated one in test/lib/simhost.
package pcibind

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"k8s.io/klog/v2"

	"github.com/vfnet-io/vfnet/driver/kernel/sysfs"
)

// VFIOPCI is the driver used for passthrough.
const VFIOPCI = "vfio-pci"

// Binder rebinds functions on one host.
type Binder struct {
	Sysfs  *sysfs.Host
	Writer sysfs.Writer
	// DevRoot holds vfio/ ("/dev" in production).
	DevRoot string
	// NodeName is named in admin-facing errors.
	NodeName string
	// Poll is the first interval between checks for the group node
	// (default 1ms, doubling up to 50ms).
	Poll time.Duration
	// Hook, if set, is called after every kernel write with a step name; the
	// crash tests stop the process there.
	Hook func(step string)
}

func (b Binder) hook(step string) {
	if b.Hook != nil {
		b.Hook(step)
	}
}

// CheckVFIOLoaded fails with the admin's fix when vfio-pci is not registered.
func (b Binder) CheckVFIOLoaded() error {
	if !b.Sysfs.DriverLoaded(VFIOPCI) {
		return fmt.Errorf("the vfio-pci driver is not loaded (%s missing): load the vfio-pci kernel module (modprobe vfio-pci) on node %s", b.Sysfs.Path(sysfs.PCIDriversDir+"/"+VFIOPCI), b.NodeName)
	}
	return nil
}

func devRel(bdf, attr string) string { return "bus/pci/devices/" + bdf + "/" + attr }

// Override reads driver_override; "" when none is set.
func (b Binder) Override(bdf string) (string, error) {
	data, err := os.ReadFile(b.Sysfs.Path(devRel(bdf, "driver_override")))
	if err != nil {
		return "", fmt.Errorf("read driver_override of %s: %w", bdf, err)
	}
	v := strings.TrimSpace(string(data))
	if v == "(null)" {
		v = ""
	}
	return v, nil
}

// Driver returns the driver bound to bdf now ("" when unbound).
func (b Binder) Driver(bdf string) (string, error) {
	fn, err := b.Sysfs.Function(bdf)
	if err != nil {
		return "", fmt.Errorf("read PCI function %s: %w", bdf, err)
	}
	return fn.Driver, nil
}

func (b Binder) setOverride(bdf, drv string) error {
	data := drv + "\n"
	if drv == "" {
		data = "\n" // clears it
	}
	if err := b.Writer.WriteFile(devRel(bdf, "driver_override"), []byte(data)); err != nil {
		return fmt.Errorf("set driver_override of %s to %q: %w", bdf, drv, err)
	}
	return nil
}

func (b Binder) unbind(bdf, drv string) error {
	if err := b.Writer.WriteFile("bus/pci/drivers/"+drv+"/unbind", []byte(bdf)); err != nil {
		return fmt.Errorf("unbind %s from %s: %w", bdf, drv, err)
	}
	return nil
}

func (b Binder) bind(bdf, drv string) error {
	if err := b.Writer.WriteFile("bus/pci/drivers/"+drv+"/bind", []byte(bdf)); err != nil {
		return fmt.Errorf("bind %s to %s: %w", bdf, drv, err)
	}
	return nil
}

// Bound describes a function bound to vfio-pci.
type Bound struct {
	IOMMUGroup string
	// DevNode is the group node relative to DevRoot: "vfio/42" or
	// "vfio/noiommu-42".
	DevNode string
}

// BindVFIO binds bdf to vfio-pci and waits (bounded by timeout and ctx) for
// its group node. It is idempotent: a function already on vfio-pci only
// gets the wait, and a function left unbound by an interrupted earlier call
// is just bound.
func (b Binder) BindVFIO(ctx context.Context, bdf string, timeout time.Duration) (Bound, error) {
	if err := b.CheckVFIOLoaded(); err != nil {
		return Bound{}, err
	}
	cur, err := b.Driver(bdf)
	if err != nil {
		return Bound{}, err
	}
	// The override first: once unbound, nothing but vfio-pci may claim the
	// function (not even a drivers_probe from elsewhere). It is checked even
	// when already bound: an interrupted restore may have cleared it.
	ov, err := b.Override(bdf)
	if err != nil {
		return Bound{}, err
	}
	if ov != VFIOPCI {
		if err := b.setOverride(bdf, VFIOPCI); err != nil {
			return Bound{}, err
		}
		b.hook("override-set")
	}
	if cur != VFIOPCI {
		if cur != "" {
			if err := b.unbind(bdf, cur); err != nil {
				return Bound{}, err
			}
			b.hook("unbound")
		}
		if err := b.bind(bdf, VFIOPCI); err != nil {
			return Bound{}, err
		}
		b.hook("vfio-bound")
	}
	bd, err := b.WaitDevNode(ctx, bdf, timeout)
	if err != nil {
		return Bound{}, err
	}
	b.hook("devnode-ready")
	return bd, nil
}

// WaitDevNode waits until bdf has an IOMMU group and vfio's node for it
// exists under DevRoot.
func (b Binder) WaitDevNode(ctx context.Context, bdf string, timeout time.Duration) (Bound, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	poll := b.Poll
	if poll <= 0 {
		poll = time.Millisecond
	}
	var last error
	for {
		bd, err := b.devNode(bdf)
		if err == nil {
			return bd, nil
		}
		last = err
		select {
		case <-ctx.Done():
			return Bound{}, fmt.Errorf("wait for the VFIO group node of %s on vfio-pci: %w (last check: %v)", bdf, ctx.Err(), last)
		case <-time.After(poll):
		}
		if poll < 50*time.Millisecond {
			poll *= 2
		}
	}
}

func (b Binder) devNode(bdf string) (Bound, error) {
	fn, err := b.Sysfs.Function(bdf)
	if err != nil {
		return Bound{}, err
	}
	if fn.Driver != VFIOPCI {
		return Bound{}, fmt.Errorf("%s is bound to %q, not vfio-pci", bdf, fn.Driver)
	}
	if fn.IOMMUGroup == "" {
		return Bound{}, fmt.Errorf("%s has no IOMMU group yet", bdf)
	}
	name, err := b.Sysfs.VFIOGroupDevice(fn.IOMMUGroup)
	if err != nil {
		return Bound{}, err
	}
	rel := "vfio/" + name
	if _, err := os.Stat(filepath.Join(b.DevRoot, filepath.FromSlash(rel))); err != nil {
		return Bound{}, fmt.Errorf("%s: %w", filepath.Join(b.DevRoot, rel), err)
	}
	return Bound{IOMMUGroup: fn.IOMMUGroup, DevNode: rel}, nil
}

// Restore gives bdf back to origDriver ("" = leave unbound) with
// driver_override origOverride. It is idempotent and a no-op when the
// function is already there. A function that no longer exists is an error
// wrapping fs.ErrNotExist.
//
// The bind happens with driver_override naming origDriver, and the
// original override is put back only afterwards: on a PF whose
// sriov_drivers_autoprobe is 0 the kernel refuses to probe a VF without an
// override (pci_device_can_probe: ENODEV), and while the VF is unbound the
// override also keeps any other driver from claiming it.
func (b Binder) Restore(ctx context.Context, bdf, origDriver, origOverride string) error {
	logger := klog.FromContext(ctx)
	cur, err := b.Driver(bdf)
	if err != nil {
		return err
	}
	ov, err := b.Override(bdf)
	if err != nil {
		return err
	}
	if cur != origDriver {
		bindOverride := origOverride
		if origDriver != "" {
			bindOverride = origDriver
		}
		if ov != bindOverride {
			if err := b.setOverride(bdf, bindOverride); err != nil {
				return err
			}
			ov = bindOverride
			b.hook("override-restored")
		}
		if cur != "" {
			if err := b.unbind(bdf, cur); err != nil {
				return err
			}
			b.hook("vfio-unbound")
		}
		if origDriver != "" {
			if !b.Sysfs.DriverLoaded(origDriver) {
				return fmt.Errorf("bind %s back to %s: driver %s is not loaded any more (load its module, then unprepare again)", bdf, origDriver, origDriver)
			}
			if err := b.bind(bdf, origDriver); err != nil {
				return err
			}
			b.hook("driver-restored")
			logger.V(4).Info("Restored driver", "device", bdf, "driver", origDriver)
		}
	}
	if ov != origOverride {
		if err := b.setOverride(bdf, origOverride); err != nil {
			return err
		}
		b.hook("override-cleared")
	}
	return nil
}

// IsNotExist reports whether err means the function is gone.
func IsNotExist(err error) bool { return errors.Is(err, fs.ErrNotExist) }
