//go:build kernelguest

package guest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"

	"github.com/vfnet-io/vfnet/test/kernel/layout"
)

// The guest node (the kubelet case).
const (
	// guestNode is the Node the guest's kubelet registers.
	guestNode = layout.GuestNode
	// guestPodSubnet is its CNI bridge's range; the bridge is the pods'
	// gateway, nothing is masqueraded (the pod needs no traffic).
	guestPodSubnet = "10.244.0.0/24"
	guestPodBridge = "cni0"
	// nodeRun is the node's state: containerd's socket, configuration, logs.
	nodeRun          = "/run/vfnet-node"
	guestContainerd  = "/run/containerd/containerd.sock"
	idlePodName      = "idle"
	idlePodNamespace = "default"
	// nodeSettle lets the kubelet's start-up work (its first housekeeping,
	// image and container GC, the first status updates) pass before an
	// idle window; idleWindow is the window.
	nodeSettle = 15 * time.Second
	idleWindow = 60 * time.Second
	// baselineWindow measures the guest before the node starts: what
	// the idle TCG guest costs by itself.
	baselineWindow = 30 * time.Second
	// userHZ is the unit of /proc's CPU times (USER_HZ, 100 on amd64).
	userHZ = 100
)

// ownMountNamespace names the cases the init starts in a mount namespace
// of their own, whose mounts (the node's root, cgroup2, tmpfs state) the
// machine and the later cases never see.
func ownMountNamespace(c string) bool { return layout.NeedsNode(c) }

// TestKubeletNode runs a real node in the guest (issue 33 item 3): the
// real-node tier's containerd 2.4.2, Debian's runc and CNI plugins and the
// kubelet v1.37, joined to the harness's API server, and measures what it
// costs idle under TCG, then with one pod. It asserts only behaviour (Node
// Ready, the pod Running with its container's process in the guest); the
// figures go to the console (layout.MarkKubelet) for BENCHMARKS.md.
func TestKubeletNode(t *testing.T) {
	m := guest(t)
	if m.lay.APIServer == "" {
		t.Fatal("the harness started no API server for this case")
	}
	ctx := t.Context()
	enterNodeRoot(t)
	kubeconfig, kube := nodeClient(t, m.lay.APIServer)
	var sum kubeletSummary
	sum.Baseline = measureIdle(t, "guest-baseline", baselineWindow, nil, nil)

	start := time.Now()
	containerd := startContainerd(t, ctx)
	sum.ContainerdUpS = seconds(time.Since(start))
	step := time.Now()
	images, _ := filepath.Glob(filepath.Join(layout.NodeImageDir, "*.tar"))
	if len(images) == 0 {
		t.Fatalf("no images in %s", layout.NodeImageDir)
	}
	for _, im := range images {
		if out, err := ctr(ctx, "images", "import", im); err != nil {
			t.Fatalf("import %s: %v\n%s", im, err, out)
		}
	}
	sum.ImagesS = seconds(time.Since(step))
	step = time.Now()
	kubelet := startKubelet(t, kubeconfig)
	node := waitNodeReady(t, ctx, kube, []*daemon{containerd, kubelet})
	sum.KubeletReadyS = seconds(time.Since(step))
	sum.NodeReadyS = seconds(time.Since(start))
	sum.KubeletVersion, sum.RuntimeVersion = node.Status.NodeInfo.KubeletVersion, node.Status.NodeInfo.ContainerRuntimeVersion
	t.Logf("node %s Ready %.1fs after containerd's start (kubelet %s, %s)", guestNode, sum.NodeReadyS, sum.KubeletVersion, sum.RuntimeVersion)

	time.Sleep(nodeSettle)
	sum.Idle = measureIdle(t, "kubelet-idle", idleWindow, kubelet, containerd)
	checkAlive(t, containerd, kubelet)

	step = time.Now()
	pod := runIdlePod(t, ctx, kube, []*daemon{containerd, kubelet})
	sum.PodRunningS = seconds(time.Since(step))
	pid := containerProcess(t, pod)
	t.Logf("pod %s Running after %.1fs, its container's process %d", pod.Name, sum.PodRunningS, pid)

	time.Sleep(nodeSettle)
	sum.PodIdle = measureIdle(t, "kubelet-pod-idle", idleWindow, kubelet, containerd)
	checkAlive(t, containerd, kubelet)
	if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err != nil {
		t.Errorf("the pod's container process %d is gone after the idle window: %v", pid, err)
	}

	step = time.Now()
	deletePod(t, ctx, kube, pid)
	sum.PodGoneS = seconds(time.Since(step))
	sum.GuestMemUsedMiB = guestMemUsed()
	data, err := json.Marshal(sum)
	if err != nil {
		t.Fatal(err)
	}
	console("%s %s", layout.MarkKubelet, data)
}

