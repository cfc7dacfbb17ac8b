// Package maclookup finds the MAC address a KubeVirt VM expects on the VF a
// claim gives it: the macAddress of the VMI interface whose network is backed
// by this claim and request.
package maclookup

import (
	"context"
	"fmt"
	"net"
	"strings"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/vfnet-io/vfnet/pkg/api/v1alpha1"
	"github.com/vfnet-io/vfnet/pkg/contract/vmiview"
)

// VMIResource is the KubeVirt VMI resource the lookup reads.
var VMIResource = schema.GroupVersionResource{Group: "kubevirt.io", Version: "v1", Resource: "virtualmachineinstances"}

// VMIGetter reads one VMI.
type VMIGetter interface {
	GetVMI(ctx context.Context, namespace, name string) (*vmiview.VMI, error)
}

// DynamicVMIGetter reads VMIs through a dynamic client into vmiview types,
// so the driver needs neither a KubeVirt client nor kubevirt.io/api.
type DynamicVMIGetter struct{ Client dynamic.Interface }

// GetVMI implements VMIGetter.
func (g DynamicVMIGetter) GetVMI(ctx context.Context, namespace, name string) (*vmiview.VMI, error) {
	u, err := g.Client.Resource(VMIResource).Namespace(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	b, err := u.MarshalJSON()
	if err != nil {
		return nil, fmt.Errorf("VirtualMachineInstance %s/%s: %w", namespace, name, err)
	}
	vmi, err := vmiview.Decode(b)
	if err != nil {
		return nil, fmt.Errorf("VirtualMachineInstance %s/%s: %w", namespace, name, err)
	}
	return vmi, nil
}

// Lookup finds VM interface MACs for claims.
type Lookup struct {
	Kube kubernetes.Interface
	VMIs VMIGetter
	// BindingName is the binding plugin name in the KubeVirt CR ("vfnet").
	BindingName string
}

// Result says which VMI interface a claim's request backs and the MAC it
// asks for.
type Result struct {
	// MAC is the interface's macAddress; nil when the interface sets none.
	MAC       net.HardwareAddr
	VMI       string // namespace/name
	Interface string
	// Ref points at the VMI (kind, name, UID), for Events about it.
	Ref *corev1.ObjectReference
	// FromTemplate: the claim is made per launcher pod from a
	// ResourceClaimTemplate (pod-claim-name annotation, or the VMI's
	// resourceClaims entry names a template), so a migration target gets
	// a claim and VF of its own.
	FromTemplate bool
	// MigrationTarget: the consuming launcher pod is the target pod of a
	// live migration (KubeVirt labels it MigrationJobLabel), so the VM is
	// still running on the source node while this VF is prepared.
	MigrationTarget bool
}

// MigrationJobLabel is the label KubeVirt's migration controller puts on
// a migration's target launcher pod (kubevirt.io/api core/v1).
const MigrationJobLabel = "kubevirt.io/migrationJobUID"

// MACFor returns the macAddress of the VMI interface backed by claim's
// request (a subrequest "req/sub" matches networks naming "req"). found is
// false when no consuming pod is a VMI launcher, the VMI or pod is gone, or
// the interface sets no MAC: the VF then keeps its MAC. API errors are
// returned so the kubelet retries.
func (l Lookup) MACFor(ctx context.Context, claim *resourceapi.ResourceClaim, request string) (Result, bool, error) {
	r, found, err := l.Find(ctx, claim, request)
	if err != nil || !found || r.MAC == nil {
		return Result{}, false, err
	}
	return r, true, nil
}

// Find returns the VMI interface backed by claim's request, with its MAC if
// it sets one. With several consuming launchers (a shared named claim) an
// interface with a MAC wins. found is false when no consuming pod is a VMI
// launcher whose VMI uses the claim through the binding. It reads only with
// get: claim.status.reservedFor -> pod -> owning VMI.
func (l Lookup) Find(ctx context.Context, claim *resourceapi.ResourceClaim, request string) (Result, bool, error) {
	logger := klog.FromContext(ctx)
	base, _, _ := strings.Cut(request, "/")
	binding := l.BindingName
	if binding == "" {
		binding = vmiview.DefaultBindingName
	}
	var noMAC *Result
	for _, ref := range claim.Status.ReservedFor {
		if ref.APIGroup != "" || ref.Resource != "pods" {
			continue
		}
		pod, err := l.Kube.CoreV1().Pods(claim.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			return Result{}, false, fmt.Errorf("get pod %s/%s reserving claim %s: %w", claim.Namespace, ref.Name, claim.Name, err)
		}
		if pod.UID != ref.UID {
			continue // a newer pod with the same name; not our consumer
		}
		owner := vmiOwner(pod)
		if owner == nil {
			continue
		}
		podClaimName, ok := podClaimName(claim, pod)
		if !ok {
			logger.V(4).Info("Pod does not reference the claim", "pod", klog.KObj(pod), "claim", klog.KObj(claim))
			continue
		}
		if l.VMIs == nil {
			return Result{}, false, fmt.Errorf("claim %s/%s is used by VirtualMachineInstance %s/%s but the driver has no VMI client", claim.Namespace, claim.Name, pod.Namespace, owner.Name)
		}
		vmi, err := l.VMIs.GetVMI(ctx, pod.Namespace, owner.Name)
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			return Result{}, false, fmt.Errorf("get VirtualMachineInstance %s/%s owning pod %s: %w", pod.Namespace, owner.Name, pod.Name, err)
		}
		if types.UID(vmi.Metadata.UID) != owner.UID {
			continue
		}
		ci, found, err := vmi.InterfaceForClaim(binding, podClaimName, base)
		if err != nil {
			return Result{}, false, fmt.Errorf("VirtualMachineInstance %s/%s: %w", pod.Namespace, owner.Name, err)
		}
		if !found {
			continue
		}
		_, annotated := claim.Annotations[resourceapi.PodResourceClaimAnnotation]
		r := Result{
			VMI: pod.Namespace + "/" + owner.Name, Interface: ci.Interface.Name,
			Ref: &corev1.ObjectReference{
				APIVersion: owner.APIVersion, Kind: owner.Kind,
				Namespace: pod.Namespace, Name: owner.Name, UID: owner.UID,
			},
			FromTemplate: annotated || ci.FromTemplate(),
		}
		_, r.MigrationTarget = pod.Labels[MigrationJobLabel]
		if ci.Interface.MacAddress == "" {
			if noMAC == nil {
				noMAC = &r
			}
			continue
		}
		if r.MAC, err = v1alpha1.ParseMAC(ci.Interface.MacAddress); err != nil {
			return Result{}, false, fmt.Errorf("VirtualMachineInstance %s/%s interface %q: %w", pod.Namespace, owner.Name, ci.Interface.Name, err)
		}
		return r, true, nil
	}
	if noMAC != nil {
		return *noMAC, true, nil
	}
	return Result{}, false, nil
}

func vmiOwner(pod *corev1.Pod) *metav1.OwnerReference {
	for i, o := range pod.OwnerReferences {
		gv, err := schema.ParseGroupVersion(o.APIVersion)
		if err == nil && gv.Group == VMIResource.Group && o.Kind == "VirtualMachineInstance" {
			return &pod.OwnerReferences[i]
		}
	}
	return nil
}

// podClaimName is the name the pod (and the VMI) give the claim:
// the pod-claim-name annotation of a claim made from a template, else the
// pod's resourceClaims entry that names the claim directly.
func podClaimName(claim *resourceapi.ResourceClaim, pod *corev1.Pod) (string, bool) {
	if n, ok := claim.Annotations[resourceapi.PodResourceClaimAnnotation]; ok {
		return n, true
	}
	for _, rc := range pod.Spec.ResourceClaims {
		if rc.ResourceClaimName != nil && *rc.ResourceClaimName == claim.Name {
			return rc.Name, true
		}
	}
	return "", false
}
