package node

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// NodeSpec is what sets a node apart from another in the same network
// namespace and control plane: the kubelet's node name and IP (its serving
// port binds that IP), its health port (on loopback), and the pod CIDR and
// CNI bridge of its pods. Everything on disk a kubelet owns (/var/lib/kubelet
// with the plugin registry, /run/containerd, /var/run/cdi, CNI state, pod
// logs) is kept apart by a mount namespace of its own instead (nodeDirs).
type NodeSpec struct {
	Name, IP             string
	PodSubnet, PodBridge string
	HealthzPort          int
}

// FirstNode is the node every step runs on.
func FirstNode() NodeSpec {
	return NodeSpec{Name: NodeName, IP: NodeIP, PodSubnet: PodSubnet, PodBridge: podBridge, HealthzPort: 10248}
}

// SecondNode is the node a live migration moves the VM to and back from.
func SecondNode() NodeSpec {
	return NodeSpec{Name: NodeName + "-2", IP: "192.0.2.11", PodSubnet: "10.244.1.0/24", PodBridge: "cni1", HealthzPort: 10258}
}

// Path is where a path inside the node's mount namespace lies for this
// process: below the node's scratch directory for what nodeDirs bind there
// (the first node's namespace is this process's own, so it maps nothing).
func (n *Node) Path(p string) string {
	if n.mnt == nil {
		return p
	}
	if rest, ok := strings.CutPrefix(p, "/var/run/"); ok {
		p = "/run/" + rest // /var/run is a link to /run
	}
	for target, sub := range nodeDirs() {
		if p == target || strings.HasPrefix(p, target+"/") {
			return filepath.Join(n.Dir, sub, strings.TrimPrefix(p, target))
		}
	}
	return p
}

// AddNode starts another node beside n with n's control plane: its own
// kubelet and containerd, in a mount namespace nested in n's (see
// mountNS), on the same node bridge with spec's IP. The images are imported
// into its containerd. prepare runs once the node's directories exist and
// before its kubelet starts (the simulated SR-IOV host the DaemonSet's
// driver expects goes there). n.Down stops it.
func (n *Node) AddNode(ctx context.Context, spec NodeSpec, images map[string]string, prepare func(*Node) error) (_ *Node, retErr error) {
	m := &Node{
		Dir: filepath.Join(n.Dir, spec.Name), Spec: spec, Parts: n.Parts,
		Plane: n.Plane, Kube: n.Kube, Kubeconfig: n.Kubeconfig, sharedPlane: true,
		Timings: map[string]time.Duration{},
	}
	defer func() {
		if retErr != nil {
			m.Down(context.Background())
		}
	}()
	if err := addNodeIP(spec.IP); err != nil {
		return nil, err
	}
	var err error
	if m.mnt, err = newMountNS(m.Dir); err != nil {
		return nil, fmt.Errorf("node %s: %w", spec.Name, err)
	}
	if prepare != nil {
		if err := prepare(m); err != nil {
			return nil, fmt.Errorf("node %s: %w", spec.Name, err)
		}
	}
	if err := m.startNode(ctx, images); err != nil {
		return nil, fmt.Errorf("node %s: %w", spec.Name, err)
	}
	n.others = append(n.others, m)
	return m, nil
}

// addNodeIP puts a second node's IP on the node bridge.
func addNodeIP(ip string) error {
	br, err := netlink.LinkByName(nodeBridge)
	if err != nil {
		return fmt.Errorf("node bridge %s: %w", nodeBridge, err)
	}
	addr, err := netlink.ParseAddr(ip + "/24")
	if err != nil {
		return err
	}
	if err := netlink.AddrAdd(br, addr); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("address %s on %s: %w", ip, nodeBridge, err)
	}
	return nil
}

// mountNS is a mount namespace nested in this process's, held by one OS
// thread: Go cannot move a running multi-threaded process into another
// mount namespace, but one thread can unshare its own, and a program
// started from that thread (exec from a goroutine locked to it) starts
// inside. The thread serves start requests until close, and is then
// parked for the rest of the process, never unlocked and never ended: Go
// reuses threads, so it may be the one that started the first node's
// containerd or kubelet earlier, whose parent-death signal (SIGKILL) its
// end would fire. (A teardown once found the first node's containerd
// killed that way.)
type mountNS struct {
	req chan func()
}

// newMountNS unshares a mount namespace on a new thread in which dir's
// subdirectories are bound over nodeDirs (as EnterNamespace does for the
// first node), with / shared again inside for the pods' HostToContainer
// mounts.
func newMountNS(dir string) (*mountNS, error) {
	m := &mountNS{req: make(chan func())}
	ready := make(chan error)
	go func() {
		runtime.LockOSThread()
		// Never unlocked and never ended (see mountNS): the thread is in
		// another mount namespace.
		if err := enterNestedMountNS(dir); err != nil {
			ready <- err
		} else {
			ready <- nil
			for f := range m.req {
				f()
			}
		}
		select {}
	}()
	if err := <-ready; err != nil {
		return nil, err
	}
	return m, nil
}

func enterNestedMountNS(dir string) error {
	if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("unshare a nested mount namespace: %w", err)
	}
	// Private first: the copied mounts are peers of the first node's,
	// which must not see these binds.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make / private in the nested mount namespace: %w", err)
	}
	// Drop the first node's binds (and the container mounts under them)
	// from the copy, so this namespace holds none of them.
	for target := range nodeDirs() {
		if err := unix.Unmount(target, unix.MNT_DETACH); err != nil {
			return fmt.Errorf("detach the first node's %s in the nested mount namespace: %w", target, err)
		}
	}
	if err := bindNodeDirs(dir); err != nil {
		return err
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_SHARED, ""); err != nil {
		return fmt.Errorf("make / shared inside the nested mount namespace: %w", err)
	}
	return nil
}

// start starts cmd inside the namespace (in this process's own for nil).
func (m *mountNS) start(cmd *exec.Cmd) error {
	if m == nil {
		return cmd.Start()
	}
	errc := make(chan error, 1)
	m.req <- func() { errc <- cmd.Start() }
	return <-errc
}

// close ends the start requests; the thread stays parked.
func (m *mountNS) close() {
	if m != nil && m.req != nil {
		close(m.req)
		m.req = nil
	}
}

// checkNestedMountNS: the node's kubelet runs in a mount namespace other
// than this process's, and its /var/lib is the node's own directory.
func (n *Node) checkNestedMountNS() error {
	for _, p := range n.procs {
		if p.name != "kubelet" {
			continue
		}
		mine, _ := os.Readlink("/proc/self/ns/mnt")
		its, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", p.cmd.Process.Pid))
		if err != nil || its == mine {
			return fmt.Errorf("kubelet of %s: mount namespace %q (%v), want one other than this process's %q", n.Spec.Name, its, err, mine)
		}
		var a, b unix.Stat_t
		if err := unix.Stat(fmt.Sprintf("/proc/%d/root/var/lib", p.cmd.Process.Pid), &a); err != nil {
			return err
		}
		if err := unix.Stat(n.Path("/var/lib"), &b); err != nil {
			return err
		}
		if a.Dev != b.Dev || a.Ino != b.Ino {
			return fmt.Errorf("kubelet of %s sees another /var/lib than %s", n.Spec.Name, n.Path("/var/lib"))
		}
		return nil
	}
	return fmt.Errorf("node %s runs no kubelet", n.Spec.Name)
}
