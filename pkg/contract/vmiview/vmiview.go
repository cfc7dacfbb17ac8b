// Package vmiview is the part of a KubeVirt VirtualMachineInstance that vfnet
// reads (interfaces, networks, resource claims, migration state), as small
// types with kubevirt.io/api's JSON field names, and the questions vfnet asks
// of it: which interfaces use the vfnet binding and which DRA claim request
// backs each.
//
// Why not kubevirt.io/api's own types here: vfnet-binding runs in every VM
// pod, and importing kubevirt.io/api/core/v1 links apimachinery's
// runtime.Scheme, whose reflect.Value.MethodByName turns off the linker's
// removal of unused methods for every API type in the program. That doubles
// the sidecar's code and with it the resident memory of each VM pod
// (BENCHMARKS.md: binding-vmiview). The driver reads VMIs as these types
// too; test/lib/kubevirtvmi converts kubevirt.io/api's for the tests, and
// TestViewMatchesKubeVirtAPI pins these types to kubevirt.io/api's JSON.
package vmiview

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// DefaultBindingName is the name the binding is registered under in the
// KubeVirt CR unless the cluster admin chose another.
const DefaultBindingName = "vfnet"

// VMI is what vfnet reads of a VirtualMachineInstance.
type VMI struct {
	Metadata Metadata `json:"metadata"`
	Spec     Spec     `json:"spec"`
	Status   Status   `json:"status"`
}

// Metadata is the VMI's object metadata vfnet reads.
type Metadata struct {
	Name            string `json:"name"`
	Namespace       string `json:"namespace"`
	UID             string `json:"uid,omitempty"`
	ResourceVersion string `json:"resourceVersion,omitempty"`
}

// Spec is vmi.spec.
type Spec struct {
	Domain         Domain          `json:"domain"`
	Networks       []Network       `json:"networks"`
	ResourceClaims []ResourceClaim `json:"resourceClaims"`
}

// Domain is vmi.spec.domain.
type Domain struct {
	Devices Devices `json:"devices"`
}

// Devices is vmi.spec.domain.devices.
type Devices struct {
	Interfaces []Interface `json:"interfaces"`
}

// Interface is one vmi.spec.domain.devices.interfaces[] entry.
type Interface struct {
	Name       string         `json:"name"`
	Binding    *PluginBinding `json:"binding,omitempty"`
	MacAddress string         `json:"macAddress,omitempty"`
	PciAddress string         `json:"pciAddress,omitempty"`
	BootOrder  *uint          `json:"bootOrder,omitempty"`
}

// PluginBinding is interfaces[].binding.
type PluginBinding struct {
	Name string `json:"name"`
}

// Network is one vmi.spec.networks[] entry (its source inlined, as in
// kubevirt.io/api); vfnet reads only resourceClaim sources.
type Network struct {
	Name          string        `json:"name"`
	ResourceClaim *ClaimRequest `json:"resourceClaim,omitempty"`
}

// ClaimRequest is networks[].resourceClaim.
type ClaimRequest struct {
	ClaimName   string `json:"claimName,omitempty"`
	RequestName string `json:"requestName,omitempty"`
}

// ResourceClaim is one vmi.spec.resourceClaims[] entry.
type ResourceClaim struct {
	Name                      string  `json:"name"`
	ResourceClaimName         *string `json:"resourceClaimName,omitempty"`
	ResourceClaimTemplateName *string `json:"resourceClaimTemplateName,omitempty"`
}

// Status is vmi.status.
type Status struct {
	MigrationState *MigrationState `json:"migrationState,omitempty"`
}

