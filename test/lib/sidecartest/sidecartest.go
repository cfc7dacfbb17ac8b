// Package sidecartest builds KubeVirt-shaped VMIs, metadata files and
// libvirt validation for the sidecar's tests.
package sidecartest

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/vfnet-io/vfnet/pkg/contract/metadata"
	"github.com/vfnet-io/vfnet/test/lib/metadatatest"
)

// Binding is the binding name the tests use.
const Binding = "vfnet"

// ReadFile reads a test input.
func ReadFile(t testing.TB, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// VMIBuilder builds KubeVirt-shaped VMIs: a masquerade pod network plus
// whatever interfaces a test adds.
type VMIBuilder struct {
	vmi *kubevirtv1.VirtualMachineInstance
}

// NewVMI starts a VMI with a masquerade pod network.
func NewVMI() *VMIBuilder {
	return &VMIBuilder{vmi: &kubevirtv1.VirtualMachineInstance{
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

// VFNet adds an interface with the vfnet binding backed by a template claim
// podClaim/request.
func (b *VMIBuilder) VFNet(name, podClaim, request string, mod func(*kubevirtv1.Interface)) *VMIBuilder {
	iface := kubevirtv1.Interface{Name: name, Binding: &kubevirtv1.PluginBinding{Name: Binding}}
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

// Direct makes podClaim name the ResourceClaim rcName instead of a template.
func (b *VMIBuilder) Direct(podClaim, rcName string) *VMIBuilder {
	for i, c := range b.vmi.Spec.ResourceClaims {
		if c.Name == podClaim {
			b.vmi.Spec.ResourceClaims[i].ResourceClaimTemplateName = nil
			b.vmi.Spec.ResourceClaims[i].ResourceClaimName = &rcName
		}
	}
	return b
}

// Other adds an interface of another binding plugin on a multus network.
func (b *VMIBuilder) Other(name, bindingName string) *VMIBuilder {
	b.vmi.Spec.Domain.Devices.Interfaces = append(b.vmi.Spec.Domain.Devices.Interfaces,
		kubevirtv1.Interface{Name: name, Binding: &kubevirtv1.PluginBinding{Name: bindingName}})
	b.vmi.Spec.Networks = append(b.vmi.Spec.Networks, kubevirtv1.Network{Name: name, NetworkSource: kubevirtv1.NetworkSource{
		Multus: &kubevirtv1.MultusNetwork{NetworkName: "other-net"},
	}})
	return b
}

// Build returns the VMI.
func (b *VMIBuilder) Build() *kubevirtv1.VirtualMachineInstance { return b.vmi }

// WriteVF writes vfnet-driver-style metadata for a template claim.
func WriteVF(t testing.TB, root, podClaim, request, bdf, mac string) {
	t.Helper()
	c := metadatatest.Claim{Namespace: "vms", Name: "vm-a-" + podClaim + "-x7k2q", UID: "u-" + podClaim, PodClaimName: podClaim, Request: request}
	if err := metadatatest.Write(metadata.TemplateClaimPath(root, podClaim, request), metadatatest.Stream(c, metadatatest.VF(bdf, mac))); err != nil {
		t.Fatal(err)
	}
}

// WriteFailoverVF is WriteVF for a claim whose VFConfig asks for failover:
// the metadata carries vfnet.io/failover, true.
func WriteFailoverVF(t testing.TB, root, podClaim, request, bdf, mac string) {
	t.Helper()
	c := metadatatest.Claim{Namespace: "vms", Name: "vm-a-" + podClaim + "-x7k2q", UID: "u-" + podClaim, PodClaimName: podClaim, Request: request}
	d := metadatatest.VF(bdf, mac)
	d.Failover = true
	if err := metadatatest.Write(metadata.TemplateClaimPath(root, podClaim, request), metadatatest.Stream(c, d)); err != nil {
		t.Fatal(err)
	}
}

// KubeVirtEmpties are the empty SMBIOS elements KubeVirt v1.9.0 always
// writes and libvirt's own schema rejects (sidecar/README.md). They are
// removed from input and output alike before virt-xml-validate; vfnet
// neither adds nor touches them.
var KubeVirtEmpties = regexp.MustCompile(`\s*<(bios|baseBoard|chassis)(></(bios|baseBoard|chassis)>|/>)`)

// Validate runs libvirt's virt-xml-validate on a whole <domain> document.
func Validate(t testing.TB, doc []byte) {
	t.Helper()
	if _, err := exec.LookPath("virt-xml-validate"); err != nil {
		t.Fatalf("virt-xml-validate not found: apt-get install -y libvirt-clients libxml2-utils (make test does this)")
	}
	f := filepath.Join(t.TempDir(), "domain.xml")
	if err := os.WriteFile(f, KubeVirtEmpties.ReplaceAll(doc, nil), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("virt-xml-validate", f, "domain").CombinedOutput(); err != nil {
		t.Fatalf("virt-xml-validate: %v\n%s\n--- document:\n%s", err, out, doc)
	}
}

// Insertion checks that out is in plus one contiguous inserted block (every
// input byte survives, in order) and returns the block.
func Insertion(t testing.TB, in, out []byte) []byte {
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

// WriteDirect writes metadata for a directly named ResourceClaim at path.
func WriteDirect(t testing.TB, path, bdf string) {
	t.Helper()
	c := metadatatest.Claim{Namespace: "vms", Name: "shared-vf-claim", UID: "u-direct", Request: "vf"}
	if err := metadatatest.Write(path, metadatatest.Stream(c, metadatatest.VF(bdf, ""))); err != nil {
		t.Fatal(err)
	}
}
