// Command vmirender renders, on the host, the VMI that cmd/kernellauncher
// runs in the real-kernel guest (package vmirender), and writes it as JSON
// (package guestvmi) for the launcher's -vmi flag.
package main

import (
	"flag"
	"fmt"
	"os"

	kutil "kubevirt.io/kubevirt/pkg/util"

	"github.com/vfnet-io/vfnet/test/kubevirt/internal/guestvmi"
	"github.com/vfnet-io/vfnet/test/kubevirt/internal/vmirender"
)

func main() {
	var o vmirender.Options
	flag.StringVar(&o.VMFile, "vm", "manifests/examples/vm.yaml", "the example VirtualMachine")
	flag.StringVar(&o.KubeVirtFile, "kubevirt", "manifests/kubevirt/binding-patch.yaml", "the KubeVirt CR patch registering the vfnet binding")
	flag.StringVar(&o.UID, "uid", "0b5e6a3c-0000-4000-8000-000000000001", "UID of the VMI")
	flag.StringVar(&o.KernelImage, "kernel-image", "quay.io/vfnet-io/test-kernel:guest", "spec.domain.firmware.kernelBoot.container.image (never pulled: only names the container)")
	flag.StringVar(&o.KernelPath, "kernel-path", "/boot/vmlinuz", "kernelBoot.container.kernelPath: the kernel's path inside the kernel-boot volume view "+kutil.VirtKernelBootVolumeDir)
	flag.StringVar(&o.InitrdPath, "initrd-path", "/boot/initrd.img", "kernelBoot.container.initrdPath (empty: none)")
	flag.StringVar(&o.KernelArgs, "kernel-args", "console=ttyS0", "kernelBoot.kernelArgs")
	flag.StringVar(&o.Memory, "memory", "256Mi", "spec.domain.memory.guest (the example asks 1Gi)")
	flag.StringVar(&o.CPUModel, "cpu-model", "", "spec.domain.cpu.model (empty: leave KubeVirt's default, host-model)")
	out := flag.String("out", "vmi.json", "where to write the rendered VMI")
	flag.Parse()
	f, err := vmirender.Render(o)
	if err == nil {
		err = guestvmi.Write(*out, f)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "vmirender: %v\n", err)
		os.Exit(1)
	}
}
