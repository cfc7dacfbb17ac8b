package launcherpod

import (
	"path/filepath"
	"slices"
	"testing"

	k8sv1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	v1 "kubevirt.io/api/core/v1"

	"github.com/vfnet-io/vfnet/test/kubevirt/internal/manifestcheck"
	"github.com/vfnet-io/vfnet/test/kubevirt/internal/product"
)

// productInputs loads the product's KubeVirt CR patch and example VM.
func productInputs(t *testing.T) (*v1.KubeVirtConfiguration, *v1.VirtualMachine, string) {
	t.Helper()
	root, err := product.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	var files []string
	for _, d := range []string{"kubevirt", "examples"} {
		fs, err := manifestcheck.YAMLFiles(filepath.Join(root, "manifests", d))
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, fs...)
	}
	objs, err := manifestcheck.DecodeFiles(files...)
	if err != nil {
		t.Fatal(err)
	}
	if len(objs.KubeVirts) != 1 || len(objs.VMs) == 0 {
		t.Fatalf("want one KubeVirt CR patch and a VM example, got %d and %d", len(objs.KubeVirts), len(objs.VMs))
	}
	cfg, _ := manifestcheck.ClusterConfig(objs.KubeVirts[0].Obj, manifestcheck.RequiredGates...)
	binding := ""
	for _, iface := range objs.VMs[0].Obj.Spec.Template.Spec.Domain.Devices.Interfaces {
		if iface.Binding != nil {
			binding = iface.Binding.Name
		}
	}
	if binding == "" {
		t.Fatal("example VM has no binding-plugin interface")
	}
	return cfg, objs.VMs[0].Obj, binding
}

func container(pod *k8sv1.Pod, name string) *k8sv1.Container {
	for i := range pod.Spec.Containers {
		if pod.Spec.Containers[i].Name == name {
			return &pod.Spec.Containers[i]
		}
	}
	return nil
}

func env(c *k8sv1.Container, name string) string {
	for _, e := range c.Env {
		if e.Name == name {
			return e.Value
		}
	}
	return ""
}

