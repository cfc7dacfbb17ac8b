// Package scale measures vfnet at cluster size on a real control plane
// (test/controlplane): many simulated nodes publish their VFs through the
// driver's own publishing path, then the real kube-scheduler places pods
// that each claim a VF from a ResourceClaimTemplate, and, in the same run,
// the same pods without a claim, so the cost of vfnet's claims is a ratio
// that does not depend on how loaded the machine is.
//
// Each simulated node runs what vfnet-driver runs to publish: the rescan
// loop (driver/slices) discovering a simulated host (pkg/simhost) with the
// node configuration from manifests/, handing the pool to the real
// kubeletplugin helper (driver/plugin), whose resourceslice controller
// writes the slices with the node's own client: a token bound to the node's
// driver pod (so the admission policy from manifests/ checks every write),
// client-go's default rate limits as in the driver, and its own connection
// as a separate process would have. Nodes are Node objects without a
// kubelet; a pod counts as scheduled when the scheduler bound it
// (spec.nodeName set), which for a pod with a claim means the claim was
// allocated first.
//
// All nodes share one simulated host, read once: the hardware is identical,
// and on a real cluster each node reads its own sysfs on its own CPU in
// parallel, where here 100 discoveries would queue for the same two cores
// as the API server and be measured as publishing time. Everything after
// reading sysfs (selection by the node configuration, attributes, slice
// chunking, the helper, the resourceslice controller) runs per node.
package scale

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"github.com/vfnet-io/vfnet/driver/plugin"
	"github.com/vfnet-io/vfnet/driver/slices"
	"github.com/vfnet-io/vfnet/pkg/nodeconfig"
	"github.com/vfnet-io/vfnet/pkg/simhost"
	"github.com/vfnet-io/vfnet/pkg/sysfs"
	"github.com/vfnet-io/vfnet/test/controlplane"
	"github.com/vfnet-io/vfnet/test/flow"
)

// Names from manifests/ the run relies on.
const (
	// ClaimTemplate is manifests/examples/resourceclaimtemplate.yaml's
	// template (one VF of DeviceClass vfnet-physnet-a, VLAN 100).
	ClaimTemplate = "vf-physnet-a-vlan100"
	// ClaimNamespace is where that manifest puts the template.
	ClaimNamespace = "default"
	// PlainNamespace holds the pods without claims.
	PlainNamespace = "scale-plain"
	// Network is what the DeviceClass of ClaimTemplate selects.
	Network = "physnet-a"
)

// Options size a run. Zero fields take the defaults noted.
type Options struct {
	// Nodes is the number of simulated nodes (default 3).
	Nodes int
	// VFsPerPF: every node is a dual-port E810 (enp59s0f0 cabled to
	// physnet-a, enp59s0f1 to physnet-b, as manifests/node-config.yaml
	// says) with this many VFs per port (default 4; 128 gives 256 VFs).
	VFsPerPF int
	// Pods is the number of pods per phase (default 10).
	Pods int
	// CreateWorkers create pods concurrently (default 32), with a client
	// without rate limit, so creating pods is never what is measured.
	CreateWorkers int
	// Timeout bounds each wait (publishing, each phase); default 10 min.
	Timeout time.Duration
	// Dir holds the simulated host and the plugins' sockets; it must be
	// short (unix socket paths). Default: flow.WorkDir().
	Dir string
	// HostDir holds the simulated host's sysfs tree (default below Dir;
	// a tmpfs is much faster).
	HostDir string
	// Progress receives a line per step (nil: discarded).
	Progress io.Writer
}

func (o *Options) defaults() {
	if o.Nodes == 0 {
		o.Nodes = 3
	}
	if o.VFsPerPF == 0 {
		o.VFsPerPF = 4
	}
	if o.Pods == 0 {
		o.Pods = 10
	}
	if o.CreateWorkers == 0 {
		o.CreateWorkers = 32
	}
	if o.Timeout == 0 {
		o.Timeout = 10 * time.Minute
	}
}

