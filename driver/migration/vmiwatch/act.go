// Acting on a migration: resolving the launcher pod, its claim and the
// VF's hostdev, then attaching (with retries) and recording the outcome.

package vmiwatch

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"

	"github.com/vfnet-io/vfnet/driver/migration/attach"
	"github.com/vfnet-io/vfnet/pkg/contract/pciaddr"
	"github.com/vfnet-io/vfnet/pkg/contract/vmiview"
)

// run resolves the launcher pod and its VFs, then attaches them.
func (w *Watcher) run(ctx context.Context, vmi *vmiview.VMI, act Action) {
	logger := klog.FromContext(ctx).WithValues("vmi", kref(vmi), "side", act.Side, "migration", act.MigrationKey)
	ctx = klog.NewContext(ctx, logger)
	start := time.Now()
	done := func(err error) {
		if w.cfg.OnAttach != nil {
			w.cfg.OnAttach(string(act.Side), time.Since(start), err)
		}
	}
	if act.PodName == "" {
		w.sourcePodUnknown(ctx, vmi, act)
		done(errors.New("source pod unknown"))
		return
	}
	req, err := w.resolveWithRetry(ctx, vmi, act)
	if err == nil {
		// The MAC first: the guest's VF driver reads it when the VF
		// appears.
		err = w.unpark(ctx, vmi, req)
	}
	if err == nil {
		var res attach.Result
		res, err = w.cfg.Attacher.Attach(ctx, req)
		if err == nil {
			if len(res.Attached) > 0 {
				w.cfg.Recorder.Eventf(eventRef(vmi), corev1.EventTypeNormal, ReasonAttached,
					"Attached %s to domain %s in pod %s on node %s after %s migration",
					describe(req.Hostdevs), req.Domain, act.PodName, w.cfg.NodeName, outcome(act.Side))
			}
			logger.Info("Migration VFs in place", "attached", res.Attached, "present", res.Present, "attempts", res.Attempts, "duration", time.Since(start))
			done(nil)
			return
		}
	}
	if ctx.Err() != nil {
		return // shutting down; a restarted driver replays the VMI
	}
	logger.Error(err, "Giving up attaching VFs after migration")
	done(err)
	w.cfg.Recorder.Eventf(eventRef(vmi), corev1.EventTypeWarning, ReasonAttachFailed,
		"Could not attach vfnet VFs to the %s launcher on node %s after %s migration: %v", act.Side, w.cfg.NodeName, outcome(act.Side), err)
}

// sourcePodUnknown reports a failed migration whose status names no source
// pod. status.activePods maps pod UIDs to nodes, but pods can only be read by
// name with the driver's RBAC (pods: get), so the launcher, its claims and
// thus the VFs to re-attach are unknown. KubeVirt's migration controller
// records the VMI's current pod as sourcePod while the migration is pending
// and copies it into the VMI status at the hand-off to the target, so this
// only happens if it did not find that pod (or something else wrote the
// status). Plan gives the action once per migration: one Event.
func (w *Watcher) sourcePodUnknown(ctx context.Context, vmi *vmiview.VMI, act Action) {
	names := make([]string, len(act.Interfaces))
	for i, ci := range act.Interfaces {
		names[i] = ci.Interface.Name
	}
	klog.FromContext(ctx).Error(nil, "Cannot re-attach VFs after a failed migration: status.migrationState.sourcePod is empty", "interfaces", names)
	w.cfg.Recorder.Eventf(eventRef(vmi), corev1.EventTypeWarning, ReasonAttachFailed,
		"Could not re-attach the VF(s) of vfnet interface(s) %s on node %s after the failed migration %s: status.migrationState.sourcePod is empty, so the source launcher pod is unknown (the driver reads pods by name only; status.activePods holds pod UIDs); the VM keeps running without them until it is restarted or migrated again",
		strings.Join(names, ", "), w.cfg.NodeName, act.MigrationKey)
}

func outcome(s Side) string {
	if s == Target {
		return "completed"
	}
	return "failed"
}

func describe(hs []attach.Hostdev) string {
	parts := make([]string, len(hs))
	for i, h := range hs {
		parts[i] = fmt.Sprintf("VF %s as %s", h.Source, attach.Alias(h.Interface))
	}
	return strings.Join(parts, ", ")
}

// retryable marks resolve errors that waiting can fix.
type retryable struct{ error }

func (r retryable) Unwrap() error { return r.error }

