package plugin

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/klog/v2/ktesting"

	"github.com/vfnet-io/vfnet/driver/discovery"
	"github.com/vfnet-io/vfnet/driver/health"
	"github.com/vfnet-io/vfnet/driver/kernel/sysfs"
	"github.com/vfnet-io/vfnet/driver/publish"
	"github.com/vfnet-io/vfnet/pkg/api/nodeconfig"
	"github.com/vfnet-io/vfnet/pkg/contract/pciaddr"
	"github.com/vfnet-io/vfnet/test/lib/simhost"
)

func claim(uid, name string) *resourceapi.ResourceClaim {
	return &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{UID: types.UID(uid), Name: name, Namespace: "ns"}}
}

func TestPrepareWithoutPreparerFailsPerClaim(t *testing.T) {
	t.Parallel()
	_, ctx := ktesting.NewTestContext(t)
	d := NewDriver(nil, nil, nil)
	res, err := d.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{claim("u1", "a"), claim("u2", "b")})
	if err != nil || len(res) != 2 {
		t.Fatalf("Prepare = %v, %v", res, err)
	}
	for uid, r := range res {
		if !errors.Is(r.Err, ErrNotSupported) || !strings.Contains(r.Err.Error(), "claim ns/") {
			t.Errorf("claim %s: %v", uid, r.Err)
		}
	}
	ures, err := d.UnprepareResourceClaims(ctx, []kubeletplugin.NamespacedObject{{UID: "u1"}})
	if err != nil || len(ures) != 1 || !errors.Is(ures["u1"], ErrNotSupported) {
		t.Fatalf("Unprepare = %v, %v", ures, err)
	}
	if err := d.WatchHealthStatus(ctx, make(chan kubeletplugin.DeviceHealthReport)); !errors.Is(err, kubeletplugin.ErrHealthNotSupported) {
		t.Fatalf("WatchHealthStatus without monitor = %v", err)
	}
}

type fakePreparer struct{ prepared, unprepared []types.UID }

func (f *fakePreparer) Prepare(_ context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	out := map[types.UID]kubeletplugin.PrepareResult{}
	for _, c := range claims {
		f.prepared = append(f.prepared, c.UID)
		out[c.UID] = kubeletplugin.PrepareResult{Devices: []kubeletplugin.Device{{PoolName: "n", DeviceName: "vf-0000-3b-02-1"}}}
	}
	return out, nil
}

func (f *fakePreparer) Unprepare(_ context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	out := map[types.UID]error{}
	for _, c := range claims {
		f.unprepared = append(f.unprepared, c.UID)
		out[c.UID] = nil
	}
	return out, nil
}

func TestPrepareDelegates(t *testing.T) {
	t.Parallel()
	_, ctx := ktesting.NewTestContext(t)
	p := &fakePreparer{}
	d := NewDriver(p, nil, nil)
	res, err := d.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{claim("u1", "a")})
	if err != nil || res["u1"].Err != nil || len(res["u1"].Devices) != 1 {
		t.Fatalf("Prepare = %+v, %v", res, err)
	}
	if _, err := d.UnprepareResourceClaims(ctx, []kubeletplugin.NamespacedObject{{UID: "u1"}}); err != nil {
		t.Fatal(err)
	}
	if len(p.prepared) != 1 || len(p.unprepared) != 1 {
		t.Fatalf("preparer saw %v / %v", p.prepared, p.unprepared)
	}
}

func TestHandleError(t *testing.T) {
	t.Parallel()
	_, ctx := ktesting.NewTestContext(t)
	var fatal []error
	d := NewDriver(nil, nil, func(err error) { fatal = append(fatal, err) })
	d.HandleError(ctx, fmt.Errorf("publish: %w", kubeletplugin.ErrRecoverable), "slices")
	if len(fatal) != 0 {
		t.Fatalf("recoverable error was fatal: %v", fatal)
	}
	d.HandleError(ctx, errors.New("boom"), "background")
	if len(fatal) != 1 || !strings.Contains(fatal[0].Error(), "background: boom") {
		t.Fatalf("fatal = %v", fatal)
	}
}