// Result is what one run measured.
type Result struct {
	Nodes, Devices, Slices int
	// Publish is from starting every node's publisher until the API server
	// served all slices of all pools.
	Publish time.Duration
	// APIServerRSS is kube-apiserver's resident memory (bytes) after
	// publishing, APIServerRSSBefore just before.
	APIServerRSS, APIServerRSSBefore uint64
	// PublishCPU is the CPU time each component spent while publishing
	// ("vfnet" is this process: discovery, the helpers, the harness).
	PublishCPU map[string]time.Duration
	// WithClaims and WithoutClaims are the two scheduling phases.
	WithClaims, WithoutClaims Phase
}

// Phase is one batch of pods, created while kube-scheduler and
// kube-controller-manager were paused; Duration runs from resuming them
// until the last pod is bound.
type Phase struct {
	Pods     int
	Duration time.Duration
	// Created is how long creating the pods took (not part of Duration:
	// kube-scheduler and kube-controller-manager were paused meanwhile).
	Created time.Duration
	// CPU is the CPU time each component spent during the phase.
	CPU map[string]time.Duration
}

// PodsPerSecond is the phase's scheduling throughput.
func (p Phase) PodsPerSecond() float64 {
	if p.Duration <= 0 {
		return 0
	}
	return float64(p.Pods) / p.Duration.Seconds()
}

// Ratio is pods/s with claims over pods/s without, from the same run.
func (r Result) Ratio() float64 {
	if r.WithoutClaims.PodsPerSecond() == 0 {
		return 0
	}
	return r.WithClaims.PodsPerSecond() / r.WithoutClaims.PodsPerSecond()
}

// Host is the simulated hardware of every node.
func Host(vfsPerPF int) simhost.Spec {
	pf0 := simhost.E810PF("0000:3b:00.0", "enp59s0f0", vfsPerPF)
	pf1 := simhost.E810PF("0000:3b:00.1", "enp59s0f1", vfsPerPF)
	pf0.TotalVFs, pf1.TotalVFs = max(pf0.TotalVFs, vfsPerPF), max(pf1.TotalVFs, vfsPerPF)
	// PF1's routing ID is PF0's + 1: its VFs start after PF0's possible ones.
	pf1.VFOffset = 16 + pf0.TotalVFs - 1
	return simhost.Spec{PFs: []simhost.PFSpec{pf0, pf1}}
}

// Components are the control-plane processes whose CPU time a run reports
// (besides "vfnet", this process).
func Components() []string {
	return []string{"kube-apiserver", "etcd", "kube-scheduler", "kube-controller-manager"}
}

// ControlPlaneFlags raise the client rate limits of kube-scheduler (default
// 50 QPS, burst 100) and kube-controller-manager (20, 30). With the
// defaults, 500 pods measure those limits rather than scheduling: a pod
// with a claim costs the controller manager two writes (claim, pod status)
// and the scheduler two (claim allocation, binding) where a pod without
// needs one binding. Large clusters raise them the same way.
func ControlPlaneFlags() controlplane.Options {
	qps := []string{"--kube-api-qps=1000", "--kube-api-burst=2000"}
	return controlplane.Options{ExtraSchedulerFlags: qps, ExtraControllerManagerFlags: qps}
}

// Cluster is vfnet installed on a plane with Options.Nodes Node objects.
type Cluster struct {
	opts  Options
	plane *controlplane.Plane
	env   *flow.Env
	admin kubernetes.Interface
	// fast is an admin client without client-side rate limit.
	fast    kubernetes.Interface
	host    *simhost.Host
	pfs     []sysfs.PF // the host as discovery read it
	cfg     *nodeconfig.Config
	nodes   []*node
	ownDir  bool
	devices int // VFs the node configuration offers per node
	// stopPlugins ends every node's plugin context.
	stopPlugins context.CancelFunc
}

type node struct {
	name   string
	dir    string
	client kubernetes.Interface
	plugin *plugin.Plugin
}

