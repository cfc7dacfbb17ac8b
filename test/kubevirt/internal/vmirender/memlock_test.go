package vmirender

import (
	"testing"

	v1 "kubevirt.io/api/core/v1"
	"kubevirt.io/kubevirt/pkg/hypervisor/kvm"

	"github.com/vfnet-io/vfnet/test/kubevirt/internal/manifestcheck"
)

// libvirtVFIOMemLock is what libvirt 11.3 sets QEMU's RLIMIT_MEMLOCK to
// for a domain with a VFIO hostdev, no vIOMMU and no memtune hard limit
// (qemuDomainGetMemLockLimitBytes): the guest's memory, its maximum when
// memory hotplug is on (virt-api sets maxGuest), plus 1 GiB for the
// device's MMIO space. A non-root launcher's libvirt cannot raise its own
// limit, so virt-handler must have raised it this far already.
func libvirtVFIOMemLock(mem *v1.Memory) int64 {
	guest := mem.Guest
	if mem.MaxGuest != nil {
		guest = mem.MaxGuest
	}
	return guest.Value() + 1<<30
}

// The example VM's locked-memory limit, as KubeVirt v1.9.0's virt-handler
// computes it for memLock: Required (kvm.CalculateMemlockSize, run here on
// the VMI virt-api admits), covers what libvirt locks for vfnet's VF: the
// VM starts under a non-root launcher. Without addedOverhead it does not
// (the real virt-launcher then fails "cannot limit locked memory",
// make test-kubevirt-guest): KubeVirt adds the VFIO gigabyte only for its
// own VFIO devices.
func TestExampleVMLocksWhatLibvirtLocksForVFIO(t *testing.T) {
	t.Parallel()
	for _, memory := range []string{"256Mi", "1Gi", "8Gi"} {
		o := exampleOptions(t)
		o.Memory = memory
		f, err := Render(o)
		if err != nil {
			t.Fatal(err)
		}
		objs, err := manifestcheck.DecodeFiles(o.KubeVirtFile)
		if err != nil {
			t.Fatal(err)
		}
		cfg, _ := manifestcheck.ClusterConfig(objs.KubeVirts[0].Obj, manifestcheck.RequiredGates...)
		runtime := kvm.NewKvmVirtRuntime(nil, nil)
		vmi := f.VMI
		need := libvirtVFIOMemLock(vmi.Spec.Domain.Memory)
		got := runtime.CalculateMemlockSize(vmi, cfg)
		if got.Value() < need {
			t.Errorf("guest %s (max %v): virt-handler raises the memlock limit to %s, libvirt needs %d bytes for the VF", memory, vmi.Spec.Domain.Memory.MaxGuest, got.String(), need)
		}

		without := vmi.DeepCopy()
		without.Spec.Domain.Memory.ReservedOverhead.AddedOverhead = nil
		if short := runtime.CalculateMemlockSize(without, cfg); short.Value() >= need {
			t.Errorf("guest %s (max %v): without addedOverhead the limit is %s, already enough: the example's addedOverhead is not what makes it so", memory, vmi.Spec.Domain.Memory.MaxGuest, short.String())
		}
	}
}
