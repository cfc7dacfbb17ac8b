package node

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	virtv1 "kubevirt.io/api/core/v1"

	"github.com/vfnet-io/vfnet/test/lib/controlplane"
)

// VirtHandlerStandIn is a STAND-IN for KubeVirt's virt-handler, limited to
// the few fields the real one would write and the real virt-controller and
// the driver read: on the Node, the labels of its heartbeat and node
// labeller (launcher pods select them) and the heartbeat annotation
// (virt-controller's node controller fails the VMIs of a node whose
// heartbeat is stale), the device plugins' extended resources (launcher
// pods request them), and a VMI's status.phase. It runs no domain and
// watches nothing: the test calls it where virt-handler would act. Why a
// stand-in: virt-handler needs a launcher that runs QEMU under libvirt,
// which the real-node tier has not (its compute container is the launcher
// stand-in); the real-kernel tier is where that can run (issue 33 item 3).
//
// It writes VMIs as virt-handler's ServiceAccount (HandlerServiceAccount,
// made by virt-operator) with a token bound to a pod on the node, as
// virt-handler's own: virt-api's VMI mutator puts back the status of an
// update from anyone else (an admin included), and its validator wants the
// node name such a token carries. That pod (handlerPodName) runs the pause
// image; it is the stand-in's identity, not virt-handler.
type VirtHandlerStandIn struct {
	Node *Node

	dyn  dynamic.Interface
	stop chan struct{}
	wg   sync.WaitGroup
}

// HandlerServiceAccount is virt-handler's ServiceAccount in KubeVirt's
// install namespace.
const HandlerServiceAccount = "kubevirt-handler"

// HandlerLabels are the Node labels the stand-in sets: virt-handler's
// heartbeat marks the node schedulable, its node labeller names the
// machine type the launcher pod of a q35 VMI selects.
func HandlerLabels() map[string]string {
	return map[string]string{
		virtv1.NodeSchedulable:                   "true",
		virtv1.SupportedMachineTypeLabel + "q35": "true",
	}
}

// HandlerResources are the extended resources virt-handler's permanent
// device plugins advertise (launcher pods request them; with emulation on,
// kvm is not requested but still advertised, as virt-handler does).
func HandlerResources() []corev1.ResourceName {
	return []corev1.ResourceName{"devices.kubevirt.io/kvm", "devices.kubevirt.io/tun", "devices.kubevirt.io/vhost-net"}
}

// heartbeatEvery is well inside virt-controller's 5-minute heartbeat
// timeout, as virt-handler's own period (1 minute) is.
const heartbeatEvery = 30 * time.Second

// Start labels the node, advertises the resources and keeps the heartbeat
// fresh until Stop.
func (s *VirtHandlerStandIn) Start(ctx context.Context, kubevirtNS string) error {
	pod, err := s.identityPod(ctx, kubevirtNS)
	if err != nil {
		return err
	}
	token, err := controlplane.PodBoundToken(ctx, s.Node.Kube, pod, 2*time.Hour)
	if err != nil {
		return fmt.Errorf("virt-handler stand-in: %w", err)
	}
	if s.dyn, err = dynamic.NewForConfig(s.Node.Plane.RESTConfigForToken(token)); err != nil {
		return err
	}
	if err := s.heartbeat(ctx, true); err != nil {
		return err
	}
	if err := s.Node.AddExtendedResources(ctx, HandlerResources(), 110); err != nil {
		return fmt.Errorf("virt-handler stand-in: %w", err)
	}
	s.stop = make(chan struct{})
	s.wg.Go(func() {
		t := time.NewTicker(heartbeatEvery)
		defer t.Stop()
		for {
			select {
			case <-s.stop:
				return
			case <-t.C:
				_ = s.heartbeat(context.Background(), false)
			}
		}
	})
	return nil
}

// handlerPodName names the stand-in's identity pod. Not labelled as
// virt-handler's pods are: virt-handler's DaemonSet would adopt it.
const handlerPodName = "virt-handler-standin"

// identityPod creates the pod the stand-in's token is bound to: virt-handler's
// ServiceAccount, on the node, running the pause image. A later stand-in on
// the same node reuses it.
func (s *VirtHandlerStandIn) identityPod(ctx context.Context, ns string) (*corev1.Pod, error) {
	name := handlerPodName + "-" + s.Node.Spec.Name
	if p, err := s.Node.Kube.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{}); err == nil {
		return p, nil
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"app": handlerPodName}},
		Spec: corev1.PodSpec{
			NodeName:                      s.Node.Spec.Name,
			ServiceAccountName:            HandlerServiceAccount,
			AutomountServiceAccountToken:  ptr.To(false),
			TerminationGracePeriodSeconds: ptr.To[int64](1),
			Containers:                    []corev1.Container{{Name: "pause", Image: PauseImage, ImagePullPolicy: corev1.PullNever}},
		},
	}
	created, err := s.Node.Kube.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("virt-handler stand-in: identity pod %s/%s: %w", ns, name, err)
	}
	return created, nil
}

// Stop ends the heartbeat (the node's labels stay, as after a
// virt-handler that went away).
func (s *VirtHandlerStandIn) Stop() {
	if s.stop != nil {
		close(s.stop)
		s.wg.Wait()
		s.stop = nil
	}
}

// heartbeat writes the heartbeat annotation (and, first, the labels).
func (s *VirtHandlerStandIn) heartbeat(ctx context.Context, labels bool) error {
	meta := map[string]any{"annotations": map[string]string{virtv1.VirtHandlerHeartbeat: metav1.Now().UTC().Format(time.RFC3339)}}
	if labels {
		meta["labels"] = HandlerLabels()
	}
	patch, err := json.Marshal(map[string]any{"metadata": meta})
	if err != nil {
		return err
	}
	if _, err := s.Node.Kube.CoreV1().Nodes().Patch(ctx, s.Node.Spec.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("virt-handler stand-in: heartbeat of node %s: %w", s.Node.Spec.Name, err)
	}
	return nil
}

// SetPhase writes a VMI's status.phase as virt-handler does once the
// domain runs (Running) or is gone (Succeeded): with list and update, all
// its role grants on VMIs (it reads them from an informer). KubeVirt's VMI
// CRD has no status subresource, so the whole object is updated.
func (s *VirtHandlerStandIn) SetPhase(ctx context.Context, ns, name string, phase virtv1.VirtualMachineInstancePhase) error {
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		list, err := s.dyn.Resource(vmiResource()).Namespace(ns).List(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + name})
		if err != nil {
			return err
		}
		if len(list.Items) != 1 {
			return apierrors.NewNotFound(vmiResource().GroupResource(), name)
		}
		vmi := &list.Items[0]
		if err := unstructured.SetNestedField(vmi.Object, string(phase), "status", "phase"); err != nil {
			return err
		}
		_, err = s.dyn.Resource(vmiResource()).Namespace(ns).Update(ctx, vmi, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return fmt.Errorf("virt-handler stand-in: VMI %s/%s phase %s: %w", ns, name, phase, err)
	}
	return nil
}

func vmiResource() schema.GroupVersionResource {
	return schema.GroupVersionResource{Group: "kubevirt.io", Version: "v1", Resource: "virtualmachineinstances"}
}