// Setup installs vfnet (kubectl apply -k manifests/, the example
// ResourceClaimTemplate), builds the simulated host and creates the Node
// objects, one driver pod per node and its pod-bound client. Nothing here
// is timed.
func Setup(ctx context.Context, plane *controlplane.Plane, opts Options) (_ *Cluster, retErr error) {
	opts.defaults()
	// Only PF 0 is cabled to the template's network.
	if opts.Pods > opts.Nodes*opts.VFsPerPF {
		return nil, fmt.Errorf("scale options: %d pods with a %s claim need as many %s VFs, but %d nodes x %d VFs on the %s PF offer %d: raise Nodes or VFsPerPF, or lower Pods",
			opts.Pods, ClaimTemplate, Network, opts.Nodes, opts.VFsPerPF, Network, opts.Nodes*opts.VFsPerPF)
	}
	c := &Cluster{opts: opts, plane: plane}
	defer func() {
		if retErr != nil {
			c.Close()
		}
	}()
	if c.opts.Dir == "" {
		dir, err := flow.WorkDir()
		if err != nil {
			return nil, err
		}
		c.opts.Dir, c.ownDir = dir, true
	}
	if c.opts.HostDir == "" {
		c.opts.HostDir = filepath.Join(c.opts.Dir, "host")
	}
	env, err := flow.NewEnv(plane, c.opts.Dir, c.opts.Progress)
	if err != nil {
		return nil, err
	}
	c.env, c.admin = env, env.Client
	fastCfg := plane.AdminRESTConfig()
	fastCfg.QPS = -1 // no client-side limiter
	if c.fast, err = kubernetes.NewForConfig(fastCfg); err != nil {
		return nil, err
	}
	c.say("installing vfnet: kubectl apply -k manifests/ and the example ResourceClaimTemplate")
	if err := env.ApplyManifests(ctx); err != nil {
		return nil, err
	}
	if _, err := env.ApplyFile(ctx, filepath.Join(env.Repo, "manifests", "examples", "resourceclaimtemplate.yaml")); err != nil {
		return nil, err
	}
	if _, err := c.admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: PlainNamespace}}, metav1.CreateOptions{}); err != nil {
		return nil, fmt.Errorf("create namespace %s: %w", PlainNamespace, err)
	}
	cm, err := c.admin.CoreV1().ConfigMaps(flow.Namespace).Get(ctx, "vfnet-node-config", metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("read the node-config ConfigMap the DaemonSet mounts: %w", err)
	}
	if c.cfg, err = nodeconfig.Parse([]byte(cm.Data["node-config.yaml"]), "vfnet-node-config/node-config.yaml"); err != nil {
		return nil, err
	}
	spec := Host(c.opts.VFsPerPF)
	c.say("building the simulated host: dual-port E810, %d VFs per port", c.opts.VFsPerPF)
	if c.host, err = simhost.Build(c.opts.HostDir, spec); err != nil {
		return nil, fmt.Errorf("build simulated host in %s: %w", c.opts.HostDir, err)
	}
	c.devices = 2 * c.opts.VFsPerPF
	if c.pfs, err = c.host.Sysfs().Discover(ctx); err != nil {
		return nil, fmt.Errorf("discover the simulated host: %w", err)
	}

	c.say("creating %d Node objects, their driver pods and pod-bound driver clients", c.opts.Nodes)
	c.nodes = make([]*node, c.opts.Nodes)
	err = c.parallel(ctx, 16, c.opts.Nodes, func(ctx context.Context, i int) error {
		n, err := c.addNode(ctx, fmt.Sprintf("node-%03d", i))
		c.nodes[i] = n
		return err
	})
	if err != nil {
		return nil, err
	}
	return c, nil
}

func (c *Cluster) say(format string, args ...any) {
	if c.opts.Progress != nil {
		fmt.Fprintf(c.opts.Progress, format+"\n", args...)
	}
}