// kubeletSummary is the case's figures (times in seconds of guest time,
// which under TCG follows the host's clock).
type kubeletSummary struct {
	// ContainerdUpS: containerd's start until it answers; ImagesS: the
	// images' import; KubeletReadyS: the kubelet's start until the Node
	// is Ready; NodeReadyS: containerd's start until then.
	ContainerdUpS  float64 `json:"containerdUpS"`
	ImagesS        float64 `json:"imagesS"`
	KubeletReadyS  float64 `json:"kubeletReadyS"`
	NodeReadyS     float64 `json:"nodeReadyS"`
	KubeletVersion string  `json:"kubeletVersion"`
	RuntimeVersion string  `json:"runtimeVersion"`
	// Baseline is the guest before containerd starts; Idle the window
	// with the node Ready and no pod; PodIdle with the pod Running.
	Baseline idleCost `json:"baseline"`
	Idle     idleCost `json:"idle"`
	PodIdle  idleCost `json:"podIdle"`
	// PodRunningS: the pod's creation until it is Running; PodGoneS: its
	// deletion until it is gone from the API server and the guest.
	PodRunningS     float64 `json:"podRunningS"`
	PodGoneS        float64 `json:"podGoneS"`
	GuestMemUsedMiB float64 `json:"guestMemUsedMiB"`
}

// idleCost is one window's cost: CPU-seconds of guest time per process
// group, their share of one vCPU (%), the guest's busy time over both
// vCPUs, and resident memory at the window's end.
type idleCost struct {
	Seconds float64 `json:"s"`
	// Kubelet and Containerd are the daemons; Shims the containerd shims;
	// Pods the processes in the pods' cgroups (kubepods).
	KubeletCPUs     float64 `json:"kubeletCPUs"`
	ContainerdCPUs  float64 `json:"containerdCPUs"`
	ShimsCPUs       float64 `json:"shimsCPUs"`
	PodsCPUs        float64 `json:"podsCPUs"`
	KubeletPct      float64 `json:"kubeletPct"`
	ContainerdPct   float64 `json:"containerdPct"`
	GuestBusyCPUs   float64 `json:"guestBusyCPUs"`
	GuestBusyPct    float64 `json:"guestBusyPct"`
	KubeletRSSMiB   float64 `json:"kubeletRSSMiB"`
	ContainerdRSSMB float64 `json:"containerdRSSMiB"`
	ShimsRSSMiB     float64 `json:"shimsRSSMiB"`
}

func seconds(d time.Duration) float64 {
	return float64(d.Round(100*time.Millisecond)) / float64(time.Second)
}