// newFakeClient is a clientset with a Node and with the two API server
// behaviours the resourceslice controller relies on: generateName and
// resourceVersion bumps.
func newFakeClient(node string) *fake.Clientset {
	c := fake.NewClientset(&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: node, UID: "node-uid"}})
	var mu sync.Mutex
	n := 0
	c.PrependReactor("create", "resourceslices", func(a k8stesting.Action) (bool, runtime.Object, error) {
		mu.Lock()
		defer mu.Unlock()
		s := a.(k8stesting.CreateAction).GetObject().(*resourceapi.ResourceSlice)
		if s.Name == "" {
			s.Name = fmt.Sprintf("%s%05d", s.GenerateName, n)
		}
		n++
		s.ResourceVersion = "1"
		if len(s.Spec.Devices) > publish.MaxDevicesPerSlice {
			return true, nil, apierrors.NewInvalid(resourceapi.SchemeGroupVersion.WithKind("ResourceSlice").GroupKind(), s.Name, nil)
		}
		return false, nil, nil
	})
	c.PrependReactor("update", "resourceslices", func(a k8stesting.Action) (bool, runtime.Object, error) {
		s := a.(k8stesting.UpdateAction).GetObject().(*resourceapi.ResourceSlice)
		var rv int
		fmt.Sscan(s.ResourceVersion, &rv)
		s.ResourceVersion = fmt.Sprint(rv + 1)
		return false, nil, nil
	})
	return c
}

// listSlices returns the node's slices of the newest generation, in name
// (= allocation preference) order, once they form a complete pool.
func listSlices(ctx context.Context, t *testing.T, c *fake.Clientset) []*resourceapi.ResourceSlice {
	t.Helper()
	list, err := c.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []*resourceapi.ResourceSlice
	for i := range list.Items {
		out = append(out, &list.Items[i])
	}
	sort.Slice(out, func(a, b int) bool { return out[a].Name < out[b].Name })
	return out
}

