package scale

import (
	"context"
	"flag"
	"fmt"
	"os"
	"sort"
	"strings"
	"testing"
	"time"

	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"

	"github.com/vfnet-io/vfnet/test/lib/controlplane"
	"github.com/vfnet-io/vfnet/test/lib/simhost"
)

// Sizes of BenchmarkManyNodes; the flags allow smaller runs while profiling
// (go test ./test/scale -run '^$' -bench ManyNodes -args -scale.nodes=20).
var (
	benchNodes    = flag.Int("scale.nodes", 100, "BenchmarkManyNodes: simulated nodes")
	benchVFsPerPF = flag.Int("scale.vfs-per-pf", 128, "BenchmarkManyNodes: VFs per PF (two PFs per node)")
	benchPods     = flag.Int("scale.pods", 500, "BenchmarkManyNodes: pods per phase")
	benchOffer    = flag.Int("scale.offer-vfs", 0, "BenchmarkManyNodes: offer only VF indexes 0 to N-1 of each PF (node-config.yaml's vfs field); 0 offers all")
	benchProfile  = flag.Bool("scale.profiling", false, "BenchmarkManyNodes: serve /debug/pprof on kube-apiserver too (kube-scheduler always does), to profile a run")
	benchTuned    = flag.Bool("scale.tuned", true, "BenchmarkManyNodes: raise kube-scheduler's and kube-controller-manager's client QPS (see ControlPlaneFlags)")
	benchRounds   = flag.Int("scale.rounds", 2, "BenchmarkManyNodes: rounds of claim phases; odd rounds run vfnet then the upstream shape, even rounds the reverse (see Options.Rounds)")
	benchShape    = flag.String("scale.upstream-shape", string(UpstreamShapeV137), "BenchmarkManyNodes: upstream device template revision: v1.37 (13 attributes, 2 capacities) or earlier (4 attributes, 1 capacity)")
	benchGates    = flag.String("scale.scheduler-feature-gates", os.Getenv("VFNET_SCALE_SCHEDULER_FEATURE_GATES"),
		"BenchmarkManyNodes: kube-scheduler --feature-gates, e.g. SchedulerPreQueueingHints=true (default: $VFNET_SCALE_SCHEDULER_FEATURE_GATES)")
	benchProfDir = flag.String("scale.profile-dir", "", "BenchmarkManyNodes: write a CPU profile of kube-scheduler (and of kube-apiserver with -scale.profiling) for each claim phase here")
	benchProfSec = flag.Int("scale.profile-seconds", 5, "BenchmarkManyNodes: length of each profile from the phase's start")
)

// TestSmallCluster is BenchmarkManyNodes' whole path at a small size: 3
// nodes publish through the driver's loop and kubelet-plugin helper, the
// real scheduler places 10 pods without a claim, then 10 with a claim from
// the example template, 10 with a claim of the upstream shape (vfnet's
// slices withdrawn, the upstream shape's created), and 10 again with the
// example template's (the upstream shape's slices deleted, vfnet's
// republished by each node's plugin); Run checks that every claim holds
// one device of its kind (a physnet-a VF for vfnet) of its pod's node.
func TestSmallCluster(t *testing.T) {
	t.Parallel()
	_, ctx := ktesting.NewTestContext(t)
	plane := controlplane.StartForTest(t, controlplane.Options{})
	const nodes, vfsPerPF, pods = 3, 4, 10
	c, r, err := Run(ctx, plane, Options{Nodes: nodes, VFsPerPF: vfsPerPF, Pods: pods, Rounds: 2, Timeout: 3 * time.Minute, HostDir: simhost.TempDir(t)})
	if c != nil {
		t.Cleanup(c.Close)
	}
	if err != nil {
		t.Fatal(err)
	}
	if want := nodes * 2 * vfsPerPF; r.Devices != want || r.Slices != nodes {
		t.Errorf("published %d devices in %d slices, want %d in %d (one slice per node)", r.Devices, r.Slices, want, nodes)
	}
	var order []string
	for _, ph := range r.Phases {
		order = append(order, fmt.Sprintf("%s/%d", ph.Kind, ph.Round))
	}
	if got, want := strings.Join(order, " "), "plain/0 vfnet/1 upstream-shape/1 upstream-shape/2 vfnet/2"; got != want {
		t.Errorf("phases ran as %q, want %q", got, want)
	}
	if r.WithoutClaims.Pods != pods || r.WithClaims.Pods != 2*pods || r.Upstream.Pods != 2*pods {
		t.Errorf("phases scheduled %d plain, %d vfnet and %d upstream-shape pods, want %d, %d and %d",
			r.WithoutClaims.Pods, r.WithClaims.Pods, r.Upstream.Pods, pods, 2*pods, 2*pods)
	}
	if r.UpstreamPublish <= 0 {
		t.Error("the upstream shape's publishing time was not measured")
	}
	if got := r.WithClaims.Attempts["scheduled"]; got < 2*pods {
		t.Errorf("kube-scheduler's metrics count %v successful attempts in the vfnet phases, want %d", got, 2*pods)
	}
	t.Log(Summary(r))
}