// addNode creates a Node object with the status a kubelet would report, the
// node's driver pod (from the DaemonSet template) and a client for a token
// bound to that pod.
func (c *Cluster) addNode(ctx context.Context, name string) (*node, error) {
	n := &node{name: name, dir: filepath.Join(c.opts.Dir, name)}
	created, err := c.admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{
		"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
	}}}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("create node %s: %w", name, err)
	}
	res := corev1.ResourceList{
		corev1.ResourceCPU:    resource.MustParse("64"),
		corev1.ResourceMemory: resource.MustParse("256Gi"),
		corev1.ResourcePods:   resource.MustParse("110"),
	}
	created.Status.Capacity, created.Status.Allocatable = res, res
	now := metav1.Now()
	created.Status.Conditions = []corev1.NodeCondition{{
		Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
		Message: "simulated node (vfnet test/scale, no kubelet)", LastHeartbeatTime: now, LastTransitionTime: now,
	}}
	if _, err := c.admin.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		return nil, fmt.Errorf("set node %s ready: %w", name, err)
	}
	pod, err := c.env.CreateDriverPod(ctx, name)
	if err != nil {
		return nil, err
	}
	token, err := controlplane.PodBoundToken(ctx, c.admin, pod, 2*time.Hour)
	if err != nil {
		return nil, err
	}
	cfg := c.plane.RESTConfigForToken(token)
	// As vfnet-driver's client (cmd/vfnet-driver/app): client-go's default
	// rate limit (5 QPS, burst 10) and its own user agent.
	cfg.QPS, cfg.Burst, cfg.UserAgent = 0, 0, "vfnet-driver"
	// A Proxy func makes client-go build this client its own transport,
	// hence its own connection, as a driver process on its node has
	// (identical configs would share one HTTP/2 connection).
	cfg.Proxy = func(*http.Request) (*url.URL, error) { return nil, nil }
	if n.client, err = kubernetes.NewForConfig(cfg); err != nil {
		return nil, err
	}
	return n, nil
}

