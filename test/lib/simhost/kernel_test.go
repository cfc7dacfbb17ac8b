package simhost

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vfnet-io/vfnet/driver/kernel/sysfs"
)

func build(t *testing.T, spec Spec, opts ...Option) *Host {
	t.Helper()
	h, err := Build(TempDir(t), spec, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return h
}

func write(t *testing.T, h *Host, rel, data string) {
	t.Helper()
	if err := h.Kernel().WriteFile(rel, []byte(data)); err != nil {
		t.Fatalf("write %q to %s: %v", data, rel, err)
	}
}

// wantErrno checks err is an *os.PathError carrying errno, as a failed
// write(2) on sysfs is.
func wantErrno(t *testing.T, err error, errno syscall.Errno) {
	t.Helper()
	var pe *os.PathError
	if !errors.As(err, &pe) || !errors.Is(err, errno) {
		t.Fatalf("err = %#v, want *os.PathError with %v", err, errno)
	}
}

func fn(t *testing.T, h *Host, bdf string) sysfs.Function {
	t.Helper()
	f, err := h.Sysfs().Function(bdf)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func exists(p string) bool {
	_, err := os.Lstat(p)
	return err == nil
}

// toVFIO is the sequence the driver runs to hand a VF to vfio-pci.
func toVFIO(t *testing.T, h *Host, bdf, from string) {
	t.Helper()
	write(t, h, "bus/pci/devices/"+bdf+"/driver_override", "vfio-pci\n")
	write(t, h, "bus/pci/drivers/"+from+"/unbind", bdf+"\n")
	write(t, h, "bus/pci/drivers/vfio-pci/bind", bdf+"\n")
}

func TestLayoutIsKernelShaped(t *testing.T) {
	t.Parallel()
	h := build(t, E810Host())
	links := map[string]string{
		"bus/pci/devices/0000:3b:02.1":                                        "../../../devices/pci0000:3a/0000:3a:00.0/0000:3b:02.1",
		"devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0/virtfn1":                "../0000:3b:02.1",
		"devices/pci0000:3a/0000:3a:00.0/0000:3b:02.1/physfn":                 "../0000:3b:00.0",
		"devices/pci0000:3a/0000:3a:00.0/0000:3b:02.1/driver":                 "../../../../bus/pci/drivers/iavf",
		"bus/pci/drivers/iavf/0000:3b:02.1":                                   "../../../../devices/pci0000:3a/0000:3a:00.0/0000:3b:02.1",
		"class/net/enp59s0f0v1":                                               "../../devices/pci0000:3a/0000:3a:00.0/0000:3b:02.1/net/enp59s0f0v1",
		"devices/pci0000:3a/0000:3a:00.0/0000:3b:02.1/net/enp59s0f0v1/device": "../../../0000:3b:02.1",
	}
	for link, want := range links {
		got, err := os.Readlink(filepath.Join(h.Root(), link))
		if err != nil || got != want {
			t.Errorf("%s -> %q (%v), want %q", link, got, err, want)
		}
	}
	g := fn(t, h, "0000:3b:02.1").IOMMUGroup
	got, err := os.Readlink(filepath.Join(h.Root(), "devices/pci0000:3a/0000:3a:00.0/0000:3b:02.1/iommu_group"))
	if err != nil || got != "../../../../kernel/iommu_groups/"+g {
		t.Errorf("iommu_group -> %q (%v)", got, err)
	}
	if !exists(filepath.Join(h.Root(), "kernel/iommu_groups", g, "devices", "0000:3b:02.1")) {
		t.Error("group has no devices/<bdf> link")
	}
	files := map[string]string{
		"devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0/vendor":          "0x8086\n",
		"devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0/device":          "0x1593\n",
		"devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0/sriov_totalvfs":  "128\n",
		"devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0/sriov_numvfs":    "4\n",
		"devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0/sriov_vf_device": "1889\n",
		"devices/pci0000:3a/0000:3a:00.0/0000:3b:02.1/driver_override": "(null)\n",
		"devices/pci0000:3a/0000:3a:00.0/0000:3b:02.1/numa_node":       "0\n",
		"class/net/enp59s0f0/type":                                     "1\n",
		"class/net/enp59s0f0/operstate":                                "up\n",
		"devices/system/node/node0/distance":                           "10\n",
	}
	for f, want := range files {
		b, err := os.ReadFile(filepath.Join(h.Root(), f))
		if err != nil || string(b) != want {
			t.Errorf("%s = %q (%v), want %q", f, b, err, want)
		}
	}
	for _, f := range []string{"bus/pci/drivers/vfio-pci/bind", "bus/pci/drivers/vfio-pci/unbind", "bus/pci/drivers/vfio-pci/new_id", "bus/pci/drivers_probe"} {
		if !exists(filepath.Join(h.Root(), f)) {
			t.Errorf("%s missing", f)
		}
	}
	if !exists(filepath.Join(h.DevRoot(), "vfio", "vfio")) {
		t.Error("/dev/vfio/vfio missing")
	}
}

func TestBindVFIOAndBack(t *testing.T) {
	t.Parallel()
	h := build(t, E810Host())
	const vf = "0000:3b:02.1"
	before := fn(t, h, vf)
	mac, _ := os.ReadFile(filepath.Join(h.Root(), "class/net/enp59s0f0v1/address"))
	toVFIO(t, h, vf, "iavf")
	f := fn(t, h, vf)
	if f.Driver != "vfio-pci" || f.NetDevs != nil || f.DriverOverride != "vfio-pci" {
		t.Fatalf("after bind: %+v", f)
	}
	if exists(filepath.Join(h.Root(), "class/net/enp59s0f0v1")) || exists(filepath.Join(h.Root(), "bus/pci/drivers/iavf", vf)) {
		t.Error("iavf leftovers after unbind")
	}
	node := filepath.Join(h.DevRoot(), "vfio", before.IOMMUGroup)
	if !exists(node) || !exists(filepath.Join(h.Root(), "bus/pci/drivers/vfio-pci", vf)) {
		t.Fatalf("no %s or vfio-pci device link", node)
	}

	write(t, h, "bus/pci/drivers/vfio-pci/unbind", vf)
	if exists(node) {
		t.Error("/dev/vfio node stays after the last member left vfio-pci")
	}
	write(t, h, "bus/pci/devices/"+vf+"/driver_override", "\n")
	write(t, h, "bus/pci/drivers_probe", vf)
	after := fn(t, h, vf)
	if !reflect.DeepEqual(after, before) {
		t.Fatalf("after rebind %+v\nwant %+v", after, before)
	}
	mac2, _ := os.ReadFile(filepath.Join(h.Root(), "class/net/enp59s0f0v1/address"))
	if string(mac) != string(mac2) || len(mac) == 0 {
		t.Errorf("netdev address %q -> %q", mac, mac2)
	}
}

func TestBindErrors(t *testing.T) {
	t.Parallel()
	h := build(t, MixedHost())
	k := h.Kernel()
	const vf = "0000:3b:02.1"
	// Bound already.
	wantErrno(t, k.WriteFile("bus/pci/drivers/iavf/bind", []byte(vf)), syscall.EBUSY)
	// vfio-pci has no ID table: without an override it does not match.
	write(t, h, "bus/pci/drivers/iavf/unbind", vf)
	wantErrno(t, k.WriteFile("bus/pci/drivers/vfio-pci/bind", []byte(vf)), syscall.ENODEV)
	// The override names another driver: iavf no longer matches either.
	write(t, h, "bus/pci/devices/"+vf+"/driver_override", "vfio-pci")
	wantErrno(t, k.WriteFile("bus/pci/drivers/iavf/bind", []byte(vf)), syscall.ENODEV)
	// A driver for another device.
	write(t, h, "bus/pci/devices/"+vf+"/driver_override", "")
	wantErrno(t, k.WriteFile("bus/pci/drivers/mlx5_core/bind", []byte(vf)), syscall.ENODEV)
	// Unknown device, unknown driver.
	wantErrno(t, k.WriteFile("bus/pci/drivers/iavf/bind", []byte("0000:3b:0f.0")), syscall.ENODEV)
	err := k.WriteFile("bus/pci/drivers/nosuch/bind", []byte(vf))
	var pe *os.PathError
	if !errors.As(err, &pe) || pe.Op != "open" || !errors.Is(err, syscall.ENOENT) {
		t.Fatalf("missing driver: %#v, want open ENOENT", err)
	}
	// Unbinding from a driver the device is not bound to.
	wantErrno(t, k.WriteFile("bus/pci/drivers/iavf/unbind", []byte("0000:3b:02.2")), syscall.ENODEV) // on vfio-pci
	write(t, h, "bus/pci/drivers/iavf/bind", vf)
	wantErrno(t, k.WriteFile("bus/pci/drivers/iavf/unbind", []byte("0000:3b:02.9")), syscall.ENODEV)
	// Read-only or unmodelled attributes.
	wantErrno(t, k.WriteFile("bus/pci/devices/"+vf+"/vendor", []byte("0x1")), syscall.EACCES)
	wantErrno(t, k.WriteFile("../etc/passwd", []byte("x")), syscall.ENOENT)
	if f := fn(t, h, vf); f.Driver != "iavf" || len(f.NetDevs) != 1 {
		t.Fatalf("VF not back on iavf: %+v", f)
	}
}

func TestUnbindFromWrongDriverIsENODEV(t *testing.T) {
	t.Parallel()
	h := build(t, E810Host())
	wantErrno(t, h.Kernel().WriteFile("bus/pci/drivers/vfio-pci/unbind", []byte("0000:3b:02.0")), syscall.ENODEV)
}

func TestVFIOPCINotLoaded(t *testing.T) {
	t.Parallel()
	spec := E810Host()
	spec.NoVFIOPCI = true
	h := build(t, spec)
	write(t, h, "bus/pci/devices/0000:3b:02.0/driver_override", "vfio-pci")
	write(t, h, "bus/pci/drivers/iavf/unbind", "0000:3b:02.0")
	err := h.Kernel().WriteFile("bus/pci/drivers/vfio-pci/bind", []byte("0000:3b:02.0"))
	if !errors.Is(err, syscall.ENOENT) {
		t.Fatalf("err = %v, want ENOENT", err)
	}
	// drivers_probe with an override naming an absent driver binds nothing
	// and succeeds, as on Linux.
	write(t, h, "bus/pci/drivers_probe", "0000:3b:02.0")
	if f := fn(t, h, "0000:3b:02.0"); f.Driver != "" {
		t.Fatalf("bound to %q", f.Driver)
	}
}

func TestDriverOverrideStore(t *testing.T) {
	t.Parallel()
	h := build(t, E810Host())
	p := filepath.Join(h.Root(), "bus/pci/devices/0000:3b:02.0/driver_override")
	for _, c := range []struct{ in, want string }{{"vfio-pci\n", "vfio-pci\n"}, {"\n", "(null)\n"}, {"a\nb", "a\n"}, {"", "(null)\n"}} {
		write(t, h, "bus/pci/devices/0000:3b:02.0/driver_override", c.in)
		if b, _ := os.ReadFile(p); string(b) != c.want {
			t.Errorf("after %q: %q, want %q", c.in, b, c.want)
		}
	}
	wantErrno(t, h.Kernel().WriteFile("bus/pci/devices/0000:3b:02.0/driver_override", []byte(strings.Repeat("x", 5000))), syscall.EINVAL)
	// The real devices/ path reaches the same attribute.
	write(t, h, "devices/pci0000:3a/0000:3a:00.0/0000:3b:02.0/driver_override", "vfio-pci")
	if f := fn(t, h, "0000:3b:02.0"); f.DriverOverride != "vfio-pci" {
		t.Errorf("override via devices/ path: %+v", f)
	}
}

func TestSharedGroupKeepsNodeUntilLastMember(t *testing.T) {
	t.Parallel()
	h := build(t, E810Host())
	a, b := "0000:3b:02.0", "0000:3b:02.1"
	// Move b into a's group, as devices behind a non-ACS switch are.
	ga, gb := fn(t, h, a).IOMMUGroup, fn(t, h, b).IOMMUGroup
	root := h.Root()
	bdir := "devices/pci0000:3a/0000:3a:00.0/" + b
	for _, step := range []error{
		os.RemoveAll(filepath.Join(root, "kernel/iommu_groups", gb)),
		os.Remove(filepath.Join(root, bdir, "iommu_group")),
		os.Symlink("../../../../kernel/iommu_groups/"+ga, filepath.Join(root, bdir, "iommu_group")),
		os.Symlink("../../../../"+bdir, filepath.Join(root, "kernel/iommu_groups", ga, "devices", b)),
	} {
		if step != nil {
			t.Fatal(step)
		}
	}
	toVFIO(t, h, a, "iavf")
	toVFIO(t, h, b, "iavf")
	node := filepath.Join(h.DevRoot(), "vfio", ga)
	write(t, h, "bus/pci/drivers/vfio-pci/unbind", a)
	if !exists(node) {
		t.Fatal("node removed while another group member is on vfio-pci")
	}
	write(t, h, "bus/pci/drivers/vfio-pci/unbind", b)
	if exists(node) {
		t.Fatal("node stays after the last member left")
	}
}

func TestNoIOMMUBind(t *testing.T) {
	t.Parallel()
	h := build(t, NoIOMMUHost())
	const vf = "0000:3b:02.0"
	toVFIO(t, h, vf, "iavf")
	g := fn(t, h, vf).IOMMUGroup
	if g == "" {
		t.Fatal("no group after vfio-pci bind")
	}
	if b, _ := os.ReadFile(filepath.Join(h.Root(), "kernel/iommu_groups", g, "name")); string(b) != "vfio-noiommu\n" {
		t.Errorf("group name = %q", b)
	}
	node := filepath.Join(h.DevRoot(), "vfio", "noiommu-"+g)
	if !exists(node) || exists(filepath.Join(h.DevRoot(), "vfio", g)) {
		t.Fatalf("want %s only", node)
	}
	write(t, h, "bus/pci/drivers/vfio-pci/unbind", vf)
	if exists(node) || exists(filepath.Join(h.Root(), "kernel/iommu_groups", g)) || fn(t, h, vf).IOMMUGroup != "" {
		t.Fatal("noiommu group or node left after unbind")
	}

	// An IOMMU host: a device without a group cannot be bound (vfio-pci
	// probe fails with EINVAL).
	h2 := build(t, E810Host())
	os.Remove(filepath.Join(h2.Root(), "devices/pci0000:3a/0000:3a:00.0", vf, "iommu_group"))
	write(t, h2, "bus/pci/devices/"+vf+"/driver_override", "vfio-pci")
	write(t, h2, "bus/pci/drivers/iavf/unbind", vf)
	wantErrno(t, h2.Kernel().WriteFile("bus/pci/drivers/vfio-pci/bind", []byte(vf)), syscall.EINVAL)
	if f := fn(t, h2, vf); f.Driver != "" {
		t.Fatalf("failed probe left driver %q", f.Driver)
	}
}

func TestDelayedVFIONode(t *testing.T) {
	t.Parallel()
	h := build(t, E810Host(), WithVFIODevDelay(30*time.Millisecond))
	const vf = "0000:3b:02.0"
	g := fn(t, h, vf).IOMMUGroup
	node := filepath.Join(h.DevRoot(), "vfio", g)
	toVFIO(t, h, vf, "iavf")
	if exists(node) {
		t.Fatal("node exists right after bind despite the delay")
	}
	deadline := time.Now().Add(10 * time.Second)
	for !exists(node) {
		if time.Now().After(deadline) {
			t.Fatal("node never appeared")
		}
		time.Sleep(5 * time.Millisecond)
	}
	// Unbinding before the delay cancels the node.
	const vf2 = "0000:3b:02.1"
	node2 := filepath.Join(h.DevRoot(), "vfio", fn(t, h, vf2).IOMMUGroup)
	toVFIO(t, h, vf2, "iavf")
	write(t, h, "bus/pci/drivers/vfio-pci/unbind", vf2)
	time.Sleep(100 * time.Millisecond)
	if exists(node2) {
		t.Fatal("node appeared for a device unbound before the delay")
	}
	// The delay is stored with the host: a reopened host keeps it.
	h2, err := Open(h.Root())
	if err != nil {
		t.Fatal(err)
	}
	defer h2.Close()
	if h2.st.VFIODevDelay != 30*time.Millisecond {
		t.Fatalf("reopened delay = %v", h2.st.VFIODevDelay)
	}
}

func TestSRIOVNumVFs(t *testing.T) {
	t.Parallel()
	h := build(t, E810Host())
	k := h.Kernel()
	const pf = "0000:3b:00.0"
	rel := "bus/pci/devices/" + pf + "/sriov_numvfs"
	if err := h.Links().SetVLAN("enp59s0f0", 1, 100, 0, "802.1Q"); err != nil {
		t.Fatal(err)
	}
	wantErrno(t, k.WriteFile(rel, []byte("6")), syscall.EBUSY)
	wantErrno(t, k.WriteFile(rel, []byte("129")), syscall.ERANGE)
	wantErrno(t, k.WriteFile(rel, []byte("many")), syscall.EINVAL)
	write(t, h, rel, "4") // same count: no-op
	toVFIO(t, h, "0000:3b:02.2", "iavf")
	g := fn(t, h, "0000:3b:02.2").IOMMUGroup
	write(t, h, rel, "0\n")
	pfs, err := h.Sysfs().Discover(t.Context())
	if err != nil || len(pfs) != 2 || pfs[0].NumVFs != 0 || len(pfs[0].VFs) != 0 {
		t.Fatalf("after 0: %+v %v", pfs, err)
	}
	for _, p := range []string{"bus/pci/devices/0000:3b:02.1", "class/net/enp59s0f0v1", "kernel/iommu_groups/" + g} {
		if exists(filepath.Join(h.Root(), p)) {
			t.Errorf("%s left after disabling SR-IOV", p)
		}
	}
	if exists(filepath.Join(h.DevRoot(), "vfio", g)) {
		t.Error("vfio node left after disabling SR-IOV")
	}
	write(t, h, rel, "2")
	pfs, _ = h.Sysfs().Discover(t.Context())
	if pfs[0].NumVFs != 2 || len(pfs[0].VFs) != 2 || pfs[0].VFs[1].Driver != "iavf" || pfs[0].VFs[1].NetDevs[0] != "enp59s0f0v1" {
		t.Fatalf("after 2: %+v", pfs[0])
	}
	// The PF driver forgot the VF settings.
	st, err := h.VFState("enp59s0f0", 1)
	if err != nil || !reflect.DeepEqual(st, DefaultVFState()) {
		t.Fatalf("VF 1 state after re-create = %+v, %v", st, err)
	}
	// Autoprobe off: new VFs stay unbound.
	write(t, h, rel, "0")
	write(t, h, "bus/pci/devices/"+pf+"/sriov_drivers_autoprobe", "0")
	write(t, h, rel, "1")
	if f := fn(t, h, "0000:3b:02.0"); f.Driver != "" {
		t.Fatalf("autoprobe off, VF bound to %q", f.Driver)
	}
	// No PF driver: ENOENT.
	write(t, h, rel, "0")
	write(t, h, "bus/pci/drivers/ice/unbind", pf)
	wantErrno(t, k.WriteFile(rel, []byte("1")), syscall.ENOENT)
	// A non-PF has no sriov_numvfs at all.
	err = k.WriteFile("bus/pci/devices/0000:3b:02.0/sriov_numvfs", []byte("1"))
	if !errors.Is(err, syscall.ENOENT) {
		t.Fatalf("VF sriov_numvfs: %v", err)
	}
}

// sriov_numvfs_store parses with kstrtou16(buf, 0): base prefixes, one
// trailing newline, nothing else; a bad value is EINVAL before any other
// check, and a driver without sriov_configure is ENOENT like no driver.
func TestSRIOVNumVFsStoreSyntax(t *testing.T) {
	t.Parallel()
	spec := E810Host()
	spec.ExtraDrivers = append(spec.ExtraDrivers, "pci-stub")
	h := build(t, spec)
	k := h.Kernel()
	const pf = "0000:3b:00.1" // sriov_numvfs 0
	rel := "bus/pci/devices/" + pf + "/sriov_numvfs"
	for _, bad := range []string{" 2", "2 ", "2\n\n", "1_0", "-1", "65536", "0x", "08", "", "two"} {
		wantErrno(t, k.WriteFile(rel, []byte(bad)), syscall.EINVAL)
	}
	numVFs := func() string {
		t.Helper()
		v, _ := os.ReadFile(filepath.Join(h.Root(), rel))
		return strings.TrimSpace(string(v))
	}
	for in, want := range map[string]string{"0x2": "2", "+3": "3", "04\n": "4", "0": "0"} {
		write(t, h, rel, "0")
		write(t, h, rel, in)
		if got := numVFs(); got != want {
			t.Errorf("wrote %q: sriov_numvfs %s, want %s", in, got, want)
		}
	}
	// Bound to a driver without sriov_configure (pci-stub): ENOENT, the
	// VF count stays.
	write(t, h, rel, "0")
	write(t, h, "bus/pci/drivers/ice/unbind", pf)
	write(t, h, "bus/pci/devices/"+pf+"/driver_override", "pci-stub")
	write(t, h, "bus/pci/drivers/pci-stub/bind", pf)
	wantErrno(t, k.WriteFile(rel, []byte("1")), syscall.ENOENT)
	// ERANGE comes before the driver check.
	wantErrno(t, k.WriteFile(rel, []byte("129")), syscall.ERANGE)
}

func TestPFUnbindDisablesVFs(t *testing.T) {
	t.Parallel()
	h := build(t, E810Host())
	write(t, h, "bus/pci/drivers/ice/unbind", "0000:3b:00.0")
	f := fn(t, h, "0000:3b:00.0")
	if f.Driver != "" || f.NetDevs != nil {
		t.Fatalf("PF after unbind: %+v", f)
	}
	if exists(filepath.Join(h.Root(), "bus/pci/devices/0000:3b:02.0")) || exists(filepath.Join(h.Root(), "class/net/enp59s0f0")) {
		t.Fatal("VFs or PF netdev survive the PF driver's remove")
	}
	write(t, h, "bus/pci/drivers/ice/bind", "0000:3b:00.0")
	pfs, _ := h.Sysfs().Discover(t.Context())
	if pfs[0].NumVFs != 0 || pfs[0].NetDevs[0] != "enp59s0f0" || pfs[0].OperState != "up" {
		t.Fatalf("PF after rebind: %+v", pfs[0])
	}
}

func TestNewIDAndRemoveID(t *testing.T) {
	t.Parallel()
	h := build(t, E810Host())
	k := h.Kernel()
	write(t, h, "bus/pci/drivers/iavf/unbind", "0000:3b:02.0")
	write(t, h, "bus/pci/drivers/vfio-pci/new_id", "8086 1889")
	if f := fn(t, h, "0000:3b:02.0"); f.Driver != "vfio-pci" {
		t.Fatalf("new_id did not attach the unbound VF: %+v", f)
	}
	if f := fn(t, h, "0000:3b:02.1"); f.Driver != "iavf" {
		t.Fatalf("new_id stole a bound VF: %+v", f)
	}
	wantErrno(t, k.WriteFile("bus/pci/drivers/vfio-pci/new_id", []byte("8086 1889")), syscall.EEXIST)
	wantErrno(t, k.WriteFile("bus/pci/drivers/vfio-pci/new_id", []byte("8086")), syscall.EINVAL)
	// Persisted: a reopened host still matches by the dynamic ID.
	h2, err := Open(h.Root())
	if err != nil {
		t.Fatal(err)
	}
	defer h2.Close()
	if err := h2.Kernel().WriteFile("bus/pci/drivers/iavf/unbind", []byte("0000:3b:02.1")); err != nil {
		t.Fatal(err)
	}
	if err := h2.Kernel().WriteFile("bus/pci/drivers/vfio-pci/bind", []byte("0000:3b:02.1")); err != nil {
		t.Fatalf("bind by dynamic ID after reopen: %v", err)
	}
	if err := h2.Kernel().WriteFile("bus/pci/drivers/vfio-pci/remove_id", []byte("8086 1889")); err != nil {
		t.Fatal(err)
	}
	// The first Host sees the removal the second saved.
	write(t, h, "bus/pci/drivers/vfio-pci/unbind", "0000:3b:02.1")
	wantErrno(t, k.WriteFile("bus/pci/drivers/vfio-pci/bind", []byte("0000:3b:02.1")), syscall.ENODEV)
	wantErrno(t, h2.Kernel().WriteFile("bus/pci/drivers/vfio-pci/remove_id", []byte("8086 1889")), syscall.ENODEV)
}

func TestFailureInjection(t *testing.T) {
	t.Parallel()
	h := build(t, E810Host())
	k := h.Kernel()
	const vf = "0000:3b:02.0"
	k.FailWrite("drivers/vfio-pci/bind", syscall.EIO, 1)
	write(t, h, "bus/pci/devices/"+vf+"/driver_override", "vfio-pci")
	write(t, h, "bus/pci/drivers/iavf/unbind", vf)
	wantErrno(t, k.WriteFile("bus/pci/drivers/vfio-pci/bind", []byte(vf)), syscall.EIO)
	if f := fn(t, h, vf); f.Driver != "" {
		t.Fatalf("failed write had an effect: %+v", f)
	}
	write(t, h, "bus/pci/drivers/vfio-pci/bind", vf) // count was 1
	var seen []string
	k.SetWriteHook(func(rel string, data []byte) error {
		seen = append(seen, rel)
		if strings.HasSuffix(rel, "/unbind") {
			return syscall.EAGAIN
		}
		return nil
	})
	wantErrno(t, k.WriteFile("bus/pci/drivers/vfio-pci/unbind", []byte(vf)), syscall.EAGAIN)
	k.SetWriteHook(nil)
	write(t, h, "bus/pci/drivers/vfio-pci/unbind", vf)
	if len(seen) != 1 {
		t.Errorf("hook saw %v", seen)
	}
	k.FailWrite("driver_override", syscall.EPERM, -1)
	for i := 0; i < 3; i++ {
		wantErrno(t, k.WriteFile("bus/pci/devices/"+vf+"/driver_override", nil), syscall.EPERM)
	}
	w := k.Writes()
	if len(w) != 9 || w[2].Err == nil || w[3].Err != nil || w[3].Rel != "bus/pci/drivers/vfio-pci/bind" {
		t.Errorf("write log = %+v", w)
	}
	// Injection is per host.
	other := build(t, E810Host())
	write(t, other, "bus/pci/devices/"+vf+"/driver_override", "vfio-pci")
}

func TestRemovePFAndOperState(t *testing.T) {
	t.Parallel()
	h := build(t, MixedHost())
	toVFIO(t, h, "0000:3b:02.1", "iavf")
	g := fn(t, h, "0000:3b:02.1").IOMMUGroup
	if err := h.RemovePF("0000:3b:00.0"); err != nil {
		t.Fatal(err)
	}
	if err := h.SetOperState("ens8f0np0", "down"); err != nil {
		t.Fatal(err)
	}
	pfs, err := h.Sysfs().Discover(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, pf := range pfs {
		got = append(got, pf.Address+"="+pf.OperState)
	}
	if want := []string{"0000:01:00.0=up", "0000:3b:00.1=up", "0000:d8:00.0=down"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("PFs = %v, want %v", got, want)
	}
	for _, p := range []string{filepath.Join(h.Root(), "class/net/enp59s0f0"), filepath.Join(h.Root(), "bus/pci/devices/0000:3b:02.1"),
		filepath.Join(h.DevRoot(), "vfio", g), filepath.Join(h.Root(), "devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0")} {
		if exists(p) {
			t.Errorf("%s survives hot-unplug", p)
		}
	}
	if _, err := h.Links().VF("enp59s0f0", 0); !errors.Is(err, syscall.ENODEV) {
		t.Errorf("link op on removed PF: %v, want ENODEV", err)
	}
	if err := h.RemovePF("0000:3b:00.0"); err == nil {
		t.Error("removing twice succeeded")
	}
	if err := h.SetOperState("nosuch", "down"); err == nil {
		t.Error("operstate of unknown netdev succeeded")
	}
	if err := h.SetNumVFs("0000:d8:00.0", 2); err != nil {
		t.Fatal(err)
	}
	if f, _ := h.Sysfs().Discover(t.Context()); len(f[2].VFs) != 2 {
		t.Fatalf("SetNumVFs: %+v", f[2])
	}
}

func TestSpecValidation(t *testing.T) {
	t.Parallel()
	dup := E810Host()
	dup.PFs[1].Address = dup.PFs[0].Address
	overlap := E810Host()
	overlap.PFs[1].VFOffset = 1 // VF 0 of PF1 lands on PF0's VF 1
	tooMany := E810Host()
	tooMany.PFs[0].NumVFs = 200
	badAddr := E810Host()
	badAddr.PFs[0].Address = "0000:3B:00.0"
	for name, s := range map[string]Spec{"duplicate": dup, "overlap": overlap, "numVFs": tooMany, "address": badAddr} {
		if _, err := Build(t.TempDir(), s); err == nil {
			t.Errorf("%s: Build accepted an invalid spec", name)
		}
	}
	if _, err := Open(t.TempDir()); err == nil {
		t.Error("Open of an empty dir succeeded")
	}
	dir := TempDir(t)
	h, err := Build(dir, E810Host())
	if err != nil {
		t.Fatal(err)
	}
	h.Close()
	if _, err := Build(dir, E810Host()); err == nil {
		t.Error("Build over an existing host succeeded")
	}
}

func TestConcurrentKernelAndLinks(t *testing.T) {
	t.Parallel()
	spec := E810Host()
	spec.PFs[0].NumVFs, spec.PFs[1].NumVFs = 16, 16
	h := build(t, spec)
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	pfs, err := h.Sysfs().Discover(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, pf := range pfs {
		for _, vf := range pf.VFs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				k := h.Kernel()
				for _, w := range []struct{ rel, data string }{
					{"bus/pci/devices/" + vf.Address + "/driver_override", "vfio-pci"},
					{"bus/pci/drivers/iavf/unbind", vf.Address},
					{"bus/pci/drivers/vfio-pci/bind", vf.Address},
				} {
					if err := k.WriteFile(w.rel, []byte(w.data)); err != nil {
						errs <- err
						return
					}
				}
				mac := []byte{0x02, 0, 0, 0, byte(vf.Index), 1}
				if err := h.Links().SetMAC(pf.NetDevs[0], vf.Index, mac); err != nil {
					errs <- err
				}
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for _, pf := range pfs {
		for _, vf := range pf.VFs {
			if f := fn(t, h, vf.Address); f.Driver != "vfio-pci" {
				t.Errorf("%s on %q", vf.Address, f.Driver)
			}
			st, err := h.VFState(pf.NetDevs[0], vf.Index)
			if err != nil || st.MAC.String() != fmt.Sprintf("02:00:00:00:%02x:01", vf.Index) {
				t.Errorf("%s vf %d MAC %v %v", pf.NetDevs[0], vf.Index, st.MAC, err)
			}
		}
	}
}

func TestFixturesBuildAndDiscover(t *testing.T) {
	t.Parallel()
	want := map[string]int{"e810": 8, "cx6dx": 8, "i350": 7, "igb82576": 7, "pfdrivers": 24, "mixed": 10, "infiniband": 4, "noiommu": 8, "large": 1024,
		"noacs": 8, "switchdev": 8, "nonuma": 8}
	if got := FixtureNames(); len(got) != len(want) {
		t.Fatalf("fixtures %v", got)
	}
	for _, name := range FixtureNames() {
		spec, err := Fixture(name)
		if err != nil {
			t.Fatal(err)
		}
		h := build(t, spec)
		pfs, err := h.Sysfs().Discover(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, pf := range pfs {
			n += len(pf.VFs)
		}
		if n != want[name] {
			t.Errorf("%s: %d VFs, want %d", name, n, want[name])
		}
	}
	if _, err := Fixture("nosuch"); err == nil || !strings.Contains(err.Error(), "e810") {
		t.Errorf("unknown fixture: %v", err)
	}
}

func TestBuildTimeVFIONodesAreImmediate(t *testing.T) {
	t.Parallel()
	spec := MixedHost()
	spec.PFs[2].VFDrivers = map[int]string{0: DriverVFIOPCI} // a second PF with a vfio VF
	h := build(t, spec, WithVFIODevDelay(time.Hour))
	for _, bdf := range []string{"0000:3b:02.2", "0000:d8:00.2"} {
		f := fn(t, h, bdf)
		if f.Driver != "vfio-pci" || !exists(filepath.Join(h.DevRoot(), "vfio", f.IOMMUGroup)) {
			t.Errorf("%s: %+v, node missing", bdf, f)
		}
	}
}

func TestOpenWithDevRoot(t *testing.T) {
	t.Parallel()
	h := build(t, E810Host())
	dev := filepath.Join(TempDir(t), "dev")
	h2, err := Open(h.Root(), WithDevRoot(dev))
	if err != nil {
		t.Fatal(err)
	}
	defer h2.Close()
	if h2.DevRoot() != dev || !exists(filepath.Join(dev, "vfio", "vfio")) {
		t.Fatalf("dev root %s, vfio/vfio present %v", h2.DevRoot(), exists(filepath.Join(dev, "vfio", "vfio")))
	}
	const vf = "0000:3b:02.0"
	for _, w := range []struct{ rel, data string }{
		{"bus/pci/devices/" + vf + "/driver_override", "vfio-pci"},
		{"bus/pci/drivers/iavf/unbind", vf},
		{"bus/pci/drivers/vfio-pci/bind", vf},
	} {
		if err := h2.Kernel().WriteFile(w.rel, []byte(w.data)); err != nil {
			t.Fatal(err)
		}
	}
	if g := fn(t, h2, vf).IOMMUGroup; !exists(filepath.Join(dev, "vfio", g)) || exists(filepath.Join(h.DevRoot(), "vfio", g)) {
		t.Fatalf("node not in the reopened host's dev root")
	}
}

func TestBuildLeavesSpecAlone(t *testing.T) {
	t.Parallel()
	spec := E810Host()
	spec.PFs[0].RootPort = ""
	var wg sync.WaitGroup
	for i := 0; i < 2; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			h, err := Build(TempDir(t), spec)
			if err != nil {
				t.Error(err)
				return
			}
			h.Close()
		}()
	}
	wg.Wait()
	if spec.PFs[0].RootPort != "" {
		t.Fatal("Build filled defaults into the caller's spec")
	}
}

// TestCharDevNodes: with WithCharDevNodes the vfio nodes are character
// devices with the kernel's numbers, also for a process that reopens the
// host (the driver) and for a dev root given at Open; unbind removes them.
func TestCharDevNodes(t *testing.T) {
	t.Parallel()
	if err := unix.Mknod(filepath.Join(TempDir(t), "probe"), unix.S_IFCHR|0o600, int(unix.Mkdev(1, 3))); err != nil {
		t.Skipf("mknod not permitted here (needs CAP_MKNOD): %v", err)
	}
	h := build(t, E810Host(), WithCharDevNodes())
	wantChar := func(p string, major, minor uint32, perm os.FileMode) {
		t.Helper()
		var st unix.Stat_t
		if err := unix.Stat(p, &st); err != nil {
			t.Fatal(err)
		}
		if st.Mode&unix.S_IFMT != unix.S_IFCHR || unix.Major(uint64(st.Rdev)) != major || unix.Minor(uint64(st.Rdev)) != minor || os.FileMode(st.Mode&0o777) != perm {
			t.Fatalf("%s: mode %o rdev %d:%d, want char device %d:%d mode %o", p, st.Mode, unix.Major(uint64(st.Rdev)), unix.Minor(uint64(st.Rdev)), major, minor, perm)
		}
	}
	wantChar(filepath.Join(h.DevRoot(), "vfio", "vfio"), VFIOContainerMajor, VFIOContainerMinor, 0o666)
	dev := filepath.Join(TempDir(t), "dev")
	h2, err := Open(h.Root(), WithDevRoot(dev))
	if err != nil {
		t.Fatal(err)
	}
	defer h2.Close()
	wantChar(filepath.Join(dev, "vfio", "vfio"), VFIOContainerMajor, VFIOContainerMinor, 0o666)
	const vf = "0000:3b:02.0"
	toVFIO(t, h2, vf, "iavf")
	g := fn(t, h2, vf).IOMMUGroup
	n, _ := strconv.Atoi(g)
	wantChar(filepath.Join(dev, "vfio", g), VFIOGroupMajor, uint32(n), 0o600)
	write(t, h2, "bus/pci/drivers/vfio-pci/unbind", vf)
	if exists(filepath.Join(dev, "vfio", g)) {
		t.Fatalf("group node %s left after unbind", g)
	}
}

// With the PF's sriov_drivers_autoprobe at 0, the kernel probes a VF only
// when its driver_override is set (pci_device_can_probe): an explicit bind
// is ENODEV, drivers_probe and new_id bind nothing. Seen on 6.1 and 6.12.
func TestAutoprobeOffNeedsOverride(t *testing.T) {
	t.Parallel()
	h := build(t, E810Host())
	const pf, vf = "0000:3b:00.0", "0000:3b:02.1"
	write(t, h, "bus/pci/devices/"+pf+"/sriov_drivers_autoprobe", "0")
	write(t, h, "bus/pci/drivers/iavf/unbind", vf)
	wantErrno(t, h.Kernel().WriteFile("bus/pci/drivers/iavf/bind", []byte(vf)), syscall.ENODEV)
	write(t, h, "bus/pci/drivers_probe", vf)
	if f := fn(t, h, vf); f.Driver != "" {
		t.Fatalf("drivers_probe bound %q", f.Driver)
	}
	write(t, h, "bus/pci/devices/"+vf+"/driver_override", "iavf")
	write(t, h, "bus/pci/drivers/iavf/bind", vf)
	if f := fn(t, h, vf); f.Driver != "iavf" {
		t.Fatalf("bind with override: driver %q", f.Driver)
	}
	// Autoprobe back on: a bind without override works again.
	write(t, h, "bus/pci/devices/"+vf+"/driver_override", "")
	write(t, h, "bus/pci/drivers/iavf/unbind", vf)
	write(t, h, "bus/pci/devices/"+pf+"/sriov_drivers_autoprobe", "1")
	write(t, h, "bus/pci/drivers/iavf/bind", vf)
	if f := fn(t, h, vf); f.Driver != "iavf" {
		t.Fatalf("bind with autoprobe on: driver %q", f.Driver)
	}
}

// TestPendingNodeSurvivesItsProcess: a bind whose /dev/vfio node was still
// pending when its process went away (Close stands in for a SIGKILL: the
// timer is gone) gets the node from the next Open, as udev would create it
// anyway. SetVFIODevDelay reaches a process that has the host open.
func TestPendingNodeSurvivesItsProcess(t *testing.T) {
	t.Parallel()
	h := build(t, E810Host())
	other, err := Open(h.Root())
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if err := h.SetVFIODevDelay(time.Hour); err != nil {
		t.Fatal(err)
	}
	const vf = "0000:3b:02.0"
	toVFIO(t, other, vf, "iavf") // other picks up the hour from the tree
	node := filepath.Join(h.DevRoot(), "vfio", fn(t, other, vf).IOMMUGroup)
	if exists(node) {
		t.Fatal("node created at once despite the delay set by another process")
	}
	other.Close()
	if err := h.SetVFIODevDelay(0); err != nil {
		t.Fatal(err)
	}
	again, err := Open(h.Root())
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	if !exists(node) {
		t.Fatal("node still missing after reopening the host")
	}
}
