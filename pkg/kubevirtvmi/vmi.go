// Package kubevirtvmi answers the questions both vfnet programs ask of a
// KubeVirt VirtualMachineInstance: which interfaces use the vfnet binding, and
// which DRA claim and request back each of them.
package kubevirtvmi

import (
	"fmt"

	kubevirtv1 "kubevirt.io/api/core/v1"
)

// DefaultBindingName is the name the binding is registered under in the
// KubeVirt CR unless the cluster admin chose another.
const DefaultBindingName = "vfnet"

// ClaimInterface is one VMI interface that uses a binding plugin and the DRA
// claim request its network points at.
type ClaimInterface struct {
	Interface kubevirtv1.Interface
	Network   kubevirtv1.Network
	// PodClaimName is vmi.spec.resourceClaims[].name: the claim's name in the
	// launcher pod, identical on a migration source and target.
	PodClaimName string
	RequestName  string
	// Exactly one of these is set, copied from vmi.spec.resourceClaims.
	ResourceClaimName         *string
	ResourceClaimTemplateName *string
}

// FromTemplate reports whether the claim is made per pod from a
// ResourceClaimTemplate (and so can follow the VM on live migration).
func (c ClaimInterface) FromTemplate() bool { return c.ResourceClaimTemplateName != nil }

// BindingInterfaces returns every interface of vmi whose binding is
// bindingName, with its claim. It fails, naming the interface, when such an
// interface has no network, a network that is not a resourceClaim, or a claim
// name that spec.resourceClaims does not define.
func BindingInterfaces(vmi *kubevirtv1.VirtualMachineInstance, bindingName string) ([]ClaimInterface, error) {
	var out []ClaimInterface
	for _, iface := range vmi.Spec.Domain.Devices.Interfaces {
		if iface.Binding == nil || iface.Binding.Name != bindingName {
			continue
		}
		ci, err := resolve(vmi, iface)
		if err != nil {
			return nil, err
		}
		out = append(out, ci)
	}
	return out, nil
}

// InterfaceForClaim returns the binding interface whose network is backed by
// the pod claim podClaimName and request requestName, if any.
func InterfaceForClaim(vmi *kubevirtv1.VirtualMachineInstance, bindingName, podClaimName, requestName string) (ClaimInterface, bool, error) {
	ifaces, err := BindingInterfaces(vmi, bindingName)
	if err != nil {
		return ClaimInterface{}, false, err
	}
	for _, ci := range ifaces {
		if ci.PodClaimName == podClaimName && ci.RequestName == requestName {
			return ci, true, nil
		}
	}
	return ClaimInterface{}, false, nil
}

func resolve(vmi *kubevirtv1.VirtualMachineInstance, iface kubevirtv1.Interface) (ClaimInterface, error) {
	ci := ClaimInterface{Interface: iface}
	var found bool
	for _, n := range vmi.Spec.Networks {
		if n.Name == iface.Name {
			ci.Network, found = n, true
			break
		}
	}
	if !found {
		return ci, fmt.Errorf("interface %q: spec.networks has no network named %q; add one with a resourceClaim source", iface.Name, iface.Name)
	}
	rc := ci.Network.ResourceClaim
	if rc == nil {
		return ci, fmt.Errorf("interface %q: network %q is not a resourceClaim network; binding %q needs networks[].resourceClaim {claimName, requestName}", iface.Name, iface.Name, iface.Binding.Name)
	}
	if rc.ClaimName == "" || rc.RequestName == "" {
		return ci, fmt.Errorf("interface %q: network %q: resourceClaim.claimName and resourceClaim.requestName must both be set", iface.Name, iface.Name)
	}
	ci.PodClaimName, ci.RequestName = rc.ClaimName, rc.RequestName
	for _, c := range vmi.Spec.ResourceClaims {
		if c.Name == rc.ClaimName {
			ci.ResourceClaimName, ci.ResourceClaimTemplateName = c.ResourceClaimName, c.ResourceClaimTemplateName
			if (ci.ResourceClaimName == nil) == (ci.ResourceClaimTemplateName == nil) {
				return ci, fmt.Errorf("interface %q: spec.resourceClaims[%q] must set exactly one of resourceClaimName and resourceClaimTemplateName", iface.Name, c.Name)
			}
			return ci, nil
		}
	}
	return ci, fmt.Errorf("interface %q: network %q names claim %q, which spec.resourceClaims does not define", iface.Name, iface.Name, rc.ClaimName)
}
