// Package scale measures vfnet at cluster size on a real control plane
// (test/lib/controlplane): many simulated nodes publish their VFs through the
// driver's own publishing path, then the real kube-scheduler places pods
// that each claim a VF from a ResourceClaimTemplate, and, in the same run,
// the same pods without a claim and the same pods each claiming one device
// of Kubernetes' own DRA benchmark shape (upstream.go), so the cost of
// vfnet's claims is a ratio that does not depend on how loaded the machine
// is, against both no claims and the claims Kubernetes measures itself.
//
// Each simulated node runs what vfnet-driver runs to publish: the rescan
// loop (driver/publish) discovering a simulated host (test/lib/simhost) with the
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
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"github.com/vfnet-io/vfnet/driver/kernel/sysfs"
	"github.com/vfnet-io/vfnet/driver/plugin"
	"github.com/vfnet-io/vfnet/driver/publish"
	"github.com/vfnet-io/vfnet/pkg/api/nodeconfig"
	"github.com/vfnet-io/vfnet/test/lib/controlplane"
	"github.com/vfnet-io/vfnet/test/lib/flow"
	"github.com/vfnet-io/vfnet/test/lib/procmem"
	"github.com/vfnet-io/vfnet/test/lib/simhost"
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

// Kind is what each pod of a phase asks for.
type Kind int

const (
	// Plain pods have no claim.
	Plain Kind = iota
	// VFNet pods each have a claim from ClaimTemplate: one physnet-a VF.
	VFNet
	// Upstream pods each have a claim from UpstreamTemplate: one device of
	// Kubernetes' own DRA benchmark shape (upstream.go).
	Upstream
)

