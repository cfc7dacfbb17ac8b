package prepare

import (
	"context"
	"fmt"
	"slices"

	resourceapi "k8s.io/api/resource/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"

	"github.com/vfnet-io/vfnet/driver/checkpoint"
)

// Writing status.devices goes through the resourceclaims/status subresource
// (real verbs update/patch). Since Kubernetes 1.37 the API server also
// checks, per driver whose entries change, the synthetic subresource
// resourceclaims/driver with resourceName = the driver name and verb
// "associated-node:update" (for a service account bound to the claim's
// node, which a DaemonSet pod's token is) or "arbitrary-node:update". The
// driver's RBAC therefore needs resourceclaims/status [get update] and
// resourceclaims/driver [associated-node:update] on sriov.vfnet.io.

// setStatus adds or replaces this driver's entries for devs in the claim's
// status.devices, keeping every other driver's entries untouched.
func (s *State) setStatus(ctx context.Context, claim *resourceapi.ResourceClaim, devs []checkpoint.Device) error {
	if s.opts.Kube == nil {
		return nil
	}
	ours := make([]resourceapi.AllocatedDeviceStatus, 0, len(devs))
	for _, d := range devs {
		st := resourceapi.AllocatedDeviceStatus{
			Driver: s.opts.DriverName, Pool: d.Pool, Device: d.Device,
			Conditions: []metav1.Condition{{
				Type: "Ready", Status: metav1.ConditionTrue, Reason: "Prepared",
				Message:            fmt.Sprintf("VF %s is bound to vfio-pci (%s) and configured", d.BDF, d.DevNode),
				ObservedGeneration: claim.Generation, LastTransitionTime: metav1.Now(),
			}},
		}
		if hw := macString(d.Applied.MAC); hw != "" {
			st.NetworkData = &resourceapi.NetworkDeviceData{HardwareAddress: hw}
		}
		ours = append(ours, st)
	}
	return s.writeStatus(ctx, claim.Namespace, claim.Name, claim.UID, claim, func(cur []resourceapi.AllocatedDeviceStatus) []resourceapi.AllocatedDeviceStatus {
		out := slices.DeleteFunc(slices.Clone(cur), func(e resourceapi.AllocatedDeviceStatus) bool {
			return e.Driver == s.opts.DriverName && slices.ContainsFunc(ours, func(o resourceapi.AllocatedDeviceStatus) bool {
				return o.Pool == e.Pool && o.Device == e.Device
			})
		})
		return append(out, ours...)
	})
}

// clearStatus removes this driver's entries on unprepare. The claim may be
// gone already; failures are logged, not returned: the host is what
// unprepare must get right, and deallocation drops the entries anyway.
func (s *State) clearStatus(ctx context.Context, c kubeletplugin.NamespacedObject) {
	if s.opts.Kube == nil {
		return
	}
	err := s.writeStatus(ctx, c.Namespace, c.Name, c.UID, nil, func(cur []resourceapi.AllocatedDeviceStatus) []resourceapi.AllocatedDeviceStatus {
		return slices.DeleteFunc(slices.Clone(cur), func(e resourceapi.AllocatedDeviceStatus) bool { return e.Driver == s.opts.DriverName })
	})
	if err != nil {
		klog.FromContext(ctx).Error(err, "Could not remove the driver's status.devices entries; they go away when the claim is deallocated")
	}
}

// writeStatus applies edit to the claim's status.devices with retries on
// conflict. cached, if set, is tried first to save a GET.
func (s *State) writeStatus(ctx context.Context, ns, name string, uid types.UID, cached *resourceapi.ResourceClaim, edit func([]resourceapi.AllocatedDeviceStatus) []resourceapi.AllocatedDeviceStatus) error {
	client := s.opts.Kube.ResourceV1().ResourceClaims(ns)
	cur := cached
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if cur == nil {
			fresh, err := client.Get(ctx, name, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				return nil
			}
			if err != nil {
				return fmt.Errorf("get claim %s/%s: %w", ns, name, err)
			}
			if fresh.UID != uid {
				return nil // replaced by another claim of the same name
			}
			cur = fresh
		}
		next := edit(cur.Status.Devices)
		if apiequality.Semantic.DeepEqual(next, cur.Status.Devices) {
			return nil
		}
		upd := cur.DeepCopy()
		upd.Status.Devices = next
		_, err := client.UpdateStatus(ctx, upd, metav1.UpdateOptions{FieldManager: s.opts.DriverName})
		if err != nil {
			cur = nil // re-read on the next attempt
			return err
		}
		return nil
	})
}
