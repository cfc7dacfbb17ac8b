// Package kubevirtvmi converts kubevirt.io/api's VirtualMachineInstance into
// pkg/contract/vmiview's view, for tests and harnesses that build VMIs with
// kubevirt.io/api's types. Neither vfnet program imports it: both read VMIs
// as vmiview types (see vmiview's package comment), and
// TestViewMatchesKubeVirtAPI here pins those types to kubevirt.io/api's JSON.
package kubevirtvmi

import (
	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/vfnet-io/vfnet/pkg/contract/vmiview"
)

// DefaultBindingName is the name the binding is registered under in the
// KubeVirt CR unless the cluster admin chose another.
const DefaultBindingName = vmiview.DefaultBindingName

// ClaimInterface is one VMI interface that uses a binding plugin and the DRA
// claim request its network points at.
type ClaimInterface = vmiview.ClaimInterface

// View copies the fields vmiview reads out of vmi.
func View(vmi *kubevirtv1.VirtualMachineInstance) *vmiview.VMI {
	v := &vmiview.VMI{Metadata: vmiview.Metadata{Name: vmi.Name, Namespace: vmi.Namespace, UID: string(vmi.UID), ResourceVersion: vmi.ResourceVersion}}
	for _, i := range vmi.Spec.Domain.Devices.Interfaces {
		vi := vmiview.Interface{Name: i.Name, MacAddress: i.MacAddress, PciAddress: i.PciAddress, BootOrder: i.BootOrder}
		if i.Binding != nil {
			vi.Binding = &vmiview.PluginBinding{Name: i.Binding.Name}
		}
		v.Spec.Domain.Devices.Interfaces = append(v.Spec.Domain.Devices.Interfaces, vi)
	}
	for _, n := range vmi.Spec.Networks {
		vn := vmiview.Network{Name: n.Name}
		if rc := n.ResourceClaim; rc != nil {
			vn.ResourceClaim = &vmiview.ClaimRequest{ClaimName: rc.ClaimName, RequestName: rc.RequestName}
		}
		v.Spec.Networks = append(v.Spec.Networks, vn)
	}
	for _, c := range vmi.Spec.ResourceClaims {
		v.Spec.ResourceClaims = append(v.Spec.ResourceClaims, vmiview.ResourceClaim{
			Name: c.Name, ResourceClaimName: c.ResourceClaimName, ResourceClaimTemplateName: c.ResourceClaimTemplateName,
		})
	}
	if ms := vmi.Status.MigrationState; ms != nil {
		vm := &vmiview.MigrationState{
			MigrationUID: string(ms.MigrationUID),
			SourceNode:   ms.SourceNode, SourcePod: ms.SourcePod, TargetNode: ms.TargetNode, TargetPod: ms.TargetPod,
			Completed: ms.Completed, Failed: ms.Failed, AbortStatus: string(ms.AbortStatus),
		}
		if ms.StartTimestamp != nil {
			t := ms.StartTimestamp.UTC() // as JSON carries it
			vm.StartTimestamp = &t
		}
		if s := ms.SourceState; s != nil {
			vm.SourceState = &vmiview.SourceState{Node: s.Node, Pod: s.Pod, MigrationUID: string(s.MigrationUID)}
		}
		if t := ms.TargetState; t != nil {
			vm.TargetState = &vmiview.TargetState{Node: t.Node, Pod: t.Pod, MigrationUID: string(t.MigrationUID),
				DomainName: t.DomainName, DomainNamespace: t.DomainNamespace}
		}
		v.Status.MigrationState = vm
	}
	return v
}

// BindingInterfaces returns every interface of vmi whose binding is
// bindingName, with its claim (see vmiview.VMI.BindingInterfaces).
func BindingInterfaces(vmi *kubevirtv1.VirtualMachineInstance, bindingName string) ([]ClaimInterface, error) {
	return View(vmi).BindingInterfaces(bindingName)
}

// InterfaceForClaim returns the binding interface whose network is backed by
// the pod claim podClaimName and request requestName, if any.
func InterfaceForClaim(vmi *kubevirtv1.VirtualMachineInstance, bindingName, podClaimName, requestName string) (ClaimInterface, bool, error) {
	return View(vmi).InterfaceForClaim(bindingName, podClaimName, requestName)
}