func (k Kind) String() string {
	switch k {
	case Plain:
		return "plain"
	case VFNet:
		return "vfnet"
	case Upstream:
		return "upstream-shape"
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// Namespace holds the kind's pods (and its template).
func (k Kind) Namespace() string {
	switch k {
	case VFNet:
		return ClaimNamespace
	case Upstream:
		return UpstreamNamespace
	}
	return PlainNamespace
}

func (k Kind) podPrefix() string {
	switch k {
	case VFNet:
		return "vm-"
	case Upstream:
		return "up-"
	}
	return "plain-"
}

// claimName is the pod's name for its claim (PodResourceClaim.Name).
func (k Kind) claimName() string {
	if k == Upstream {
		return "device"
	}
	return "vf"
}

func (k Kind) driver() string {
	if k == Upstream {
		return UpstreamDriver
	}
	return flow.DriverName
}

// Options size a run. Zero fields take the defaults noted.
type Options struct {
	// Nodes is the number of simulated nodes (default 3).
	Nodes int
	// VFsPerPF: every node is a dual-port E810 (enp59s0f0 cabled to
	// physnet-a, enp59s0f1 to physnet-b, as manifests/node-config.yaml
	// says) with this many VFs per port (default 4; 128 gives 256 VFs).
	VFsPerPF int
	// OfferVFs, if set, makes the node configuration offer only VF
	// indexes 0 to OfferVFs-1 of each PF (node-config.yaml's vfs field, as
	// an admin would to publish fewer devices); default every VF.
	OfferVFs int
	// Pods is the number of pods per phase (default 10).
	Pods int
	// Rounds of claim phases (default 1). A round schedules Pods pods with
	// vfnet claims and Pods pods with upstream-shape claims; odd rounds run
	// vfnet first, even rounds the upstream shape first, so with 2 rounds
	// (vfnet, upstream, upstream, vfnet) neither shape always runs on the
	// fresher or the more used cluster.
	Rounds int
	// UpstreamShape picks the revision of the upstream device template
	// (default UpstreamShapeV137).
	UpstreamShape UpstreamShape
	// ProfileDir, if set, receives a CPU profile of kube-scheduler (and of
	// kube-apiserver when it serves /debug/pprof) for each claim phase,
	// ProfileSeconds long (default 5) from the phase's start; the run waits
	// for it before cleaning up, so the profile holds nothing else.
	ProfileDir     string
	ProfileSeconds int
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
	if o.Rounds == 0 {
		o.Rounds = 1
	}
	if o.UpstreamShape == "" {
		o.UpstreamShape = UpstreamShapeV137
	}
	if o.ProfileSeconds == 0 {
		o.ProfileSeconds = 5
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
	// UpstreamPublish is how long the admin client took, the first time,
	// to create the upstream shape's slices until the API server served
	// them all (one create per node, as scheduler_perf does; not comparable
	// with Publish).
	UpstreamPublish time.Duration
	// WithoutClaims is the phase of plain pods; WithClaims (vfnet) and
	// Upstream add up the rounds of their kind.
	WithClaims, WithoutClaims, Upstream Phase
	// Phases are all phases in the order they ran.
	Phases []Phase
}

// Phase is one batch of pods, created while kube-scheduler and
// kube-controller-manager were paused; Duration runs from resuming them
// until the last pod is bound.
type Phase struct {
	Kind Kind
	// Round is the claim round (0 for the plain phase and for sums).
	Round    int
	Pods     int
	Duration time.Duration
	// Created is how long creating the pods took (not part of Duration:
	// kube-scheduler and kube-controller-manager were paused meanwhile).
	Created time.Duration
	// CPU is the CPU time each component spent during the phase.
	CPU map[string]time.Duration
	// Attempts counts kube-scheduler's scheduling attempts during the
	// phase by result (scheduler_schedule_attempts_total): "unschedulable"
	// ones are pods tried before their claim existed, and retried.
	Attempts map[string]float64
}

// add sums two phases of q's kind (durations, pods, CPU, attempts); p may
// be the zero Phase.
func (p Phase) add(q Phase) Phase {
	sum := Phase{Kind: q.Kind, Pods: p.Pods + q.Pods, Duration: p.Duration + q.Duration, Created: p.Created + q.Created,
		CPU: map[string]time.Duration{}, Attempts: map[string]float64{}}
	for _, m := range []map[string]time.Duration{p.CPU, q.CPU} {
		for k, v := range m {
			sum.CPU[k] += v
		}
	}
	for _, m := range []map[string]float64{p.Attempts, q.Attempts} {
		for k, v := range m {
			sum.Attempts[k] += v
		}
	}
	return sum
}

// PodsPerSecond is the phase's scheduling throughput.
func (p Phase) PodsPerSecond() float64 {
	if p.Duration <= 0 {
		return 0
	}
	return float64(p.Pods) / p.Duration.Seconds()
}

// Ratio is pods/s with vfnet claims over pods/s without, from the same run.
func (r Result) Ratio() float64 { return ratio(r.WithClaims, r.WithoutClaims) }

// UpstreamRatio is pods/s with vfnet claims over pods/s with claims of the
// upstream shape, from the same run.
func (r Result) UpstreamRatio() float64 { return ratio(r.WithClaims, r.Upstream) }

// UpstreamPlainRatio is pods/s with upstream-shape claims over pods/s
// without claims: what Kubernetes' own claims cost on this machine.
func (r Result) UpstreamPlainRatio() float64 { return ratio(r.Upstream, r.WithoutClaims) }

// CPURatio is UpstreamRatio by CPU instead of wall time: control-plane CPU
// (Components) per pod with upstream-shape claims over the same with vfnet
// claims. On a machine shared with other work the phases' wall times
// depend on what else ran meanwhile; their CPU per pod does much less, and
// with every component on the same cores it bounds the throughput ratio.
func (r Result) CPURatio() float64 {
	v, u := r.WithClaims.ControlPlaneCPUPerPod(), r.Upstream.ControlPlaneCPUPerPod()
	if v == 0 {
		return 0
	}
	return float64(u) / float64(v)
}

// ControlPlaneCPUPerPod is the CPU time of all Components over the
// phase's pods.
func (p Phase) ControlPlaneCPUPerPod() time.Duration {
	if p.Pods == 0 {
		return 0
	}
	var sum time.Duration
	for _, c := range Components() {
		sum += p.CPU[c]
	}
	return sum / time.Duration(p.Pods)
}

func ratio(a, b Phase) float64 {
	if b.PodsPerSecond() == 0 {
		return 0
	}
	return a.PodsPerSecond() / b.PodsPerSecond()
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
	// watch follows every ResourceSlice from the first Publish on.
	watch *sliceWatch
	// published says whose slices are in the cluster now (see Only).
	published map[Kind]bool
	// round is the claim round running (names profiles).
	round int
	// upstreamPublish is the first publish of the upstream shape.
	upstreamPublish time.Duration
}

type node struct {
	name   string
	dir    string
	client kubernetes.Interface
	plugin *plugin.Plugin
	// last is what the node's loop last handed its plugin, to publish it
	// again after the upstream phase.
	last recorder
}

// recorder is the loop's Publisher: it keeps what it forwards.
type recorder struct {
	mu     sync.Mutex
	plugin *plugin.Plugin
	res    resourceslice.DriverResources
}

func (r *recorder) PublishResources(ctx context.Context, res resourceslice.DriverResources) error {
	r.mu.Lock()
	r.res = res
	r.mu.Unlock()
	return r.plugin.PublishResources(ctx, res)
}

func (r *recorder) resources() resourceslice.DriverResources {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.res
}

// Setup installs vfnet (kubectl apply -k manifests/, the example
// ResourceClaimTemplate), builds the simulated host and creates the Node
// objects, one driver pod per node and its pod-bound client. Nothing here
// is timed.
func Setup(ctx context.Context, plane *controlplane.Plane, opts Options) (_ *Cluster, retErr error) {
	opts.defaults()
	// Only PF 0 is cabled to the template's network.
	offered := opts.VFsPerPF
	if opts.OfferVFs > 0 {
		offered = min(offered, opts.OfferVFs)
	}
	if opts.Pods > opts.Nodes*offered {
		return nil, fmt.Errorf("scale options: %d pods with a %s claim need as many %s VFs, but %d nodes x %d VFs offered on the %s PF are %d: raise Nodes, VFsPerPF or OfferVFs, or lower Pods",
			opts.Pods, ClaimTemplate, Network, opts.Nodes, offered, Network, opts.Nodes*offered)
	}
	if opts.Pods > opts.Nodes*UpstreamDevicesPerNode {
		return nil, fmt.Errorf("scale options: %d pods with an upstream-shape claim need as many devices, but %d nodes x %d offer %d: raise Nodes or lower Pods",
			opts.Pods, opts.Nodes, UpstreamDevicesPerNode, opts.Nodes*UpstreamDevicesPerNode)
	}
	if opts.UpstreamShape != UpstreamShapeV137 && opts.UpstreamShape != UpstreamShapeEarlier {
		return nil, fmt.Errorf("scale options: upstream shape %q, want %q or %q", opts.UpstreamShape, UpstreamShapeV137, UpstreamShapeEarlier)
	}
	c := &Cluster{opts: opts, plane: plane, published: map[Kind]bool{}}
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
	for _, ns := range []string{PlainNamespace, UpstreamNamespace} {
		if _, err := c.admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			return nil, fmt.Errorf("create namespace %s: %w", ns, err)
		}
	}
	c.say("creating the upstream shape's DeviceClass %s and ResourceClaimTemplate %s/%s", UpstreamClass, UpstreamNamespace, UpstreamTemplate)
	if _, err := c.admin.ResourceV1().DeviceClasses().Create(ctx, UpstreamDeviceClass(), metav1.CreateOptions{}); err != nil {
		return nil, fmt.Errorf("create DeviceClass %s: %w", UpstreamClass, err)
	}
	if _, err := c.admin.ResourceV1().ResourceClaimTemplates(UpstreamNamespace).Create(ctx, UpstreamClaimTemplate(), metav1.CreateOptions{}); err != nil {
		return nil, fmt.Errorf("create ResourceClaimTemplate %s/%s: %w", UpstreamNamespace, UpstreamTemplate, err)
	}
	cm, err := c.admin.CoreV1().ConfigMaps(flow.Namespace).Get(ctx, "vfnet-node-config", metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("read the node-config ConfigMap the DaemonSet mounts: %w", err)
	}
	if c.cfg, err = nodeconfig.Parse([]byte(cm.Data["node-config.yaml"]), "vfnet-node-config/node-config.yaml"); err != nil {
		return nil, err
	}
	if c.opts.OfferVFs > 0 {
		if c.cfg, err = offerVFs(c.cfg, c.opts.OfferVFs); err != nil {
			return nil, err
		}
	}
	spec := Host(c.opts.VFsPerPF)
	c.say("building the simulated host: dual-port E810, %d VFs per port", c.opts.VFsPerPF)
	if c.host, err = simhost.Build(c.opts.HostDir, spec); err != nil {
		return nil, fmt.Errorf("build simulated host in %s: %w", c.opts.HostDir, err)
	}
	c.devices = 2 * offered
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
	if c.watch == nil {
		w, err := c.watchSlices(ctx)
		if err != nil {
			return err
		}
		c.watch = w
	}
	var err error
	if r.APIServerRSSBefore, err = c.rss("kube-apiserver"); err != nil {
		return err
	}
	c.say("publishing: %d nodes x %d VFs", len(c.nodes), c.devices)
	// Waiting starts before publishing: the first complete state ends it.
	served := c.watch.waiter(flow.DriverName, c.allServed(c.devices))
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
		n.plugin, n.last.plugin = p, p
		loop := publish.NewLoop(publish.LoopOptions{
			NodeName: n.name, Discoverer: readHost(c.pfs), Publisher: &n.last,
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
	got, err := c.watch.wait(ctx, served, c.opts.Timeout)
	if err != nil {
		return fmt.Errorf("%w: the API server serves %d complete pools' slices with %d of %d devices: publishing is stuck or far too slow",
			err, got.Slices, got.Devices, len(c.nodes)*c.devices)
	}
	r.Publish = time.Since(start)
	r.PublishCPU = c.cpuSince(cpu0)
	r.Devices, r.Slices = got.Devices, got.Slices
	if r.APIServerRSS, err = c.rss("kube-apiserver"); err != nil {
		return err
	}
	c.published[VFNet] = true
	c.say("published %d devices in %d slices in %v; kube-apiserver RSS %d MiB",
		r.Devices, r.Slices, r.Publish.Round(time.Millisecond), r.APIServerRSS>>20)
	return nil
}

// allServed is the condition "every node's pool is complete, with perNode
// devices each, and no other slice of the driver is left".
func (c *Cluster) allServed(perNode int) func(poolCount) bool {
	return func(p poolCount) bool {
		return p.Complete == len(c.nodes) && p.Pools == len(c.nodes) && p.Devices == len(c.nodes)*perNode && p.All == p.Slices
	}
}

func withdrawn(p poolCount) bool { return p.All == 0 }

// Only makes k's slices the only DRA slices in the cluster, withdrawing
// the other shape's first (Plain needs none and changes nothing).
//
// Each claim phase runs with only its own shape's slices present, not with
// both: in Kubernetes 1.37 the scheduler's DynamicResources plugin builds
// each pod's allocator from every ResourceSlice (no filter by driver), its
// Filter converts every slice of the node being tried (GatherPools) and
// walks their devices through the class's CEL selector until one matches.
// With both shapes present each phase would pay for the other's devices
// (the upstream phase for 256 vfnet VFs a node next to its own 10), which
// hides the very difference being measured. Kubernetes' own benchmark has
// only its own slices, and a vfnet cluster measured before had only
// vfnet's. vfnet's slices are withdrawn and restored through each node's
// own plugin (an empty, then the recorded, DriverResources), the upstream
// shape's are created and deleted by the admin client.
func (c *Cluster) Only(ctx context.Context, k Kind) error {
	if k == Plain {
		return nil
	}
	other := VFNet
	if k == VFNet {
		other = Upstream
	}
	if c.published[other] {
		if err := c.withdraw(ctx, other); err != nil {
			return err
		}
	}
	if !c.published[k] {
		if err := c.publish(ctx, k); err != nil {
			return err
		}
	}
	return nil
}

func (c *Cluster) withdraw(ctx context.Context, k Kind) error {
	start := time.Now()
	done := c.watch.waiter(k.driver(), withdrawn)
	switch k {
	case VFNet:
		err := c.parallel(ctx, 16, len(c.nodes), func(ctx context.Context, i int) error {
			return c.nodes[i].plugin.PublishResources(ctx, resourceslice.DriverResources{})
		})
		if err != nil {
			return fmt.Errorf("withdraw vfnet's slices: %w", err)
		}
	case Upstream:
		err := c.fast.ResourceV1().ResourceSlices().DeleteCollection(ctx, metav1.DeleteOptions{},
			metav1.ListOptions{FieldSelector: "spec.driver=" + UpstreamDriver})
		if err != nil {
			return fmt.Errorf("delete the upstream shape's slices: %w", err)
		}
	}
	if got, err := c.watch.wait(ctx, done, c.opts.Timeout); err != nil {
		return fmt.Errorf("withdraw %s's slices: %w; %d left", k, err, got.All)
	}
	c.published[k] = false
	c.say("withdrew %s's slices in %v", k, time.Since(start).Round(time.Millisecond))
	return nil
}

// publish puts k's slices back (vfnet: every node's recorded resources
// through its own plugin) or creates them (upstream shape: one slice per
// node, by the admin client), and waits until all are served.
func (c *Cluster) publish(ctx context.Context, k Kind) error {
	perNode := c.devices
	if k == Upstream {
		perNode = UpstreamDevicesPerNode
	}
	done := c.watch.waiter(k.driver(), c.allServed(perNode))
	start := time.Now()
	err := c.parallel(ctx, 16, len(c.nodes), func(ctx context.Context, i int) error {
		n := c.nodes[i]
		if k == VFNet {
			return n.plugin.PublishResources(ctx, n.last.resources())
		}
		_, err := c.fast.ResourceV1().ResourceSlices().Create(ctx, UpstreamSlice(n.name, c.opts.UpstreamShape), metav1.CreateOptions{})
		return err
	})
	if err != nil {
		return fmt.Errorf("publish %s's slices: %w", k, err)
	}
	got, err := c.watch.wait(ctx, done, c.opts.Timeout)
	if err != nil {
		return fmt.Errorf("publish %s's slices: %w; %d complete pools with %d devices served", k, err, got.Complete, got.Devices)
	}
	d := time.Since(start)
	c.published[k] = true
	if k == Upstream && c.upstreamPublish == 0 {
		c.upstreamPublish = d
	}
	c.say("published %s's %d devices in %d slices in %v", k, got.Devices, got.Slices, d.Round(time.Millisecond))
	return nil
}

// offerVFs is cfg with "vfs: [0-(n-1)]" added to every PF selector, as an
// admin would write it into node-config.yaml. It handles the selectors the
// shipped file has (pfName and network).
func offerVFs(cfg *nodeconfig.Config, n int) (*nodeconfig.Config, error) {
	var b strings.Builder
	fmt.Fprintf(&b, "apiVersion: %s\nkind: %s\npfs:\n", nodeconfig.APIVersion, nodeconfig.Kind)
	for _, s := range cfg.PFs {
		if s.PFName == "" || s.PCIAddress != "" || s.VendorID != "" || s.DeviceID != "" || s.VFs != nil || s.AllowSwitchdev {
			return nil, fmt.Errorf("scale options: OfferVFs handles PF selectors with only pfName and network, not %+v", s)
		}
		fmt.Fprintf(&b, "- pfName: %s\n  network: %s\n  vfs: [\"0-%d\"]\n", s.PFName, s.Network, n-1)
	}
	if cfg.AllowUnsafeNoIOMMU {
		b.WriteString("allowUnsafeNoIOMMU: true\n")
	}
	return nodeconfig.Parse([]byte(b.String()), fmt.Sprintf("node-config.yaml with vfs: [0-%d]", n-1))
}

// readHost is a Discoverer answering with the model read at Setup.
type readHost []sysfs.PF

func (h readHost) Discover(context.Context) ([]sysfs.PF, error) { return h, nil }

// poolCount is what the API server serves of one driver's publish.
type poolCount struct {
	// Pools is the number of pools, Complete of those with all slices of
	// their newest generation; Slices and Devices count complete pools'.
	Pools, Complete, Slices, Devices int
	// All is every slice of the driver, older generations included.
	All int
}

// sliceWatch follows every ResourceSlice and wakes waiters whose condition
// on their driver's slices holds.
type sliceWatch struct {
	mu      sync.Mutex
	byName  map[string]*resourceapi.ResourceSlice
	waiters []*sliceWaiter
	stop    func()
}

type sliceWaiter struct {
	driver string
	cond   func(poolCount) bool
	done   chan struct{}
	last   poolCount // under sliceWatch.mu
}

func (c *Cluster) watchSlices(ctx context.Context) (*sliceWatch, error) {
	w := &sliceWatch{byName: map[string]*resourceapi.ResourceSlice{}}
	factory := informers.NewSharedInformerFactory(c.admin, 0)
	inf := factory.Resource().V1().ResourceSlices().Informer()
	set := func(obj any) {
		s := obj.(*resourceapi.ResourceSlice)
		w.mu.Lock()
		defer w.mu.Unlock()
		w.byName[s.Name] = s
		w.changedLocked()
	}
	_, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    set,
		UpdateFunc: func(_, obj any) { set(obj) },
		DeleteFunc: func(obj any) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			s, ok := obj.(*resourceapi.ResourceSlice)
			if !ok {
				return
			}
			w.mu.Lock()
			defer w.mu.Unlock()
			delete(w.byName, s.Name)
			w.changedLocked()
		},
	})
	if err != nil {
		return nil, err
	}
	wctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	factory.Start(wctx.Done())
	w.stop = func() { cancel(); factory.Shutdown() }
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		w.stop()
		return nil, errors.New("ResourceSlice informer did not sync")
	}
	return w, nil
}

