package health

import (
	"context"
	"strings"
	"testing"
	"time"

	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2/ktesting"

	"github.com/vfnet-io/vfnet/driver/discovery"
	"github.com/vfnet-io/vfnet/driver/kernel/sysfs"
	"github.com/vfnet-io/vfnet/driver/kernel/vflink"
	"github.com/vfnet-io/vfnet/pkg/api/nodeconfig"
	"github.com/vfnet-io/vfnet/test/lib/simhost"
)

func host(operstate string, vfs ...string) []sysfs.PF {
	pf := sysfs.PF{Function: sysfs.Function{Address: "0000:3b:00.0", NetDevs: []string{"ens1f0"}}, NetDev: "ens1f0", OperState: operstate}
	for i, a := range vfs {
		pf.VFs = append(pf.VFs, sysfs.VF{Function: sysfs.Function{Address: a}, Index: i, PFAddress: pf.Address})
	}
	return []sysfs.PF{pf}
}

var devs = []discovery.Device{
	{Name: "vf-0000-3b-01-0", Address: "0000:3b:01.0", PFAddress: "0000:3b:00.0"},
	{Name: "vf-0000-3b-01-1", Address: "0000:3b:01.1", PFAddress: "0000:3b:00.0"},
}

func healthOf(r kubeletplugin.DeviceHealthReport) map[string]kubeletplugin.HealthStatus {
	out := map[string]kubeletplugin.HealthStatus{}
	for _, d := range r.Devices {
		out[d.DeviceName] = d.Health
	}
	return out
}