// BenchmarkManyNodes: 100 simulated nodes x 256 VFs (25,600 devices)
// published the way vfnet-driver publishes them, then 500 pods with vfnet
// claims scheduled by the real kube-scheduler versus 500 identical pods
// without claims and 500 identical pods each claiming one device of
// Kubernetes' own DRA benchmark shape (10 devices a node, upstream.go), in
// the same run; the claim phases run twice, alternated (-scale.rounds).
// Goals: all slices in under 10 s, and pods/s with vfnet claims at least
// 0.9 of pods/s with upstream-shape claims. Results and their analysis:
// BENCHMARKS.md. Run with `make bench-scale`, i.e.
//
//	VFNET_K8S_BIN=$(test/builds/kubernetes/build.sh) go test ./test/scale -run '^$' -bench ManyNodes -benchtime 1x -timeout 60m
//
// and with -args -scale.scheduler-feature-gates=SchedulerPreQueueingHints=true
// (or VFNET_SCALE_SCHEDULER_FEATURE_GATES) for kube-scheduler's alpha gate.
func BenchmarkManyNodes(b *testing.B) {
	// klog's stderr logger, not the benchmark's log: go test keeps only the
	// first ten lines of that, and the summary goes there.
	ctx := klog.NewContext(context.Background(), klog.Background())
	// One iteration is a whole cluster experiment, and the timer runs
	// through it: ns/op is one run, and the first run already outlasts the
	// default -benchtime, so `make bench` runs it once too. (With the timer
	// stopped around it, b.Loop never reached the benchtime and started
	// cluster after cluster until the test timeout.)
	var r Result
	for b.Loop() {
		r = benchOnce(ctx, b)
	}
	b.ReportMetric(r.Publish.Seconds(), "publish-s")
	b.ReportMetric(float64(r.APIServerRSS)/(1<<20), "apiserver-MiB")
	b.ReportMetric(r.WithClaims.PodsPerSecond(), "pods/s-claims")
	b.ReportMetric(r.WithoutClaims.PodsPerSecond(), "pods/s-plain")
	b.ReportMetric(r.Upstream.PodsPerSecond(), "pods/s-upstream")
	b.ReportMetric(r.Ratio(), "ratio")
	b.ReportMetric(r.UpstreamRatio(), "ratio-vfnet/upstream")
	b.ReportMetric(r.CPURatio(), "cpu-ratio-vfnet/upstream")
	b.ReportMetric(float64(r.Devices), "devices")
	if *benchGates != "" {
		b.Logf("kube-scheduler --feature-gates=%s", *benchGates)
	}
	b.Log(Summary(r))
	if load, err := os.ReadFile("/proc/loadavg"); err == nil {
		b.Logf("load average: %s", strings.TrimSpace(string(load)))
	}
}