func (w *sliceWatch) countLocked(driver string) poolCount {
	type pool struct {
		gen                   int64
		want, slices, devices int
	}
	pools := map[string]*pool{}
	var pc poolCount
	for _, s := range w.byName {
		if s.Spec.Driver != driver {
			continue
		}
		pc.All++
		p := pools[s.Spec.Pool.Name]
		if p == nil || s.Spec.Pool.Generation > p.gen {
			p = &pool{gen: s.Spec.Pool.Generation, want: int(s.Spec.Pool.ResourceSliceCount)}
			pools[s.Spec.Pool.Name] = p
		} else if s.Spec.Pool.Generation < p.gen {
			continue
		}
		p.slices++
		p.devices += len(s.Spec.Devices)
	}
	pc.Pools = len(pools)
	for _, p := range pools {
		if p.slices == p.want {
			pc.Complete++
			pc.Slices += p.slices
			pc.Devices += p.devices
		}
	}
	return pc
}

func (w *sliceWatch) changedLocked() {
	kept := w.waiters[:0]
	for _, wt := range w.waiters {
		wt.last = w.countLocked(wt.driver)
		if wt.cond(wt.last) {
			close(wt.done)
			continue
		}
		kept = append(kept, wt)
	}
	w.waiters = kept
}

// waiter registers cond on driver's slices; wait then blocks until it holds
// (it may already hold now).
func (w *sliceWatch) waiter(driver string, cond func(poolCount) bool) *sliceWaiter {
	wt := &sliceWaiter{driver: driver, cond: cond, done: make(chan struct{})}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.waiters = append(w.waiters, wt)
	w.changedLocked()
	return wt
}

