package flow

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	kubevirtv1 "kubevirt.io/api/core/v1"

	vfnetv1alpha1 "github.com/vfnet-io/vfnet/pkg/api/v1alpha1"
	"github.com/vfnet-io/vfnet/test/lib/kubevirtvmi"
)

// VMIResource is KubeVirt's VirtualMachineInstance resource.
var VMIResource = schema.GroupVersionResource{Group: "kubevirt.io", Version: "v1", Resource: "virtualmachineinstances"}

// VMSpec describes a VM with one vfnet interface.
type VMSpec struct {
	Name      string
	Namespace string // default "default"
	// DeviceClass selects the physical network ("vfnet-physnet-a").
	DeviceClass string
	MAC         string
	VLAN        int
	// Interface is the VMI interface (and network) name; default "net1".
	Interface string
	// Settings are further VFConfig fields of the claim, by JSON name
	// (e.g. "maxTxRateMbps": 1000).
	Settings map[string]any
}

// VM is what KubeVirt would have created for one VM: the VMI, the
// ResourceClaimTemplate the user wrote, and the virt-launcher pod.
type VM struct {
	Spec     VMSpec
	Template *resourceapi.ResourceClaimTemplate
	VMI      *kubevirtv1.VirtualMachineInstance
	Pod      *corev1.Pod
	// CreatedAt is when the launcher pod was created.
	CreatedAt time.Time
}

// PodClaimName is the claim's name in the VMI and the launcher pod.
const PodClaimName = "vf"

// RequestName is the request inside the ResourceClaimTemplate.
const RequestName = "vf"

func (s *VMSpec) defaults() {
	if s.Namespace == "" {
		s.Namespace = "default"
	}
	if s.Interface == "" {
		s.Interface = "net1"
	}
}

// CreateVM creates the user's ResourceClaimTemplate (a VFConfig with the
// VLAN), the VirtualMachineInstance (binding vfnet, explicit MAC) and a pod
// shaped like KubeVirt's virt-launcher pod for it: owned by the VMI, with
// the claim in pod.spec.resourceClaims and in the compute and hook-sidecar-0
// containers.
func (e *Env) CreateVM(ctx context.Context, s VMSpec) (*VM, error) {
	s.defaults()
	vm := &VM{Spec: s}
	cfg := map[string]any{"apiVersion": vfnetv1alpha1.APIVersion, "kind": vfnetv1alpha1.Kind, "vlan": s.VLAN}
	maps.Copy(cfg, s.Settings)
	params, err := json.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	tmpl := &resourceapi.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: s.Name + "-vf", Namespace: s.Namespace},
		Spec: resourceapi.ResourceClaimTemplateSpec{Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
			Requests: []resourceapi.DeviceRequest{{Name: RequestName, Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: s.DeviceClass}}},
			Config: []resourceapi.DeviceClaimConfiguration{{
				Requests: []string{RequestName},
				DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
					Driver: DriverName, Parameters: runtime.RawExtension{Raw: params},
				}},
			}},
		}}},
	}
	if vm.Template, err = e.Client.ResourceV1().ResourceClaimTemplates(s.Namespace).Create(ctx, tmpl, metav1.CreateOptions{}); err != nil {
		return nil, fmt.Errorf("create ResourceClaimTemplate %s: %w", tmpl.Name, err)
	}

	vmi := &kubevirtv1.VirtualMachineInstance{
		TypeMeta:   metav1.TypeMeta{APIVersion: "kubevirt.io/v1", Kind: "VirtualMachineInstance"},
		ObjectMeta: metav1.ObjectMeta{Name: s.Name, Namespace: s.Namespace},
		Spec: kubevirtv1.VirtualMachineInstanceSpec{
			Domain: kubevirtv1.DomainSpec{
				Memory: &kubevirtv1.Memory{
					Guest:            ptr.To(resource.MustParse("1Gi")),
					ReservedOverhead: &kubevirtv1.ReservedOverhead{MemLock: ptr.To(kubevirtv1.MemLockRequirement(kubevirtv1.MemLockRequired))},
				},
				Devices: kubevirtv1.Devices{Interfaces: []kubevirtv1.Interface{{
					Name: s.Interface, Binding: &kubevirtv1.PluginBinding{Name: kubevirtvmi.DefaultBindingName}, MacAddress: s.MAC,
				}}},
			},
			Networks: []kubevirtv1.Network{{Name: s.Interface, NetworkSource: kubevirtv1.NetworkSource{
				ResourceClaim: &kubevirtv1.ClaimRequest{ClaimName: PodClaimName, RequestName: RequestName},
			}}},
			ResourceClaims: []kubevirtv1.VirtualMachineInstanceResourceClaim{{
				Name: PodClaimName, ResourceClaimTemplateName: ptr.To(vm.Template.Name),
			}},
		},
	}
	obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(vmi)
	if err != nil {
		return nil, err
	}
	u, err := e.Dynamic.Resource(VMIResource).Namespace(s.Namespace).Create(ctx, unstructuredObj{obj}.u(), metav1.CreateOptions{FieldValidation: "Strict"})
	if err != nil {
		return nil, fmt.Errorf("create VirtualMachineInstance %s: %w", s.Name, err)
	}
	vm.VMI = &kubevirtv1.VirtualMachineInstance{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, vm.VMI); err != nil {
		return nil, err
	}

	pod := launcherPod(vm.VMI)
	vm.CreatedAt = time.Now()
	if vm.Pod, err = e.Client.CoreV1().Pods(s.Namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		return nil, fmt.Errorf("create virt-launcher pod for %s: %w", s.Name, err)
	}
	return vm, nil
}

