package node

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/vfnet-io/vfnet/test/lib/controlplane"
	"github.com/vfnet-io/vfnet/test/lib/tcpforward"
)

// Addresses inside the node's network namespace. The node IP is from
// TEST-NET-1 (the kubelet refuses loopback) on a bridge with no ports: no
// packet can leave. 10.96.0.1 is the "kubernetes" Service's ClusterIP;
// without kube-proxy, this process serves it (a TCP forward to the API
// server).
const (
	NodeName   = "realnode"
	NodeIP     = "192.0.2.10"
	ServiceIP  = "10.96.0.1"
	PodSubnet  = "10.244.0.0/24"
	nodeBridge = "vfnet-node"
	podBridge  = "cni0"
)

// SimRoot is the simulated host inside the namespace (the overlay passes
// SimRoot/sys and SimRoot/dev to the driver). It lies under /var/lib,
// which the namespace binds from the scratch directory.
const SimRoot = "/var/lib/vfnet-sim"

// Kernel tunables the kubelet sets at start (setupKernelTunables) and the
// values it wants; inside the namespace, a file with that value is bound
// read-only over each one that differs, so the kubelet finds nothing to
// change and the host's values stay as they are.
func kubeletTunables() map[string]string {
	return map[string]string{
		"vm/overcommit_memory":      "1",
		"vm/panic_on_oom":           "0",
		"kernel/panic":              "10",
		"kernel/panic_on_oops":      "1",
		"kernel/keys/root_maxkeys":  "1000000",
		"kernel/keys/root_maxbytes": "25000000",
	}
}

// EnterNamespace prepares the mount and network namespace this process
// runs in (it was started with CLONE_NEWNS|CLONE_NEWNET): no mount
// propagates to the host, /run, /var/lib and /var/log come from dir, the
// kubelet's tunables are pinned, and the node bridge carries the node IP
// and the service IP. Finally / is made shared again inside, for the
// DaemonSet's HostToContainer mounts.
func EnterNamespace(dir string) error {
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make / private in the node's mount namespace: %w", err)
	}
	if err := bindNodeDirs(dir); err != nil {
		return err
	}
	sysctlDir := filepath.Join(dir, "sysctl")
	if err := os.MkdirAll(sysctlDir, 0o755); err != nil {
		return err
	}
	for key, want := range kubeletTunables() {
		target := "/proc/sys/" + key
		cur, err := os.ReadFile(target)
		if err != nil || strings.TrimSpace(string(cur)) == want {
			continue // absent in this kernel, or already what the kubelet wants
		}
		f := filepath.Join(sysctlDir, strings.ReplaceAll(key, "/", "."))
		if err := os.WriteFile(f, []byte(want+"\n"), 0o444); err != nil {
			return err
		}
		if err := unix.Mount(f, target, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind %s over %s: %w", f, target, err)
		}
		if err := unix.Mount("", target, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
			return fmt.Errorf("make %s read-only: %w", target, err)
		}
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_SHARED, ""); err != nil {
		return fmt.Errorf("make / shared inside the node's mount namespace: %w", err)
	}
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return err
	}
	if err := netlink.LinkSetUp(lo); err != nil {
		return fmt.Errorf("loopback up: %w", err)
	}
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: nodeBridge}}
	if err := netlink.LinkAdd(br); err != nil {
		return fmt.Errorf("node bridge: %w", err)
	}
	for _, a := range []string{NodeIP + "/24", ServiceIP + "/32"} {
		addr, err := netlink.ParseAddr(a)
		if err != nil {
			return err
		}
		if err := netlink.AddrAdd(br, addr); err != nil {
			return fmt.Errorf("address %s on %s: %w", a, nodeBridge, err)
		}
	}
	if err := netlink.LinkSetUp(br); err != nil {
		return err
	}
	return nil
}

// nodeDirs are the node paths bound from its scratch directory, each to
// the subdirectory named: what two kubelets (and their containerd, CNI
// state, CDI specs, plugin registry, pods) on one machine must not share.
func nodeDirs() map[string]string {
	return map[string]string{"/run": "run", "/var/lib": "varlib", "/var/log": "varlog"}
}