// Publish starts every node's kubelet plugin and rescan loop at once, as a
// DaemonSet rollout on a ready cluster would, and waits until the API
// server serves every pool completely. It fills the publishing fields of r.
func (c *Cluster) Publish(ctx context.Context, r *Result) error {
	logger := klog.FromContext(ctx)
	r.Nodes = len(c.nodes)
	watch, err := c.watchSlices(ctx, len(c.nodes), c.devices)
	if err != nil {
		return err
	}
	defer watch.stop()

	if r.APIServerRSSBefore, err = c.rss("kube-apiserver"); err != nil {
		return err
	}
	c.say("publishing: %d nodes x %d VFs", len(c.nodes), c.devices)
	cpu0 := c.cpu()
	start := time.Now()
	// The plugins live until Close, not just while they are being started.
	pctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	c.stopPlugins = stop
	err = c.parallel(ctx, len(c.nodes), len(c.nodes), func(_ context.Context, i int) error {
		n := c.nodes[i]
		// A node's info lines times 100 would drown the run: keep errors.
		nctx := klog.NewContext(pctx, logger.WithName(n.name).V(8))
		for _, d := range []string{"reg", "plugin", "cdi"} {
			if err := os.MkdirAll(filepath.Join(n.dir, d), 0o755); err != nil {
				return err
			}
		}
		p, err := plugin.Start(nctx, plugin.Options{
			NodeName: n.name, KubeClient: n.client,
			RegistrarDir: filepath.Join(n.dir, "reg"), PluginDir: filepath.Join(n.dir, "plugin"), CDIDir: filepath.Join(n.dir, "cdi"),
			OnFatal: func(err error) { logger.Error(err, "Kubelet plugin failed", "node", n.name) },
		})
		if err != nil {
			return fmt.Errorf("node %s: %w", n.name, err)
		}
		n.plugin = p
		loop := slices.NewLoop(slices.LoopOptions{
			NodeName: n.name, Discoverer: readHost(c.pfs), Publisher: p,
			LoadConfig: func() (*nodeconfig.Config, error) { return c.cfg, nil },
		})
		if _, err := loop.Scan(nctx); err != nil {
			return fmt.Errorf("node %s: first scan: %w", n.name, err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	select {
	case <-watch.done:
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(c.opts.Timeout):
		return fmt.Errorf("after %v the API server serves %d complete pools' slices with %d of %d devices: publishing is stuck or far too slow",
			c.opts.Timeout, watch.slices.Load(), watch.devices.Load(), int64(len(c.nodes)*c.devices))
	}
	r.Publish = time.Since(start)
	r.PublishCPU = c.cpuSince(cpu0)
	r.Devices, r.Slices = int(watch.devices.Load()), int(watch.slices.Load())
	if r.APIServerRSS, err = c.rss("kube-apiserver"); err != nil {
		return err
	}
	c.say("published %d devices in %d slices in %v; kube-apiserver RSS %d MiB",
		r.Devices, r.Slices, r.Publish.Round(time.Millisecond), r.APIServerRSS>>20)
	return nil
}

// readHost is a Discoverer answering with the model read at Setup.
type readHost []sysfs.PF

func (h readHost) Discover(context.Context) ([]sysfs.PF, error) { return h, nil }

type sliceWatch struct {
	done    chan struct{}
	stop    func()
	slices  atomic.Int64
	devices atomic.Int64
}

// watchSlices closes done once every one of nodes pools is complete (all
// its slices of one generation present) with perNode devices in total.
func (c *Cluster) watchSlices(ctx context.Context, nodes, perNode int) (*sliceWatch, error) {
	w := &sliceWatch{done: make(chan struct{})}
	factory := informers.NewSharedInformerFactory(c.admin, 0)
	inf := factory.Resource().V1().ResourceSlices().Informer()
	var mu sync.Mutex
	byName := map[string]*resourceapi.ResourceSlice{}
	var closed bool
	update := func() {
		type pool struct {
			gen            int64
			count, devices int
			slices         int
		}
		pools := map[string]*pool{}
		var devs, sls int
		for _, s := range byName {
			if s.Spec.Driver != flow.DriverName {
				continue
			}
			p := pools[s.Spec.Pool.Name]
			if p == nil || s.Spec.Pool.Generation > p.gen {
				p = &pool{gen: s.Spec.Pool.Generation, count: int(s.Spec.Pool.ResourceSliceCount)}
				pools[s.Spec.Pool.Name] = p
			} else if s.Spec.Pool.Generation < p.gen {
				continue
			}
			p.slices++
			p.devices += len(s.Spec.Devices)
		}
		complete := 0
		for _, p := range pools {
			if p.slices == p.count {
				complete++
				devs += p.devices
				sls += p.slices
			}
		}
		w.slices.Store(int64(sls))
		w.devices.Store(int64(devs))
		if !closed && complete == nodes && devs == nodes*perNode {
			closed = true
			close(w.done)
		}
	}
	_, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			s := obj.(*resourceapi.ResourceSlice)
			mu.Lock()
			defer mu.Unlock()
			byName[s.Name] = s
			update()
		},
		UpdateFunc: func(_, obj any) {
			s := obj.(*resourceapi.ResourceSlice)
			mu.Lock()
			defer mu.Unlock()
			byName[s.Name] = s
			update()
		},
		DeleteFunc: func(obj any) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			s, ok := obj.(*resourceapi.ResourceSlice)
			if !ok {
				return
			}
			mu.Lock()
			defer mu.Unlock()
			delete(byName, s.Name)
			update()
		},
	})
	if err != nil {
		return nil, err
	}
	wctx, cancel := context.WithCancel(ctx)
	factory.Start(wctx.Done())
	w.stop = func() { cancel(); factory.Shutdown() }
	if !cache.WaitForCacheSync(wctx.Done(), inf.HasSynced) {
		w.stop()
		return nil, errors.New("ResourceSlice informer did not sync")
	}
	return w, nil
}