// launcherPod renders the parts of KubeVirt v1.10's virt-launcher pod that
// vfnet depends on.
func launcherPod(vmi *kubevirtv1.VirtualMachineInstance) *corev1.Pod {
	var podClaims []corev1.PodResourceClaim
	for _, c := range vmi.Spec.ResourceClaims {
		podClaims = append(podClaims, corev1.PodResourceClaim{Name: c.Name, ResourceClaimName: c.ResourceClaimName, ResourceClaimTemplateName: c.ResourceClaimTemplateName})
	}
	var claims []corev1.ResourceClaim
	for _, n := range vmi.Spec.Networks {
		if rc := n.ResourceClaim; rc != nil && rc.ClaimName != "" {
			claims = append(claims, corev1.ResourceClaim{Name: rc.ClaimName, Request: rc.RequestName})
		}
	}
	nonRoot := &corev1.SecurityContext{
		RunAsUser: ptr.To[int64](107), RunAsGroup: ptr.To[int64](107), RunAsNonRoot: ptr.To(true),
		AllowPrivilegeEscalation: ptr.To(false), Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			GenerateName: "virt-launcher-" + vmi.Name + "-",
			Namespace:    vmi.Namespace,
			Labels: map[string]string{
				"kubevirt.io": "virt-launcher", "kubevirt.io/created-by": string(vmi.UID), "vm.kubevirt.io/name": vmi.Name,
			},
			Annotations: map[string]string{"kubevirt.io/domain": vmi.Name},
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: "kubevirt.io/v1", Kind: "VirtualMachineInstance", Name: vmi.Name, UID: vmi.UID,
				Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true),
			}},
		},
		Spec: corev1.PodSpec{
			AutomountServiceAccountToken: ptr.To(false),
			ResourceClaims:               podClaims,
			Containers: []corev1.Container{
				{
					Name: "compute", Image: "quay.io/kubevirt/virt-launcher:v1.10.0",
					Resources: corev1.ResourceRequirements{
						Requests: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("1300Mi"), corev1.ResourceCPU: resource.MustParse("100m")},
						Claims:   claims,
					},
					VolumeMounts:    []corev1.VolumeMount{{Name: "libvirt-runtime", MountPath: "/var/run/libvirt"}, {Name: "hook-sidecar-sockets", MountPath: "/var/run/kubevirt-hooks"}},
					SecurityContext: nonRoot,
				},
				{
					Name: "hook-sidecar-0", Image: "ghcr.io/vfnet-io/vfnet-binding:v0.1.0",
					Env: []corev1.EnvVar{{Name: "CONTAINER_NAME", Value: "hook-sidecar-0"}, {Name: "NETWORK_BINDING_PLUGIN_NAME", Value: kubevirtvmi.DefaultBindingName}},
					Resources: corev1.ResourceRequirements{
						Requests: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("20Mi"), corev1.ResourceCPU: resource.MustParse("10m")},
						Claims:   claims,
					},
					VolumeMounts:    []corev1.VolumeMount{{Name: "hook-sidecar-sockets", MountPath: "/var/run/kubevirt-hooks", SubPath: "hook-sidecar-0"}},
					SecurityContext: nonRoot,
				},
			},
			Volumes: []corev1.Volume{
				{Name: "libvirt-runtime", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
				{Name: "hook-sidecar-sockets", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
			},
		},
	}
}

// Scheduled is a launcher pod bound to a node with its claim allocated.
type Scheduled struct {
	NodeName string
	Claim    *resourceapi.ResourceClaim
	// Device is the allocated device of our driver.
	Device resourceapi.DeviceRequestAllocationResult
}