// enterNodeRoot gives this case's mount namespace (ownMountNamespace) a
// root runc can pivot_root from, and the node's own state directories.
//
// runc's pivot_root fails with EINVAL when the current root is the
// initramfs (rootfs has no parent mount). Options: containerd's runc
// option NoPivotRoot (chroot instead: every container then sees the
// node's mounts under its root, which KubeVirt's virt-handler and
// virt-launcher, the next steps, do not expect of a node), a copy of the
// initramfs into a tmpfs with switch_root (hundreds of MiB copied under
// TCG, and every case would change), or what this does, as switch_root
// does but without the copy: a recursive bind of / moved over / and
// chrooted into. The node's root is then a mount with a parent, runc
// pivots as on any node, and only this namespace sees it.
func enterNodeRoot(t *testing.T) {
	t.Helper()
	self, _ := os.Readlink("/proc/self/ns/mnt")
	initNS, _ := os.Readlink("/proc/1/ns/mnt")
	if self == "" || self == initNS {
		t.Fatalf("the case runs in the init's mount namespace (%q): the init must start it in its own (ownMountNamespace)", self)
	}
	const newRoot = "/vfnet-node-root"
	steps := []struct {
		what string
		do   func() error
	}{
		{"make every mount private", func() error { return unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, "") }},
		{"create " + newRoot, func() error { return os.MkdirAll(newRoot, 0o755) }},
		{"bind / recursively on " + newRoot, func() error { return unix.Mount("/", newRoot, "", unix.MS_BIND|unix.MS_REC, "") }},
		{"chdir " + newRoot, func() error { return unix.Chdir(newRoot) }},
		{"move " + newRoot + " over /", func() error { return unix.Mount(newRoot, "/", "", unix.MS_MOVE, "") }},
		{"chroot", func() error { return unix.Chroot(".") }},
		{"chdir /", func() error { return unix.Chdir("/") }},
		// Shared, as on a systemd host: the kubelet's and (later)
		// virt-handler's mount propagation (HostToContainer, Bidirectional).
		{"make / rshared", func() error { return unix.Mount("", "/", "", unix.MS_REC|unix.MS_SHARED, "") }},
	}
	for _, s := range steps {
		if err := s.do(); err != nil {
			t.Fatalf("the node's root: %s: %v", s.what, err)
		}
	}
	// The node's state on tmpfs of its own (the rootfs may be a ramfs,
	// which overlayfs cannot use as an upper layer), so the later cases
	// see none of it.
	for _, dir := range []string{"/run", "/var/lib", "/var/log"} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "mode=0755"); err != nil {
			t.Fatalf("tmpfs on %s for the node: %v", dir, err)
		}
	}
	if err := unix.Mount("cgroup2", "/sys/fs/cgroup", "cgroup2", 0, ""); err != nil {
		t.Fatalf("mount cgroup v2 on /sys/fs/cgroup: %v", err)
	}
	order, err := os.ReadFile(layout.NodeModuleOrder)
	if err != nil {
		t.Fatalf("the node's modules (the harness adds them with the kubelet case): %v", err)
	}
	for _, p := range strings.Fields(string(order)) {
		if err := loadModule(p); err != nil {
			t.Fatal(err)
		}
	}
	// The kubelet mounts tmpfs volumes (a pod's service account token)
	// with mount(8): busybox's, on a PATH directory of the node's own.
	bin := filepath.Join(nodeRun, "bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, applet := range []string{"mount", "umount"} {
		if err := os.Symlink(layout.Busybox, filepath.Join(bin, applet)); err != nil {
			t.Fatal(err)
		}
	}
	// cAdvisor and the kubelet read a machine ID, the kubelet the user
	// database (its user namespace mappings), containerd /etc/hosts (the
	// base of each sandbox's); the guest has none of them unless the vm
	// case's files brought a user database.
	for file, data := range map[string]string{
		"/etc/machine-id": "0f1e2d3c4b5a69788796a5b4c3d2e1f0\n",
		"/etc/passwd":     "root:x:0:0:root:/root:/bin/sh\n",
		"/etc/group":      "root:x:0:\n",
		"/etc/hosts":      "127.0.0.1 localhost\n",
	} {
		if _, err := os.Stat(file); errors.Is(err, os.ErrNotExist) {
			if err := os.WriteFile(file, []byte(data), 0o444); err != nil {
				t.Fatalf("%s for the node: %v", file, err)
			}
		}
	}
}

// nodePath is the PATH of the node's daemons.
func nodePath() string {
	return "PATH=" + filepath.Join(nodeRun, "bin") + ":/usr/sbin:/usr/bin:/sbin:/bin"
}

