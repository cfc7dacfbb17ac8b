package flow

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"github.com/vfnet-io/vfnet/pkg/contract/metadata"
	"github.com/vfnet-io/vfnet/test/lib/controlplane"
	"github.com/vfnet-io/vfnet/test/lib/kubeletsim"
	"github.com/vfnet-io/vfnet/test/lib/simhost"
)

// Node is one simulated node: a synthetic host, the kubelet stand-in and the
// real driver process (vfnet-driver-sim) running under the DaemonSet's ServiceAccount.
type Node struct {
	env  *Env
	Name string
	// Dir holds everything of the node (short: sockets live below it).
	Dir string
	// Host is the simulated machine (sysfs tree, /dev, VF link state).
	Host         *simhost.Host
	NodeConfig   string // path of the node-config file the driver reads
	RegistrarDir string
	PluginDir    string
	CDIDir       string
	PodsDir      string
	Kubelet      *kubeletsim.Kubelet
	// DriverPod is the pod the DaemonSet controller would create on this
	// node, made from the applied DaemonSet's template. The driver's token
	// is bound to it.
	DriverPod *corev1.Pod

	// healthAddr is where this node's driver serves its probes.
	healthAddr string
	extraArgs  []string
	apiServer  *APIServer

	cancelKubelet context.CancelFunc
	kubeletDone   chan struct{}

	mu       sync.Mutex
	driver   *exec.Cmd
	drvDone  chan struct{}
	drvErr   error
	drvLog   string
	restarts int
}

// NodeOptions describe a node to add.
type NodeOptions struct {
	Name string
	// Spec is the simulated hardware.
	Spec simhost.Spec
	// NodeConfig is the node-config YAML; empty: the sample from manifests/
	// (the ConfigMap data the DaemonSet mounts).
	NodeConfig string
	// ExtraDriverArgs are appended to the DaemonSet's driver flags (a later
	// flag wins), e.g. a short --rescan-interval.
	ExtraDriverArgs []string
	// DriverAPIServer, if set, is the API server the driver's kubeconfig
	// names instead of the plane's: a test's proxy in front of it. The
	// driver's token, and so its RBAC, stay the real ones.
	DriverAPIServer *APIServer
}

// APIServer is an https endpoint and the PEM CA bundle that verifies it.
type APIServer struct {
	URL    string
	CAData []byte
}

// AddNode builds the simulated host, creates the Node and the driver pod,
// and starts the kubelet stand-in. StartDriver starts the driver.
func (e *Env) AddNode(ctx context.Context, o NodeOptions) (_ *Node, retErr error) {
	dir := filepath.Join(e.Dir, o.Name)
	n := &Node{env: e, Name: o.Name, Dir: dir,
		RegistrarDir: filepath.Join(dir, "reg"), PluginDir: filepath.Join(dir, "plugin"),
		CDIDir: filepath.Join(dir, "cdi"), PodsDir: filepath.Join(dir, "pods"),
		NodeConfig: filepath.Join(dir, "node-config.yaml"), extraArgs: o.ExtraDriverArgs, apiServer: o.DriverAPIServer}
	for _, d := range []string{n.RegistrarDir, n.PluginDir, n.CDIDir, n.PodsDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
	}
	defer func() {
		if retErr != nil {
			n.Close()
		}
	}()
	host, err := simhost.Build(filepath.Join(dir, "host"), o.Spec)
	if err != nil {
		return nil, fmt.Errorf("node %s: build simulated host: %w", o.Name, err)
	}
	n.Host = host
	cfg := o.NodeConfig
	if cfg == "" {
		cm, err := e.Client.CoreV1().ConfigMaps(Namespace).Get(ctx, "vfnet-node-config", metav1.GetOptions{})
		if err != nil {
			return nil, fmt.Errorf("node %s: read the node-config ConfigMap the DaemonSet mounts: %w", o.Name, err)
		}
		cfg = cm.Data["node-config.yaml"]
	}
	if err := os.WriteFile(n.NodeConfig, []byte(cfg), 0o644); err != nil {
		return nil, err
	}
	k, err := kubeletsim.New(kubeletsim.Options{
		NodeName: o.Name, Client: e.Client, RegistrarDir: n.RegistrarDir,
		CDIDirs: []string{n.CDIDir}, PodsDir: n.PodsDir,
	})
	if err != nil {
		return nil, err
	}
	n.Kubelet = k
	if err := k.CreateNode(ctx); err != nil {
		return nil, err
	}
	kctx, cancel := context.WithCancel(klog.NewContext(context.WithoutCancel(ctx), klog.FromContext(ctx).WithName(o.Name)))
	n.cancelKubelet, n.kubeletDone = cancel, make(chan struct{})
	go func() {
		defer close(n.kubeletDone)
		if err := k.Run(kctx); err != nil {
			klog.FromContext(kctx).Error(err, "Simulated kubelet stopped")
		}
	}()
	if err := n.createDriverPod(ctx); err != nil {
		return nil, err
	}
	e.nodes = append(e.nodes, n)
	return n, nil
}