func TestObserve(t *testing.T) {
	t.Parallel()
	m := NewMonitor(Options{PoolName: "node"})
	m.Observe(host("up", "0000:3b:01.0", "0000:3b:01.1"), devs)
	r := m.Report()
	if len(r.Devices) != 2 || r.Devices[0].PoolName != "node" || r.Devices[0].DeviceName != "vf-0000-3b-01-0" {
		t.Fatalf("report %+v", r)
	}
	for n, h := range healthOf(r) {
		if h != kubeletplugin.HealthStatusHealthy {
			t.Errorf("%s: %s", n, h)
		}
	}
	for _, tc := range []struct {
		name string
		pfs  []sysfs.PF
		want [2]kubeletplugin.HealthStatus
	}{
		{"unknown operstate is healthy", host("unknown", "0000:3b:01.0", "0000:3b:01.1"), [2]kubeletplugin.HealthStatus{"Healthy", "Healthy"}},
		{"link down", host("down", "0000:3b:01.0", "0000:3b:01.1"), [2]kubeletplugin.HealthStatus{"Unhealthy", "Unhealthy"}},
		{"lower layer down", host("lowerlayerdown", "0000:3b:01.0", "0000:3b:01.1"), [2]kubeletplugin.HealthStatus{"Unhealthy", "Unhealthy"}},
		{"VF gone", host("up", "0000:3b:01.0"), [2]kubeletplugin.HealthStatus{"Healthy", "Unhealthy"}},
		{"PF gone", nil, [2]kubeletplugin.HealthStatus{"Unhealthy", "Unhealthy"}},
		{"back", host("up", "0000:3b:01.0", "0000:3b:01.1"), [2]kubeletplugin.HealthStatus{"Healthy", "Healthy"}},
	} {
		// Devices no longer offered stay tracked.
		m.Observe(tc.pfs, nil)
		got := healthOf(m.Report())
		if got["vf-0000-3b-01-0"] != tc.want[0] || got["vf-0000-3b-01-1"] != tc.want[1] {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestWatchSendsFullThenChangesThenResends(t *testing.T) {
	t.Parallel()
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	m := NewMonitor(Options{PoolName: "node", ResendInterval: 200 * time.Millisecond})
	m.Observe(host("up", "0000:3b:01.0", "0000:3b:01.1"), devs)
	reports := make(chan kubeletplugin.DeviceHealthReport)
	done := make(chan error)
	go func() { done <- m.Watch(ctx, reports) }()

	first := <-reports
	if len(first.Devices) != 2 || healthOf(first)["vf-0000-3b-01-0"] != kubeletplugin.HealthStatusHealthy {
		t.Fatalf("first report %+v", first)
	}
	m.Observe(host("down", "0000:3b:01.0", "0000:3b:01.1"), devs)
	second := <-reports
	if healthOf(second)["vf-0000-3b-01-1"] != kubeletplugin.HealthStatusUnhealthy || second.Devices[1].Message != "PF 0000:3b:00.0 link is down" {
		t.Fatalf("report after link down %+v", second)
	}
	// No change: the same state comes again after the resend interval.
	third := <-reports
	if healthOf(third)["vf-0000-3b-01-1"] != kubeletplugin.HealthStatusUnhealthy {
		t.Fatalf("resent report %+v", third)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Watch returned %v", err)
	}
}

func TestObserveUnchangedDoesNotWake(t *testing.T) {
	t.Parallel()
	m := NewMonitor(Options{})
	m.Observe(host("up", "0000:3b:01.0", "0000:3b:01.1"), devs)
	m.mu.Lock()
	ch := m.changed
	m.mu.Unlock()
	m.Observe(host("up", "0000:3b:01.0", "0000:3b:01.1"), devs)
	select {
	case <-ch:
		t.Fatal("an unchanged observation signalled a change")
	default:
	}
	if m.opts.ResendInterval != DefaultResendInterval || DefaultResendInterval >= 30*time.Second {
		t.Fatalf("resend interval %v must stay below the kubelet's 30s lease", m.opts.ResendInterval)
	}
}

// TestPFStates: each PF's state follows the host (link down, gone, back),
// and OnPFChange fires exactly when one changes (the slices loop then
// republishes with or without the taint).
func TestPFStates(t *testing.T) {
	t.Parallel()
	calls := 0
	m := NewMonitor(Options{PoolName: "node", OnPFChange: func(pfs []string) {
		calls++
		if len(pfs) != 1 || pfs[0] != "0000:3b:00.0" {
			t.Errorf("OnPFChange(%v), want the one PF", pfs)
		}
	}})
	offered := []discovery.Device{
		{Name: "vf-0000-3b-01-0", Address: "0000:3b:01.0", PFAddress: "0000:3b:00.0", Network: "physnet-a"},
	}
	for _, step := range []struct {
		name  string
		pfs   []sysfs.PF
		state string
		calls int
	}{
		{"first", host("up", "0000:3b:01.0"), PFHealthy, 0},
		{"same", host("up", "0000:3b:01.0"), PFHealthy, 0},
		{"cable pulled", host("down", "0000:3b:01.0"), PFLinkDown, 1},
		{"lower layer down", host("lowerlayerdown", "0000:3b:01.0"), PFLinkDown, 1},
		{"unknown operstate is not down", host("unknown", "0000:3b:01.0"), PFHealthy, 2},
		{"PF removed", nil, PFGone, 3},
		{"PF back", host("up", "0000:3b:01.0"), PFHealthy, 4},
	} {
		m.Observe(step.pfs, offered)
		got := m.PFs()
		want := PFHealth{Address: "0000:3b:00.0", Name: "ens1f0", Network: "physnet-a", State: step.state}
		if len(got) != 1 || got[0] != want || calls != step.calls {
			t.Errorf("%s: PFs() = %+v, OnPFChange calls %d; want [%+v], %d", step.name, got, calls, want, step.calls)
		}
	}
}

// A PF whose netdev the VF link layer cannot find (the driver looks in
// another network namespace, or the netdev went away from it) makes its
// VFs Unhealthy, with the namespace in the message: their settings could
// not be changed or restored.
func TestObserveUnreachablePFNetdev(t *testing.T) {
	t.Parallel()
	h, err := simhost.Build(t.TempDir(), simhost.E810Host())
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	pfs, err := h.Sysfs().Discover(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := nodeconfig.Parse([]byte("apiVersion: vfnet.io/v1alpha1\nkind: NodeConfig\npfs:\n- pfName: enp59s0f0\n  network: a\n"), "node.yaml")
	if err != nil {
		t.Fatal(err)
	}
	res, err := discovery.Build(pfs, cfg, discovery.Options{})
	if err != nil || len(res.Devices) == 0 {
		t.Fatalf("devices %d, err %v", len(res.Devices), err)
	}
	podNs, err := h.AddNetns("pod")
	if err != nil {
		t.Fatal(err)
	}
	pod, err := h.LinksAt(podNs)
	if err != nil {
		t.Fatal(err)
	}
	var links vflink.Links = pod
	m := NewMonitor(Options{PoolName: "node", Resolve: func(nd string) error { _, err := links.Resolve(nd); return err }})
	m.Observe(pfs, res.Devices)
	for _, d := range m.Report().Devices {
		if d.Health != kubeletplugin.HealthStatusUnhealthy || !strings.Contains(d.Message, "PF 0000:3b:00.0 netdev enp59s0f0") ||
			!strings.Contains(d.Message, "not found in network namespace "+podNs) {
			t.Fatalf("%s: %s %q", d.DeviceName, d.Health, d.Message)
		}
	}
	links = h.Links()
	m.Observe(pfs, res.Devices)
	for _, d := range m.Report().Devices {
		if d.Health != kubeletplugin.HealthStatusHealthy || d.Message != "" {
			t.Fatalf("host namespace: %s: %s %q", d.DeviceName, d.Health, d.Message)
		}
	}
}