// wait returns the count that satisfied wt, or the last one seen and an
// error after timeout.
func (w *sliceWatch) wait(ctx context.Context, wt *sliceWaiter, timeout time.Duration) (poolCount, error) {
	var err error
	select {
	case <-wt.done:
	case <-ctx.Done():
		err = ctx.Err()
	case <-time.After(timeout):
		err = fmt.Errorf("not done after %v", timeout)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if err != nil {
		w.waiters = slicesDelete(w.waiters, wt)
	}
	return wt.last, err
}

func slicesDelete(ws []*sliceWaiter, wt *sliceWaiter) []*sliceWaiter {
	out := ws[:0]
	for _, x := range ws {
		if x != wt {
			out = append(out, x)
		}
	}
	return out
}

// Schedule creates opts.Pods identical pods of kind k at once (in
// k.Namespace()) and waits until the scheduler bound all of them.
func (c *Cluster) Schedule(ctx context.Context, k Kind) (Phase, error) {
	ns, prefix := k.Namespace(), k.podPrefix()
	ph := Phase{Kind: k, Pods: c.opts.Pods}
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
	// are created, so every phase measures working off the same backlog,
	// not how fast this process can create pods.
	var resumes []func() error
	resumeAll := func() error {
		var errs []error
		for _, r := range resumes {
			errs = append(errs, r())
		}
		resumes = nil
		return errors.Join(errs...)
	}
	defer resumeAll()
	attempts0, err := c.schedulerAttempts(ctx)
	if err != nil {
		return ph, err
	}
	for _, comp := range []string{"kube-scheduler", "kube-controller-manager"} {
		resume, err := c.plane.Pause(comp)
		if err != nil {
			return ph, err
		}
		resumes = append(resumes, resume)
	}
	c.say("creating %d pods (%s) with kube-scheduler and kube-controller-manager paused", c.opts.Pods, k)
	created := time.Now()
	err = c.parallel(ctx, c.opts.CreateWorkers, c.opts.Pods, func(ctx context.Context, i int) error {
		_, err := c.fast.CoreV1().Pods(ns).Create(ctx, Pod(fmt.Sprintf("%s%04d", prefix, i), k), metav1.CreateOptions{})
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
	profiled := func() error { return nil }
	if k != Plain {
		profiled = c.startProfiles(ctx, fmt.Sprintf("%s-%d", k, c.round))
	}
	select {
	case <-done:
	case <-ctx.Done():
		return ph, ctx.Err()
	case <-time.After(c.opts.Timeout):
		mu.Lock()
		n := len(bound)
		mu.Unlock()
		return ph, fmt.Errorf("after %v only %d of %d pods (%s) are scheduled; a pending one: %s",
			c.opts.Timeout, n, c.opts.Pods, k, c.pendingReason(ctx, ns))
	}
	ph.Duration = time.Since(start)
	ph.CPU = c.cpuSince(cpu0)
	// kube-scheduler counts an attempt after its binding call returned,
	// so the last ones may not be counted yet when the pods show bound
	// (a CI-loaded scheduler can take seconds to get there).
	for wait := time.Now(); ; time.Sleep(100 * time.Millisecond) {
		attempts, err := c.schedulerAttempts(ctx)
		if err != nil {
			return ph, err
		}
		ph.Attempts = map[string]float64{}
		for r, v := range attempts {
			ph.Attempts[r] = v - attempts0[r]
		}
		if ph.Attempts["scheduled"] >= float64(ph.Pods) || time.Since(wait) > 30*time.Second {
			break
		}
	}
	c.say("  %d pods bound in %v: %.1f pods/s; scheduling attempts %v", ph.Pods, ph.Duration.Round(time.Millisecond), ph.PodsPerSecond(), ph.Attempts)
	// The next step deletes pods: the profile must not see it.
	return ph, profiled()
}

// DeletePods removes the pods of kind k (grace period 0: no kubelet would
// confirm) and waits until they, and with them their claims, are gone, so
// the next phase starts on an empty cluster.
func (c *Cluster) DeletePods(ctx context.Context, k Kind) error {
	ns := k.Namespace()
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

// Pod is a virt-launcher-shaped pod (one compute container with requests).
// A VFNet pod asks for one VF from ClaimTemplate as KubeVirt does for a
// vfnet network; an Upstream pod is the same pod asking for one device from
// UpstreamTemplate, so the two differ only in the claim.
func Pod(name string, k Kind) *corev1.Pod {
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
	template := ClaimTemplate
	if k == Upstream {
		template = UpstreamTemplate
	}
	if k != Plain {
		pod.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: k.claimName(), ResourceClaimTemplateName: ptr.To(template)}}
		pod.Spec.Containers[0].Resources.Claims = []corev1.ResourceClaim{{Name: k.claimName()}}
	}
	return pod
}

// Run is a whole measurement on a started plane: Setup, Publish, the phase
// without claims, then opts.Rounds rounds of a vfnet and an upstream-shape
// claim phase (see Options.Rounds), each with only its own shape's slices
// present (see Only) and checked by Verify; every phase's pods and claims
// are deleted before the next one.
func Run(ctx context.Context, plane *controlplane.Plane, opts Options) (*Cluster, Result, error) {
	var r Result
	c, err := Setup(ctx, plane, opts)
	if err != nil {
		return nil, r, err
	}
	if err := c.Publish(ctx, &r); err != nil {
		return c, r, err
	}
	phase := func(k Kind, round int) error {
		c.round = round
		if err := c.Only(ctx, k); err != nil {
			return err
		}
		ph, err := c.Schedule(ctx, k)
		if err != nil {
			return err
		}
		ph.Round = round
		r.Phases = append(r.Phases, ph)
		switch k {
		case Plain:
			r.WithoutClaims = ph
		case VFNet:
			r.WithClaims = r.WithClaims.add(ph)
		case Upstream:
			r.Upstream = r.Upstream.add(ph)
		}
		if err := c.Verify(ctx, k); err != nil {
			return err
		}
		return c.DeletePods(ctx, k)
	}
	if err := phase(Plain, 0); err != nil {
		return c, r, err
	}
	for round := 1; round <= c.opts.Rounds; round++ {
		order := []Kind{VFNet, Upstream}
		if round%2 == 0 {
			order = []Kind{Upstream, VFNet}
		}
		for _, k := range order {
			if err := phase(k, round); err != nil {
				return c, r, err
			}
		}
	}
	r.UpstreamPublish = c.upstreamPublish
	return c, r, nil
}

// Verify checks a phase's outcome: every pod of kind k bound, and for a
// claim phase its claim allocated exactly one device of the kind's driver
// (for vfnet a VF of network physnet-a) from the pool of the node the pod
// is bound to, and no device given twice.
func (c *Cluster) Verify(ctx context.Context, k Kind) error {
	ns := k.Namespace()
	pods, err := c.admin.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	var errs []error
	if len(pods.Items) != c.opts.Pods {
		errs = append(errs, fmt.Errorf("%d pods (%s) exist, want %d", len(pods.Items), k, c.opts.Pods))
	}
	for _, p := range pods.Items {
		if p.Spec.NodeName == "" {
			errs = append(errs, fmt.Errorf("pod %s is not scheduled", p.Name))
		}
	}
	if k == Plain {
		return errors.Join(errs...)
	}
	claims, err := c.admin.ResourceV1().ResourceClaims(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	sl, err := c.admin.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: "spec.driver=" + k.driver()})
	if err != nil {
		return err
	}
	network := map[string]string{} // pool/device -> vfnet.io/network
	exists := map[string]bool{}
	for _, s := range sl.Items {
		for _, d := range s.Spec.Devices {
			exists[s.Spec.Pool.Name+"/"+d.Name] = true
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
	for _, p := range pods.Items {
		if p.Spec.NodeName == "" {
			continue
		}
		var claimName string
		for _, st := range p.Status.ResourceClaimStatuses {
			if st.Name == k.claimName() && st.ResourceClaimName != nil {
				claimName = *st.ResourceClaimName
			}
		}
		cl := byName[claimName]
		if cl == nil {
			errs = append(errs, fmt.Errorf("pod %s: no claim generated from its template (status %+v)", p.Name, p.Status.ResourceClaimStatuses))
			continue
		}
		if cl.Status.Allocation == nil || len(cl.Status.Allocation.Devices.Results) != 1 {
			errs = append(errs, fmt.Errorf("pod %s: claim %s is not allocated exactly one device: %+v", p.Name, cl.Name, cl.Status.Allocation))
			continue
		}
		res := cl.Status.Allocation.Devices.Results[0]
		key := res.Pool + "/" + res.Device
		switch {
		case res.Driver != k.driver():
			errs = append(errs, fmt.Errorf("pod %s: claim %s allocated by driver %s, want %s", p.Name, cl.Name, res.Driver, k.driver()))
		case res.Pool != p.Spec.NodeName:
			errs = append(errs, fmt.Errorf("pod %s on node %s got %s from another node's pool", p.Name, p.Spec.NodeName, key))
		case !exists[key]:
			errs = append(errs, fmt.Errorf("pod %s got %s, which no slice of %s offers", p.Name, key, k.driver()))
		case k == VFNet && network[key] != Network:
			errs = append(errs, fmt.Errorf("pod %s got %s of network %q, want %s", p.Name, key, network[key], Network))
		case used[key] != "":
			errs = append(errs, fmt.Errorf("device %s allocated to both %s and %s", key, used[key], p.Name))
		}
		used[key] = p.Name
	}
	return errors.Join(errs...)
}

// Close stops every node's plugin and removes the run's directory.
func (c *Cluster) Close() {
	if c.watch != nil {
		c.watch.stop()
	}
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
		if d, err := procmem.CPU(pid); err == nil {
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