// createDriverPod creates this node's driver pod (see CreateDriverPod).
func (n *Node) createDriverPod(ctx context.Context) error {
	pod, err := n.env.CreateDriverPod(ctx, n.Name)
	if err != nil {
		return err
	}
	n.DriverPod = pod
	return nil
}

// CreateDriverPod creates the pod the DaemonSet controller would create on
// node (from the applied template, bound to the node, owned by the
// DaemonSet), so a driver's token is a real pod-bound projected token.
func (e *Env) CreateDriverPod(ctx context.Context, node string) (*corev1.Pod, error) {
	ds, err := e.Client.AppsV1().DaemonSets(Namespace).Get(ctx, DaemonSet, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("node %s: get DaemonSet %s/%s (apply manifests first): %w", node, Namespace, DaemonSet, err)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: DaemonSet + "-" + node, Namespace: Namespace,
			Labels: ds.Spec.Template.Labels, Annotations: ds.Spec.Template.Annotations,
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: "apps/v1", Kind: "DaemonSet", Name: ds.Name, UID: ds.UID,
				Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true),
			}},
		},
		Spec: *ds.Spec.Template.Spec.DeepCopy(),
	}
	pod.Spec.NodeName = node
	created, err := e.Client.CoreV1().Pods(Namespace).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("node %s: create driver pod from the DaemonSet template: %w", node, err)
	}
	return created, nil
}

// DriverToken returns a fresh token of the driver's ServiceAccount bound to
// the driver pod (it carries this node's name).
func (n *Node) DriverToken(ctx context.Context) (string, error) {
	return controlplane.PodBoundToken(ctx, n.env.Client, n.DriverPod, time.Hour)
}

// DriverArgs is the vfnet-driver command line for this node: the driver
// container's args from the applied DaemonSet, with $(NODE_NAME) and
// $(POD_UID) expanded as the kubelet does, followed by overrides that point
// the host paths at the simulation (the flag package keeps the last value).
func (n *Node) DriverArgs(kubeconfig string) []string {
	var args []string
	for _, c := range n.DriverPod.Spec.Containers {
		if c.Name != "driver" {
			continue
		}
		for _, a := range c.Args {
			a = strings.ReplaceAll(a, "$(NODE_NAME)", n.Name)
			a = strings.ReplaceAll(a, "$(POD_UID)", string(n.DriverPod.UID))
			args = append(args, a)
		}
	}
	return append(append(args,
		"--simulate",
		"--kubeconfig="+kubeconfig,
		"--sysfs-root="+n.Host.Root(),
		"--dev-root="+n.Host.DevRoot(),
		"--node-config="+n.NodeConfig,
		"--registrar-dir="+n.RegistrarDir,
		"--plugin-dir="+n.PluginDir,
		"--cdi-dir="+n.CDIDir,
		"--kubelet-pods-dir="+n.PodsDir,
		"--health-addr="+n.healthAddr,
		"-v=4",
	), n.extraArgs...)
}