func benchOnce(ctx context.Context, b *testing.B) Result {
	opts := controlplane.Options{HandleSignals: true}
	if *benchTuned {
		opts = ControlPlaneFlags()
		opts.HandleSignals = true
	}
	if *benchProfile {
		opts.ExtraAPIServerFlags = append(opts.ExtraAPIServerFlags, "--profiling=true")
	}
	if *benchGates != "" {
		opts.ExtraSchedulerFlags = append(opts.ExtraSchedulerFlags, "--feature-gates="+*benchGates)
	}
	plane, err := controlplane.Start(ctx, opts)
	if err != nil {
		b.Fatal(err)
	}
	defer plane.Stop()
	o := Options{Nodes: *benchNodes, VFsPerPF: *benchVFsPerPF, OfferVFs: *benchOffer, Pods: *benchPods, Rounds: *benchRounds,
		UpstreamShape: UpstreamShape(*benchShape), ProfileDir: *benchProfDir, ProfileSeconds: *benchProfSec,
		HostDir: simhost.TempDir(b)}
	if testing.Verbose() {
		o.Progress = os.Stderr
	}
	c, r, err := Run(ctx, plane, o)
	if c != nil {
		defer c.Close()
	}
	if err != nil {
		b.Fatal(err)
	}
	return r
}

// Summary is a human-readable account of a run, CPU per component included
// (the first place to look for the bottleneck).
func Summary(r Result) string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "%d nodes, %d devices in %d slices published in %v; kube-apiserver RSS %d MiB (%d before)\n",
		r.Nodes, r.Devices, r.Slices, r.Publish.Round(time.Millisecond), r.APIServerRSS>>20, r.APIServerRSSBefore>>20)
	fmt.Fprintf(&sb, "  publish CPU: %s\n", cpuLine(r.PublishCPU))
	fmt.Fprintf(&sb, "upstream shape's %d slices (%d devices a node) created and served in %v\n",
		r.Nodes, UpstreamDevicesPerNode, r.UpstreamPublish.Round(time.Millisecond))
	for _, ph := range r.Phases {
		name := ph.Kind.String()
		if ph.Round > 0 {
			name += fmt.Sprintf(" (round %d)", ph.Round)
		}
		fmt.Fprintf(&sb, "%s: %d pods in %v = %.1f pods/s (created beforehand in %v); attempts %s; CPU: %s\n", name, ph.Pods,
			ph.Duration.Round(time.Millisecond), ph.PodsPerSecond(), ph.Created.Round(time.Millisecond), attemptsLine(ph.Attempts), cpuLine(ph.CPU))
	}
	fmt.Fprintf(&sb, "pods/s: plain %.1f, vfnet %.1f, upstream shape %.1f (claim phases summed over their rounds)\n",
		r.WithoutClaims.PodsPerSecond(), r.WithClaims.PodsPerSecond(), r.Upstream.PodsPerSecond())
	fmt.Fprintf(&sb, "CPU per pod: vfnet %s; upstream shape %s\n", perPodLine(r.WithClaims), perPodLine(r.Upstream))
	fmt.Fprintf(&sb, "control-plane CPU per pod: vfnet %.1fms, upstream shape %.1fms, plain %.1fms\n",
		ms(r.WithClaims.ControlPlaneCPUPerPod()), ms(r.Upstream.ControlPlaneCPUPerPod()), ms(r.WithoutClaims.ControlPlaneCPUPerPod()))
	fmt.Fprintf(&sb, "ratio vfnet/upstream shape: %.2f (by control-plane CPU per pod: %.2f); vfnet/plain: %.2f; upstream shape/plain: %.2f",
		r.UpstreamRatio(), r.CPURatio(), r.Ratio(), r.UpstreamPlainRatio())
	return sb.String()
}

func attemptsLine(m map[string]float64) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		if m[k] != 0 {
			parts = append(parts, fmt.Sprintf("%s %.0f", k, m[k]))
		}
	}
	return strings.Join(parts, ", ")
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// perPodLine is a phase's CPU per pod and component, in ms.
func perPodLine(p Phase) string {
	if p.Pods == 0 {
		return ""
	}
	keys := make([]string, 0, len(p.CPU))
	for k := range p.CPU {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %.1fms", k, ms(p.CPU[k])/float64(p.Pods)))
	}
	return strings.Join(parts, ", ")
}

func cpuLine(m map[string]time.Duration) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %.1fs", k, m[k].Seconds()))
	}
	return strings.Join(parts, ", ")
}