// nodeKubeconfig writes the kubelet's kubeconfig: the harness's admin
// kubeconfig, whose server 127.0.0.1:<port> (the name the API server's
// certificate carries) is the host's loopback, pointed at the address the
// guest reaches it by (QEMU's user-mode network) with the certificate's
// name kept as the TLS server name.
func nodeKubeconfig(t *testing.T, apiServer string) string {
	t.Helper()
	cfg, err := clientcmd.LoadFromFile(layout.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	for name, c := range cfg.Clusters {
		u, err := url.Parse(c.Server)
		if err != nil {
			t.Fatalf("cluster %s's server %q: %v", name, c.Server, err)
		}
		c.TLSServerName = u.Hostname()
		u.Host = apiServer
		c.Server = u.String()
	}
	out := filepath.Join(nodeRun, "kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, out); err != nil {
		t.Fatal(err)
	}
	return out
}

// nodeClient writes the node's kubeconfig (nodeKubeconfig) and returns
// it with a client of the API server.
func nodeClient(t *testing.T, apiServer string) (string, kubernetes.Interface) {
	t.Helper()
	kubeconfig := nodeKubeconfig(t, apiServer)
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return kubeconfig, kube
}

// daemon is one of the node's long-running processes.
type daemon struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
}

func startDaemon(t *testing.T, name string, argv ...string) *daemon {
	t.Helper()
	logDir := filepath.Join(nodeRun, "logs")
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		t.Fatal(err)
	}
	d := &daemon{name: name, log: filepath.Join(logDir, name+".log"), done: make(chan struct{})}
	f, err := os.Create(d.log)
	if err != nil {
		t.Fatal(err)
	}
	d.cmd = exec.Command(argv[0], argv[1:]...)
	d.cmd.Stdout, d.cmd.Stderr = f, f
	d.cmd.Env = []string{nodePath(), "HOME=/root", "TMPDIR=/tmp"}
	if err := d.cmd.Start(); err != nil {
		f.Close()
		t.Fatalf("start %s: %v", name, err)
	}
	go func() {
		_ = d.cmd.Wait()
		f.Close()
		close(d.done)
	}()
	t.Cleanup(func() {
		d.stop(30 * time.Second)
		if t.Failed() {
			t.Logf("%s's log (last lines):\n%s", name, tailFile(d.log, 40))
		}
	})
	return d
}

func (d *daemon) exited() error {
	select {
	case <-d.done:
		return fmt.Errorf("%s exited: %s\n%s", d.name, d.cmd.ProcessState, tailFile(d.log, 30))
	default:
		return nil
	}
}

func (d *daemon) stop(grace time.Duration) {
	select {
	case <-d.done:
		return
	default:
	}
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.done:
	case <-time.After(grace):
		_ = d.cmd.Process.Kill()
		<-d.done
	}
}

func checkAlive(t *testing.T, ds ...*daemon) {
	t.Helper()
	for _, d := range ds {
		if err := d.exited(); err != nil {
			t.Fatal(err)
		}
	}
}

