package sysfs_test

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"

	"github.com/go-logr/logr/funcr"
	"k8s.io/dynamic-resource-allocation/deviceattribute"
	"k8s.io/klog/v2"

	"github.com/vfnet-io/vfnet/driver/kernel/sysfs"
	"github.com/vfnet-io/vfnet/test/lib/simhost"
)

// logCtx returns a context whose logger records every line.
func logCtx(t *testing.T) (context.Context, func() string) {
	var mu sync.Mutex
	var lines []string
	logger := funcr.New(func(prefix, args string) {
		mu.Lock()
		defer mu.Unlock()
		lines = append(lines, prefix+" "+args)
	}, funcr.Options{})
	return klog.NewContext(context.Background(), logger), func() string {
		mu.Lock()
		defer mu.Unlock()
		return strings.Join(lines, "\n")
	}
}

func build(t *testing.T, spec simhost.Spec) *simhost.Host {
	t.Helper()
	h, err := simhost.Build(simhost.TempDir(t), spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return h
}

func vfAddrs(pf sysfs.PF) []string {
	var out []string
	for _, vf := range pf.VFs {
		out = append(out, vf.Address)
	}
	return out
}

func TestDiscoverMixedHost(t *testing.T) {
	t.Parallel()
	h := build(t, simhost.MixedHost())
	ctx, logs := logCtx(t)
	pfs, err := sysfs.New(h.Root()).Discover(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var addrs []string
	for _, pf := range pfs {
		addrs = append(addrs, pf.Address)
	}
	// The I210 (no SR-IOV) and root ports are not PFs; the E810 port with
	// sriov_numvfs=0 is.
	want := []string{"0000:01:00.0", "0000:3b:00.0", "0000:3b:00.1", "0000:d8:00.0"}
	if !reflect.DeepEqual(addrs, want) {
		t.Fatalf("PFs = %v, want %v", addrs, want)
	}
	if l := logs(); l != "" {
		t.Errorf("clean host logged: %s", l)
	}

	igb, e810, e810b, cx := pfs[0], pfs[1], pfs[2], pfs[3]
	wantE810 := sysfs.Function{Address: "0000:3b:00.0", VendorID: "8086", DeviceID: "1593", NUMANode: 0,
		PCIeRoot: "pci0000:3a", IOMMUGroup: e810.IOMMUGroup, Driver: "ice", NetDevs: []string{"enp59s0f0"}}
	if !reflect.DeepEqual(e810.Function, wantE810) {
		t.Errorf("E810 PF = %+v\nwant %+v", e810.Function, wantE810)
	}
	if e810.IOMMUGroup == "" || e810.TotalVFs != 128 || e810.NumVFs != 4 || e810.LinkType != "ethernet" || e810.OperState != "up" {
		t.Errorf("E810 PF = %+v", e810)
	}
	if got := vfAddrs(e810); !reflect.DeepEqual(got, []string{"0000:3b:02.0", "0000:3b:02.1", "0000:3b:02.2", "0000:3b:02.3"}) {
		t.Errorf("E810 VFs = %v", got)
	}
	groups := map[string]bool{e810.IOMMUGroup: true}
	for i, vf := range e810.VFs {
		if vf.Index != i || vf.PFAddress != "0000:3b:00.0" || vf.VendorID != "8086" || vf.DeviceID != "1889" ||
			vf.NUMANode != 0 || vf.PCIeRoot != "pci0000:3a" {
			t.Errorf("E810 VF %d = %+v", i, vf)
		}
		if groups[vf.IOMMUGroup] || vf.IOMMUGroup == "" {
			t.Errorf("E810 VF %d: group %q missing or shared", i, vf.IOMMUGroup)
		}
		groups[vf.IOMMUGroup] = true
		if i == 2 {
			if vf.Driver != "vfio-pci" || vf.NetDevs != nil || vf.DriverOverride != "vfio-pci" {
				t.Errorf("VF 2 should be on vfio-pci without netdev: %+v", vf)
			}
			continue
		}
		if vf.Driver != "iavf" || !reflect.DeepEqual(vf.NetDevs, []string{"enp59s0f0v" + string(rune('0'+i))}) || vf.DriverOverride != "" {
			t.Errorf("E810 VF %d: driver %q netdevs %v override %q", i, vf.Driver, vf.NetDevs, vf.DriverOverride)
		}
	}
	if e810b.NumVFs != 0 || len(e810b.VFs) != 0 || e810b.TotalVFs != 128 {
		t.Errorf("E810 port 1 should have no VFs: %+v", e810b)
	}
	if igb.NUMANode != -1 || igb.PCIeRoot != "pci0000:00" || igb.Driver != "igb" || igb.TotalVFs != 7 ||
		!reflect.DeepEqual(vfAddrs(igb), []string{"0000:01:10.0", "0000:01:10.4"}) {
		t.Errorf("I350 = %+v", igb)
	}
	for _, vf := range igb.VFs {
		if vf.NUMANode != -1 || vf.Driver != "igbvf" || vf.DeviceID != "1520" {
			t.Errorf("I350 VF = %+v", vf)
		}
	}
	if cx.NUMANode != 1 || cx.PCIeRoot != "pci0000:d7" || cx.Driver != "mlx5_core" || cx.VendorID != "15b3" ||
		cx.DeviceID != "101d" || len(cx.VFs) != 4 || cx.VFs[0].DeviceID != "101e" || cx.VFs[0].Driver != "mlx5_core" ||
		cx.VFs[0].Address != "0000:d8:00.2" || cx.VFs[0].NetDevs[0] != "ens8f0np0v0" {
		t.Errorf("ConnectX-6 Dx = %+v", cx)
	}
}

// The standard attributes come from the deviceattribute helpers reading
// the same tree; they must agree with what Discover reports.
func TestDeviceAttributesAgree(t *testing.T) {
	t.Parallel()
	h := build(t, simhost.MixedHost())
	pfs, err := h.Sysfs().Discover(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	check := func(fn sysfs.Function) {
		root, err := deviceattribute.GetPCIeRootAttributeByPCIBusID(fn.Address, deviceattribute.WithFSFromRoot(h.Root()))
		if err != nil || *root.Value.StringValue != fn.PCIeRoot {
			t.Errorf("%s: deviceattribute pcieRoot = %v (%v), Discover says %s", fn.Address, root.Value.StringValue, err, fn.PCIeRoot)
		}
		numa, err := deviceattribute.GetNUMANodeAttributeByPCIBusID(fn.Address, deviceattribute.ScalarAttribute, deviceattribute.WithFSFromRoot(h.Root()))
		if fn.NUMANode < 0 {
			if err == nil {
				t.Errorf("%s: numa_node -1 must not give a numaNode attribute", fn.Address)
			}
			return
		}
		if err != nil || *numa.Value.IntValue != int64(fn.NUMANode) {
			t.Errorf("%s: deviceattribute numaNode = %v (%v), Discover says %d", fn.Address, numa.Value.IntValue, err, fn.NUMANode)
		}
		// The list form reads devices/system/node/*/distance.
		list, err := deviceattribute.GetNUMANodeAttributeByPCIBusID(fn.Address, deviceattribute.ListAttribute, deviceattribute.WithFSFromRoot(h.Root()))
		if err != nil || len(list.Value.IntValues) == 0 || list.Value.IntValues[0] != int64(fn.NUMANode) {
			t.Errorf("%s: list numaNode = %v (%v)", fn.Address, list.Value.IntValues, err)
		}
	}
	n := 0
	for _, pf := range pfs {
		check(pf.Function)
		for _, vf := range pf.VFs {
			check(vf.Function)
			n++
		}
	}
	if n != 10 {
		t.Fatalf("checked %d VFs, want 10", n)
	}
}

func TestDiscoverInfiniband(t *testing.T) {
	t.Parallel()
	h := build(t, simhost.InfinibandHost())
	pfs, err := h.Sysfs().Discover(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(pfs) != 1 || pfs[0].LinkType != sysfs.LinkTypeInfiniband || pfs[0].NetDevs[0] != "ibp216s0f0" || len(pfs[0].VFs) != 4 {
		t.Fatalf("InfiniBand PF = %+v", pfs)
	}
	if b, _ := os.ReadFile(filepath.Join(h.Root(), "class/net/ibp216s0f0/type")); string(b) != "32\n" {
		t.Errorf("class/net/ibp216s0f0/type = %q, want 32", b)
	}
}

func TestDiscoverLargeHost(t *testing.T) {
	t.Parallel()
	h := build(t, simhost.LargeHost())
	pfs, err := h.Sysfs().Discover(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	groups := map[string]bool{}
	if len(pfs) != 4 {
		t.Fatalf("%d PFs, want 4", len(pfs))
	}
	for _, pf := range pfs {
		if len(pf.VFs) != 256 {
			t.Errorf("%s: %d VFs, want 256", pf.Address, len(pf.VFs))
		}
		for i, vf := range pf.VFs {
			if vf.Index != i || seen[vf.Address] || groups[vf.IOMMUGroup] {
				t.Fatalf("VF %+v: wrong index, duplicate address or group", vf)
			}
			seen[vf.Address], groups[vf.IOMMUGroup] = true, true
		}
	}
	// VFs past function 0xff of the PF's bus continue on the next bus.
	if last := pfs[0].VFs[255].Address; last != "0000:3c:01.7" {
		t.Errorf("last VF of PF0 = %s, want 0000:3c:01.7", last)
	}
}

// mutate breaks a freshly built E810Host; want lists the VFs left per PF
// and logged the path fragment that must appear in the log.
func TestDiscoverBadSysfs(t *testing.T) {
	t.Parallel()
	const pf0 = "devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0"
	const vf1 = "devices/pci0000:3a/0000:3a:00.0/0000:3b:02.1"
	all0 := []string{"0000:3b:02.0", "0000:3b:02.1", "0000:3b:02.2", "0000:3b:02.3"}
	no1 := []string{"0000:3b:02.0", "0000:3b:02.2", "0000:3b:02.3"}
	all1 := []string{"0000:3b:12.0", "0000:3b:12.1", "0000:3b:12.2", "0000:3b:12.3"}
	write := func(rel, content string) func(string) error {
		return func(root string) error { return os.WriteFile(filepath.Join(root, rel), []byte(content), 0o644) }
	}
	remove := func(rel string) func(string) error {
		return func(root string) error { return os.Remove(filepath.Join(root, rel)) }
	}
	// A directory where a file should be: reading it fails with EISDIR,
	// which is how an unreadable attribute looks even to root.
	unreadable := func(rel string) func(string) error {
		return func(root string) error {
			p := filepath.Join(root, rel)
			if err := os.Remove(p); err != nil {
				return err
			}
			return os.Mkdir(p, 0o755)
		}
	}
	relink := func(rel, target string) func(string) error {
		return func(root string) error {
			p := filepath.Join(root, rel)
			if err := os.Remove(p); err != nil {
				return err
			}
			return os.Symlink(target, p)
		}
	}
	cases := []struct {
		name   string
		mutate func(root string) error
		want   map[string][]string // PF -> VFs; missing PF = skipped
		logged string
	}{
		// CONFIG_NUMA=n: no numa_node file is not an error (NUMANode -1).
		{"VF numa_node missing", remove(vf1 + "/numa_node"), map[string][]string{"0000:3b:00.0": all0, "0000:3b:00.1": all1}, ""},
		{"PF numa_node missing", remove(pf0 + "/numa_node"), map[string][]string{"0000:3b:00.0": all0, "0000:3b:00.1": all1}, ""},
		{"VF numa_node garbage", write(vf1+"/numa_node", "zero\n"), map[string][]string{"0000:3b:00.0": no1, "0000:3b:00.1": all1}, vf1 + "/numa_node"},
		{"VF numa_node below -1", write(vf1+"/numa_node", "-2\n"), map[string][]string{"0000:3b:00.0": no1, "0000:3b:00.1": all1}, vf1 + "/numa_node"},
		{"VF vendor garbage", write(vf1+"/vendor", "0xzz86\n"), map[string][]string{"0000:3b:00.0": no1, "0000:3b:00.1": all1}, vf1 + "/vendor"},
		{"VF device unreadable", unreadable(vf1 + "/device"), map[string][]string{"0000:3b:00.0": no1, "0000:3b:00.1": all1}, vf1 + "/device"},
		{"PF vendor unreadable", unreadable(pf0 + "/vendor"), map[string][]string{"0000:3b:00.1": all1}, pf0 + "/vendor"},
		{"dangling virtfn", relink(pf0+"/virtfn1", "../0000:3b:09.1"), map[string][]string{"0000:3b:00.0": no1, "0000:3b:00.1": all1}, pf0 + "/virtfn1"},
		{"virtfn to garbage", relink(pf0+"/virtfn1", "../not-a-device"), map[string][]string{"0000:3b:00.0": no1, "0000:3b:00.1": all1}, pf0 + "/virtfn1"},
		{"dangling VF driver link", relink(vf1+"/driver", "../../../../bus/pci/drivers/gone"), map[string][]string{"0000:3b:00.0": no1, "0000:3b:00.1": all1}, vf1 + "/driver"},
		{"dangling VF iommu_group link", relink(vf1+"/iommu_group", "../../../../kernel/iommu_groups/999"), map[string][]string{"0000:3b:00.0": no1, "0000:3b:00.1": all1}, vf1 + "/iommu_group"},
		{"dangling PF bus link", relink("bus/pci/devices/0000:3b:00.0", "../../../devices/pci0000:3a/0000:3a:00.0/gone"), map[string][]string{"0000:3b:00.1": all1}, "bus/pci/devices/0000:3b:00.0"},
		{"sriov_totalvfs garbage", write(pf0+"/sriov_totalvfs", "lots\n"), map[string][]string{"0000:3b:00.1": all1}, "bus/pci/devices/0000:3b:00.0/sriov_totalvfs"},
		{"sriov_numvfs garbage", write(pf0+"/sriov_numvfs", "x\n"), map[string][]string{"0000:3b:00.1": all1}, pf0 + "/sriov_numvfs"},
		{"sriov_numvfs above total", write(pf0+"/sriov_numvfs", "129\n"), map[string][]string{"0000:3b:00.1": all1}, pf0 + "/sriov_numvfs"},
		{"PF netdev type garbage", write(pf0+"/net/enp59s0f0/type", "ether\n"), map[string][]string{"0000:3b:00.1": all1}, "class/net/enp59s0f0/type"},
		{"PF class/net link missing", remove("class/net/enp59s0f0"), map[string][]string{"0000:3b:00.1": all1}, "class/net/enp59s0f0/type"},
		{"foreign entry in bus/pci/devices", write("bus/pci/devices/README", "x"), map[string][]string{"0000:3b:00.0": all0, "0000:3b:00.1": all1}, "bus/pci/devices/README"},
		{"sriov_totalvfs 0 is not a PF", write(pf0+"/sriov_totalvfs", "0\n"), map[string][]string{"0000:3b:00.1": all1}, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := build(t, simhost.E810Host())
			if err := tc.mutate(h.Root()); err != nil {
				t.Fatal(err)
			}
			ctx, logs := logCtx(t)
			pfs, err := sysfs.New(h.Root()).Discover(ctx)
			if err != nil {
				t.Fatalf("Discover failed as a whole: %v", err)
			}
			got := map[string][]string{}
			for _, pf := range pfs {
				got[pf.Address] = vfAddrs(pf)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
			rep, err := sysfs.New(h.Root()).DiscoverReport(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			var skipped []string
			for _, s := range rep.Skipped {
				if s.Reason == "" {
					t.Errorf("skip without a reason: %+v", s)
				}
				skipped = append(skipped, s.Path+": "+s.Reason)
			}
			if tc.logged != "" && (len(skipped) != 1 || !strings.HasPrefix(skipped[0], filepath.Join(h.Root(), tc.logged))) &&
				!strings.Contains(strings.Join(skipped, "\n"), filepath.Join(h.Root(), tc.logged)) {
				t.Errorf("report does not name %s: %q", tc.logged, skipped)
			}
			if tc.logged == "" && len(skipped) != 0 {
				t.Errorf("unexpected skips: %q", skipped)
			}
			l := logs()
			if tc.logged == "" {
				if l != "" {
					t.Errorf("unexpected log: %s", l)
				}
				return
			}
			if !strings.Contains(l, filepath.Join(h.Root(), tc.logged)) {
				t.Errorf("log does not name %s:\n%s", tc.logged, l)
			}
		})
	}
}

func TestDiscoverFailsWithoutPCIBus(t *testing.T) {
	t.Parallel()
	_, err := sysfs.New(t.TempDir()).Discover(context.Background())
	if err == nil || !strings.Contains(err.Error(), "bus/pci/devices") {
		t.Fatalf("err = %v, want one naming bus/pci/devices", err)
	}
}

func TestDiscoverCancelled(t *testing.T) {
	t.Parallel()
	h := build(t, simhost.E810Host())
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := h.Sysfs().Discover(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
}

func TestFunctionFollowsKernel(t *testing.T) {
	t.Parallel()
	h := build(t, simhost.E810Host())
	s := sysfs.New(h.Root())
	const vf = "0000:3b:02.1"
	fn, err := s.Function(vf)
	if err != nil {
		t.Fatal(err)
	}
	if fn.Driver != "iavf" || !reflect.DeepEqual(fn.NetDevs, []string{"enp59s0f0v1"}) || fn.PCIeRoot != "pci0000:3a" ||
		fn.VendorID != "8086" || fn.DeviceID != "1889" || fn.IOMMUGroup == "" {
		t.Fatalf("Function = %+v", fn)
	}
	k := h.Kernel()
	for _, w := range []struct{ rel, data string }{
		{"bus/pci/devices/" + vf + "/driver_override", "vfio-pci\n"},
		{"bus/pci/drivers/iavf/unbind", vf},
		{"bus/pci/drivers/vfio-pci/bind", vf},
	} {
		if err := k.WriteFile(w.rel, []byte(w.data)); err != nil {
			t.Fatal(err)
		}
	}
	fn2, err := s.Function(vf)
	if err != nil {
		t.Fatal(err)
	}
	if fn2.Driver != "vfio-pci" || fn2.NetDevs != nil || fn2.DriverOverride != "vfio-pci" || fn2.IOMMUGroup != fn.IOMMUGroup {
		t.Fatalf("after vfio bind: %+v", fn2)
	}
	node, err := s.VFIOGroupDevice(fn2.IOMMUGroup)
	if err != nil || node != fn.IOMMUGroup {
		t.Fatalf("VFIOGroupDevice = %q, %v; want %q", node, err, fn.IOMMUGroup)
	}
	members, err := s.IOMMUGroupDevices(fn2.IOMMUGroup)
	if err != nil || !reflect.DeepEqual(members, []string{vf}) {
		t.Fatalf("group members = %v, %v", members, err)
	}

	if _, err := s.Function("0000:3b:0f.7"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("absent function: err = %v, want fs.ErrNotExist", err)
	}
	if _, err := s.Function("0000:3B:02.1"); err == nil {
		t.Errorf("upper-case BDF accepted")
	}
	if _, err := s.VFIOGroupDevice("../1"); err == nil {
		t.Errorf("group name with a path accepted")
	}
}

func TestNoIOMMUGroup(t *testing.T) {
	t.Parallel()
	h := build(t, simhost.NoIOMMUHost())
	s := h.Sysfs()
	if !s.NoIOMMUMode() {
		t.Fatal("NoIOMMUMode = false on a noiommu host")
	}
	if build(t, simhost.E810Host()).Sysfs().NoIOMMUMode() {
		t.Fatal("NoIOMMUMode = true on an IOMMU host")
	}
	const vf = "0000:3b:02.0"
	fn, err := s.Function(vf)
	if err != nil || fn.IOMMUGroup != "" {
		t.Fatalf("before vfio: %+v %v, want no group", fn, err)
	}
	k := h.Kernel()
	for _, w := range []struct{ rel, data string }{
		{"bus/pci/devices/" + vf + "/driver_override", "vfio-pci"},
		{"bus/pci/drivers/iavf/unbind", vf},
		{"bus/pci/drivers/vfio-pci/bind", vf},
	} {
		if err := k.WriteFile(w.rel, []byte(w.data)); err != nil {
			t.Fatal(err)
		}
	}
	fn, err = s.Function(vf)
	if err != nil || fn.IOMMUGroup == "" {
		t.Fatalf("after vfio: %+v %v, want a group", fn, err)
	}
	node, err := s.VFIOGroupDevice(fn.IOMMUGroup)
	if err != nil || node != "noiommu-"+fn.IOMMUGroup {
		t.Fatalf("VFIOGroupDevice = %q, %v", node, err)
	}
}

func TestDriverLoaded(t *testing.T) {
	t.Parallel()
	h := build(t, simhost.E810Host())
	s := h.Sysfs()
	for name, want := range map[string]bool{"vfio-pci": true, "ice": true, "iavf": true, "mlx5_core": false, "": false, "../drivers": false} {
		if got := s.DriverLoaded(name); got != want {
			t.Errorf("DriverLoaded(%q) = %v, want %v", name, got, want)
		}
	}
	spec := simhost.E810Host()
	spec.NoVFIOPCI = true
	if build(t, spec).Sysfs().DriverLoaded("vfio-pci") {
		t.Error("vfio-pci loaded on a host without it")
	}
}

// A kernel built without CONFIG_NUMA has no numa_node files: every
// function is still found, with NUMANode -1.
func TestDiscoverWithoutNUMAFiles(t *testing.T) {
	t.Parallel()
	h := build(t, simhost.NoNUMAHost())
	if _, err := os.Stat(filepath.Join(h.Root(), "bus/pci/devices/0000:3b:02.0/numa_node")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("fixture has a numa_node file: %v", err)
	}
	rep, err := h.Sysfs().DiscoverReport(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, pf := range rep.PFs {
		if pf.NUMANode != -1 {
			t.Errorf("PF %s NUMANode %d, want -1", pf.Address, pf.NUMANode)
		}
		for _, vf := range pf.VFs {
			n++
			if vf.NUMANode != -1 {
				t.Errorf("VF %s NUMANode %d, want -1", vf.Address, vf.NUMANode)
			}
		}
	}
	if n != 8 || len(rep.Skipped) != 0 {
		t.Fatalf("%d VFs (want 8), skipped %+v", n, rep.Skipped)
	}
}

// Behind a root port without ACS every function shares one group; each
// VF reports the others, with their drivers.
func TestDiscoverSharedIOMMUGroup(t *testing.T) {
	t.Parallel()
	h := build(t, simhost.NoACSHost())
	pfs, err := h.Sysfs().Discover(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	vf := pfs[0].VFs[1]
	if vf.IOMMUGroup == "" || vf.IOMMUGroup != pfs[0].IOMMUGroup || vf.IOMMUGroup != pfs[1].VFs[0].IOMMUGroup {
		t.Fatalf("groups: VF %q PF %q other PF's VF %q, want one shared group", vf.IOMMUGroup, pfs[0].IOMMUGroup, pfs[1].VFs[0].IOMMUGroup)
	}
	// Root port + 2 PFs + 8 VFs, minus the VF itself.
	if len(vf.IOMMUPeers) != 10 {
		t.Fatalf("peers %+v, want 10", vf.IOMMUPeers)
	}
	want := map[string]string{"0000:3a:00.0": "pcieport", "0000:3b:00.0": "ice", "0000:3b:02.0": "iavf"}
	for _, p := range vf.IOMMUPeers {
		if d, ok := want[p.Address]; ok && d != p.Driver {
			t.Errorf("peer %s driver %q, want %q", p.Address, p.Driver, d)
		}
		delete(want, p.Address)
		if p.Address == vf.Address {
			t.Errorf("VF lists itself as a peer")
		}
	}
	if len(want) != 0 {
		t.Errorf("peers missing: %v", want)
	}
	// A host with ACS: VFs are alone in their groups.
	h2 := build(t, simhost.E810Host())
	pfs2, err := h2.Sysfs().Discover(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if p := pfs2[0].VFs[1].IOMMUPeers; len(p) != 0 {
		t.Fatalf("VF with ACS has peers %+v", p)
	}
	// VFs created later join the shared group too.
	if err := h.SetNumVFs("0000:3b:00.1", 2); err != nil {
		t.Fatal(err)
	}
	fn, err := h.Sysfs().Function("0000:3b:12.1")
	if err != nil || fn.IOMMUGroup != pfs[0].IOMMUGroup {
		t.Fatalf("new VF group %q (%v), want %s", fn.IOMMUGroup, err, pfs[0].IOMMUGroup)
	}
}

// In switchdev mode the PF's net/ also lists VF representors, which can
// sort before the uplink; the uplink is found by phys_port_name.
func TestDiscoverSwitchdevUplink(t *testing.T) {
	t.Parallel()
	h := build(t, simhost.SwitchdevHost())
	pfs, err := h.Sysfs().Discover(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	p0, p1 := pfs[0], pfs[1]
	if p0.NetDevs[0] != "ens8f0_0" {
		t.Fatalf("fixture: first netdev %q, want a representor sorting first", p0.NetDevs[0])
	}
	if p0.NetDev != "ens8f0np0" || !p0.Switchdev || !reflect.DeepEqual(p0.Representors, []string{"ens8f0_0", "ens8f0_1", "ens8f0_2", "ens8f0_3"}) {
		t.Errorf("switchdev PF: uplink %q switchdev %v representors %v", p0.NetDev, p0.Switchdev, p0.Representors)
	}
	if p1.NetDev != "ens8f1np1" || p1.Switchdev || len(p1.Representors) != 0 {
		t.Errorf("legacy PF: uplink %q switchdev %v representors %v", p1.NetDev, p1.Switchdev, p1.Representors)
	}
	if up, err := h.Sysfs().UplinkOf("0000:d8:00.0"); err != nil || up != "ens8f0np0" {
		t.Errorf("UplinkOf = %q, %v", up, err)
	}
	// Disabling SR-IOV removes the representors with the VFs.
	if err := h.SetNumVFs("0000:d8:00.0", 0); err != nil {
		t.Fatal(err)
	}
	pf, err := h.Sysfs().Function("0000:d8:00.0")
	if err != nil || !reflect.DeepEqual(pf.NetDevs, []string{"ens8f0np0"}) {
		t.Errorf("after sriov_numvfs=0: netdevs %v (%v)", pf.NetDevs, err)
	}
	// igb has no devlink port (no phys_port_name): its only netdev is the uplink.
	h3 := build(t, simhost.I350Host())
	if up, err := h3.Sysfs().UplinkOf("0000:01:00.0"); err != nil || up != "enp1s0f0" {
		t.Errorf("I350 UplinkOf = %q, %v", up, err)
	}
}

// UplinkOf follows a rename of the PF netdev.
// A netdev type other than Ethernet or InfiniBand is reported by number, so
// discovery's refusal can say what the kernel showed.
func TestDiscoverOtherLinkType(t *testing.T) {
	t.Parallel()
	h := build(t, simhost.E810Host())
	if err := os.WriteFile(filepath.Join(h.Root(), "class/net/enp59s0f0/type"), []byte("24\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	pfs, err := h.Sysfs().Discover(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, pf := range pfs {
		got[pf.NetDev] = pf.LinkType
	}
	if got["enp59s0f0"] != "arphrd 24" || got["enp59s0f1"] != sysfs.LinkTypeEthernet {
		t.Fatalf("link types %v, want enp59s0f0 \"arphrd 24\" and enp59s0f1 ethernet", got)
	}
}

func TestUplinkOfAfterRename(t *testing.T) {
	t.Parallel()
	h := build(t, simhost.E810Host())
	if err := h.RenameNetdev("enp59s0f0", "wan0"); err == nil || !strings.Contains(err.Error(), "busy") {
		t.Fatalf("renaming an up interface: %v, want EBUSY", err)
	}
	if err := h.SetOperState("enp59s0f0", "down"); err != nil {
		t.Fatal(err)
	}
	if err := h.RenameNetdev("enp59s0f0", "wan0"); err != nil {
		t.Fatal(err)
	}
	if up, err := h.Sysfs().UplinkOf("0000:3b:00.0"); err != nil || up != "wan0" {
		t.Fatalf("UplinkOf = %q, %v; want wan0", up, err)
	}
	if _, err := h.Sysfs().UplinkOf("0000:3b:09.0"); err == nil {
		t.Fatal("UplinkOf a missing PF: no error")
	}
}
