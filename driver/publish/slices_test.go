package publish

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2/ktesting"

	"github.com/vfnet-io/vfnet/driver/discovery"
	"github.com/vfnet-io/vfnet/driver/health"
	"github.com/vfnet-io/vfnet/driver/kernel/sysfs"
	"github.com/vfnet-io/vfnet/driver/kernel/vflink"
	"github.com/vfnet-io/vfnet/driver/vfcount"
	"github.com/vfnet-io/vfnet/pkg/api/nodeconfig"
	"github.com/vfnet-io/vfnet/pkg/contract/pciaddr"
)

func devices(n int) []discovery.Device {
	out := make([]discovery.Device, n)
	for i := range out {
		addr := fmt.Sprintf("0000:3b:%02x.%d", 1+i/8, i%8)
		name, _ := pciaddr.DeviceName(addr)
		out[i] = discovery.Device{Name: name, Address: addr, VFIndex: i, PFAddress: "0000:3b:00.0", PFName: "p", Network: "n", NUMANode: -1}
	}
	return out
}

func TestPoolSplits(t *testing.T) {
	t.Parallel()
	for n, want := range map[int][]int{0: {0}, 1: {1}, 128: {128}, 129: {128, 1}, 1024: {128, 128, 128, 128, 128, 128, 128, 128}} {
		pool := Pool(devices(n), nil)
		var got []int
		for _, s := range pool.Slices {
			got = append(got, len(s.Devices))
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%d devices: slices %v, want %v", n, got, want)
		}
		// Order is kept.
		if n > 129 && pool.Slices[1].Devices[0].Name != devices(n)[128].Name {
			t.Errorf("%d devices: slice 1 starts with %s", n, pool.Slices[1].Devices[0].Name)
		}
	}
}

func TestResourceSlices(t *testing.T) {
	t.Parallel()
	res := DriverResources("node-1", devices(300), nil)
	out := ResourceSlices(discovery.DriverName, "node-1", res)
	if len(out) != 3 {
		t.Fatalf("%d slices", len(out))
	}
	for i, s := range out {
		if s.APIVersion != "resource.k8s.io/v1" || s.Kind != "ResourceSlice" ||
			s.GenerateName != fmt.Sprintf("%05x-sriov.vfnet.io-node-1-", i) ||
			s.Spec.Pool.Name != "node-1" || s.Spec.Pool.ResourceSliceCount != 3 || *s.Spec.NodeName != "node-1" || s.Spec.Driver != "sriov.vfnet.io" {
			t.Errorf("slice %d: %+v", i, s.ObjectMeta)
		}
	}
	if ResourceSlices(discovery.DriverName, "other", res) != nil {
		t.Error("slices for a node without pool")
	}
}

type fakeDiscoverer struct {
	pfs []sysfs.PF
	err error
}

func (f *fakeDiscoverer) Discover(context.Context) ([]sysfs.PF, error) { return f.pfs, f.err }

type recorder struct {
	published []resourceslice.DriverResources
}

func (r *recorder) PublishResources(_ context.Context, res resourceslice.DriverResources) error {
	r.published = append(r.published, res)
	return nil
}

func (r *recorder) lastDevices(node string) int {
	n := 0
	for _, s := range r.published[len(r.published)-1].Pools[node].Slices {
		n += len(s.Devices)
	}
	return n
}

func pfWith(addr, netdev string, vfs int) sysfs.PF {
	pf := sysfs.PF{Function: sysfs.Function{Address: addr, VendorID: "8086", DeviceID: "1593", NetDevs: []string{netdev}, NUMANode: 0}, TotalVFs: 64, NumVFs: vfs, OperState: "up", LinkType: "ethernet"}
	for i := 0; i < vfs; i++ {
		pf.VFs = append(pf.VFs, sysfs.VF{Function: sysfs.Function{Address: fmt.Sprintf("%s:%02x.%d", addr[:7], 0x10+i/8, i%8), VendorID: "8086", DeviceID: "1889", Driver: "iavf", IOMMUGroup: strconv.Itoa(100 + i)}, Index: i, PFAddress: addr})
	}
	return pf
}

