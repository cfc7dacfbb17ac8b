// Package vmirender renders the VMI the real-kernel guest's VM runs: the
// example VM through virt-controller's VMIFromVM and virt-api's create
// mutations (defaults, the non-root user 107) under the KubeVirt CR patch,
// with the guest's unavoidable changes applied to the VM template first, so
// virt-api derives its defaults from them as it would for a user who wrote
// them. It runs on the host; cmd/kernellauncher reads the result in the
// guest (package guestvmi).
package vmirender

import (
	"fmt"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"
	v1 "kubevirt.io/api/core/v1"

	"github.com/vfnet-io/vfnet/test/kubevirt/internal/guestvmi"
	"github.com/vfnet-io/vfnet/test/kubevirt/internal/launcherpod"
	"github.com/vfnet-io/vfnet/test/kubevirt/internal/manifestcheck"
)

// Options are the inputs and the guest's changes.
type Options struct {
	// VMFile is the example VirtualMachine, KubeVirtFile the KubeVirt CR
	// patch registering the vfnet binding.
	VMFile, KubeVirtFile string
	// UID is the VMI's UID.
	UID string
	// KernelImage, KernelPath, InitrdPath and KernelArgs replace the
	// example's containerDisk by kernel boot.
	KernelImage, KernelPath, InitrdPath, KernelArgs string
	// Memory is spec.domain.memory.guest, a Kubernetes quantity.
	Memory string
	// CPUModel, when set, is spec.domain.cpu.model.
	CPUModel string
}

// Render returns the VMI and the changes made to the example VM.
func Render(o Options) (guestvmi.File, error) {
	objs, err := manifestcheck.DecodeFiles(o.KubeVirtFile, o.VMFile)
	if err != nil {
		return guestvmi.File{}, fmt.Errorf("read -kubevirt %s and -vm %s: %w", o.KubeVirtFile, o.VMFile, err)
	}
	if len(objs.KubeVirts) != 1 || len(objs.VMs) != 1 {
		return guestvmi.File{}, fmt.Errorf("want one KubeVirt in -kubevirt and one VirtualMachine in -vm, found %d and %d", len(objs.KubeVirts), len(objs.VMs))
	}
	cfg, _ := manifestcheck.ClusterConfig(objs.KubeVirts[0].Obj, manifestcheck.RequiredGates...)
	vmi := launcherpod.VMIFromVM(objs.VMs[0].Obj, o.UID)
	changes, err := guestChanges(o, vmi)
	if err != nil {
		return guestvmi.File{}, err
	}
	if err := launcherpod.MutateAsVirtAPI(vmi, cfg); err != nil {
		return guestvmi.File{}, err
	}
	return guestvmi.File{VMI: vmi, Changes: changes}, nil
}

// guestChanges are the only differences from the example VM, each named.
func guestChanges(o Options, vmi *v1.VirtualMachineInstance) ([]string, error) {
	var changes []string
	change := func(what, why string) { changes = append(changes, what+" ("+why+")") }
	spec := &vmi.Spec
	var removed []string
	var volumes []v1.Volume
	for _, v := range spec.Volumes {
		if v.ContainerDisk != nil {
			removed = append(removed, v.Name)
			continue
		}
		volumes = append(volumes, v)
	}
	if len(removed) == 0 {
		return nil, fmt.Errorf("the VM in %s has no containerDisk volume to replace by kernel boot: the guest expects manifests/examples/vm.yaml", o.VMFile)
	}
	var disks []v1.Disk
	for _, d := range spec.Domain.Devices.Disks {
		if !slices.Contains(removed, d.Name) {
			disks = append(disks, d)
		}
	}
	spec.Volumes, spec.Domain.Devices.Disks = volumes, disks
	if spec.Domain.Firmware == nil {
		spec.Domain.Firmware = &v1.Firmware{}
	}
	spec.Domain.Firmware.KernelBoot = &v1.KernelBoot{
		KernelArgs: o.KernelArgs,
		Container: &v1.KernelBootContainer{
			Image:      o.KernelImage,
			KernelPath: o.KernelPath,
			InitrdPath: o.InitrdPath,
		},
	}
	change(fmt.Sprintf("containerDisk disk+volume %s replaced by spec.domain.firmware.kernelBoot container kernelPath=%s initrdPath=%s kernelArgs=%q",
		strings.Join(removed, ","), o.KernelPath, o.InitrdPath, o.KernelArgs),
		"the test guest has no container runtime or images; kernel boot is KubeVirt's own feature and boots from files")

	mem, err := resource.ParseQuantity(o.Memory)
	if err != nil {
		return nil, fmt.Errorf("-memory %q: %w (give a Kubernetes quantity such as 256Mi)", o.Memory, err)
	}
	if spec.Domain.Memory == nil {
		spec.Domain.Memory = &v1.Memory{}
	}
	old := "unset"
	if spec.Domain.Memory.Guest != nil {
		old = spec.Domain.Memory.Guest.String()
	}
	if old != mem.String() {
		spec.Domain.Memory.Guest = &mem
		change(fmt.Sprintf("spec.domain.memory.guest %s -> %s", old, mem.String()), "the test guest has about 2 GiB of RAM")
	}
	if o.CPUModel != "" {
		if spec.Domain.CPU == nil {
			spec.Domain.CPU = &v1.CPU{}
		}
		spec.Domain.CPU.Model = o.CPUModel
		change("spec.domain.cpu.model "+o.CPUModel, "asked by -cpu-model: the default host-model is what KubeVirt uses, set this only where libvirt refuses it under TCG")
	}
	return changes, nil
}
