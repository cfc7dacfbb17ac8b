// Package golden builds the domain XML KubeVirt v1.9.0's virt-launcher would
// hand to a hook sidecar's OnDefineDomain for a set of VMIs that use the vfnet
// binding. It runs KubeVirt's own converter and marshals the result exactly
// like the launcher's hook manager does, so the committed inputs are what a
// real cluster produces, not hand-written XML.
package golden

import (
	k8sv1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	v1 "kubevirt.io/api/core/v1"

	"kubevirt.io/kubevirt/pkg/os/disk"
)

// BindingName is the binding plugin name the product registers.
const BindingName = "vfnet"

// VF is the device metadata a vfnet interface's claim request resolves to.
type VF struct {
	// Interface is the VMI interface (and network) name.
	Interface string
	// PCIBusID is the host VF address written to the metadata file.
	PCIBusID string
	// MAC is networkData.hardwareAddress in the metadata ("" to omit).
	MAC string
}

// Case is one VMI with the context the converter needs and the VFs its vfnet
// interfaces are allocated.
type Case struct {
	Name string
	VMI  *v1.VirtualMachineInstance
	// DomainAttachment mirrors what virt-handler passes as
	// VirtualMachineOptions.InterfaceDomainAttachment: "tap" for interfaces
	// the converter itself must turn into a domain <interface>.
	DomainAttachment map[string]string
	VFs              []VF
	// DisksInfo is what virt-handler reports about containerDisk images
	// (qemu-img info), by volume name; the converter needs it for each.
	DisksInfo map[string]*disk.DiskInfo
}

// Cases returns the VMIs the golden inputs are generated from. Names are file
// stems under testdata/golden.
func Cases() []Case {
	return []Case{
		{
			Name: "q35-single",
			VMI: newVMI("q35-single", withVfnet("dra-net", "02:00:00:00:00:01", "", nil),
				withTemplateClaim("vf-claim", "vf-template"), withDRANetwork("dra-net", "vf-claim", "vf")),
			VFs: []VF{{Interface: "dra-net", PCIBusID: "0000:3b:02.1", MAC: "02:00:00:00:00:01"}},
		},
		{
			Name: "q35-pciaddress-bootorder",
			VMI: newVMI("q35-pciaddress-bootorder", withVfnet("dra-net", "02:00:00:00:00:02", "0000:81:01.0", ptr(uint(1))),
				withTemplateClaim("vf-claim", "vf-template"), withDRANetwork("dra-net", "vf-claim", "vf")),
			VFs: []VF{{Interface: "dra-net", PCIBusID: "0000:3b:02.2", MAC: "02:00:00:00:00:02"}},
		},
		{
			Name: "two-vfnet-masquerade",
			VMI: newVMI("two-vfnet-masquerade",
				withMasqueradePod("default"),
				withVfnet("net-a", "02:00:00:00:0a:01", "", nil),
				withVfnet("net-b", "", "", ptr(uint(2))),
				withTemplateClaim("claim-a", "vf-template-a"),
				withDirectClaim("claim-b", "shared-vf-b"),
				withDRANetwork("net-a", "claim-a", "vf"),
				withDRANetwork("net-b", "claim-b", "vf")),
			DomainAttachment: map[string]string{"default": string(v1.Tap)},
			VFs: []VF{
				{Interface: "net-a", PCIBusID: "0000:3b:02.3", MAC: "02:00:00:00:0a:01"},
				{Interface: "net-b", PCIBusID: "0000:5e:10.7", MAC: "aa:bb:cc:00:00:07"},
			},
		},
		{
			// A second binding plugin ("other", attached as tap like passt's
			// registration does) must be left exactly as the converter wrote it.
			Name: "other-binding",
			VMI: newVMI("other-binding",
				withBinding("default", "other"), withPodNetwork("default"),
				withVfnet("dra-net", "02:00:00:00:00:03", "", nil),
				withTemplateClaim("vf-claim", "vf-template"), withDRANetwork("dra-net", "vf-claim", "vf")),
			DomainAttachment: map[string]string{"default": string(v1.Tap)},
			VFs:              []VF{{Interface: "dra-net", PCIBusID: "0000:af:00.4", MAC: "02:00:00:00:00:03"}},
		},
	}
}

func ptr[T any](v T) *T { return &v }

type option func(*v1.VirtualMachineInstance)

