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

	"github.com/vfnet-io/vfnet/pkg/simhost"
	"github.com/vfnet-io/vfnet/test/controlplane"
)

// Sizes of BenchmarkManyNodes; the flags allow smaller runs while profiling
// (go test ./test/scale -run '^$' -bench ManyNodes -args -scale.nodes=20).
var (
	benchNodes    = flag.Int("scale.nodes", 100, "BenchmarkManyNodes: simulated nodes")
	benchVFsPerPF = flag.Int("scale.vfs-per-pf", 128, "BenchmarkManyNodes: VFs per PF (two PFs per node)")
	benchPods     = flag.Int("scale.pods", 500, "BenchmarkManyNodes: pods per phase")
	benchProfile  = flag.Bool("scale.profiling", false, "BenchmarkManyNodes: serve /debug/pprof on kube-apiserver too (kube-scheduler always does), to profile a run")
	benchTuned    = flag.Bool("scale.tuned", true, "BenchmarkManyNodes: raise kube-scheduler's and kube-controller-manager's client QPS (see ControlPlaneFlags)")
)

// TestSmallCluster is BenchmarkManyNodes' whole path at a small size: 3
// nodes publish through the driver's loop and kubelet-plugin helper, the
// real scheduler places 10 pods without and 10 with a claim from the
// example template, and every claim holds one physnet-a VF of its pod's node.
func TestSmallCluster(t *testing.T) {
	t.Parallel()
	_, ctx := ktesting.NewTestContext(t)
	plane := controlplane.StartForTest(t, controlplane.Options{})
	const nodes, vfsPerPF, pods = 3, 4, 10
	c, r, err := Run(ctx, plane, Options{Nodes: nodes, VFsPerPF: vfsPerPF, Pods: pods, Timeout: 3 * time.Minute, HostDir: simhost.TempDir(t)})
	if c != nil {
		t.Cleanup(c.Close)
	}
	if err != nil {
		t.Fatal(err)
	}
	if want := nodes * 2 * vfsPerPF; r.Devices != want || r.Slices != nodes {
		t.Errorf("published %d devices in %d slices, want %d in %d (one slice per node)", r.Devices, r.Slices, want, nodes)
	}
	if r.WithoutClaims.Pods != pods || r.WithClaims.Pods != pods {
		t.Errorf("phases scheduled %d and %d pods, want %d each", r.WithoutClaims.Pods, r.WithClaims.Pods, pods)
	}
	if err := c.Verify(ctx); err != nil {
		t.Error(err)
	}
	t.Log(Summary(r))
}

// BenchmarkManyNodes: 100 simulated nodes x 256 VFs (25,600 devices)
// published the way vfnet-driver publishes them, then 500 pods with vfnet
// claims scheduled by the real kube-scheduler versus 500 identical pods
// without claims, in the same run. Goals: all slices in under 10 s, and
// pods/s with claims at least half of pods/s without. Results and their
// analysis: BENCHMARKS.md. Run with `make bench-scale`, i.e.
//
//	VFNET_K8S_BIN=$(test/tools/build.sh) go test ./test/scale -run '^$' -bench ManyNodes -benchtime 1x -timeout 60m
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
	b.ReportMetric(r.Ratio(), "ratio")
	b.ReportMetric(float64(r.Devices), "devices")
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
	plane, err := controlplane.Start(ctx, opts)
	if err != nil {
		b.Fatal(err)
	}
	defer plane.Stop()
	o := Options{Nodes: *benchNodes, VFsPerPF: *benchVFsPerPF, Pods: *benchPods, HostDir: simhost.TempDir(b)}
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
	if err := c.Verify(ctx); err != nil {
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
	for _, ph := range []struct {
		name string
		p    Phase
	}{{"without claims", r.WithoutClaims}, {"with claims", r.WithClaims}} {
		fmt.Fprintf(&sb, "%s: %d pods in %v = %.1f pods/s (created beforehand in %v); CPU: %s\n", ph.name, ph.p.Pods,
			ph.p.Duration.Round(time.Millisecond), ph.p.PodsPerSecond(), ph.p.Created.Round(time.Millisecond), cpuLine(ph.p.CPU))
	}
	fmt.Fprintf(&sb, "ratio with/without claims: %.2f", r.Ratio())
	return sb.String()
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
