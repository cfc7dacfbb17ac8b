package domain_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/vfnet-io/vfnet/pkg/metadata"
	"github.com/vfnet-io/vfnet/pkg/metadata/metadatatest"
)

const binding = "vfnet"

func readTestdata(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// vmiBuilder builds KubeVirt-shaped VMIs: a masquerade pod network plus
// whatever interfaces a test adds.
type vmiBuilder struct{ vmi *kubevirtv1.VirtualMachineInstance }

func newVMI() *vmiBuilder {
	return &vmiBuilder{vmi: &kubevirtv1.VirtualMachineInstance{
		TypeMeta:   metav1.TypeMeta{Kind: "VirtualMachineInstance", APIVersion: "kubevirt.io/v1"},
		ObjectMeta: metav1.ObjectMeta{Name: "vm-a", Namespace: "vms", UID: "9a4c5e1a-27d8-5b1c-9a5e-0f7b4d6f2a11"},
		Spec: kubevirtv1.VirtualMachineInstanceSpec{
			Domain: kubevirtv1.DomainSpec{Devices: kubevirtv1.Devices{Interfaces: []kubevirtv1.Interface{{
				Name: "default", InterfaceBindingMethod: kubevirtv1.InterfaceBindingMethod{Masquerade: &kubevirtv1.InterfaceMasquerade{}},
			}}}},
			Networks: []kubevirtv1.Network{{Name: "default", NetworkSource: kubevirtv1.NetworkSource{Pod: &kubevirtv1.PodNetwork{}}}},
		},
	}}
}

// vfnet adds an interface with the vfnet binding backed by a template claim
// podClaim/request.
func (b *vmiBuilder) vfnet(name, podClaim, request string, mod func(*kubevirtv1.Interface)) *vmiBuilder {
	iface := kubevirtv1.Interface{Name: name, Binding: &kubevirtv1.PluginBinding{Name: binding}}
	if mod != nil {
		mod(&iface)
	}
	b.vmi.Spec.Domain.Devices.Interfaces = append(b.vmi.Spec.Domain.Devices.Interfaces, iface)
	b.vmi.Spec.Networks = append(b.vmi.Spec.Networks, kubevirtv1.Network{Name: name, NetworkSource: kubevirtv1.NetworkSource{
		ResourceClaim: &kubevirtv1.ClaimRequest{ClaimName: podClaim, RequestName: request},
	}})
	for _, c := range b.vmi.Spec.ResourceClaims {
		if c.Name == podClaim {
			return b
		}
	}
	tmpl := podClaim + "-template"
	b.vmi.Spec.ResourceClaims = append(b.vmi.Spec.ResourceClaims, kubevirtv1.VirtualMachineInstanceResourceClaim{
		Name: podClaim, ResourceClaimTemplateName: &tmpl,
	})
	return b
}

// direct makes podClaim name the ResourceClaim rcName instead of a template.
func (b *vmiBuilder) direct(podClaim, rcName string) *vmiBuilder {
	for i, c := range b.vmi.Spec.ResourceClaims {
		if c.Name == podClaim {
			b.vmi.Spec.ResourceClaims[i].ResourceClaimTemplateName = nil
			b.vmi.Spec.ResourceClaims[i].ResourceClaimName = &rcName
		}
	}
	return b
}

// other adds an interface of another binding plugin on a multus network.
func (b *vmiBuilder) other(name, bindingName string) *vmiBuilder {
	b.vmi.Spec.Domain.Devices.Interfaces = append(b.vmi.Spec.Domain.Devices.Interfaces,
		kubevirtv1.Interface{Name: name, Binding: &kubevirtv1.PluginBinding{Name: bindingName}})
	b.vmi.Spec.Networks = append(b.vmi.Spec.Networks, kubevirtv1.Network{Name: name, NetworkSource: kubevirtv1.NetworkSource{
		Multus: &kubevirtv1.MultusNetwork{NetworkName: "other-net"},
	}})
	return b
}

func (b *vmiBuilder) build() *kubevirtv1.VirtualMachineInstance { return b.vmi }

// writeVF writes vfnet-driver-style metadata for a template claim.
func writeVF(t testing.TB, root, podClaim, request, bdf, mac string) {
	t.Helper()
	c := metadatatest.Claim{Namespace: "vms", Name: "vm-a-" + podClaim + "-x7k2q", UID: "u-" + podClaim, PodClaimName: podClaim, Request: request}
	if err := metadatatest.Write(metadata.TemplateClaimPath(root, podClaim, request), metadatatest.Stream(c, metadatatest.VF(bdf, mac))); err != nil {
		t.Fatal(err)
	}
}

// kubevirtEmpties are the empty SMBIOS elements KubeVirt v1.9.0 always
// writes and libvirt's own schema rejects (contract.md section 3). They are
// removed from input and output alike before virt-xml-validate; vfnet
// neither adds nor touches them.
var kubevirtEmpties = regexp.MustCompile(`\s*<(bios|baseBoard|chassis)(></(bios|baseBoard|chassis)>|/>)`)

// validate runs libvirt's virt-xml-validate on a whole <domain> document.
func validate(t testing.TB, doc []byte) {
	t.Helper()
	if _, err := exec.LookPath("virt-xml-validate"); err != nil {
		t.Fatalf("virt-xml-validate not found: apt-get install -y libvirt-clients libxml2-utils (make test does this)")
	}
	f := filepath.Join(t.TempDir(), "domain.xml")
	if err := os.WriteFile(f, kubevirtEmpties.ReplaceAll(doc, nil), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("virt-xml-validate", f, "domain").CombinedOutput(); err != nil {
		t.Fatalf("virt-xml-validate: %v\n%s\n--- document:\n%s", err, out, doc)
	}
}

// insertion checks that out is in plus one contiguous inserted block (every
// input byte survives, in order) and returns the block.
func insertion(t testing.TB, in, out []byte) []byte {
	t.Helper()
	p := 0
	for p < len(in) && p < len(out) && in[p] == out[p] {
		p++
	}
	s := 0
	for s < len(in)-p && s < len(out)-p && in[len(in)-1-s] == out[len(out)-1-s] {
		s++
	}
	if p+s != len(in) {
		t.Fatalf("output is not the input plus one inserted block: input bytes %d..%d changed\n--- out:\n%s", p, len(in)-s, out)
	}
	return bytes.Clone(out[p : len(out)-s])
}
func writeAt(t testing.TB, path, bdf string) {
	t.Helper()
	c := metadatatest.Claim{Namespace: "vms", Name: "shared-vf-claim", UID: "u-direct", Request: "vf"}
	if err := metadatatest.Write(path, metadatatest.Stream(c, metadatatest.VF(bdf, ""))); err != nil {
		t.Fatal(err)
	}
}