// bindNodeDirs binds dir's subdirectories over nodeDirs in the calling
// thread's mount namespace.
func bindNodeDirs(dir string) error {
	for target, sub := range nodeDirs() {
		src := filepath.Join(dir, sub)
		if err := os.MkdirAll(src, 0o755); err != nil {
			return err
		}
		if err := unix.Mount(src, target, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind %s over %s: %w", src, target, err)
		}
	}
	return nil
}

// Node is a running node: control plane, service forward, containerd and
// kubelet, all in this process's namespaces.
type Node struct {
	Dir string
	// Spec is what sets this node apart from another in the same network
	// namespace (name, IP, pod CIDR and bridge, kubelet health port).
	Spec  NodeSpec
	Parts Parts
	Plane *controlplane.Plane
	Kube  kubernetes.Interface
	// Kubeconfig is the admin kubeconfig (kubectl, kubelet).
	Kubeconfig string

	forward net.Listener
	procs   []*proc
	// mnt is the nested mount namespace of a node added beside the first
	// (AddNode); nil for the first, which runs in this process's own.
	mnt *mountNS
	// others are the nodes added beside this one; Down stops them first.
	others []*Node
	// sharedPlane: the control plane is the first node's (Down leaves it).
	sharedPlane bool
	Timings     map[string]time.Duration
	timingsMu   sync.Mutex
}

type proc struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
}

// Up starts the node in dir (inside the namespace) and imports images.
func Up(ctx context.Context, dir string, parts Parts, images map[string]string) (_ *Node, retErr error) {
	n := &Node{Dir: dir, Spec: FirstNode(), Parts: parts, Timings: map[string]time.Duration{}}
	defer func() {
		if retErr != nil {
			n.Down(context.Background())
		}
	}()
	begin := time.Now()
	plane, err := controlplane.Start(ctx, controlplane.Options{
		BinDir: parts.K8sBin,
		ExtraAPIServerFlags: []string{
			// kubectl logs/exec reach the kubelet by its InternalIP.
			"--kubelet-preferred-address-types=InternalIP",
		},
		ExtraControllers: []string{"daemonset-controller", "root-ca-certificate-publisher-controller"},
		// The KubeVirt step runs KubeVirt's own control plane here.
		KubeVirt: true,
	})
	if err != nil {
		return nil, err
	}
	n.Plane = plane
	n.Kubeconfig = plane.AdminKubeconfig
	if n.Kube, err = plane.AdminClient(); err != nil {
		return nil, err
	}
	n.timing("control plane", time.Since(begin))
	if err := n.serveServiceIP(); err != nil {
		return nil, err
	}
	if err := n.startNode(ctx, images); err != nil {
		return nil, err
	}
	return n, nil
}

// startNode starts containerd, imports the images and starts the kubelet,
// until the Node is Ready: the part of the bring-up every node has.
func (n *Node) startNode(ctx context.Context, images map[string]string) error {
	t := time.Now()
	if err := n.startContainerd(ctx); err != nil {
		return err
	}
	for ref, file := range images {
		if out, err := n.Ctr(ctx, "images", "import", file); err != nil {
			return fmt.Errorf("import image %s from %s: %w\n%s", ref, file, err, out)
		}
		if err := n.tagRepoDigest(ctx, ref); err != nil {
			return err
		}
	}
	n.timing("containerd + images", time.Since(t))
	t = time.Now()
	if err := n.startKubelet(ctx); err != nil {
		return err
	}
	if err := n.waitNodeReady(ctx, 2*time.Minute); err != nil {
		return err
	}
	n.timing("kubelet to node Ready", time.Since(t))
	return nil
}

func (n *Node) timing(what string, d time.Duration) {
	n.timingsMu.Lock()
	defer n.timingsMu.Unlock()
	n.Timings[what] = d
}