func cfg(t *testing.T, network string) *nodeconfig.Config {
	c, err := nodeconfig.Parse([]byte("apiVersion: vfnet.io/v1alpha1\nkind: NodeConfig\npfs:\n- pfName: ens1\n  network: "+network+"\n"), "node.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestLoopRepublishesOnlyOnChange(t *testing.T) {
	t.Parallel()
	_, ctx := ktesting.NewTestContext(t)
	disc := &fakeDiscoverer{pfs: []sysfs.PF{pfWith("0000:3b:00.0", "ens1", 4)}}
	pub := &recorder{}
	current, cfgErr := cfg(t, "a"), error(nil)
	scans := 0
	l := NewLoop(LoopOptions{NodeName: "n", Discoverer: disc, Publisher: pub,
		LoadConfig: func() (*nodeconfig.Config, error) { return current, cfgErr },
		OnScan:     func([]sysfs.PF, discovery.Result) { scans++ }})
	step := func(name string, wantChanged bool, wantDevices int) {
		t.Helper()
		changed, err := l.Scan(ctx)
		if err != nil || changed != wantChanged {
			t.Fatalf("%s: Scan = %v, %v; want changed=%v", name, changed, err, wantChanged)
		}
		if got := pub.lastDevices("n"); got != wantDevices {
			t.Fatalf("%s: last publish has %d devices, want %d", name, got, wantDevices)
		}
	}
	step("first", true, 4)
	step("unchanged", false, 4)
	// Prepare binding a VF to vfio-pci does not change the published device.
	disc.pfs[0].VFs[1].Driver = "vfio-pci"
	l.opts.Owned = func(a string) bool { return a == disc.pfs[0].VFs[1].Address }
	step("driver change", false, 4)
	disc.pfs = []sysfs.PF{pfWith("0000:3b:00.0", "ens1", 6)}
	step("more VFs", true, 6)
	current = cfg(t, "b")
	step("network renamed", true, 6)
	if a := pub.published[len(pub.published)-1].Pools["n"].Slices[0].Devices[0].Attributes[discovery.AttrNetwork]; *a.StringValue != "b" {
		t.Fatalf("network attribute %s", *a.StringValue)
	}
	cfgErr = errors.New("node.yaml: pfs[0].network: bad")
	step("invalid config keeps the last good one", false, 6)
	cfgErr = nil
	// A PF whose link is down keeps its VFs published, with the taint.
	disc.pfs[0].OperState = "down"
	step("link down taints", true, 6)
	checkTaints(t, pub, 6, "link-down")
	step("still down", false, 6)
	disc.pfs[0].OperState = "up"
	step("link up lifts the taint", true, 6)
	checkTaints(t, pub, 0, "")
	// A vanished PF's VFs stay published, tainted, until it comes back.
	disc.pfs = nil
	step("PF removed", true, 6)
	checkTaints(t, pub, 6, "gone")
	step("still gone", false, 6)
	if got := l.Tainted(); got["0000:3b:00.0"] != 6 {
		t.Errorf("Tainted() = %v", got)
	}
	disc.pfs = []sysfs.PF{pfWith("0000:3b:00.0", "ens1", 6)}
	step("PF back", true, 6)
	checkTaints(t, pub, 0, "")
	disc.err = errors.New("read failed")
	if _, err := l.Scan(ctx); err == nil || !strings.Contains(err.Error(), "read failed") {
		t.Fatalf("discovery error = %v", err)
	}
	if scans != 12 {
		t.Fatalf("OnScan called %d times, want 12", scans)
	}
	if len(pub.published) != 7 {
		t.Fatalf("%d publishes, want 7", len(pub.published))
	}
}

// checkTaints: the last publication has n devices with the vfnet taint
// (NoSchedule, value reason) and no other taints.
func checkTaints(t *testing.T, pub *recorder, n int, reason string) {
	t.Helper()
	got := 0
	for _, s := range pub.published[len(pub.published)-1].Pools["n"].Slices {
		for _, d := range s.Devices {
			for _, taint := range d.Taints {
				if taint.Key != TaintKey || taint.Value != reason || taint.Effect != resourceapi.DeviceTaintEffectNoSchedule || len(d.Taints) != 1 {
					t.Fatalf("device %s taints %+v, want one %s=%s:NoSchedule", d.Name, d.Taints, TaintKey, reason)
				}
				got++
			}
		}
	}
	if got != n {
		t.Fatalf("%d tainted devices, want %d", got, n)
	}
}

// TestPoolTaintedSlicesHoldAtMost64 checks the API server's limit: a slice
// with a tainted device holds at most 64 devices, others up to 128; order
// is kept.
func TestPoolTaintedSlicesHoldAtMost64(t *testing.T) {
	t.Parallel()
	devs := make([]discovery.Device, 300)
	for i := range devs {
		addr := fmt.Sprintf("0000:%02x:%02x.%d", 0x3b+i/256, (i/8)%32, i%8)
		name, err := pciaddr.DeviceName(addr)
		if err != nil {
			t.Fatal(err)
		}
		devs[i] = discovery.Device{Name: name, Address: addr, VFIndex: i, PFAddress: "0000:3a:00.0", Network: "n", NUMANode: -1}
	}
	taint := func(from, to int) Taints {
		out := Taints{}
		for i := from; i < to; i++ {
			out[devs[i].Name] = "link-down"
		}
		return out
	}
	for _, tc := range []struct {
		name   string
		taints Taints
		want   []int
	}{
		{"none", nil, []int{128, 128, 44}},
		{"all", taint(0, 300), []int{64, 64, 64, 64, 44}},
		// A tainted run closes slices at 64, the untainted rest goes on at 128.
		{"first PF's 100", taint(0, 100), []int{64, 64, 128, 44}},
		{"one in the middle", taint(150, 151), []int{128, 64, 108}},
		{"last", taint(299, 300), []int{128, 128, 44}},
	} {
		pool := Pool(devs, tc.taints)
		var got []int
		i := 0
		for _, s := range pool.Slices {
			got = append(got, len(s.Devices))
			tainted := false
			for _, d := range s.Devices {
				if d.Name != devs[i].Name {
					t.Fatalf("%s: device %d is %s, want %s", tc.name, i, d.Name, devs[i].Name)
				}
				i++
				tainted = tainted || len(d.Taints) > 0
			}
			if tainted && len(s.Devices) > 64 || len(s.Devices) > 128 {
				t.Errorf("%s: slice of %d devices (tainted %v)", tc.name, len(s.Devices), tainted)
			}
		}
		if fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Errorf("%s: slices %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestLoopStartupErrors(t *testing.T) {
	t.Parallel()
	_, ctx := ktesting.NewTestContext(t)
	disc := &fakeDiscoverer{pfs: []sysfs.PF{pfWith("0000:3b:00.0", "ens1", 2)}}
	l := NewLoop(LoopOptions{NodeName: "n", Discoverer: disc, Publisher: &recorder{},
		LoadConfig: func() (*nodeconfig.Config, error) { return nil, errors.New("node.yaml: kind: bad") }})
	if _, err := l.Scan(ctx); err == nil || !strings.Contains(err.Error(), "node.yaml: kind") {
		t.Fatalf("invalid config at start-up: %v", err)
	}
	overlap, err := nodeconfig.Parse([]byte("apiVersion: vfnet.io/v1alpha1\nkind: NodeConfig\npfs:\n- pfName: ens1\n  network: a\n- vendorID: \"8086\"\n  network: b\n"), "node.yaml")
	if err != nil {
		t.Fatal(err)
	}
	l = NewLoop(LoopOptions{NodeName: "n", Discoverer: disc, Publisher: &recorder{},
		LoadConfig: func() (*nodeconfig.Config, error) { return overlap, nil }})
	if _, err := l.Scan(ctx); err == nil || !strings.Contains(err.Error(), "matched by pfs[0] and pfs[1]") {
		t.Fatalf("ambiguous config at start-up: %v", err)
	}
	pub := &recorder{}
	l = NewLoop(LoopOptions{NodeName: "n", Discoverer: disc, Publisher: pub})
	if changed, err := l.Scan(ctx); err != nil || !changed || pub.lastDevices("n") != 0 {
		t.Fatalf("no config: %v, %v, %d devices", changed, err, pub.lastDevices("n"))
	}
}

// TestPublishedDuringScan: the prepare path reads Published while a scan
// asks it (Owned) about VFs; that must not deadlock.
func TestPublishedDuringScan(t *testing.T) {
	t.Parallel()
	_, ctx := ktesting.NewTestContext(t)
	var l *Loop
	calls := 0
	l = NewLoop(LoopOptions{NodeName: "n", Publisher: &recorder{},
		Discoverer: &fakeDiscoverer{pfs: []sysfs.PF{pfWith("0000:3b:00.0", "ens1", 2)}},
		LoadConfig: func() (*nodeconfig.Config, error) { return cfg(t, "a"), nil },
		Owned: func(string) bool {
			calls++
			_ = l.Published()
			return true
		}})
	l.opts.Discoverer.(*fakeDiscoverer).pfs[0].VFs[0].Driver = "vfio-pci"
	if _, err := l.Scan(ctx); err != nil {
		t.Fatal(err)
	}
	if calls != 1 || len(l.Published()) != 2 {
		t.Fatalf("Owned called %d times, %d devices published", calls, len(l.Published()))
	}
}

// Two instances building the same devices log the same digest; any
// published difference changes it.
func TestDigest(t *testing.T) {
	t.Parallel()
	devs := func(network string) []discovery.Device {
		return []discovery.Device{{Name: "vf-0000-3b-02-1", Address: "0000:3b:02.1", PFName: "enp59s0f0", PFAddress: "0000:3b:00.0", VFIndex: 1, Network: network, NUMANode: 0}}
	}
	a, b := Digest(DriverResources("n", devs("physnet-a"), nil)), Digest(DriverResources("n", devs("physnet-a"), nil))
	if a != b || len(a) != 16 {
		t.Fatalf("digests %q and %q of equal content", a, b)
	}
	if c := Digest(DriverResources("n", devs("physnet-b"), nil)); c == a {
		t.Fatalf("digest %q unchanged by a different network", c)
	}
}

// The loop asks the link layer for each PF netdev: a driver that cannot
// find them (wrong network namespace) publishes no devices, and one that
// finds them again publishes them.
func TestLoopWithholdsUnresolvablePFs(t *testing.T) {
	t.Parallel()
	_, ctx := ktesting.NewTestContext(t)
	disc := &fakeDiscoverer{pfs: []sysfs.PF{pfWith("0000:3b:00.0", "ens1", 4)}}
	pub := &recorder{}
	resolveErr := error(&vflink.LinkNotFoundError{Name: "ens1", Netns: "/proc/1/ns/net"})
	var asked []string
	l := NewLoop(LoopOptions{NodeName: "n", Discoverer: disc, Publisher: pub,
		LoadConfig: func() (*nodeconfig.Config, error) { return cfg(t, "a"), nil },
		Resolve:    func(nd string) error { asked = append(asked, nd); return resolveErr }})
	if _, err := l.Scan(ctx); err != nil {
		t.Fatal(err)
	}
	if got := pub.lastDevices("n"); got != 0 || len(l.Published()) != 0 || strings.Join(asked, ",") != "ens1" {
		t.Fatalf("unresolvable PF: %d devices published, asked %v", got, asked)
	}
	resolveErr = nil
	if changed, err := l.Scan(ctx); err != nil || !changed || pub.lastDevices("n") != 4 {
		t.Fatalf("resolvable again: changed %v, %d devices, %v", changed, pub.lastDevices("n"), err)
	}
}

// A VF count change taint counts as a taint for the slice size limit and
// sits next to the health taint on a device that has both.
func TestPoolWithCountChangeTaints(t *testing.T) {
	t.Parallel()
	devs := devices(200)
	changing := Taints{}
	for _, d := range devs[:100] {
		changing[d.Name] = vfcount.TaintRecreating
	}
	health := Taints{devs[0].Name: "link-down"}
	pool := PoolWith(devs, health, changing)
	var got []int
	for _, s := range pool.Slices {
		got = append(got, len(s.Devices))
	}
	if fmt.Sprint(got) != fmt.Sprint([]int{64, 64, 72}) {
		t.Fatalf("slices %v, want [64 64 72]", got)
	}
	first := pool.Slices[0].Devices[0]
	want := []resourceapi.DeviceTaint{
		{Key: TaintKey, Value: "link-down", Effect: resourceapi.DeviceTaintEffectNoSchedule},
		{Key: vfcount.TaintKey, Value: vfcount.TaintRecreating, Effect: resourceapi.DeviceTaintEffectNoSchedule},
	}
	if fmt.Sprint(first.Taints) != fmt.Sprint(want) {
		t.Fatalf("device %s taints %+v, want %+v", first.Name, first.Taints, want)
	}
	if last := pool.Slices[2].Devices[71]; len(last.Taints) != 0 {
		t.Fatalf("device %s outside the change has taints %+v", last.Name, last.Taints)
	}
}

// onePFDiscoverer can reread one PF, and counts what it was asked.
type onePFDiscoverer struct {
	fakeDiscoverer
	full  int
	asked []string
	err   error
}

func (f *onePFDiscoverer) Discover(ctx context.Context) ([]sysfs.PF, error) {
	f.full++
	return f.fakeDiscoverer.Discover(ctx)
}

func (f *onePFDiscoverer) DiscoverPF(_ context.Context, bdf string) (sysfs.PF, bool, error) {
	f.asked = append(f.asked, bdf)
	if f.err != nil {
		return sysfs.PF{}, false, f.err
	}
	for _, pf := range f.pfs {
		if pf.Address == bdf {
			return pf, true, nil
		}
	}
	return sysfs.PF{}, false, nil
}

// TestScanPFsRereadsOnlyThosePFs: a rescan for a host event reads the PFs
// it named and keeps the rest as last read; a PF gone is dropped; a read
// that fails falls back to reading the whole host.
func TestScanPFsRereadsOnlyThosePFs(t *testing.T) {
	t.Parallel()
	_, ctx := ktesting.NewTestContext(t)
	a, b := pfWith("0000:3b:00.0", "ens1", 4), pfWith("0000:5e:00.0", "ens1b", 2)
	c, err := nodeconfig.Parse([]byte("apiVersion: vfnet.io/v1alpha1\nkind: NodeConfig\npfs:\n- pfName: ens1\n  network: a\n- pfName: ens1b\n  network: b\n"), "node.yaml")
	if err != nil {
		t.Fatal(err)
	}
	disc := &onePFDiscoverer{fakeDiscoverer: fakeDiscoverer{pfs: []sysfs.PF{a, b}}}
	pub := &recorder{}
	var seen []sysfs.PF
	l := NewLoop(LoopOptions{NodeName: "n", Discoverer: disc, Publisher: pub,
		LoadConfig: func() (*nodeconfig.Config, error) { return c, nil },
		OnScan:     func(pfs []sysfs.PF, _ discovery.Result) { seen = pfs }})
	if _, err := l.Scan(ctx); err != nil {
		t.Fatal(err)
	}
	if got := pub.lastDevices("n"); got != 6 || disc.full != 1 {
		t.Fatalf("first scan: %d devices, %d full reads; want 6, 1", got, disc.full)
	}
	// PF a drops to 1 VF; b changes too, but nothing named it.
	disc.pfs = []sysfs.PF{pfWith("0000:3b:00.0", "ens1", 1), pfWith("0000:5e:00.0", "ens1b", 3)}
	if _, err := l.ScanPFs(ctx, []string{"0000:3b:00.0"}); err != nil {
		t.Fatal(err)
	}
	if got := pub.lastDevices("n"); got != 3 || disc.full != 1 || !slices.Equal(disc.asked, []string{"0000:3b:00.0"}) {
		t.Fatalf("rescan of PF a: %d devices, %d full reads, asked %v; want 1+2, no full read, only a", got, disc.full, disc.asked)
	}
	// PF b is gone: the host as seen drops it (its VFs stay published,
	// tainted, as after a full read).
	disc.pfs = []sysfs.PF{pfWith("0000:3b:00.0", "ens1", 1)}
	if _, err := l.ScanPFs(ctx, []string{"0000:5e:00.0"}); err != nil {
		t.Fatal(err)
	}
	if len(seen) != 1 || seen[0].Address != "0000:3b:00.0" || disc.full != 1 {
		t.Fatalf("PF b gone: host seen %v, %d full reads; want only PF a, no full read", seen, disc.full)
	}
	// A PF read fails: the whole host is read.
	disc.err = errors.New("sysfs entry unreadable")
	disc.pfs = []sysfs.PF{pfWith("0000:3b:00.0", "ens1", 2)}
	if _, err := l.ScanPFs(ctx, []string{"0000:3b:00.0"}); err != nil {
		t.Fatal(err)
	}
	if got := pub.lastDevices("n"); got != 4 || disc.full != 2 {
		t.Fatalf("after a failed PF read: %d devices, %d full reads; want 2 of PF a + PF b's 2 tainted, 2", got, disc.full)
	}
}

// TestTriggerScope: PF triggers add up; a full trigger wins.
func TestTriggerScope(t *testing.T) {
	t.Parallel()
	l := NewLoop(LoopOptions{})
	l.TriggerPFs("a", []string{"0000:5e:00.0"})
	l.TriggerPFs("b", []string{"0000:3b:00.0", "0000:5e:00.0"})
	if causes, pfs := l.takeCauses(); !slices.Equal(pfs, []string{"0000:3b:00.0", "0000:5e:00.0"}) || len(causes) != 2 {
		t.Fatalf("takeCauses = %v, %v", causes, pfs)
	}
	l.TriggerPFs("a", []string{"0000:5e:00.0"})
	l.TriggerFor("config")
	if _, pfs := l.takeCauses(); pfs != nil {
		t.Fatalf("a full trigger after a PF trigger: scope %v, want every PF (nil)", pfs)
	}
}

// TestHotUnplugSeenHalfway: a PF that lost its VFs in one scan and vanished
// in the next (the kernel removes the VFs first) keeps its VFs published,
// tainted gone, as if both had been seen at once.
func TestHotUnplugSeenHalfway(t *testing.T) {
	t.Parallel()
	_, ctx := ktesting.NewTestContext(t)
	a, b := pfWith("0000:3b:00.0", "ens1", 2), pfWith("0000:5e:00.0", "ens1b", 1)
	c, err := nodeconfig.Parse([]byte("apiVersion: vfnet.io/v1alpha1\nkind: NodeConfig\npfs:\n- pfName: ens1\n  network: a\n- pfName: ens1b\n  network: b\n"), "node.yaml")
	if err != nil {
		t.Fatal(err)
	}
	disc := &fakeDiscoverer{pfs: []sysfs.PF{a, b}}
	pub := &recorder{}
	l := NewLoop(LoopOptions{NodeName: "n", Discoverer: disc, Publisher: pub,
		LoadConfig: func() (*nodeconfig.Config, error) { return c, nil }})
	scan := func(what string, want int) {
		t.Helper()
		if _, err := l.Scan(ctx); err != nil {
			t.Fatal(err)
		}
		if got := pub.lastDevices("n"); got != want {
			t.Fatalf("%s: %d devices published, want %d", what, got, want)
		}
	}
	scan("both PFs", 3)
	b.VFs, b.NumVFs = nil, 0
	disc.pfs = []sysfs.PF{a, b}
	scan("PF b without its VF", 2)
	disc.pfs = []sysfs.PF{a}
	scan("PF b gone", 3)
	last := pub.published[len(pub.published)-1].Pools["n"].Slices
	gone := 0
	for _, s := range last {
		for _, d := range s.Devices {
			if hasTaint(d, TaintKey, health.PFGone) {
				gone++
			}
		}
	}
	if gone != 1 {
		t.Fatalf("%d devices tainted %s, want PF b's one VF", gone, health.PFGone)
	}
}