// WaitScheduled waits until the scheduler bound vm's pod and the claim the
// controller made from the template is allocated and reserved for it.
func (e *Env) WaitScheduled(ctx context.Context, vm *VM, timeout time.Duration) (*Scheduled, error) {
	var out *Scheduled
	var last string
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		pod, err := e.Client.CoreV1().Pods(vm.Pod.Namespace).Get(ctx, vm.Pod.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		vm.Pod = pod
		if pod.Spec.NodeName == "" {
			last = "pod not bound: " + podScheduledMessage(pod)
			return false, nil
		}
		claimName := ""
		for _, s := range pod.Status.ResourceClaimStatuses {
			if s.Name == PodClaimName && s.ResourceClaimName != nil {
				claimName = *s.ResourceClaimName
			}
		}
		if claimName == "" {
			last = "no claim in pod.status.resourceClaimStatuses"
			return false, nil
		}
		claim, err := e.Client.ResourceV1().ResourceClaims(pod.Namespace).Get(ctx, claimName, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		if claim.Status.Allocation == nil || len(claim.Status.ReservedFor) == 0 {
			last = "claim " + claimName + " not allocated and reserved"
			return false, nil
		}
		for _, r := range claim.Status.Allocation.Devices.Results {
			if r.Driver == DriverName {
				out = &Scheduled{NodeName: pod.Spec.NodeName, Claim: claim, Device: r}
				return true, nil
			}
		}
		return false, fmt.Errorf("claim %s is allocated without a %s device: %+v", claimName, DriverName, claim.Status.Allocation.Devices.Results)
	})
	if err != nil {
		return nil, fmt.Errorf("VM %s: wait for scheduling: %w (last: %s)", vm.Spec.Name, err, last)
	}
	return out, nil
}

// WaitUnschedulable waits until the scheduler marks vm's pod unschedulable
// and returns its message.
func (e *Env) WaitUnschedulable(ctx context.Context, vm *VM, timeout time.Duration) (string, error) {
	var msg string
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		pod, err := e.Client.CoreV1().Pods(vm.Pod.Namespace).Get(ctx, vm.Pod.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		if pod.Spec.NodeName != "" {
			return false, fmt.Errorf("pod %s was bound to %s, want unschedulable", pod.Name, pod.Spec.NodeName)
		}
		for _, c := range pod.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
				msg = c.Message
				return true, nil
			}
		}
		return false, nil
	})
	return msg, err
}

func podScheduledMessage(pod *corev1.Pod) string {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodScheduled {
			return c.Reason + ": " + c.Message
		}
	}
	return "no PodScheduled condition yet"
}

// DeleteVM deletes the launcher pod (as virt-controller does when the VM
// stops) and the VMI, and waits until the pod is gone and the claim the
// controller made for it is deleted.
func (e *Env) DeleteVM(ctx context.Context, vm *VM, claimName string, timeout time.Duration) error {
	if err := e.Client.CoreV1().Pods(vm.Pod.Namespace).Delete(ctx, vm.Pod.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete pod %s: %w", vm.Pod.Name, err)
	}
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		_, err := e.Client.CoreV1().Pods(vm.Pod.Namespace).Get(ctx, vm.Pod.Name, metav1.GetOptions{})
		if !apierrors.IsNotFound(err) {
			return false, nil
		}
		if claimName == "" {
			return true, nil
		}
		_, err = e.Client.ResourceV1().ResourceClaims(vm.Pod.Namespace).Get(ctx, claimName, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	if err != nil {
		return fmt.Errorf("VM %s: wait for pod %s and claim %s to be gone: %w", vm.Spec.Name, vm.Pod.Name, claimName, err)
	}
	if err := e.Dynamic.Resource(VMIResource).Namespace(vm.Pod.Namespace).Delete(ctx, vm.VMI.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete VMI %s: %w", vm.VMI.Name, err)
	}
	return nil
}

// VMIJSON returns the VMI as the API server has it (what virt-launcher
// passes to hook sidecars).
func (e *Env) VMIJSON(ctx context.Context, vm *VM) ([]byte, error) {
	u, err := e.Dynamic.Resource(VMIResource).Namespace(vm.VMI.Namespace).Get(ctx, vm.VMI.Name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	return u.MarshalJSON()
}

func shortDevice(r resourceapi.DeviceRequestAllocationResult) string {
	return strings.Join([]string{r.Pool, r.Device}, "/")
}

type unstructuredObj struct{ obj map[string]any }

func (o unstructuredObj) u() *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: o.obj}
}