// serveServiceIP forwards ServiceIP:443 to the API server: pods reach
// "kubernetes.default" as in a cluster, with the server's own TLS.
func (n *Node) serveServiceIP() error {
	l, err := net.Listen("tcp", net.JoinHostPort(ServiceIP, "443"))
	if err != nil {
		return fmt.Errorf("serve the kubernetes Service IP: %w", err)
	}
	n.forward = l
	tcpforward.Serve(l, strings.TrimPrefix(n.Plane.URL, "https://"))
	return nil
}

func (n *Node) spawn(name string, env []string, bin string, args ...string) (*proc, error) {
	logDir := filepath.Join(n.Dir, "logs")
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		return nil, err
	}
	logFile := filepath.Join(logDir, name+".log")
	f, err := os.Create(logFile)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Env = append(os.Environ(), env...)
	// A killed test binary takes its node with it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := n.mnt.start(cmd); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, log: logFile, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	n.procs = append(n.procs, p)
	return p, nil
}

func (p *proc) stop(grace time.Duration) {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

func (p *proc) exited() error {
	select {
	case <-p.done:
		return fmt.Errorf("%s exited: %s\n%s", p.name, p.cmd.ProcessState, Tail(p.log, 30))
	default:
		return nil
	}
}

// Tail returns the last n lines of a file.
func Tail(path string, n int) string {
	b, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// LogFile is the log of a node component ("containerd", "kubelet").
func (n *Node) LogFile(name string) string { return filepath.Join(n.Dir, "logs", name+".log") }

// containerdSock is the socket's path inside the node's mount namespace.
const containerdSock = "/run/containerd/containerd.sock"

func (n *Node) startContainerd(ctx context.Context) error {
	cniConf := filepath.Join(n.Dir, "cni")
	if err := os.MkdirAll(cniConf, 0o755); err != nil {
		return err
	}
	// One bridge for the pods, the gateway on it; no masquerade and no
	// port mapping (no iptables): pods talk to the node and each other.
	conflist := `{"cniVersion": "1.0.0", "name": "vfnet-pods", "plugins": [{
  "type": "bridge", "bridge": "` + n.Spec.PodBridge + `", "isGateway": true, "ipMasq": false,
  "ipam": {"type": "host-local", "ranges": [[{"subnet": "` + n.Spec.PodSubnet + `"}]], "routes": [{"dst": "0.0.0.0/0"}]}
}]}`
	if err := os.WriteFile(filepath.Join(cniConf, "10-pods.conflist"), []byte(conflist), 0o644); err != nil {
		return err
	}
	cfg := fmt.Sprintf(`version = 3
root = "/var/lib/containerd"
state = "/run/containerd"
imports = []

[grpc]
  address = %q

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = %q

[plugins.'io.containerd.cri.v1.runtime']
  # Root here lacks CAP_SYS_RESOURCE: runc must not lower oom_score_adj
  # below the runtime's own.
  restrict_oom_score_adj = true
  cdi_spec_dirs = ["/var/run/cdi"]
  [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
    BinaryName = %q
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = [%q]
    conf_dir = %q

# NRI on, as containerd 2.x ships it (vfnet's failover standbys), its
# socket in this node's /run and no plugin directories outside the tier.
[plugins.'io.containerd.nri.v1.nri']
  disable = false
  socket_path = "/var/run/nri/nri.sock"
  plugin_path = %q
  plugin_config_path = %q
`, containerdSock, PauseImage, n.Parts.Runc, n.Parts.CNIBin, cniConf, filepath.Join(n.Dir, "nri", "plugins"), filepath.Join(n.Dir, "nri", "conf.d"))
	cfgFile := filepath.Join(n.Dir, "containerd.toml")
	if err := os.WriteFile(cfgFile, []byte(cfg), 0o644); err != nil {
		return err
	}
	p, err := n.spawn("containerd", []string{"PATH=" + n.Parts.NodeBin + ":/usr/sbin:/usr/bin:/sbin:/bin"},
		filepath.Join(n.Parts.NodeBin, "containerd"), "--config", cfgFile)
	if err != nil {
		return err
	}
	return wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		if err := p.exited(); err != nil {
			return false, err
		}
		_, err := n.Ctr(ctx, "version")
		return err == nil, nil
	})
}