// Schedule creates opts.Pods identical pods at once (in ClaimNamespace,
// each with a claim from ClaimTemplate, when withClaims; else in
// PlainNamespace without) and waits until the scheduler bound all of them.
func (c *Cluster) Schedule(ctx context.Context, withClaims bool) (Phase, error) {
	ns, prefix := PlainNamespace, "plain-"
	if withClaims {
		ns, prefix = ClaimNamespace, "vm-"
	}
	ph := Phase{Pods: c.opts.Pods}
	factory := informers.NewSharedInformerFactoryWithOptions(c.admin, 0, informers.WithNamespace(ns))
	inf := factory.Core().V1().Pods().Informer()
	var mu sync.Mutex
	bound := map[string]bool{}
	done := make(chan struct{})
	onPod := func(obj any) {
		p, ok := obj.(*corev1.Pod)
		if !ok || p.Spec.NodeName == "" || !strings.HasPrefix(p.Name, prefix) {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if !bound[p.Name] {
			bound[p.Name] = true
			if len(bound) == c.opts.Pods {
				close(done)
			}
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: onPod, UpdateFunc: func(_, obj any) { onPod(obj) },
	}); err != nil {
		return ph, err
	}
	wctx, cancel := context.WithCancel(ctx)
	defer func() { cancel(); factory.Shutdown() }()
	factory.Start(wctx.Done())
	if !cache.WaitForCacheSync(wctx.Done(), inf.HasSynced) {
		return ph, errors.New("pod informer did not sync")
	}

	// The scheduler and the controller manager are paused while the pods
	// are created, so both phases measure working off the same backlog,
	// not how fast this process can create pods.
	var resumes []func() error
	resumeAll := func() error {
		var errs []error
		for _, r := range resumes {
			errs = append(errs, r())
		}
		return errors.Join(errs...)
	}
	defer resumeAll()
	for _, comp := range []string{"kube-scheduler", "kube-controller-manager"} {
		resume, err := c.plane.Pause(comp)
		if err != nil {
			return ph, err
		}
		resumes = append(resumes, resume)
	}
	c.say("creating %d pods (claims: %v) with kube-scheduler and kube-controller-manager paused", c.opts.Pods, withClaims)
	created := time.Now()
	err := c.parallel(ctx, c.opts.CreateWorkers, c.opts.Pods, func(ctx context.Context, i int) error {
		_, err := c.fast.CoreV1().Pods(ns).Create(ctx, Pod(fmt.Sprintf("%s%04d", prefix, i), withClaims), metav1.CreateOptions{})
		return err
	})
	if err != nil {
		return ph, fmt.Errorf("create pods: %w", err)
	}
	ph.Created = time.Since(created)
	cpu0 := c.cpu()
	start := time.Now()
	if err := resumeAll(); err != nil {
		return ph, err
	}
	select {
	case <-done:
	case <-ctx.Done():
		return ph, ctx.Err()
	case <-time.After(c.opts.Timeout):
		mu.Lock()
		n := len(bound)
		mu.Unlock()
		return ph, fmt.Errorf("after %v only %d of %d pods (claims: %v) are scheduled; a pending one: %s",
			c.opts.Timeout, n, c.opts.Pods, withClaims, c.pendingReason(ctx, ns))
	}
	ph.Duration = time.Since(start)
	ph.CPU = c.cpuSince(cpu0)
	c.say("  %d pods bound in %v: %.1f pods/s", ph.Pods, ph.Duration.Round(time.Millisecond), ph.PodsPerSecond())
	return ph, nil
}

// DeletePods removes the pods of a phase (grace period 0: no kubelet would
// confirm) and waits until they, and with them their claims, are gone, so
// the next phase starts on an empty cluster.
func (c *Cluster) DeletePods(ctx context.Context, withClaims bool) error {
	ns := PlainNamespace
	if withClaims {
		ns = ClaimNamespace
	}
	pods := c.fast.CoreV1().Pods(ns)
	if err := pods.DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}, metav1.ListOptions{}); err != nil {
		return fmt.Errorf("delete pods in %s: %w", ns, err)
	}
	return wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, c.opts.Timeout, true, func(ctx context.Context) (bool, error) {
		l, err := pods.List(ctx, metav1.ListOptions{Limit: 1})
		if err != nil || len(l.Items) > 0 {
			return false, err
		}
		cl, err := c.fast.ResourceV1().ResourceClaims(ns).List(ctx, metav1.ListOptions{Limit: 1})
		return err == nil && len(cl.Items) == 0, err
	})
}