func (w *Watcher) resolveWithRetry(ctx context.Context, vmi *vmiview.VMI, act Action) (attach.Request, error) {
	ctx, cancel := context.WithTimeout(ctx, w.cfg.ResolveTimeout)
	defer cancel()
	delay := 20 * time.Millisecond
	for {
		req, err := w.resolve(ctx, vmi, act)
		var r retryable
		if err == nil || !errors.As(err, &r) {
			return req, err
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return req, fmt.Errorf("gave up waiting: %w", err)
		case <-t.C:
		}
		delay = min(2*delay, 2*time.Second)
	}
}

func (w *Watcher) resolve(ctx context.Context, vmi *vmiview.VMI, act Action) (attach.Request, error) {
	pod, err := w.launcherPod(ctx, vmi, act.PodName)
	if err != nil {
		return attach.Request{}, err
	}
	req := attach.Request{PodUID: string(pod.UID), Domain: act.Domain}
	for _, ci := range act.Interfaces {
		claim, err := w.podClaim(ctx, pod, ci)
		if err != nil {
			return req, err
		}
		h, err := w.hostdev(claim, ci)
		if err != nil {
			return req, err
		}
		req.Hostdevs = append(req.Hostdevs, h)
	}
	return req, nil
}

// launcherPod returns the named launcher pod, which must run on this node.
func (w *Watcher) launcherPod(ctx context.Context, vmi *vmiview.VMI, name string) (*corev1.Pod, error) {
	ns := vmi.Metadata.Namespace
	pod, err := w.cfg.Kube.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, retryable{fmt.Errorf("launcher pod %s/%s not found", ns, name)}
	}
	if err != nil {
		return nil, retryable{fmt.Errorf("get launcher pod %s/%s: %w", ns, name, err)}
	}
	if pod.Spec.NodeName != w.cfg.NodeName {
		return nil, fmt.Errorf("launcher pod %s/%s runs on node %q, not on this node %q", ns, name, pod.Spec.NodeName, w.cfg.NodeName)
	}
	return pod, nil
}

// podClaim returns the allocated ResourceClaim behind one interface in pod.
func (w *Watcher) podClaim(ctx context.Context, pod *corev1.Pod, ci vmiview.ClaimInterface) (*resourceapi.ResourceClaim, error) {
	var name string
	if ci.ResourceClaimName != nil {
		name = *ci.ResourceClaimName
	} else {
		for _, s := range pod.Status.ResourceClaimStatuses {
			if s.Name == ci.PodClaimName && s.ResourceClaimName != nil {
				name = *s.ResourceClaimName
			}
		}
		if name == "" {
			return nil, retryable{fmt.Errorf("pod %s/%s: status.resourceClaimStatuses has no claim for %q yet", pod.Namespace, pod.Name, ci.PodClaimName)}
		}
	}
	claim, err := w.cfg.Kube.ResourceV1().ResourceClaims(pod.Namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, retryable{fmt.Errorf("get ResourceClaim %s/%s of pod %s: %w", pod.Namespace, name, pod.Name, err)}
	}
	if claim.Status.Allocation == nil {
		return nil, retryable{fmt.Errorf("ResourceClaim %s/%s is not allocated yet", claim.Namespace, claim.Name)}
	}
	return claim, nil
}

// hostdev finds the VF allocated by this driver for the interface's request.
func (w *Watcher) hostdev(claim *resourceapi.ResourceClaim, ci vmiview.ClaimInterface) (attach.Hostdev, error) {
	h := attach.Hostdev{Interface: ci.Interface.Name, BootOrder: ci.Interface.BootOrder}
	var devs []string
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver == w.cfg.DriverName && (r.Request == ci.RequestName || strings.HasPrefix(r.Request, ci.RequestName+"/")) {
			devs = append(devs, r.Device)
		}
	}
	if len(devs) != 1 {
		return h, fmt.Errorf("ResourceClaim %s/%s request %q: want exactly one %s device for interface %q, allocation has %d (%v)",
			claim.Namespace, claim.Name, ci.RequestName, w.cfg.DriverName, ci.Interface.Name, len(devs), devs)
	}
	src, err := pciaddr.ParseDeviceName(devs[0])
	if err != nil {
		return h, fmt.Errorf("ResourceClaim %s/%s: %w", claim.Namespace, claim.Name, err)
	}
	h.Source = src
	if pa := ci.Interface.PciAddress; pa != "" {
		g, err := pciaddr.ParseLoose(pa)
		if err != nil {
			return h, fmt.Errorf("VMI interface %q pciAddress %q: %w; fix spec.domain.devices.interfaces[].pciAddress", ci.Interface.Name, pa, err)
		}
		h.Guest = &g
	}
	return h, nil
}