// newVMI is a VMI as virt-api stores it: the fields a user sets plus
// KubeVirt's own object defaults, with fixed identity so output is stable.
func newVMI(name string, opts ...option) *v1.VirtualMachineInstance {
	vmi := &v1.VirtualMachineInstance{
		TypeMeta: metav1.TypeMeta{Kind: "VirtualMachineInstance", APIVersion: v1.SchemeGroupVersion.String()},
		ObjectMeta: metav1.ObjectMeta{
			Name:      name,
			Namespace: "default",
			UID:       types.UID("6f0e8a9c-0000-4000-8000-" + uidSuffix(name)),
		},
		Spec: v1.VirtualMachineInstanceSpec{
			Architecture: "amd64",
			Domain: v1.DomainSpec{
				Machine: &v1.Machine{Type: "q35"},
				Resources: v1.ResourceRequirements{
					Requests: k8sv1.ResourceList{k8sv1.ResourceMemory: resource.MustParse("1Gi")},
				},
				Firmware: &v1.Firmware{UUID: types.UID("5d307ca9-b3ef-428c-8861-" + uidSuffix(name))},
				Devices:  v1.Devices{Interfaces: []v1.Interface{}},
			},
		},
	}
	for _, o := range opts {
		o(vmi)
	}
	v1.SetObjectDefaults_VirtualMachineInstance(vmi)
	return vmi
}

// uidSuffix derives the 12 hex digits that end a UUID from the case name.
func uidSuffix(name string) string {
	const hex = "0123456789abcdef"
	var h uint64 = 1469598103934665603
	for i := 0; i < len(name); i++ {
		h = (h ^ uint64(name[i])) * 1099511628211
	}
	out := make([]byte, 12)
	for i := range out {
		out[i] = hex[h&0xf]
		h >>= 4
	}
	return string(out)
}

func withVfnet(name, mac, pciAddress string, bootOrder *uint) option {
	return func(vmi *v1.VirtualMachineInstance) {
		vmi.Spec.Domain.Devices.Interfaces = append(vmi.Spec.Domain.Devices.Interfaces, v1.Interface{
			Name:       name,
			Binding:    &v1.PluginBinding{Name: BindingName},
			MacAddress: mac,
			PciAddress: pciAddress,
			BootOrder:  bootOrder,
		})
	}
}

func withBinding(name, binding string) option {
	return func(vmi *v1.VirtualMachineInstance) {
		vmi.Spec.Domain.Devices.Interfaces = append(vmi.Spec.Domain.Devices.Interfaces, v1.Interface{
			Name: name, Binding: &v1.PluginBinding{Name: binding},
		})
	}
}

func withMasqueradePod(name string) option {
	return func(vmi *v1.VirtualMachineInstance) {
		vmi.Spec.Domain.Devices.Interfaces = append(vmi.Spec.Domain.Devices.Interfaces, v1.Interface{
			Name: name, InterfaceBindingMethod: v1.InterfaceBindingMethod{Masquerade: &v1.InterfaceMasquerade{}},
		})
		withPodNetwork(name)(vmi)
	}
}

func withPodNetwork(name string) option {
	return func(vmi *v1.VirtualMachineInstance) {
		vmi.Spec.Networks = append(vmi.Spec.Networks, v1.Network{
			Name: name, NetworkSource: v1.NetworkSource{Pod: &v1.PodNetwork{}},
		})
	}
}

func withDRANetwork(name, claim, request string) option {
	return func(vmi *v1.VirtualMachineInstance) {
		vmi.Spec.Networks = append(vmi.Spec.Networks, v1.Network{
			Name: name,
			NetworkSource: v1.NetworkSource{ResourceClaim: &v1.ClaimRequest{
				ClaimName: claim, RequestName: request,
			}},
		})
	}
}

func withTemplateClaim(name, template string) option {
	return func(vmi *v1.VirtualMachineInstance) {
		vmi.Spec.ResourceClaims = append(vmi.Spec.ResourceClaims, v1.VirtualMachineInstanceResourceClaim{
			Name: name, ResourceClaimTemplateName: ptr(template),
		})
	}
}

func withDirectClaim(name, claim string) option {
	return func(vmi *v1.VirtualMachineInstance) {
		vmi.Spec.ResourceClaims = append(vmi.Spec.ResourceClaims, v1.VirtualMachineInstanceResourceClaim{
			Name: name, ResourceClaimName: ptr(claim),
		})
	}
}