func (c *Cluster) pendingReason(ctx context.Context, ns string) string {
	l, err := c.admin.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err.Error()
	}
	for _, p := range l.Items {
		if p.Spec.NodeName != "" {
			continue
		}
		for _, cond := range p.Status.Conditions {
			if cond.Type == corev1.PodScheduled {
				return fmt.Sprintf("pod %s: %s: %s", p.Name, cond.Reason, cond.Message)
			}
		}
		return fmt.Sprintf("pod %s: not yet considered by the scheduler", p.Name)
	}
	return "none"
}

// Pod is a virt-launcher-shaped pod (one compute container with requests);
// with a claim it asks for one VF from ClaimTemplate as KubeVirt does for a
// vfnet network.
func Pod(name string, withClaim bool) *corev1.Pod {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"kubevirt.io": "virt-launcher", "vfnet.io/scale": "true"}},
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{{
				Name: "compute", Image: "quay.io/kubevirt/virt-launcher:v1.9.0",
				Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{
					corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("256Mi"),
				}},
			}},
		},
	}
	if withClaim {
		pod.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "vf", ResourceClaimTemplateName: ptr.To(ClaimTemplate)}}
		pod.Spec.Containers[0].Resources.Claims = []corev1.ResourceClaim{{Name: "vf"}}
	}
	return pod
}

// Run is a whole measurement on a started plane: Setup, Publish, the phase
// without claims, its cleanup, then the phase with claims (whose pods and
// claims are left for Verify).
func Run(ctx context.Context, plane *controlplane.Plane, opts Options) (*Cluster, Result, error) {
	var r Result
	c, err := Setup(ctx, plane, opts)
	if err != nil {
		return nil, r, err
	}
	if err := c.Publish(ctx, &r); err != nil {
		return c, r, err
	}
	if r.WithoutClaims, err = c.Schedule(ctx, false); err != nil {
		return c, r, err
	}
	if err := c.DeletePods(ctx, false); err != nil {
		return c, r, err
	}
	if r.WithClaims, err = c.Schedule(ctx, true); err != nil {
		return c, r, err
	}
	return c, r, nil
}