// checkProbes asks the driver's health server the DaemonSet's liveness and
// readiness probe paths, as the kubelet would.
func (n *Node) checkProbes(ctx context.Context) error {
	for _, c := range n.DriverPod.Spec.Containers {
		for what, p := range map[string]*corev1.Probe{"liveness": c.LivenessProbe, "readiness": c.ReadinessProbe} {
			if p == nil || p.HTTPGet == nil {
				continue
			}
			url := "http://" + n.healthAddr + p.HTTPGet.Path
			err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 20*time.Second, true, func(ctx context.Context) (bool, error) {
				req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
				if err != nil {
					return false, err
				}
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					return false, nil
				}
				resp.Body.Close()
				return resp.StatusCode == http.StatusOK, nil
			})
			if err != nil {
				return fmt.Errorf("node %s: DaemonSet %s probe GET %s did not answer 200: %w", n.Name, what, url, err)
			}
		}
	}
	return nil
}

// StartDriver starts vfnet-driver with a kubeconfig for the driver pod's
// token and waits until the kubelet stand-in registered it.
func (n *Node) StartDriver(ctx context.Context) error {
	bin, err := n.env.BinDir(ctx)
	if err != nil {
		return err
	}
	token, err := n.DriverToken(ctx)
	if err != nil {
		return err
	}
	kubeconfig := filepath.Join(n.Dir, "driver.kubeconfig")
	if n.apiServer != nil {
		err = writeKubeconfig(kubeconfig, n.apiServer, token)
	} else {
		err = n.env.Plane.WriteKubeconfig(kubeconfig, token)
	}
	if err != nil {
		return err
	}
	if n.healthAddr == "" {
		port, err := freePort()
		if err != nil {
			return err
		}
		n.healthAddr = fmt.Sprintf("127.0.0.1:%d", port)
	}
	n.mu.Lock()
	if n.driver != nil {
		n.mu.Unlock()
		return fmt.Errorf("node %s: driver already running", n.Name)
	}
	gen := n.Kubelet.Registrations(DriverName)
	n.drvLog = filepath.Join(n.Dir, fmt.Sprintf("driver-%d.log", n.restarts))
	n.restarts++
	logf, err := os.Create(n.drvLog)
	if err != nil {
		n.mu.Unlock()
		return err
	}
	cmd := exec.Command(filepath.Join(bin, "vfnet-driver-sim"), n.DriverArgs(kubeconfig)...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = append(os.Environ(), "NODE_NAME="+n.Name, "POD_UID="+string(n.DriverPod.UID))
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		n.mu.Unlock()
		return fmt.Errorf("node %s: start vfnet-driver: %w", n.Name, err)
	}
	logf.Close()
	done := make(chan struct{})
	n.driver, n.drvDone = cmd, done
	go func() {
		err := cmd.Wait()
		n.mu.Lock()
		n.drvErr = err
		n.mu.Unlock()
		close(done)
	}()
	n.mu.Unlock()

	wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	regErr := make(chan error, 1)
	go func() { regErr <- n.Kubelet.WaitRegistered(wctx, DriverName, gen+1) }()
	select {
	case err := <-regErr:
		if err != nil {
			return fmt.Errorf("%w\n--- vfnet-driver log ---\n%s", err, n.DriverLog(4000))
		}
		return n.checkProbes(ctx)
	case <-done:
		return fmt.Errorf("node %s: vfnet-driver exited during start: %v\n--- vfnet-driver log ---\n%s", n.Name, n.drvErr, n.DriverLog(4000))
	}
}