// tagRepoDigest names an imported image also by its repository digest
// (<repository>@sha256:...), as a pull from a registry records it: a
// runtime reports that as the image's ID, and KubeVirt's migration target
// pod names the container disk by the ID the source pod's runtime reported.
func (n *Node) tagRepoDigest(ctx context.Context, ref string) error {
	ref = dockerRef(ref)
	out, err := n.Ctr(ctx, "images", "ls", "name=="+ref)
	if err != nil {
		return err
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	var digest string
	if len(lines) == 2 {
		// REF TYPE DIGEST SIZE ...
		if f := strings.Fields(lines[1]); len(f) > 2 && strings.HasPrefix(f[2], "sha256:") {
			digest = f[2]
		}
	}
	if digest == "" {
		return fmt.Errorf("image %s: no digest in ctr images ls:\n%s", ref, out)
	}
	repo := ref
	if i := strings.LastIndexByte(ref, ':'); i > strings.LastIndexByte(ref, '/') {
		repo = ref[:i]
	}
	if out, err := n.Ctr(ctx, "images", "tag", "--force", ref, repo+"@"+digest); err != nil {
		return fmt.Errorf("name image %s by its digest: %w\n%s", ref, err, out)
	}
	return nil
}

// dockerRef is an image name as containerd stores it: a name without a
// registry is Docker Hub's ("pause:1" is docker.io/library/pause:1).
func dockerRef(ref string) string {
	first, _, found := strings.Cut(ref, "/")
	switch {
	case !found:
		return "docker.io/library/" + ref
	case strings.ContainsAny(first, ".:") || first == "localhost":
		return ref
	default:
		return "docker.io/" + ref
	}
}

// Ctr runs ctr against the node's containerd in the CRI namespace (through
// the socket's path as this process sees it).
func (n *Node) Ctr(ctx context.Context, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(n.Parts.NodeBin, "ctr"), append([]string{"--address", n.Path(containerdSock), "--namespace", "k8s.io"}, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("ctr %s: %w: %s", strings.Join(args, " "), err, stderr.String())
	}
	return out, nil
}

func (n *Node) startKubelet(ctx context.Context) error {
	cfg := `apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# cgroup v1 here: allowed with a warning; no QoS or node-allocatable
# cgroups, so the kubelet creates no cgroup hierarchy of its own.
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupsPerQOS: false
enforceNodeAllocatable: ["none"]
failSwapOn: false
containerRuntimeEndpoint: unix://` + containerdSock + `
authentication:
  anonymous: {enabled: true}
  webhook: {enabled: false}
authorization: {mode: AlwaysAllow}
address: ` + n.Spec.IP + `
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: ` + strconv.Itoa(n.Spec.HealthzPort) + `
# No cluster DNS, and no resolv.conf of the host inside pods.
resolvConf: ""
# The shared machine's disk and memory are not this node's to police.
evictionHard: {"memory.available": "0%", "nodefs.available": "0%", "imagefs.available": "0%", "nodefs.inodesFree": "0%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
# Quick pod status and probe reaction for the test.
syncFrequency: 5s
nodeStatusUpdateFrequency: 5s
`
	cfgFile := filepath.Join(n.Dir, "kubelet.yaml")
	if err := os.WriteFile(cfgFile, []byte(cfg), 0o644); err != nil {
		return err
	}
	_, err := n.spawn("kubelet", []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}, filepath.Join(n.Parts.K8sBin, "kubelet"),
		"--config="+cfgFile, "--kubeconfig="+n.Kubeconfig,
		"--node-ip="+n.Spec.IP, "--hostname-override="+n.Spec.Name,
		"--v=2")
	return err
}

