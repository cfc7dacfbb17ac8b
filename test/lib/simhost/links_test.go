package simhost

import (
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/vfnet-io/vfnet/driver/kernel/vflink"
)

func mustMAC(t *testing.T, s string) net.HardwareAddr {
	t.Helper()
	m, err := net.ParseMAC(s)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestLinksDefaultsAndSetters(t *testing.T) {
	t.Parallel()
	h := build(t, E810Host())
	l := h.Links()
	st, err := l.VF("enp59s0f0", 3)
	if err != nil {
		t.Fatal(err)
	}
	want := vflink.VFState{MAC: net.HardwareAddr{0, 0, 0, 0, 0, 0}, VLANProto: "802.1Q", SpoofChk: true, LinkState: "auto"}
	if !reflect.DeepEqual(st, want) {
		t.Fatalf("default = %+v, want %+v", st, want)
	}
	mac := mustMAC(t, "02:00:00:00:00:01")
	for _, err := range []error{
		l.SetMAC("enp59s0f0", 3, mac),
		l.SetVLAN("enp59s0f0", 3, 100, 5, vflink.VLANProto8021AD),
		l.SetSpoofChk("enp59s0f0", 3, false),
		l.SetTrust("enp59s0f0", 3, true),
		l.SetLinkState("enp59s0f0", 3, vflink.LinkStateDisable),
		l.SetRate("enp59s0f0", 3, 100, 1000),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	want = vflink.VFState{MAC: mac, VLAN: 100, QoS: 5, VLANProto: "802.1ad", SpoofChk: false, Trust: true,
		LinkState: "disable", MinTxRateMbps: 100, MaxTxRateMbps: 1000}
	if st, _ := l.VF("enp59s0f0", 3); !reflect.DeepEqual(st, want) {
		t.Fatalf("after set = %+v, want %+v", st, want)
	}
	// Other VFs and the other PF are untouched.
	if st, _ := l.VF("enp59s0f1", 3); !reflect.DeepEqual(st, DefaultVFState()) {
		t.Fatalf("other PF's VF changed: %+v", st)
	}
	// The VF's netdev takes the MAC; clearing it with zeros is allowed.
	addr := filepath.Join(h.Root(), "class/net/enp59s0f0v3/address")
	if b, _ := os.ReadFile(addr); string(b) != "02:00:00:00:00:01\n" {
		t.Errorf("netdev address = %q", b)
	}
	if err := l.SetMAC("enp59s0f0", 3, make(net.HardwareAddr, 6)); err != nil {
		t.Fatalf("zero MAC: %v", err)
	}
	if b, _ := os.ReadFile(addr); string(b) == "02:00:00:00:00:01\n" {
		t.Error("netdev kept the cleared MAC")
	}
	// Returned MACs are copies.
	st, _ = l.VF("enp59s0f0", 3)
	st.MAC[0] = 0xff
	if st2, _ := l.VF("enp59s0f0", 3); st2.MAC[0] != 0 {
		t.Error("VF returned a MAC aliasing the stored state")
	}
}

func TestLinksRejectLikeTheKernel(t *testing.T) {
	t.Parallel()
	h := build(t, MixedHost())
	l := h.Links()
	mac := mustMAC(t, "02:00:00:00:00:01")
	cases := []struct {
		name  string
		err   error
		errno syscall.Errno
	}{
		{"unknown PF", l.SetMAC("nosuch", 0, mac), syscall.ENODEV},
		{"PF name with slash", l.SetTrust("../x", 0, true), syscall.ENODEV},
		{"VF netdev is not a PF", l.SetTrust("enp59s0f0v0", 0, true), syscall.EOPNOTSUPP},
		{"plain NIC", l.SetTrust("enp2s0", 0, true), syscall.EOPNOTSUPP},
		{"index = numvfs", l.SetTrust("enp59s0f0", 4, true), syscall.EINVAL},
		{"negative index", l.SetTrust("enp59s0f0", -1, true), syscall.EINVAL},
		{"PF without VFs", l.SetTrust("enp59s0f1", 0, true), syscall.EINVAL},
		{"read past numvfs", func() error { _, err := l.VF("enp59s0f0", 9); return err }(), syscall.EINVAL},
		{"multicast MAC", l.SetMAC("enp59s0f0", 0, mustMAC(t, "01:00:5e:00:00:01")), syscall.EINVAL},
		{"broadcast MAC", l.SetMAC("enp59s0f0", 0, mustMAC(t, "ff:ff:ff:ff:ff:ff")), syscall.EINVAL},
		{"short MAC", l.SetMAC("enp59s0f0", 0, net.HardwareAddr{2, 0, 0}), syscall.EINVAL},
		{"20-byte MAC", l.SetMAC("enp59s0f0", 0, make(net.HardwareAddr, 20)), syscall.EINVAL},
		{"VLAN 4096", l.SetVLAN("enp59s0f0", 0, 4096, 0, "802.1Q"), syscall.EINVAL},
		{"VLAN -1", l.SetVLAN("enp59s0f0", 0, -1, 0, "802.1Q"), syscall.EINVAL},
		{"qos 8", l.SetVLAN("enp59s0f0", 0, 10, 8, "802.1Q"), syscall.EINVAL},
		{"bad proto", l.SetVLAN("enp59s0f0", 0, 10, 0, "802.1X"), syscall.EPROTONOSUPPORT},
		{"min > max", l.SetRate("enp59s0f0", 0, 500, 100), syscall.EINVAL},
		{"negative rate", l.SetRate("enp59s0f0", 0, -1, 0), syscall.EINVAL},
		{"bad link state", l.SetLinkState("enp59s0f0", 0, "up"), syscall.EINVAL},
	}
	for _, c := range cases {
		if !errors.Is(c.err, c.errno) {
			t.Errorf("%s: err = %v, want %v", c.name, c.err, c.errno)
		}
	}
	// None of the rejected calls changed anything.
	if st, _ := l.VF("enp59s0f0", 0); !reflect.DeepEqual(st, DefaultVFState()) {
		t.Fatalf("rejected calls changed VF 0: %+v", st)
	}
	// Accepted edge values.
	for name, err := range map[string]error{
		"VLAN 4095":       l.SetVLAN("enp59s0f0", 0, 4095, 7, ""),
		"min with no max": l.SetRate("enp59s0f0", 0, 500, 0),
		"mlx5 PF":         l.SetTrust("ens8f0np0", 3, true),
		"igb numa -1 PF":  l.SetSpoofChk("enp1s0f0", 1, false),
	} {
		if err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	if st, _ := l.VF("enp59s0f0", 0); st.VLANProto != "802.1Q" || st.VLAN != 4095 {
		t.Errorf("empty proto should mean 802.1Q: %+v", st)
	}
}

func TestLinksFailureInjection(t *testing.T) {
	t.Parallel()
	h := build(t, E810Host())
	l := h.Links()
	l.Fail(OpSetVLAN, syscall.EBUSY, 2)
	for i := 0; i < 2; i++ {
		if err := l.SetVLAN("enp59s0f0", 0, 10, 0, ""); !errors.Is(err, syscall.EBUSY) {
			t.Fatalf("call %d: %v", i, err)
		}
	}
	if st, _ := l.VF("enp59s0f0", 0); st.VLAN != 0 {
		t.Fatal("failed call had an effect")
	}
	if err := l.SetVLAN("enp59s0f0", 0, 10, 0, ""); err != nil {
		t.Fatal(err)
	}
	l.Fail(OpVF, syscall.EIO, 1)
	if _, err := l.VF("enp59s0f0", 0); !errors.Is(err, syscall.EIO) {
		t.Fatal(err)
	}
	// VFState (the test's view) ignores injection.
	l.Fail(OpVF, syscall.EIO, -1)
	if st, err := h.VFState("enp59s0f0", 0); err != nil || st.VLAN != 10 {
		t.Fatalf("VFState = %+v, %v", st, err)
	}
}

func TestLinksCorruptStateFile(t *testing.T) {
	t.Parallel()
	h := build(t, E810Host())
	if err := os.WriteFile(filepath.Join(h.Root(), ".simhost/vflinks.json"), []byte("{"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := h.Links().VF("enp59s0f0", 0); err == nil {
		t.Fatal("corrupt state accepted")
	}
}

// TestLinksAcrossProcesses runs this test binary again as a second process
// that reopens the host and changes a VF; this process must see it.
func TestLinksAcrossProcesses(t *testing.T) {
	if root := os.Getenv("SIMHOST_CHILD_ROOT"); root != "" {
		h, err := Open(root)
		if err != nil {
			t.Fatal(err)
		}
		defer h.Close()
		if st, err := h.Links().VF("enp59s0f0", 1); err != nil || st.VLAN != 42 {
			t.Fatalf("child sees %+v, %v; want VLAN 42 from the parent", st, err)
		}
		if err := h.Links().SetMAC("enp59s0f0", 1, net.HardwareAddr{2, 9, 9, 9, 9, 9}); err != nil {
			t.Fatal(err)
		}
		if err := h.Kernel().WriteFile("bus/pci/drivers/iavf/unbind", []byte("0000:3b:02.1")); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Parallel()
	h := build(t, E810Host())
	if err := h.Links().SetVLAN("enp59s0f0", 1, 42, 0, ""); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestLinksAcrossProcesses$", "-test.count=1")
	cmd.Env = append(os.Environ(), "SIMHOST_CHILD_ROOT="+h.Root())
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	st, err := h.Links().VF("enp59s0f0", 1)
	if err != nil || st.MAC.String() != "02:09:09:09:09:09" || st.VLAN != 42 {
		t.Fatalf("parent sees %+v, %v after the child's change", st, err)
	}
	if f := fn(t, h, "0000:3b:02.1"); f.Driver != "" {
		t.Fatalf("child's unbind not visible: %+v", f)
	}
}

func TestLinksInfiniband(t *testing.T) {
	t.Parallel()
	h := build(t, InfinibandHost())
	l := h.Links()
	if err := l.SetLinkState("ibp216s0f0", 0, vflink.LinkStateEnable); err != nil {
		t.Fatal(err)
	}
	if st, err := l.VF("ibp216s0f0", 0); err != nil || st.LinkState != "enable" {
		t.Fatalf("VF = %+v, %v", st, err)
	}
	for name, err := range map[string]error{
		"mac":      l.SetMAC("ibp216s0f0", 0, net.HardwareAddr{2, 0, 0, 0, 0, 1}),
		"vlan":     l.SetVLAN("ibp216s0f0", 0, 10, 0, ""),
		"spoofchk": l.SetSpoofChk("ibp216s0f0", 0, false),
		"trust":    l.SetTrust("ibp216s0f0", 0, true),
		"rate":     l.SetRate("ibp216s0f0", 0, 0, 100),
	} {
		if !errors.Is(err, syscall.EOPNOTSUPP) {
			t.Errorf("%s on IPoIB: %v, want EOPNOTSUPP", name, err)
		}
	}
}

// The rates cross netlink as u32 (struct ifla_vf_rate): a value past 32
// bits reaches the PF cut to its low bits, as on a real NIC, so a driver
// that forgot the bound would read back a different rate. VLAN and qos
// are u32 too; the kernel refuses past 12 and 3 bits.
func TestLinksRateFieldWidths(t *testing.T) {
	t.Parallel()
	h := build(t, ConnectX6DxHost()) // mlx5 stores any max rate
	l := h.Links()
	const pf = "ens8f0np0"
	if err := l.SetRate(pf, 1, 0, 4294967396); err != nil {
		t.Fatal(err)
	}
	if st, _ := l.VF(pf, 1); st.MaxTxRateMbps != 100 {
		t.Fatalf("max rate 4294967396 reads back %d, want 100 (low 32 bits)", st.MaxTxRateMbps)
	}
	if err := l.SetRate(pf, 1, 0, 4294967295); err != nil {
		t.Fatal(err)
	}
	if st, _ := l.VF(pf, 1); st.MaxTxRateMbps != 4294967295 {
		t.Fatalf("max rate at the 32-bit bound reads back %d", st.MaxTxRateMbps)
	}
	// 1<<32 + 5 arrives as VLAN 5; 1<<32 + 4096 is refused like 4096.
	if err := l.SetVLAN(pf, 2, 1<<32+5, 0, vflink.VLANProto8021Q); err != nil {
		t.Fatal(err)
	}
	if st, _ := l.VF(pf, 2); st.VLAN != 5 {
		t.Fatalf("VLAN 1<<32+5 reads back %d, want 5", st.VLAN)
	}
	for _, c := range []struct{ vlan, qos int }{{4096, 0}, {1<<32 + 4096, 0}, {10, 8}, {10, -1}} {
		if err := l.SetVLAN(pf, 2, c.vlan, c.qos, vflink.VLANProto8021Q); !errors.Is(err, syscall.EINVAL) {
			t.Errorf("vlan %d qos %d: %v, want EINVAL", c.vlan, c.qos, err)
		}
	}
}

// A VF nobody set a MAC for reads 00:00:00:00:00:00 through the PF. After
// its VF driver is rebound, the driver picks its own MAC and the PF
// reports that one, although no MAC is administratively set (igb with
// igbvf on 6.1; bnxt and ice report the VF's own MAC too). Setting a MAC
// through the PF replaces it; a function reset makes the PF forget it.
func TestPFReportsTheVFDriversOwnMAC(t *testing.T) {
	t.Parallel()
	h := build(t, E810Host())
	l := h.Links()
	const pf, idx, vf = "enp59s0f0", 1, "0000:3b:02.1"
	reported := func() net.HardwareAddr {
		t.Helper()
		st, err := l.VF(pf, idx)
		if err != nil {
			t.Fatal(err)
		}
		return st.MAC
	}
	admin := func() net.HardwareAddr {
		t.Helper()
		st, err := h.VFState(pf, idx)
		if err != nil {
			t.Fatal(err)
		}
		return st.MAC
	}
	zero := net.HardwareAddr{0, 0, 0, 0, 0, 0}
	if m := reported(); !isZeroMAC(m) {
		t.Fatalf("pristine VF reports %s", m)
	}
	toVFIO(t, h, vf, "iavf")
	if m := reported(); !isZeroMAC(m) {
		t.Fatalf("VF on vfio-pci reports %s", m)
	}
	// Back to iavf: the driver picks its own MAC (its netdev's address).
	write(t, h, "bus/pci/devices/"+vf+"/driver_override", "")
	write(t, h, "bus/pci/drivers/vfio-pci/unbind", vf)
	write(t, h, "bus/pci/drivers/iavf/bind", vf)
	f := fn(t, h, vf)
	own, err := os.ReadFile(filepath.Join(h.Root(), "class/net", f.NetDevs[0], "address"))
	if err != nil {
		t.Fatal(err)
	}
	if m := reported(); isZeroMAC(m) || m.String()+"\n" != string(own) {
		t.Fatalf("after the rebind the PF reports %s, want the VF driver's own %s", m, own)
	}
	if m := admin(); !reflect.DeepEqual(m, zero) {
		t.Fatalf("administrative MAC %s, want none", m)
	}
	// An administrator's MAC wins and replaces the driver's.
	set := mustMAC(t, "02:00:00:00:00:aa")
	if err := l.SetMAC(pf, idx, set); err != nil {
		t.Fatal(err)
	}
	if m := reported(); m.String() != set.String() {
		t.Fatalf("after SetMAC the PF reports %s", m)
	}
	if err := l.SetMAC(pf, idx, zero); err != nil {
		t.Fatal(err)
	}
	if m := reported(); !isZeroMAC(m) {
		t.Fatalf("after clearing the MAC the PF reports %s", m)
	}
	// Rebound again it reports its own MAC, which its netdev marks as
	// random (addr_assign_type 1), and the PF keeps showing it after the
	// driver lets go, also with the VF on vfio-pci (igb on 6.1 does:
	// test/kernel/scenario's kernel trace).
	write(t, h, "bus/pci/drivers/iavf/unbind", vf)
	write(t, h, "bus/pci/drivers/iavf/bind", vf)
	ownAgain := reported()
	if isZeroMAC(ownAgain) {
		t.Fatal("rebound VF driver reported no MAC")
	}
	if at := readAssignType(t, h, vf); at != "1" {
		t.Fatalf("the VF driver's own MAC has addr_assign_type %s, want 1 (random)", at)
	}
	write(t, h, "bus/pci/drivers/iavf/unbind", vf)
	if m := reported(); m.String() != ownAgain.String() {
		t.Fatalf("unbound VF reports %s, want the driver's %s still", m, ownAgain)
	}
	write(t, h, "bus/pci/devices/"+vf+"/driver_override", "vfio-pci\n")
	write(t, h, "bus/pci/drivers/vfio-pci/bind", vf+"\n")
	if m := reported(); m.String() != ownAgain.String() {
		t.Fatalf("VF on vfio-pci reports %s, want the driver's %s still", m, ownAgain)
	}
	write(t, h, "bus/pci/devices/"+vf+"/driver_override", "")
	write(t, h, "bus/pci/drivers/vfio-pci/unbind", vf)
	// An administrator's MAC reaches the rebound driver as its permanent one.
	if err := l.SetMAC(pf, idx, set); err != nil {
		t.Fatal(err)
	}
	write(t, h, "bus/pci/drivers/iavf/bind", vf)
	if at := readAssignType(t, h, vf); at != "0" {
		t.Fatalf("a MAC set through the PF has addr_assign_type %s, want 0 (permanent)", at)
	}
	if err := l.SetMAC(pf, idx, zero); err != nil {
		t.Fatal(err)
	}
	// SR-IOV disable forgets everything.
	if err := h.SetNumVFs("0000:3b:00.0", 0); err != nil {
		t.Fatal(err)
	}
	if err := h.SetNumVFs("0000:3b:00.0", 4); err != nil {
		t.Fatal(err)
	}
	if m := reported(); !isZeroMAC(m) {
		t.Fatalf("re-created VF reports %s", m)
	}
}

func readAssignType(t *testing.T, h *Host, vf string) string {
	t.Helper()
	f := fn(t, h, vf)
	if len(f.NetDevs) == 0 {
		t.Fatalf("VF %s has no netdev", vf)
	}
	b, err := os.ReadFile(filepath.Join(h.Root(), "class/net", f.NetDevs[0], "addr_assign_type"))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// With reset windows on, MAC, VLAN and trust changes and VF driver changes
// reset the VF; settings made during the reset fail with EBUSY (ice) or
// EAGAIN (i40e) and work once it is over. Reads work throughout.
func TestVFResetWindows(t *testing.T) {
	t.Parallel()
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	h := build(t, PFDriverHost(), WithClock(clk))
	h.SetVFResets(VFResets{Window: 100 * time.Millisecond})
	l := h.Links()
	for _, c := range []struct {
		pf    string
		errno syscall.Errno
	}{{"enp59s0f0", syscall.EBUSY}, {"enp94s0f0", syscall.EAGAIN}} {
		if err := l.SetVLAN(c.pf, 0, 10, 0, vflink.VLANProto8021Q); err != nil {
			t.Fatal(err)
		}
		if err := l.SetTrust(c.pf, 0, true); !errors.Is(err, c.errno) {
			t.Fatalf("%s: set during the reset: %v, want %v", c.pf, err, c.errno)
		}
		if err := l.SetSpoofChk(c.pf, 0, false); !errors.Is(err, c.errno) {
			t.Fatalf("%s: spoofchk during the reset: %v, want %v", c.pf, err, c.errno)
		}
		if st, err := l.VF(c.pf, 0); err != nil || st.VLAN != 10 || st.Trust {
			t.Fatalf("%s: read during the reset: %+v %v", c.pf, st, err)
		}
		// Other VFs are not affected.
		if err := l.SetSpoofChk(c.pf, 1, false); err != nil {
			t.Fatalf("%s: other VF: %v", c.pf, err)
		}
		// Spoof checking does not reset the VF.
		if err := l.SetSpoofChk(c.pf, 1, true); err != nil {
			t.Fatalf("%s: second spoofchk: %v", c.pf, err)
		}
	}
	clk.Step(100 * time.Millisecond)
	if err := l.SetTrust("enp59s0f0", 0, true); err != nil {
		t.Fatalf("after the reset: %v", err)
	}
	clk.Step(time.Second)
	// A VF driver change is a function reset too.
	const vf = "0000:3b:02.2" // enp59s0f0 vf 2
	write(t, h, "bus/pci/devices/"+vf+"/driver_override", "vfio-pci")
	write(t, h, "bus/pci/drivers/iavf/unbind", vf)
	if err := l.SetTrust("enp59s0f0", 2, true); !errors.Is(err, syscall.EBUSY) {
		t.Fatalf("set right after the unbind: %v, want EBUSY", err)
	}
	clk.Step(time.Second)
	if err := l.SetTrust("enp59s0f0", 2, true); err != nil {
		t.Fatal(err)
	}
	// Off again: no windows.
	h.SetVFResets(VFResets{})
	write(t, h, "bus/pci/drivers/vfio-pci/bind", vf)
	if err := l.SetTrust("enp59s0f0", 2, false); err != nil {
		t.Fatal(err)
	}
}
