package node

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
)

// WaitPod polls a pod until cond holds; the error says the pod's last
// phase, conditions and container states.
func (n *Node) WaitPod(ctx context.Context, ns, name string, timeout time.Duration, what string, cond func(*corev1.Pod) bool) (*corev1.Pod, error) {
	var last *corev1.Pod
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		p, err := n.Kube.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			if apierrors.IsNotFound(err) {
				last = nil
				return false, nil
			}
			return false, err
		}
		last = p
		return cond(p), nil
	})
	if err != nil {
		return last, fmt.Errorf("pod %s/%s not %s after %s: %w\n%s", ns, name, what, timeout, err, DescribePod(last))
	}
	return last, nil
}

// WaitPodGone waits until the pod no longer exists.
func (n *Node) WaitPodGone(ctx context.Context, ns, name string, timeout time.Duration) error {
	return wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		_, err := n.Kube.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		return false, nil
	})
}

// PodReady reports the Ready condition.
func PodReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// DescribePod summarises a pod's status for an error message.
func DescribePod(p *corev1.Pod) string {
	if p == nil {
		return "(pod does not exist)"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "phase %s node %q", p.Status.Phase, p.Spec.NodeName)
	for _, c := range p.Status.Conditions {
		fmt.Fprintf(&b, "\n  %s=%s %s %s", c.Type, c.Status, c.Reason, c.Message)
	}
	for _, cs := range append(append([]corev1.ContainerStatus{}, p.Status.InitContainerStatuses...), p.Status.ContainerStatuses...) {
		fmt.Fprintf(&b, "\n  container %s ready=%v restarts=%d", cs.Name, cs.Ready, cs.RestartCount)
		if w := cs.State.Waiting; w != nil {
			fmt.Fprintf(&b, " waiting %s: %s", w.Reason, w.Message)
		}
		if x := cs.State.Terminated; x != nil {
			fmt.Fprintf(&b, " terminated %s (exit %d): %s", x.Reason, x.ExitCode, x.Message)
		}
	}
	return b.String()
}

// Events lists the events of an object, oldest first, one per line.
func (n *Node) Events(ctx context.Context, ns, name string) string {
	evs, err := n.Kube.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
	if err != nil {
		return err.Error()
	}
	sort.Slice(evs.Items, func(i, j int) bool { return evs.Items[i].LastTimestamp.Before(&evs.Items[j].LastTimestamp) })
	var b strings.Builder
	for _, e := range evs.Items {
		fmt.Fprintf(&b, "%s %s %s: %s\n", e.Type, e.Reason, e.Source.Component, e.Message)
	}
	return b.String()
}

// PodLog reads a container's log as the kubelet stored it
// (/var/log/pods/<ns>_<pod>_<uid>/<container>/<restart>.log, CRI format),
// all restarts in order, without the CRI prefixes.
func PodLog(p *corev1.Pod, container string) string {
	return podLogIn("/var/log/pods", p, container)
}

// PodLog is PodLog for a pod of node n.
func (n *Node) PodLog(p *corev1.Pod, container string) string {
	return podLogIn(n.Path("/var/log/pods"), p, container)
}

func podLogIn(root string, p *corev1.Pod, container string) string {
	dir := filepath.Join(root, p.Namespace+"_"+p.Name+"_"+string(p.UID), container)
	ents, _ := os.ReadDir(dir)
	var restarts []int
	for _, e := range ents {
		if n, err := strconv.Atoi(strings.TrimSuffix(e.Name(), ".log")); err == nil && strings.HasSuffix(e.Name(), ".log") {
			restarts = append(restarts, n)
		}
	}
	sort.Ints(restarts)
	var b strings.Builder
	for _, r := range restarts {
		f, err := os.Open(filepath.Join(dir, strconv.Itoa(r)+".log"))
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 1<<20), 4<<20)
		for sc.Scan() {
			// <time> <stream> <P|F> <text>: P lines continue on the next.
			parts := strings.SplitN(sc.Text(), " ", 4)
			if len(parts) < 4 {
				continue
			}
			b.WriteString(parts[3])
			if parts[2] == "F" {
				b.WriteByte('\n')
			}
		}
		f.Close()
	}
	return b.String()
}

// ContainerPID is the host PID of a running container of a pod, from
// containerd's task list.
func (n *Node) ContainerPID(ctx context.Context, p *corev1.Pod, container string) (int, error) {
	var id string
	for _, cs := range append(append([]corev1.ContainerStatus{}, p.Status.InitContainerStatuses...), p.Status.ContainerStatuses...) {
		if cs.Name == container && cs.State.Running != nil {
			id = strings.TrimPrefix(cs.ContainerID, "containerd://")
		}
	}
	if id == "" {
		return 0, fmt.Errorf("container %s of pod %s/%s is not running:\n%s", container, p.Namespace, p.Name, DescribePod(p))
	}
	out, err := n.Ctr(ctx, "tasks", "list")
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(string(out), "\n") {
		f := strings.Fields(l)
		if len(f) >= 3 && f[0] == id {
			return strconv.Atoi(f[1])
		}
	}
	return 0, fmt.Errorf("container %s (%s) of pod %s/%s has no task in containerd:\n%s", container, id, p.Namespace, p.Name, out)
}

// DevNode describes a device node.
type DevNode struct {
	Char         bool
	Major, Minor uint32
}

// StatDev stats a device node.
func StatDev(path string) (DevNode, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return DevNode{}, err
	}
	return DevNode{Char: st.Mode&unix.S_IFMT == unix.S_IFCHR, Major: unix.Major(uint64(st.Rdev)), Minor: unix.Minor(uint64(st.Rdev))}, nil
}

// ProcessIDs returns the real, effective, saved and filesystem uids of a
// process (/proc/<pid>/status Uid line).
func ProcessIDs(pid int, field string) ([]string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return nil, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, field+":") {
			return strings.Fields(strings.TrimPrefix(l, field+":")), nil
		}
	}
	return nil, fmt.Errorf("no %s in /proc/%d/status", field, pid)
}