// TestProductCRPatchShapesLauncherPod renders, with virt-controller's own
// code, the launcher pod of the product's example VM under the product's
// KubeVirt CR patch, and checks what the pod carries (manifests/kubevirt/README.md).
func TestProductCRPatchShapesLauncherPod(t *testing.T) {
	t.Parallel()
	cfg, vm, binding := productInputs(t)
	vmi := VMIFromVM(vm, "0b5e6a3c-0000-4000-8000-000000000001")
	pod, err := Render(vmi, cfg)
	if err != nil {
		t.Fatal(err)
	}
	plugin := cfg.NetworkConfiguration.Binding[binding]

	sidecar := container(pod, "hook-sidecar-0")
	if sidecar == nil {
		t.Fatalf("no hook-sidecar-0 container; containers: %v", names(pod))
	}
	if sidecar.Image != plugin.SidecarImage {
		t.Errorf("sidecar image %q, CR patch registers %q", sidecar.Image, plugin.SidecarImage)
	}
	if got := env(sidecar, "NETWORK_BINDING_PLUGIN_NAME"); got != binding {
		t.Errorf("sidecar NETWORK_BINDING_PLUGIN_NAME=%q, want %q", got, binding)
	}
	if got := env(sidecar, "CONTAINER_NAME"); got != "hook-sidecar-0" {
		t.Errorf("sidecar CONTAINER_NAME=%q", got)
	}

	// pod.spec.resourceClaims mirrors vmi.spec.resourceClaims.
	if len(pod.Spec.ResourceClaims) != len(vmi.Spec.ResourceClaims) {
		t.Fatalf("pod resourceClaims %+v, VMI %+v", pod.Spec.ResourceClaims, vmi.Spec.ResourceClaims)
	}
	for i, rc := range vmi.Spec.ResourceClaims {
		prc := pod.Spec.ResourceClaims[i]
		if prc.Name != rc.Name || !equalPtr(prc.ResourceClaimTemplateName, rc.ResourceClaimTemplateName) || !equalPtr(prc.ResourceClaimName, rc.ResourceClaimName) {
			t.Errorf("pod claim %+v does not mirror VMI claim %+v", prc, rc)
		}
	}

	// The compute container holds every DRA network's claim request.
	compute := container(pod, "compute")
	if compute == nil {
		t.Fatal("no compute container")
	}
	for _, n := range vmi.Spec.Networks {
		if n.ResourceClaim == nil {
			continue
		}
		want := k8sv1.ResourceClaim{Name: n.ResourceClaim.ClaimName, Request: n.ResourceClaim.RequestName}
		if !slices.Contains(compute.Resources.Claims, want) {
			t.Errorf("compute claims %+v lack %+v", compute.Resources.Claims, want)
		}
	}
	// KubeVirt v1.9.0 does not give the binding sidecar the claim (that is
	// kubevirt PR 18741, v1.10): the metadata is not mounted there, which is
	// why vfnet-binding's error for a missing metadata directory says so.
	if len(sidecar.Resources.Claims) != 0 {
		t.Errorf("v1.9.0 now gives the sidecar claims %+v: update manifests/kubevirt/README.md, docs/install.md and the binding's error text", sidecar.Resources.Claims)
	}

	// VFIO's gigabyte is reserved once, by the VM's addedOverhead, as
	// KubeVirt reserves it for its own VFIO devices: the registration adds
	// nothing to the compute container.
	if o := plugin.ComputeResourceOverhead; o != nil && !o.Requests.Memory().IsZero() {
		t.Errorf("the CR patch reserves %s more for every VM: VFIO's gigabyte twice with the VM's addedOverhead", o.Requests.Memory())
	}
	noAdded := vmi.DeepCopy()
	if m := noAdded.Spec.Domain.Memory; m == nil || m.ReservedOverhead == nil || m.ReservedOverhead.AddedOverhead == nil {
		t.Fatalf("the example VM sets no reservedOverhead.addedOverhead: %+v", vmi.Spec.Domain.Memory)
	}
	noAdded.Spec.Domain.Memory.ReservedOverhead.AddedOverhead = nil
	base, err := Render(noAdded, cfg)
	if err != nil {
		t.Fatal(err)
	}
	got := compute.Resources.Requests.Memory().DeepCopy()
	got.Sub(*container(base, "compute").Resources.Requests.Memory())
	if want := resource.MustParse("1Gi"); got.Cmp(want) != 0 {
		t.Errorf("the example's addedOverhead grows the compute memory request by %s, want %s (VFIO's gigabyte, once)", got.String(), want.String())
	}
}

func names(pod *k8sv1.Pod) []string {
	var out []string
	for _, c := range pod.Spec.Containers {
		out = append(out, c.Name)
	}
	return out
}

func equalPtr(a, b *string) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

// TestNonRootSidecarWithClaims: with virt-api's create mutations the pod's
// containers run as 107 (KubeVirt's default non-root mode), and the v1.10
// rendering gives the binding sidecar the VM's claim, which v1.9.0 does not.
func TestNonRootSidecarWithClaims(t *testing.T) {
	cfg, vm, _ := productInputs(t)
	vmi := VMIFromVM(vm, "0b5e6a3c-0000-4000-8000-000000000009")
	if err := MutateAsVirtAPI(vmi, cfg); err != nil {
		t.Fatal(err)
	}
	pod, err := Render(vmi, cfg)
	if err != nil {
		t.Fatal(err)
	}
	sc := container(pod, "hook-sidecar-0")
	if sc == nil || sc.SecurityContext == nil || sc.SecurityContext.RunAsUser == nil || *sc.SecurityContext.RunAsUser != 107 {
		t.Fatalf("sidecar does not run as 107: %+v", sc)
	}
	if len(sc.Resources.Claims) != 0 {
		t.Fatalf("v1.9.0 gives the sidecar claims %v; the test below would prove nothing", sc.Resources.Claims)
	}
	if err := AddBindingSidecarClaims(pod, vmi); err != nil {
		t.Fatal(err)
	}
	want := container(pod, "compute").Resources.Claims
	if len(want) == 0 || !slices.Equal(container(pod, "hook-sidecar-0").Resources.Claims, want) {
		t.Fatalf("sidecar claims %v, want the compute container's %v", container(pod, "hook-sidecar-0").Resources.Claims, want)
	}
}