func (n *Node) waitNodeReady(ctx context.Context, timeout time.Duration) error {
	last, err := WaitNodeReady(ctx, n.Kube, n.Spec.Name, timeout, func() error {
		for _, p := range n.procs {
			if err := p.exited(); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("node %s not Ready (last: %s): %w\nkubelet log:\n%s", n.Spec.Name, last, err, Tail(n.LogFile("kubelet"), 40))
	}
	return nil
}

// WaitNodeReady waits until the Node name is Ready. alive is called at
// each poll: its error (the kubelet or the machine gone) ends the wait.
// last is the Ready condition as last seen.
func WaitNodeReady(ctx context.Context, kube kubernetes.Interface, name string, timeout time.Duration, alive func() error) (last string, err error) {
	err = wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		if err := alive(); err != nil {
			return false, err
		}
		node, err := kube.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			last = err.Error()
			return false, nil
		}
		for _, c := range node.Status.Conditions {
			if c.Type == corev1.NodeReady {
				last = fmt.Sprintf("%s %s: %s", c.Status, c.Reason, c.Message)
				return c.Status == corev1.ConditionTrue, nil
			}
		}
		return false, nil
	})
	return last, err
}

// AddExtendedResources advertises extended resources on the node, as a
// device plugin would (KubeVirt's virt-handler advertises
// devices.kubevirt.io/kvm, tun and vhost-net, which launcher pods request).
func (n *Node) AddExtendedResources(ctx context.Context, names []corev1.ResourceName, count int) error {
	if len(names) == 0 {
		return nil
	}
	var ops []string
	for _, r := range names {
		p := "/status/capacity/" + strings.ReplaceAll(string(r), "/", "~1")
		ops = append(ops, fmt.Sprintf(`{"op":"add","path":%q,"value":%q}`, p, strconv.Itoa(count)))
	}
	_, err := n.Kube.CoreV1().Nodes().Patch(ctx, n.Spec.Name, types.JSONPatchType, []byte("["+strings.Join(ops, ",")+"]"), metav1.PatchOptions{}, "status")
	if err != nil {
		return fmt.Errorf("advertise %v on node %s: %w", names, n.Spec.Name, err)
	}
	return wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		node, err := n.Kube.CoreV1().Nodes().Get(ctx, n.Spec.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		for _, r := range names {
			if q, ok := node.Status.Allocatable[r]; !ok || q.IsZero() {
				return false, nil
			}
		}
		return true, nil
	})
}

// Kubectl runs kubectl as admin.
func (n *Node) Kubectl(ctx context.Context, stdin io.Reader, args ...string) ([]byte, error) {
	return n.Plane.Kubectl(ctx, stdin, args...)
}

// Down stops everything Up started, newest first: the kubelet, every
// container (killed and deleted through containerd, so runc removes its
// cgroups), containerd, the service forward and the control plane. What
// escapes this (a shim whose containerd died) the parent's Sweep finds.
func (n *Node) Down(ctx context.Context) error {
	var errs []error
	logger := klog.FromContext(ctx)
	for i := len(n.others) - 1; i >= 0; i-- {
		if err := n.others[i].Down(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	var containerd *proc
	for i := len(n.procs) - 1; i >= 0; i-- {
		p := n.procs[i]
		if p.name == "containerd" {
			containerd = p
			continue
		}
		p.stop(20 * time.Second)
	}
	if containerd != nil {
		if err := containerd.exited(); err == nil {
			if err := n.removeContainers(ctx); err != nil {
				errs = append(errs, err)
			}
		}
		containerd.stop(20 * time.Second)
	}
	n.mnt.close()
	if n.forward != nil {
		n.forward.Close()
	}
	if n.Plane != nil && !n.sharedPlane {
		if err := n.Plane.Stop(); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		logger.Error(errors.Join(errs...), "Node teardown")
	}
	return errors.Join(errs...)
}

// removeContainers kills and deletes every task and container in
// containerd's CRI namespace.
func (n *Node) removeContainers(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	out, err := n.Ctr(ctx, "containers", "list", "--quiet")
	if err != nil {
		return err
	}
	var errs []error
	for _, id := range strings.Fields(string(out)) {
		_, _ = n.Ctr(ctx, "tasks", "kill", "--signal", "SIGKILL", id)
		_ = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
			_, err := n.Ctr(ctx, "tasks", "delete", id)
			return err == nil || strings.Contains(err.Error(), "not found"), nil
		})
		if _, err := n.Ctr(ctx, "containers", "delete", id); err != nil && !strings.Contains(err.Error(), "not found") {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