// Verify checks the claims phase's outcome: every pod bound, its claim
// allocated exactly one vfnet VF of network physnet-a from the pool of the
// node the pod is bound to, and no VF given twice.
func (c *Cluster) Verify(ctx context.Context) error {
	pods, err := c.admin.CoreV1().Pods(ClaimNamespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	claims, err := c.admin.ResourceV1().ResourceClaims(ClaimNamespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	sl, err := c.admin.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	network := map[string]string{} // pool/device -> vfnet.io/network
	for _, s := range sl.Items {
		for _, d := range s.Spec.Devices {
			if a, ok := d.Attributes["vfnet.io/network"]; ok && a.StringValue != nil {
				network[s.Spec.Pool.Name+"/"+d.Name] = *a.StringValue
			}
		}
	}
	byName := map[string]*resourceapi.ResourceClaim{}
	for i := range claims.Items {
		byName[claims.Items[i].Name] = &claims.Items[i]
	}
	used := map[string]string{}
	var errs []error
	for _, p := range pods.Items {
		if p.Spec.NodeName == "" {
			errs = append(errs, fmt.Errorf("pod %s is not scheduled", p.Name))
			continue
		}
		var claimName string
		for _, st := range p.Status.ResourceClaimStatuses {
			if st.Name == "vf" && st.ResourceClaimName != nil {
				claimName = *st.ResourceClaimName
			}
		}
		cl := byName[claimName]
		if cl == nil {
			errs = append(errs, fmt.Errorf("pod %s: no claim generated from template %s (status %+v)", p.Name, ClaimTemplate, p.Status.ResourceClaimStatuses))
			continue
		}
		if cl.Status.Allocation == nil || len(cl.Status.Allocation.Devices.Results) != 1 {
			errs = append(errs, fmt.Errorf("pod %s: claim %s is not allocated exactly one device: %+v", p.Name, cl.Name, cl.Status.Allocation))
			continue
		}
		res := cl.Status.Allocation.Devices.Results[0]
		key := res.Pool + "/" + res.Device
		switch {
		case res.Driver != flow.DriverName:
			errs = append(errs, fmt.Errorf("pod %s: claim %s allocated by driver %s, want %s", p.Name, cl.Name, res.Driver, flow.DriverName))
		case res.Pool != p.Spec.NodeName:
			errs = append(errs, fmt.Errorf("pod %s on node %s got %s from another node's pool", p.Name, p.Spec.NodeName, key))
		case network[key] != Network:
			errs = append(errs, fmt.Errorf("pod %s got %s of network %q, want %s", p.Name, key, network[key], Network))
		case used[key] != "":
			errs = append(errs, fmt.Errorf("VF %s allocated to both %s and %s", key, used[key], p.Name))
		}
		used[key] = p.Name
	}
	if len(pods.Items) != c.opts.Pods {
		errs = append(errs, fmt.Errorf("%d pods with claims exist, want %d", len(pods.Items), c.opts.Pods))
	}
	return errors.Join(errs...)
}

// Close stops every node's plugin and removes the run's directory.
func (c *Cluster) Close() {
	if c.stopPlugins != nil {
		c.stopPlugins()
	}
	for _, n := range c.nodes {
		if n != nil && n.plugin != nil {
			n.plugin.Stop()
		}
	}
	if c.host != nil {
		c.host.Close()
	}
	if c.ownDir {
		os.RemoveAll(c.opts.Dir)
	}
}

// parallel runs fn(0..n-1) on up to workers goroutines; the first error
// cancels the rest.
func (c *Cluster) parallel(ctx context.Context, workers, n int, fn func(ctx context.Context, i int) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	next := atomic.Int64{}
	var wg sync.WaitGroup
	for range min(workers, n) {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= n || ctx.Err() != nil {
					return
				}
				if err := fn(ctx, i); err != nil {
					cancel(err)
					return
				}
			}
		})
	}
	wg.Wait()
	if err := context.Cause(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return ctx.Err()
}

// cpu samples the CPU time of every component and of this process.
func (c *Cluster) cpu() map[string]time.Duration {
	out := map[string]time.Duration{}
	for _, name := range Components() {
		pid, err := c.plane.PID(name)
		if err != nil {
			continue
		}
		if d, err := procCPU(pid); err == nil {
			out[name] = d
		}
	}
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		out["vfnet"] = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	return out
}

func (c *Cluster) cpuSince(before map[string]time.Duration) map[string]time.Duration {
	out := map[string]time.Duration{}
	for k, v := range c.cpu() {
		out[k] = v - before[k]
	}
	return out
}

// procCPU is a process's user+system time from /proc/<pid>/stat.
func procCPU(pid int) (time.Duration, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name may contain spaces: fields follow the last ')'.
	s := string(data)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("parse /proc/%d/stat: no ')'", pid)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("parse /proc/%d/stat: %d fields", pid, len(f))
	}
	// Fields 14 and 15 (utime, stime) are at 11 and 12 after the name;
	// USER_HZ is 100 on every Linux ABI Go supports.
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, fmt.Errorf("parse /proc/%d/stat: %w", pid, err)
	}
	return time.Duration(ut+st) * 10 * time.Millisecond, nil
}

// rss is a component's resident set size (VmRSS).
func (c *Cluster) rss(component string) (uint64, error) {
	pid, err := c.plane.PID(component)
	if err != nil {
		return 0, err
	}
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, fmt.Errorf("read %s memory: %w", component, err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("parse %s VmRSS %q: %w", component, rest, err)
			}
			return kb << 10, nil
		}
	}
	return 0, fmt.Errorf("no VmRSS in /proc/%d/status (%s)", pid, component)
}