// StopDriver stops the driver with SIGTERM (a DaemonSet pod being replaced)
// or SIGKILL (a crash) and waits for it.
func (n *Node) StopDriver(kill bool) error {
	n.mu.Lock()
	cmd, done := n.driver, n.drvDone
	n.mu.Unlock()
	if cmd == nil {
		return nil
	}
	sig := syscall.SIGTERM
	if kill {
		sig = syscall.SIGKILL
	}
	_ = cmd.Process.Signal(sig)
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		_ = cmd.Process.Kill()
		<-done
	}
	n.mu.Lock()
	n.driver = nil
	err := n.drvErr
	n.mu.Unlock()
	var exit *exec.ExitError
	if !kill && err != nil && !(errors.As(err, &exit) && exit.ExitCode() == 0) {
		return fmt.Errorf("node %s: vfnet-driver did not stop cleanly on SIGTERM: %v\n%s", n.Name, err, n.DriverLog(3000))
	}
	return nil
}

// writeKubeconfig writes a kubeconfig at path that reaches api with token.
func writeKubeconfig(path string, api *APIServer, token string) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["vfnet"] = &clientcmdapi.Cluster{Server: api.URL, CertificateAuthorityData: api.CAData}
	cfg.AuthInfos["user"] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts["vfnet"] = &clientcmdapi.Context{Cluster: "vfnet", AuthInfo: "user"}
	cfg.CurrentContext = "vfnet"
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		return fmt.Errorf("write kubeconfig %s for API server %s: %w", path, api.URL, err)
	}
	return nil
}

// DriverRunning returns nil while the driver started last still runs, and
// otherwise how it ended with its log's tail: a test that expects the
// driver to ride out a failure checks it.
func (n *Node) DriverRunning() error {
	n.mu.Lock()
	cmd, done, log := n.driver, n.drvDone, n.drvLog
	n.mu.Unlock()
	if cmd == nil {
		return fmt.Errorf("node %s: no driver started (or it was stopped)", n.Name)
	}
	select {
	case <-done:
	default:
		return nil
	}
	n.mu.Lock()
	err := n.drvErr
	n.mu.Unlock()
	data, _ := os.ReadFile(log)
	if len(data) > 4000 {
		data = data[len(data)-4000:]
	}
	return fmt.Errorf("node %s: vfnet-driver (pid %d) exited: %v\n--- vfnet-driver log ---\n%s", n.Name, cmd.Process.Pid, err, data)
}

// MetricsURL is the driver's Prometheus endpoint (on its health server, as
// the DaemonSet's port "health" serves it); empty before StartDriver.
func (n *Node) MetricsURL() string {
	if n.healthAddr == "" {
		return ""
	}
	return "http://" + n.healthAddr + "/metrics"
}

// DriverLog returns the last max bytes of the current driver log.
func (n *Node) DriverLog(max int) string {
	n.mu.Lock()
	p := n.drvLog
	n.mu.Unlock()
	data, err := os.ReadFile(p)
	if err != nil {
		return ""
	}
	if len(data) > max {
		data = data[len(data)-max:]
	}
	return string(data)
}

// Close stops the driver and the kubelet stand-in.
func (n *Node) Close() error {
	err := n.StopDriver(false)
	if n.cancelKubelet != nil {
		n.cancelKubelet()
		<-n.kubeletDone
	}
	if n.Host != nil {
		n.Host.Close()
	}
	return err
}

// ContainerMetadataRoot is the directory that stands for
// /var/run/kubernetes.io/dra-device-attributes in a container of pod uid.
func (n *Node) ContainerMetadataRoot(uid types.UID, container string) string {
	return filepath.Join(n.Kubelet.ContainerRoot(uid, container), strings.TrimPrefix(metadata.DefaultRoot, "/"))
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// ForbiddenLogLines returns the lines of every driver run's log on this
// node in which the API server refused the driver something: the RBAC in
// manifests/ must allow all the driver does.
func (n *Node) ForbiddenLogLines() []string {
	logs, _ := filepath.Glob(filepath.Join(n.Dir, "driver-*.log"))
	var out []string
	for _, l := range logs {
		data, err := os.ReadFile(l)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(data), "\n") {
			if strings.Contains(line, "is forbidden") || strings.Contains(line, "Forbidden") {
				out = append(out, filepath.Base(l)+": "+line)
			}
		}
	}
	return out
}