func waitForPool(ctx context.Context, t *testing.T, c *fake.Clientset, wantSlices, wantDevices int) []*resourceapi.ResourceSlice {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		got := listSlices(ctx, t, c)
		devs := 0
		complete := len(got) == wantSlices
		for _, s := range got {
			devs += len(s.Spec.Devices)
			if s.Spec.Pool.ResourceSliceCount != int64(wantSlices) || s.Spec.Pool.Generation != got[0].Spec.Pool.Generation {
				complete = false
			}
		}
		if complete && devs == wantDevices {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out: %d slices with %d devices, want %d with %d", len(got), devs, wantSlices, wantDevices)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

const largeConfig = `apiVersion: vfnet.io/v1alpha1
kind: NodeConfig
pfs:
- pciAddress: "0000:3b:00.0"
  network: physnet-a
- pciAddress: "0000:3b:00.1"
  network: physnet-a
- pciAddress: "0000:86:00.0"
  network: physnet-b
- pciAddress: "0000:86:00.1"
  network: physnet-b
`

// TestPublishLargeHost runs the real kubeletplugin helper and its
// resourceslice controller against a fake API: 4 PFs x 256 VFs become 8
// slices in a stable order, a PF removal republishes its VFs tainted, and the
// scheduler's allocator picks VFs from the right network.
func TestPublishLargeHost(t *testing.T) {
	t.Parallel()
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	const node = "node-1"
	h, err := simhost.Build(t.TempDir(), simhost.LargeHost())
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	cfgPath := filepath.Join(t.TempDir(), "node.yaml")
	if err := os.WriteFile(cfgPath, []byte(largeConfig), 0o644); err != nil {
		t.Fatal(err)
	}
	sock, err := os.MkdirTemp("", "vf")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(sock)
	if err := os.Mkdir(filepath.Join(sock, "r"), 0o700); err != nil {
		t.Fatal(err)
	}
	client := newFakeClient(node)
	monitor := health.NewMonitor(health.Options{PoolName: node})
	p, err := Start(ctx, Options{
		NodeName: node, KubeClient: client,
		RegistrarDir: filepath.Join(sock, "r"), PluginDir: filepath.Join(sock, "p"), CDIDir: filepath.Join(sock, "c"),
		PodUID: "pod-uid", Health: monitor,
		OnFatal: func(err error) { t.Errorf("fatal: %v", err) },
	})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Stop()
	for _, f := range []string{"r/" + kubeletplugin.RollingUpdateRegistrarSocketFile(filepath.Join(sock, "r"), discovery.DriverName, "pod-uid"), "p/dra-pod-uid.sock"} {
		if _, err := os.Stat(filepath.Join(sock, f)); err != nil {
			t.Errorf("socket %s: %v", f, err)
		}
	}

	loop := publish.NewLoop(publish.LoopOptions{
		NodeName: node, Discoverer: h.Sysfs(), Publisher: p,
		LoadConfig: func() (*nodeconfig.Config, error) { return nodeconfig.Load(cfgPath) },
		OnScan:     func(pfs []sysfs.PF, res discovery.Result) { monitor.Observe(pfs, res.Devices) },
	})
	if changed, err := loop.Scan(ctx); err != nil || !changed {
		t.Fatalf("first Scan = %v, %v", changed, err)
	}
	got := waitForPool(ctx, t, client, 8, 1024)
	var prev *resourceapi.Device
	var prevPF string
	for i, s := range got {
		if !strings.HasPrefix(s.Name, fmt.Sprintf("%05x-sriov.vfnet.io-node-1-", i)) || s.Spec.Driver != discovery.DriverName ||
			s.Spec.Pool.Name != node || s.Spec.NodeName == nil || *s.Spec.NodeName != node || len(s.Spec.Devices) != 128 {
			t.Fatalf("slice %d: %s %s pool %s, %d devices", i, s.Name, s.Spec.Driver, s.Spec.Pool.Name, len(s.Spec.Devices))
		}
		for j := range s.Spec.Devices {
			d := &s.Spec.Devices[j]
			pf := *d.Attributes[discovery.AttrPFPCIAddress].StringValue
			if prev != nil {
				pidx, idx := *prev.Attributes[discovery.AttrVFIndex].IntValue, *d.Attributes[discovery.AttrVFIndex].IntValue
				if pciaddr.Compare(prevPF, pf) > 0 || (prevPF == pf && pidx >= idx) {
					t.Fatalf("order broken at slice %d device %d: %s/%d after %s/%d", i, j, pf, idx, prevPF, pidx)
				}
			}
			prev, prevPF = d, pf
		}
	}
	// The first slice starts with VF 0 of the lowest PF.
	if first := got[0].Spec.Devices[0]; *first.Attributes[discovery.AttrPFPCIAddress].StringValue != "0000:3b:00.0" || *first.Attributes[discovery.AttrVFIndex].IntValue != 0 {
		t.Fatalf("first device %s", first.Name)
	}

	t.Run("allocate", func(t *testing.T) { allocate(ctx, t, got, node) })

	// Nothing changed: no republish.
	if changed, err := loop.Scan(ctx); err != nil || changed {
		t.Fatalf("unchanged Scan = %v, %v", changed, err)
	}
	// Health: all healthy, one report entry per device.
	if r := monitor.Report(); len(r.Devices) != 1024 || r.Devices[0].Health != kubeletplugin.HealthStatusHealthy {
		t.Fatalf("health report: %d devices, first %+v", len(r.Devices), r.Devices[0])
	}

	if err := h.RemovePF("0000:86:00.0"); err != nil {
		t.Fatal(err)
	}
	if changed, err := loop.Scan(ctx); err != nil || !changed {
		t.Fatalf("Scan after PF removal = %v, %v", changed, err)
	}
	// The removed PF's VFs stay published with the "gone" taint, which
	// caps their slices at 64 devices: 4x128, 4x64 tainted, 2x128.
	got = waitForPool(ctx, t, client, 10, 1024)
	for _, s := range got {
		for _, d := range s.Spec.Devices {
			gone := *d.Attributes[discovery.AttrPFPCIAddress].StringValue == "0000:86:00.0"
			if tainted := len(d.Taints) == 1 && d.Taints[0].Key == publish.TaintKey && d.Taints[0].Value == health.PFGone; tainted != gone {
				t.Fatalf("device %s (of the removed PF: %v) has taints %+v", d.Name, gone, d.Taints)
			}
			if gone && len(s.Spec.Devices) > 64 {
				t.Fatalf("slice %s has %d devices, one of them tainted", s.Name, len(s.Spec.Devices))
			}
		}
	}
	unhealthy := 0
	for _, d := range monitor.Report().Devices {
		if d.Health == kubeletplugin.HealthStatusUnhealthy {
			unhealthy++
			if !strings.Contains(d.Message, "PF 0000:86:00.0 is gone") {
				t.Errorf("%s: %s", d.DeviceName, d.Message)
			}
		}
	}
	if unhealthy != 256 {
		t.Fatalf("%d unhealthy devices after PF removal, want 256", unhealthy)
	}

	// A VF count change republishes too.
	if err := h.SetNumVFs("0000:3b:00.1", 10); err != nil {
		t.Fatal(err)
	}
	if changed, err := loop.Scan(ctx); err != nil || !changed {
		t.Fatalf("Scan after numvfs change = %v, %v", changed, err)
	}
	// 2x128 | 10 + 54 tainted | 3x64 tainted | 10 tainted + 54 | 128, 74.
	waitForPool(ctx, t, client, 9, 256+10+256+256)
}

type classLister map[string]*resourceapi.DeviceClass

func (l classLister) List() ([]*resourceapi.DeviceClass, error) {
	var out []*resourceapi.DeviceClass
	for _, c := range l {
		out = append(out, c)
	}
	return out, nil
}

func (l classLister) Get(name string) (*resourceapi.DeviceClass, error) {
	if c, ok := l[name]; ok {
		return c, nil
	}
	return nil, apierrors.NewNotFound(resourceapi.Resource("deviceclasses"), name)
}

func networkClass(network string) *resourceapi.DeviceClass {
	return &resourceapi.DeviceClass{
		ObjectMeta: metav1.ObjectMeta{Name: network},
		Spec: resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
			Expression: fmt.Sprintf(`device.driver == %q && device.attributes["vfnet.io"].network == %q`, discovery.DriverName, network),
		}}}},
	}
}

