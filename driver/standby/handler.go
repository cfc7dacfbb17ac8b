package standby

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"

	"github.com/containerd/nri/pkg/api"
	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"
)

// Want is a standby the driver prepared for a pod: the VMI interface and
// the node bridge (checkpoint.Standby).
type Want struct {
	Interface string
	Bridge    string
	// Claim names the claim (namespace/name), for messages.
	Claim string
}

// Handler is the NRI plugin's logic: at RunPodSandbox it plumbs every
// standby the driver prepared for the pod, at StopPodSandbox and
// RemovePodSandbox it removes the node-side veth ends, and at Synchronize
// (every (re)connection to the runtime) it plumbs running pods again and
// prunes the veths of pods that are gone.
type Handler struct {
	Plumber Plumber
	// Wanted returns the standbys prepared for a pod UID (from the
	// prepare checkpoint).
	Wanted func(podUID string) []Want
	// ProcRoot is the host's /proc: the pod's namespace through its
	// sandbox process when the runtime's namespace path is not visible
	// to the driver.
	ProcRoot string
	// OnSync, if set, is called after each Synchronize (the plugin is
	// registered and the runtime sends it pod events).
	OnSync func()
}

// RunPodSandbox plumbs the pod's standbys. An error fails the sandbox:
// without its tap the VM cannot start, and the runtime's message tells the
// user why.
func (h *Handler) RunPodSandbox(ctx context.Context, pod *api.PodSandbox) error {
	wants := h.Wanted(pod.GetUid())
	if len(wants) == 0 {
		return nil
	}
	return h.attach(ctx, pod, wants)
}

func (h *Handler) attach(ctx context.Context, pod *api.PodSandbox, wants []Want) error {
	logger := klog.FromContext(ctx).WithValues("pod", klog.KRef(pod.GetNamespace(), pod.GetName()), "podUID", pod.GetUid())
	nsPath, err := h.podNetns(pod)
	if err != nil {
		return fmt.Errorf("vfnet failover standby for pod %s/%s: %w", pod.GetNamespace(), pod.GetName(), err)
	}
	for _, w := range wants {
		a := Attachment{PodUID: pod.GetUid(), Netns: nsPath, Interface: w.Interface, Bridge: w.Bridge}
		if err := h.Plumber.Attach(ctx, a); err != nil {
			return fmt.Errorf("vfnet failover standby for interface %q of pod %s/%s (claim %s): tap %s on node bridge %s: %w; "+
				"fix: check that bridge %s exists on the node (nodeconfig pfs[].standby.bridge) and the vfnet-driver log, or remove VFConfig.failover from the claim",
				w.Interface, pod.GetNamespace(), pod.GetName(), w.Claim, NamesFor(a).Tap, w.Bridge, err, w.Bridge)
		}
		logger.Info("Plumbed failover standby", "interface", w.Interface, "tap", NamesFor(a).Tap, "bridge", w.Bridge)
	}
	return nil
}

// StopPodSandbox removes the pod's node-side veth ends: its namespace may
// outlive the stop (it is removed later), and the VM is gone.
func (h *Handler) StopPodSandbox(ctx context.Context, pod *api.PodSandbox) error {
	return h.detach(ctx, pod)
}

// RemovePodSandbox makes sure again that nothing of the pod stays on the
// node (a stop handled while the driver was down).
func (h *Handler) RemovePodSandbox(ctx context.Context, pod *api.PodSandbox) error {
	return h.detach(ctx, pod)
}

func (h *Handler) detach(ctx context.Context, pod *api.PodSandbox) error {
	if len(h.Wanted(pod.GetUid())) == 0 {
		// Not a failover pod, or its claims are gone already: Synchronize
		// prunes what such a pod might have left.
		return nil
	}
	if err := h.Plumber.Detach(ctx, pod.GetUid()); err != nil {
		return fmt.Errorf("vfnet failover standby of pod %s/%s: %w", pod.GetNamespace(), pod.GetName(), err)
	}
	return nil
}

// Synchronize runs at every (re)connection: pods started while the driver
// was not connected get their standbys (idempotent for the others), and
// node-side veths of pods that no longer exist are removed.
func (h *Handler) Synchronize(ctx context.Context, pods []*api.PodSandbox, _ []*api.Container) ([]*api.ContainerUpdate, error) {
	logger := klog.FromContext(ctx)
	keep := make(map[string]bool, len(pods))
	for _, pod := range pods {
		keep[pod.GetUid()] = true
		if wants := h.Wanted(pod.GetUid()); len(wants) > 0 {
			if err := h.attach(ctx, pod, wants); err != nil {
				// Not fatal to the other pods; the VM's start reports it too.
				logger.Error(err, "Plumbing a running pod's failover standby failed")
			}
		}
	}
	if err := h.Plumber.Prune(ctx, keep); err != nil {
		logger.Error(err, "Removing failover standby veths of pods that are gone failed")
	}
	if h.OnSync != nil {
		h.OnSync()
	}
	return nil, nil
}

// podNetns is the pod's network namespace file: the runtime's path when
// the driver sees it as a namespace, else the sandbox process's
// (hostPID). A pod without a namespace of its own (hostNetwork) cannot
// hold a standby.
func (h *Handler) podNetns(pod *api.PodSandbox) (string, error) {
	var path string
	for _, ns := range pod.GetLinux().GetNamespaces() {
		if ns.GetType() == "network" {
			path = ns.GetPath()
		}
	}
	if path == "" {
		return "", errors.New("the pod has no network namespace of its own (hostNetwork?); a failover standby needs the launcher pod's namespace")
	}
	if isNsfs(path) {
		return path, nil
	}
	if pid := pod.GetPid(); pid > 0 && h.ProcRoot != "" {
		alt := filepath.Join(h.ProcRoot, strconv.FormatUint(uint64(pid), 10), "ns", "net")
		if isNsfs(alt) {
			return alt, nil
		}
	}
	return "", fmt.Errorf("the pod's network namespace %s is not visible to vfnet-driver, nor its sandbox process under %s: run the driver with hostPID and the host's /proc (--proc-root), as the shipped DaemonSet does", path, h.ProcRoot)
}

// isNsfs reports whether path is a namespace file (not the empty file a
// bind mount that did not propagate leaves).
func isNsfs(path string) bool {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return false
	}
	return st.Type == unix.NSFS_MAGIC
}