func tailFile(path string, n int) string {
	b, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// startContainerd writes containerd's configuration (the real-node tier's,
// test/node, for this guest: root here has every capability, so runc may
// set oom_score_adj) and the CNI bridge, starts it and waits until it
// answers.
func startContainerd(t *testing.T, ctx context.Context) *daemon {
	t.Helper()
	cniConf := filepath.Join(nodeRun, "cni")
	if err := os.MkdirAll(cniConf, 0o755); err != nil {
		t.Fatal(err)
	}
	conflist := `{"cniVersion": "1.0.0", "name": "vfnet-pods", "plugins": [{
  "type": "bridge", "bridge": "` + guestPodBridge + `", "isGateway": true, "ipMasq": false,
  "ipam": {"type": "host-local", "ranges": [[{"subnet": "` + guestPodSubnet + `"}]], "routes": [{"dst": "0.0.0.0/0"}]}
}]}`
	if err := os.WriteFile(filepath.Join(cniConf, "10-pods.conflist"), []byte(conflist), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := fmt.Sprintf(`version = 3
root = "/var/lib/containerd"
state = "/run/containerd"

[grpc]
  address = %q

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = %q

[plugins.'io.containerd.cri.v1.runtime']
  cdi_spec_dirs = ["/var/run/cdi"]
  [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
    BinaryName = %q
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = [%q]
    conf_dir = %q

[plugins.'io.containerd.nri.v1.nri']
  disable = false
  socket_path = "/var/run/nri/nri.sock"
  plugin_path = "/run/vfnet-node/nri/plugins"
  plugin_config_path = "/run/vfnet-node/nri/conf.d"
`, guestContainerd, layout.PauseImage, layout.Runc, layout.CNIBinDir, cniConf)
	cfgFile := filepath.Join(nodeRun, "containerd.toml")
	if err := os.WriteFile(cfgFile, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	d := startDaemon(t, "containerd", layout.Containerd, "--config", cfgFile)
	t.Cleanup(func() { removeContainers(t) })
	deadline := time.Now().Add(3 * time.Minute)
	for {
		if err := d.exited(); err != nil {
			t.Fatal(err)
		}
		if _, err := ctr(ctx, "version"); err == nil {
			return d
		}
		if time.Now().After(deadline) {
			t.Fatalf("containerd does not answer after 3m:\n%s", tailFile(d.log, 30))
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// ctr runs ctr against the node's containerd in the CRI namespace.
func ctr(ctx context.Context, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, layout.Ctr, append([]string{"--address", guestContainerd, "--namespace", "k8s.io"}, args...)...)
	cmd.Env = []string{nodePath()}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("ctr %s: %w", strings.Join(args, " "), err)
	}
	return out, nil
}

// removeContainers kills and deletes what containerd still runs (a failed
// case's pod), before containerd stops: its shims would outlive it.
func removeContainers(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := ctr(ctx, "containers", "list", "--quiet")
	if err != nil {
		return
	}
	for _, id := range strings.Fields(string(out)) {
		_, _ = ctr(ctx, "tasks", "kill", "--signal", "SIGKILL", id)
		for i := 0; i < 50; i++ {
			if _, err := ctr(ctx, "tasks", "delete", id); err == nil || strings.Contains(err.Error(), "not found") {
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
		if out, err := ctr(ctx, "containers", "delete", id); err != nil {
			t.Logf("container %s left: %v\n%s", id, err, out)
		}
	}
}

// startKubelet starts the kubelet with a production-like configuration:
// cgroup v2 with the cgroupfs driver (no systemd in the guest), QoS
// cgroups and node-allocatable enforcement on, default sync and status
// periods (the idle cost measured is a default kubelet's); only the
// evictions are off (the guest's memory is not the point) and the node's
// API is open to the test.
func startKubelet(t *testing.T, kubeconfig string) *daemon {
	t.Helper()
	cfg := `apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: cgroupfs
failSwapOn: false
containerRuntimeEndpoint: unix://` + guestContainerd + `
authentication:
  anonymous: {enabled: true}
  webhook: {enabled: false}
authorization: {mode: AlwaysAllow}
readOnlyPort: 0
# No cluster DNS, and no resolv.conf of the guest inside pods.
resolvConf: ""
evictionHard: {"memory.available": "0%", "nodefs.available": "0%", "imagefs.available": "0%", "nodefs.inodesFree": "0%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
`
	cfgFile := filepath.Join(nodeRun, "kubelet.yaml")
	if err := os.WriteFile(cfgFile, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	addr, _, _ := strings.Cut(layout.GuestAddr, "/")
	return startDaemon(t, "kubelet", layout.Kubelet, "--config="+cfgFile, "--kubeconfig="+kubeconfig,
		"--node-ip="+addr, "--hostname-override="+guestNode, "--v=2")
}

func waitNodeReady(t *testing.T, ctx context.Context, kube kubernetes.Interface, ds []*daemon) *corev1.Node {
	t.Helper()
	var last string
	deadline := time.Now().Add(5 * time.Minute)
	for {
		checkAlive(t, ds...)
		node, err := kube.CoreV1().Nodes().Get(ctx, guestNode, metav1.GetOptions{})
		if err != nil {
			last = err.Error()
		} else {
			for _, c := range node.Status.Conditions {
				if c.Type == corev1.NodeReady {
					last = fmt.Sprintf("%s: %s: %s", c.Status, c.Reason, c.Message)
					if c.Status == corev1.ConditionTrue {
						return node
					}
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("node %s not Ready after 5m (last: %s)", guestNode, last)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// runIdlePod creates a pod whose one container sleeps (busybox, from the
// imported image; the sandbox is the pause image) and waits until it is
// Running with its container running.
func runIdlePod(t *testing.T, ctx context.Context, kube kubernetes.Interface, ds []*daemon) *corev1.Pod {
	t.Helper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: idlePodName, Namespace: idlePodNamespace},
		Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: ptr.To[int64](2),
			Containers: []corev1.Container{{
				Name: "sleep", Image: layout.BusyboxImage, ImagePullPolicy: corev1.PullNever,
				Command: []string{"/bin/busybox", "sleep", "100000"},
			}},
		},
	}
	if _, err := kube.CoreV1().Pods(pod.Namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create pod %s: %v", pod.Name, err)
	}
	var last string
	deadline := time.Now().Add(3 * time.Minute)
	for {
		checkAlive(t, ds...)
		p, err := kube.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			last = err.Error()
		} else {
			last = fmt.Sprintf("phase %s, node %q, conditions %v, containers %v", p.Status.Phase, p.Spec.NodeName, p.Status.Conditions, p.Status.ContainerStatuses)
			if p.Status.Phase == corev1.PodRunning && len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].State.Running != nil {
				if p.Spec.NodeName != guestNode {
					t.Fatalf("pod %s runs on %q, not the guest's node %s", p.Name, p.Spec.NodeName, guestNode)
				}
				return p
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("pod %s not Running after 3m (last: %s)", pod.Name, last)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// containerProcess finds the pod's container process in the guest: the
// process in the container's cgroup (the ID the kubelet reports), which
// must be busybox's sleep in a PID namespace of its own.
func containerProcess(t *testing.T, pod *corev1.Pod) int {
	t.Helper()
	_, id, ok := strings.Cut(pod.Status.ContainerStatuses[0].ContainerID, "://")
	if !ok || id == "" {
		t.Fatalf("pod %s reports container ID %q", pod.Name, pod.Status.ContainerStatuses[0].ContainerID)
	}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cg, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
		if !strings.Contains(string(cg), id) {
			continue
		}
		cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		argv := strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00")
		if strings.Join(argv, " ") != "/bin/busybox sleep 100000" {
			t.Fatalf("process %d in container %s runs %q, not the pod's command", pid, id, argv)
		}
		own, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", pid))
		mine, _ := os.Readlink("/proc/self/ns/pid")
		if own == "" || own == mine {
			t.Fatalf("process %d of container %s is in PID namespace %q, the node's is %q: want its own", pid, id, own, mine)
		}
		return pid
	}
	t.Fatalf("no process in the guest is in container %s's cgroup (pod %s)", id, pod.Name)
	return 0
}

// deletePod deletes the pod and waits until the API server has forgotten
// it and its process pid is gone from the guest.
func deletePod(t *testing.T, ctx context.Context, kube kubernetes.Interface, pid int) {
	t.Helper()
	if err := kube.CoreV1().Pods(idlePodNamespace).Delete(ctx, idlePodName, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("delete pod %s: %v", idlePodName, err)
	}
	deadline := time.Now().Add(3 * time.Minute)
	for {
		_, err := kube.CoreV1().Pods(idlePodNamespace).Get(ctx, idlePodName, metav1.GetOptions{})
		_, perr := os.Stat(fmt.Sprintf("/proc/%d", pid))
		if apierrors.IsNotFound(err) && errors.Is(perr, os.ErrNotExist) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("pod %s not gone 3m after its deletion (API: %v, process %d: %v)", idlePodName, err, pid, perr)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// procSample is one process's cumulated CPU time (ticks) and RSS.
type procSample struct {
	comm   string
	ticks  int64
	rssKiB int64
	pods   bool // in the pods' cgroups
}

func sampleProcs() map[int]procSample {
	out := map[int]procSample{}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		s := string(stat)
		lp, rp := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if lp < 0 || rp < lp {
			continue
		}
		f := strings.Fields(s[rp+1:])
		if len(f) < 22 {
			continue
		}
		// utime and stime are fields 14 and 15 of the line, 12 and 13
		// after the name; rss (pages) is field 24.
		u, _ := strconv.ParseInt(f[11], 10, 64)
		st, _ := strconv.ParseInt(f[12], 10, 64)
		rss, _ := strconv.ParseInt(f[21], 10, 64)
		cg, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
		out[pid] = procSample{comm: s[lp+1 : rp], ticks: u + st, rssKiB: rss * int64(os.Getpagesize()) / 1024,
			pods: strings.Contains(string(cg), "/kubepods")}
	}
	return out
}

// guestCPU is the guest's busy and total time over all its CPUs (/proc/stat).
func guestCPU() (busy, total int64) {
	data, _ := os.ReadFile("/proc/stat")
	line, _, _ := strings.Cut(string(data), "\n")
	f := strings.Fields(line) // cpu user nice system idle iowait irq softirq steal ...
	for i := 1; i < len(f) && i <= 8; i++ {
		n, _ := strconv.ParseInt(f[i], 10, 64)
		total += n
		if i != 4 && i != 5 {
			busy += n
		}
	}
	return busy, total
}

// measureIdle measures one idle window of length window: the CPU the
// node's processes (none yet when nil) and the guest used in it, their
// memory at its end. It opens and closes the window on the console
// (layout.MarkWindow), where the harness reads QEMU's own CPU time.
func measureIdle(t *testing.T, name string, window time.Duration, kubelet, containerd *daemon) idleCost {
	t.Helper()
	before := sampleProcs()
	busy0, total0 := guestCPU()
	console("%s %s BEGIN", layout.MarkWindow, name)
	began := time.Now()
	time.Sleep(window)
	after := sampleProcs()
	busy1, total1 := guestCPU()
	took := time.Since(began)
	console("%s %s END", layout.MarkWindow, name)

	c := idleCost{Seconds: seconds(took)}
	delta := func(pid int) float64 {
		d := after[pid].ticks - before[pid].ticks // a new process started at 0
		return float64(d) / userHZ
	}
	if kubelet != nil && containerd != nil {
		kpid, cpid := kubelet.cmd.Process.Pid, containerd.cmd.Process.Pid
		c.KubeletCPUs, c.ContainerdCPUs = delta(kpid), delta(cpid)
		c.KubeletRSSMiB, c.ContainerdRSSMB = float64(after[kpid].rssKiB)/1024, float64(after[cpid].rssKiB)/1024
	}
	for pid, s := range after {
		switch {
		case s.comm == "containerd-shim":
			c.ShimsCPUs += delta(pid)
			c.ShimsRSSMiB += float64(s.rssKiB) / 1024
		case s.pods:
			c.PodsCPUs += delta(pid)
		}
	}
	c.KubeletPct = round1(100 * c.KubeletCPUs / took.Seconds())
	c.ContainerdPct = round1(100 * c.ContainerdCPUs / took.Seconds())
	c.GuestBusyCPUs = float64(busy1-busy0) / userHZ
	if total1 > total0 {
		c.GuestBusyPct = round1(100 * float64(busy1-busy0) / float64(total1-total0))
	}
	c.KubeletRSSMiB, c.ContainerdRSSMB, c.ShimsRSSMiB = round1(c.KubeletRSSMiB), round1(c.ContainerdRSSMB), round1(c.ShimsRSSMiB)
	t.Logf("%s: %+v", name, c)
	return c
}

func round1(f float64) float64 { return float64(int64(f*10+0.5)) / 10 }

// guestMemUsed is the guest's MemTotal - MemAvailable, MiB.
func guestMemUsed() float64 {
	data, _ := os.ReadFile("/proc/meminfo")
	var total, avail int64
	for _, l := range strings.Split(string(data), "\n") {
		f := strings.Fields(l)
		if len(f) < 2 {
			continue
		}
		n, _ := strconv.ParseInt(f[1], 10, 64)
		switch f[0] {
		case "MemTotal:":
			total = n
		case "MemAvailable:":
			avail = n
		}
	}
	return round1(float64(total-avail) / 1024)
}