func vfClaim(name, class string) *resourceapi.ResourceClaim {
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", UID: types.UID(name)},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
			Name:    "vf",
			Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: class, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1},
		}}}},
	}
}

// allocate runs the scheduler's allocator over the published publish.
func allocate(ctx context.Context, t *testing.T, published []*resourceapi.ResourceSlice, node string) {
	classes := classLister{"physnet-a": networkClass("physnet-a"), "physnet-b": networkClass("physnet-b"), "physnet-x": networkClass("physnet-x")}
	byName := map[string]resourceapi.Device{}
	for _, s := range published {
		for _, d := range s.Spec.Devices {
			byName[d.Name] = d
		}
	}
	nodeObj := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}
	// The second PF pair is on physnet-b; "already allocated" makes the
	// allocator skip the first 10 physnet-b VFs, as the scheduler would.
	allocated := sets.New[structured.DeviceID]()
	for _, d := range published[4].Spec.Devices[:10] {
		allocated.Insert(structured.MakeDeviceID(discovery.DriverName, node, d.Name))
	}
	for _, tc := range []struct {
		class, wantPF string
	}{{"physnet-a", "0000:3b:00.0"}, {"physnet-b", "0000:86:00.0"}} {
		alloc, err := structured.NewAllocator(ctx, structured.Features{}, structured.AllocatedState{AllocatedDevices: allocated}, classes, published, cel.NewCache(10, cel.Features{}))
		if err != nil {
			t.Fatal(err)
		}
		res, err := alloc.Allocate(ctx, nodeObj, []*resourceapi.ResourceClaim{vfClaim("c-"+tc.class, tc.class)})
		if err != nil || len(res) != 1 || len(res[0].Devices.Results) != 1 {
			t.Fatalf("%s: Allocate = %+v, %v", tc.class, res, err)
		}
		r := res[0].Devices.Results[0]
		d := byName[r.Device]
		if r.Driver != discovery.DriverName || r.Pool != node || *d.Attributes[discovery.AttrNetwork].StringValue != tc.class ||
			*d.Attributes[discovery.AttrPFPCIAddress].StringValue != tc.wantPF {
			t.Fatalf("%s: allocated %s/%s %s on %v", tc.class, r.Driver, r.Pool, r.Device, d.Attributes)
		}
		if allocated.Has(structured.MakeDeviceID(r.Driver, r.Pool, r.Device)) {
			t.Fatalf("%s: allocated an already allocated device %s", tc.class, r.Device)
		}
	}
	alloc, err := structured.NewAllocator(ctx, structured.Features{}, structured.AllocatedState{AllocatedDevices: allocated}, classes, published, cel.NewCache(10, cel.Features{}))
	if err != nil {
		t.Fatal(err)
	}
	res, err := alloc.Allocate(ctx, nodeObj, []*resourceapi.ResourceClaim{vfClaim("c-x", "physnet-x")})
	if err == nil && len(res) != 0 {
		t.Fatalf("a claim for an absent network was allocated: %+v", res)
	}
}