// MigrationState is vmi.status.migrationState. The flat source and target
// fields are the classic ones; a decentralized (cross-cluster) migration
// fills sourceState and targetState instead.
type MigrationState struct {
	MigrationUID   string     `json:"migrationUid,omitempty"`
	StartTimestamp *time.Time `json:"startTimestamp,omitempty"`
	SourceNode     string     `json:"sourceNode,omitempty"`
	SourcePod      string     `json:"sourcePod,omitempty"`
	TargetNode     string     `json:"targetNode,omitempty"`
	TargetPod      string     `json:"targetPod,omitempty"`
	Completed      bool       `json:"completed,omitempty"`
	Failed         bool       `json:"failed,omitempty"`
	// AbortStatus is "Succeeded", "Failed" or "Aborting" once an abort was
	// requested.
	AbortStatus string       `json:"abortStatus,omitempty"`
	SourceState *SourceState `json:"sourceState,omitempty"`
	TargetState *TargetState `json:"targetState,omitempty"`
}

// MigrationAbortSucceeded is the abortStatus of an aborted migration.
const MigrationAbortSucceeded = "Succeeded"

// SourceState is vmi.status.migrationState.sourceState.
type SourceState struct {
	Node         string `json:"node,omitempty"`
	Pod          string `json:"pod,omitempty"`
	MigrationUID string `json:"migrationUID,omitempty"`
}

// TargetState is vmi.status.migrationState.targetState.
type TargetState struct {
	Node            string  `json:"node,omitempty"`
	Pod             string  `json:"pod,omitempty"`
	MigrationUID    string  `json:"migrationUID,omitempty"`
	DomainName      *string `json:"domainName,omitempty"`
	DomainNamespace *string `json:"domainNamespace,omitempty"`
}

// Decode reads the fields of VMI from a VirtualMachineInstance in JSON, as
// virt-launcher sends it to hook sidecars; all other fields are skipped.
func Decode(b []byte) (*VMI, error) {
	if len(b) == 0 {
		return nil, errors.New("no VMI JSON")
	}
	v := &VMI{}
	if err := json.Unmarshal(b, v); err != nil {
		return nil, fmt.Errorf("decode the VMI JSON: %w", err)
	}
	return v, nil
}

// MigrationTarget reports whether the VMI, as virt-launcher passes it to a
// hook, describes a live migration in progress. The hook's input does not say
// which pod is asking, but during a migration only the target launcher calls
// OnDefineDomain: the source defined its domain when the VM started and
// migrates the running domain's XML.
func (v *VMI) MigrationTarget() bool {
	ms := v.Status.MigrationState
	if ms == nil || ms.Completed || ms.Failed {
		return false
	}
	return ms.TargetPod != "" || (ms.TargetState != nil && ms.TargetState.Pod != "")
}

// ClaimInterface is one VMI interface that uses a binding plugin and the DRA
// claim request its network points at.
type ClaimInterface struct {
	Interface Interface
	Network   Network
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

// BindingInterfaces returns every interface of v whose binding is
// bindingName, with its claim. It fails, naming the interface, when such an
// interface has no network, a network that is not a resourceClaim, or a claim
// name that spec.resourceClaims does not define.
func (v *VMI) BindingInterfaces(bindingName string) ([]ClaimInterface, error) {
	var out []ClaimInterface
	for _, iface := range v.Spec.Domain.Devices.Interfaces {
		if iface.Binding == nil || iface.Binding.Name != bindingName {
			continue
		}
		ci, err := v.resolve(iface)
		if err != nil {
			return nil, err
		}
		out = append(out, ci)
	}
	return out, nil
}

// InterfaceForClaim returns the binding interface whose network is backed by
// the pod claim podClaimName and request requestName, if any.
func (v *VMI) InterfaceForClaim(bindingName, podClaimName, requestName string) (ClaimInterface, bool, error) {
	ifaces, err := v.BindingInterfaces(bindingName)
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

func (v *VMI) resolve(iface Interface) (ClaimInterface, error) {
	ci := ClaimInterface{Interface: iface}
	var found bool
	for _, n := range v.Spec.Networks {
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
	for _, c := range v.Spec.ResourceClaims {
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
