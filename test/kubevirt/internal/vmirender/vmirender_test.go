package vmirender

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/equality"

	"github.com/vfnet-io/vfnet/test/kubevirt/internal/guestvmi"
	"github.com/vfnet-io/vfnet/test/kubevirt/internal/product"
)

func exampleOptions(t *testing.T) Options {
	t.Helper()
	root, err := product.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return Options{
		VMFile:       filepath.Join(root, "manifests", "examples", "vm.yaml"),
		KubeVirtFile: filepath.Join(root, "manifests", "kubevirt", "binding-patch.yaml"),
		UID:          "0b5e6a3c-0000-4000-8000-000000000001",
		KernelImage:  "quay.io/vfnet-io/test-kernel:guest",
		KernelPath:   "/boot/vmlinux", InitrdPath: "/boot/initrd", KernelArgs: "console=ttyS0",
		Memory: "256Mi",
	}
}

// The example VM becomes a kernel-boot VMI with the guest's memory, virt-api's
// defaults and non-root user, each change named; it survives the file.
func TestRenderExampleVM(t *testing.T) {
	t.Parallel()
	o := exampleOptions(t)
	f, err := Render(o)
	if err != nil {
		t.Fatal(err)
	}
	vmi := f.VMI
	for _, v := range vmi.Spec.Volumes {
		if v.ContainerDisk != nil {
			t.Errorf("containerDisk volume %s left", v.Name)
		}
	}
	kb := vmi.Spec.Domain.Firmware.KernelBoot
	if kb == nil || kb.Container == nil || kb.Container.KernelPath != o.KernelPath || kb.KernelArgs != o.KernelArgs {
		t.Errorf("kernelBoot %+v", kb)
	}
	if got := vmi.Spec.Domain.Memory.Guest.String(); got != "256Mi" {
		t.Errorf("guest memory %s", got)
	}
	// virt-api's mutations ran: the machine type default and the non-root user.
	if vmi.Spec.Domain.Machine == nil || vmi.Spec.Domain.Machine.Type == "" {
		t.Errorf("no machine type: virt-api's defaults did not run")
	}
	if vmi.Status.RuntimeUser != 107 {
		t.Errorf("runtime user %d, want 107 (non-root)", vmi.Status.RuntimeUser)
	}
	if len(f.Changes) != 2 || !strings.HasPrefix(f.Changes[0], "containerDisk disk+volume ") || !strings.HasPrefix(f.Changes[1], "spec.domain.memory.guest 1Gi -> 256Mi (") {
		t.Errorf("changes %q", f.Changes)
	}
	path := filepath.Join(t.TempDir(), "vmi.json")
	if err := guestvmi.Write(path, f); err != nil {
		t.Fatal(err)
	}
	back, err := guestvmi.Read(path)
	if err != nil {
		t.Fatal(err)
	}
	if !equality.Semantic.DeepEqual(back.VMI.Spec, vmi.Spec) || !slices.Equal(back.Changes, f.Changes) || back.VMI.Status.RuntimeUser != 107 {
		t.Errorf("the file does not carry the VMI as rendered")
	}
}

func TestRenderRefuses(t *testing.T) {
	t.Parallel()
	o := exampleOptions(t)
	o.Memory = "lots"
	if _, err := Render(o); err == nil || !strings.Contains(err.Error(), `-memory "lots"`) {
		t.Errorf("bad memory: %v", err)
	}
	o = exampleOptions(t)
	o.VMFile = o.KubeVirtFile
	if _, err := Render(o); err == nil || !strings.Contains(err.Error(), "one VirtualMachine") {
		t.Errorf("no VM: %v", err)
	}
	if _, err := guestvmi.Read(filepath.Join(t.TempDir(), "none.json")); err == nil || !strings.Contains(err.Error(), "cmd/vmirender") {
		t.Errorf("missing file: %v", err)
	}
}
