//go:build kernelguest

package guest

import (
	"bytes"
	"context"
	"crypto/rand"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/vfnet-io/vfnet/driver/kernel/sysfs"
	"github.com/vfnet-io/vfnet/driver/kernel/vflink"
	"github.com/vfnet-io/vfnet/test/kernel/layout"
)

const vfConfigHead = `"apiVersion":"vfnet.io/v1alpha1","kind":"VFConfig"`

// checkPrepared checks that vf is on vfio-pci with its group node, and that
// the PF reports want (through netlink and through iproute2).
func (m *machine) checkPrepared(t *testing.T, pf sysfs.PF, vf sysfs.VF, want vflink.VFState) {
	t.Helper()
	got := m.vfState(t, pf, vf)
	fn, err := m.sysfs.Function(vf.Address)
	if err != nil {
		t.Fatal(err)
	}
	if got.Driver != "vfio-pci" || got.Override != "vfio-pci" {
		t.Errorf("prepared VF %s: %s; want vfio-pci with driver_override vfio-pci", vf.Address, got)
	}
	if st, err := os.Stat("/dev/vfio/" + fn.IOMMUGroup); err != nil || st.Mode()&os.ModeCharDevice == 0 {
		t.Errorf("prepared VF %s: group node /dev/vfio/%s: %v", vf.Address, fn.IOMMUGroup, err)
	}
	l := got.Link
	if !bytes.Equal(l.MAC, want.MAC) || l.VLAN != want.VLAN || l.QoS != want.QoS || l.SpoofChk != want.SpoofChk ||
		l.Trust != want.Trust || l.MaxTxRateMbps != want.MaxTxRateMbps {
		t.Errorf("prepared VF %s: the PF reports %s; want mac=%s vlan=%d qos=%d spoofchk=%v trust=%v max rate %d",
			vf.Address, got, want.MAC, want.VLAN, want.QoS, want.SpoofChk, want.Trust, want.MaxTxRateMbps)
	}
	line := ipVF(t, pf.NetDev, vf.Index)
	t.Logf("ip: %s", line)
	onOff := map[bool]string{true: "on", false: "off"}
	for _, s := range []string{
		"link/ether " + want.MAC.String(),
		"vlan " + itoa(want.VLAN), "qos " + itoa(want.QoS),
		"spoof checking " + onOff[want.SpoofChk], "trust " + onOff[want.Trust],
		"max_tx_rate " + itoa(want.MaxTxRateMbps) + "Mbps",
	} {
		if want.MaxTxRateMbps == 0 && strings.HasPrefix(s, "max_tx_rate") || want.VLAN == 0 && strings.HasPrefix(s, "vlan") || want.QoS == 0 && strings.HasPrefix(s, "qos") {
			continue
		}
		if !strings.Contains(line, s) {
			t.Errorf("iproute2 does not report %q for VF %d of %s: %s", s, vf.Index, pf.NetDev, line)
		}
	}
}

// checkRestored checks that vf is as before prepare: driver, override and
// the PF-side settings. The MAC must be the same when the test had set one
// administratively (adminMAC). Otherwise the VF's MAC is not vfnet's to
// keep: each time igbvf binds it picks a random one and reports it to the
// PF (a failed or undone prepare rebinds it), so the check is that no MAC
// was left set administratively: the VF may still change its own (igb
// refuses that once the PF set one).
func (m *machine) checkRestored(t *testing.T, pf sysfs.PF, vf sysfs.VF, before vfState, adminMAC bool) {
	t.Helper()
	after := m.vfState(t, pf, vf)
	a, b := after.Link, before.Link
	macOK := bytes.Equal(a.MAC, b.MAC)
	if after.Driver != before.Driver || after.Override != before.Override || a.VLAN != b.VLAN || a.QoS != b.QoS ||
		a.VLANProto != b.VLANProto || a.SpoofChk != b.SpoofChk || a.Trust != b.Trust || a.LinkState != b.LinkState ||
		a.MinTxRateMbps != b.MinTxRateMbps || a.MaxTxRateMbps != b.MaxTxRateMbps || (!macOK && adminMAC) ||
		strings.Join(after.DevNodes, ",") != strings.Join(before.DevNodes, ",") {
		t.Errorf("VF %s not restored:\nbefore %s\nafter  %s", vf.Address, before, after)
	}
	if !macOK {
		t.Logf("VF %s: the PF reports %s, a MAC igbvf chose for itself (before: %s)", vf.Address, a.MAC, b.MAC)
	}
	if !adminMAC && after.Driver == "igbvf" {
		m.checkMACNotAdministrative(t, vf)
	}
}

// checkMACNotAdministrative changes the VF's MAC from the VF's own driver:
// igb refuses it ("attempted to override administratively set MAC") when
// the PF has set one.
func (m *machine) checkMACNotAdministrative(t *testing.T, vf sysfs.VF) {
	t.Helper()
	var netdev string
	deadline := time.Now().Add(10 * time.Second)
	for netdev == "" {
		fn, err := m.sysfs.Function(vf.Address)
		if err != nil {
			t.Fatal(err)
		}
		if len(fn.NetDevs) > 0 {
			netdev = fn.NetDevs[0]
		} else if time.Now().After(deadline) {
			t.Fatalf("VF %s on igbvf has no netdev", vf.Address)
		} else {
			time.Sleep(50 * time.Millisecond)
		}
	}
	l, err := netlink.LinkByName(netdev)
	if err != nil {
		t.Fatal(err)
	}
	at, _ := os.ReadFile("/sys/class/net/" + netdev + "/addr_assign_type")
	t.Logf("VF %s netdev %s address %s addr_assign_type %s", vf.Address, netdev, l.Attrs().HardwareAddr, strings.TrimSpace(string(at)))
	// A MAC it never had: setting the current one again proves nothing.
	mac := net.HardwareAddr{0x02, 0x5a, 0, 0, 0, 0}
	if _, err := rand.Read(mac[2:]); err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkSetHardwareAddr(l, mac); err != nil {
		t.Errorf("VF %s (%s) cannot set its own MAC %s: %v: the PF left an administratively set MAC behind", vf.Address, netdev, mac, err)
	}
}

func itoa(i int) string { return strconv.Itoa(i) }

// Case 2: prepare applies the settings igb accepts and binds vfio-pci;
// unprepare puts everything back.
func TestPrepareUnprepare(t *testing.T) {
	m := guest(t)
	pf := m.pf(t, layout.RoleMain)
	vf := pf.VFs[0]
	before := m.vfState(t, pf, vf)
	t.Logf("before: %s\nip: %s", before, ipVF(t, pf.NetDev, vf.Index))
	if len(vf.NetDevs) > 0 {
		at, _ := os.ReadFile("/sys/class/net/" + vf.NetDevs[0] + "/addr_assign_type")
		addr, _ := os.ReadFile("/sys/class/net/" + vf.NetDevs[0] + "/address")
		t.Logf("EXPERIMENT pristine: netdev %s address %s addr_assign_type %s", vf.NetDevs[0], strings.TrimSpace(string(addr)), strings.TrimSpace(string(at)))
	}
	c := claim("prepare", `{`+vfConfigHead+`,"mac":"02:00:00:0a:0b:0c","vlan":100,"qos":3,"spoofChk":false,"trust":true,"maxTxRateMbps":200}`, vf)
	dir := t.TempDir()
	s := m.state(t, dir, nil, c)
	ctx := context.Background()
	start := time.Now()
	if err := prepareClaim(ctx, s, c); err != nil {
		t.Fatalf("prepare: %v", err)
	}
	t.Logf("prepare took %s", time.Since(start).Round(time.Millisecond))
	m.checkPrepared(t, pf, vf, vflink.VFState{MAC: net.HardwareAddr{2, 0, 0, 0x0a, 0x0b, 0x0c}, VLAN: 100, QoS: 3, Trust: true, MaxTxRateMbps: 200})
	if specs, _ := filepath.Glob(filepath.Join(dir, "cdi", "*")); len(specs) != 1 {
		t.Errorf("CDI specs after prepare: %v, want one", specs)
	}
	start = time.Now()
	if err := unprepareClaim(ctx, s, c); err != nil {
		t.Fatalf("unprepare: %v", err)
	}
	t.Logf("unprepare took %s", time.Since(start).Round(time.Millisecond))
	m.checkRestored(t, pf, vf, before, false)
	if specs, _ := filepath.Glob(filepath.Join(dir, "cdi", "*")); len(specs) != 0 {
		t.Errorf("CDI specs left after unprepare: %v", specs)
	}

	// A MAC an administrator set through the PF is put back as it was.
	admin := net.HardwareAddr{2, 0, 0, 0, 0, 0x99}
	if err := m.links.SetMAC(pf.NetDev, vf.Index, admin); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := m.links.SetMAC(pf.NetDev, vf.Index, make(net.HardwareAddr, 6)); err != nil {
			t.Error(err)
		}
	}()
	before = m.vfState(t, pf, vf)
	{
		fn, _ := m.sysfs.Function(vf.Address)
		_ = os.WriteFile("/sys/bus/pci/drivers/igbvf/unbind", []byte(vf.Address), 0)
		_ = os.WriteFile("/sys/bus/pci/drivers/igbvf/bind", []byte(vf.Address), 0)
		fn, _ = m.sysfs.Function(vf.Address)
		if len(fn.NetDevs) > 0 {
			at, _ := os.ReadFile("/sys/class/net/" + fn.NetDevs[0] + "/addr_assign_type")
			addr, _ := os.ReadFile("/sys/class/net/" + fn.NetDevs[0] + "/address")
			t.Logf("EXPERIMENT admin MAC set, igbvf rebound: netdev %s address %s addr_assign_type %s", fn.NetDevs[0], strings.TrimSpace(string(addr)), strings.TrimSpace(string(at)))
		}
	}
	c2 := claim("prepare-admin-mac", `{`+vfConfigHead+`,"mac":"02:00:00:0a:0b:0d","vlan":101}`, vf)
	s2 := m.state(t, t.TempDir(), nil, c2)
	if err := prepareClaim(ctx, s2, c2); err != nil {
		t.Fatalf("prepare: %v", err)
	}
	m.checkPrepared(t, pf, vf, vflink.VFState{MAC: net.HardwareAddr{2, 0, 0, 0x0a, 0x0b, 0x0d}, VLAN: 101, SpoofChk: before.Link.SpoofChk, Trust: before.Link.Trust})
	if err := unprepareClaim(ctx, s2, c2); err != nil {
		t.Fatalf("unprepare: %v", err)
	}
	m.checkRestored(t, pf, vf, before, true)
}

// Case 3: settings igb refuses fail prepare with an error naming the
// setting and the PF driver, and leave nothing changed.
func TestRefusedSettings(t *testing.T) {
	m := guest(t)
	pf := m.pf(t, layout.RoleMain)
	vf := pf.VFs[1]
	for _, tc := range []struct{ setting, params string }{
		{"vlanProtocol", `"vlan":10,"vlanProtocol":"802.1ad"`},
		{"linkState", `"linkState":"disable"`},
		{"minTxRateMbps", `"minTxRateMbps":10,"maxTxRateMbps":100`},
	} {
		t.Run(tc.setting, func(t *testing.T) {
			before := m.vfState(t, pf, vf)
			c := claim("refused-"+strings.ToLower(tc.setting), `{`+vfConfigHead+`,`+tc.params+`}`, vf)
			s := m.state(t, t.TempDir(), nil, c)
			err := prepareClaim(context.Background(), s, c)
			if err == nil {
				_ = unprepareClaim(context.Background(), s, c)
				t.Fatalf("prepare with %s succeeded; igb refuses it", tc.params)
			}
			t.Logf("prepare failed: %v", err)
			if !strings.Contains(err.Error(), tc.setting) || !strings.Contains(err.Error(), "igb") {
				t.Errorf("the error does not name the setting %s and the PF driver igb: %v", tc.setting, err)
			}
			m.checkRestored(t, pf, vf, before, false)
			if n := len(s.Snapshot().Claims); n != 0 {
				t.Errorf("the checkpoint still holds %d claims after a failed prepare", n)
			}
		})
	}
}

// Case 5: with the PF's sriov_drivers_autoprobe at 0 the kernel binds a VF
// only to the driver its driver_override names; unprepare must still give
// the VF back to igbvf.
func TestNoAutoprobe(t *testing.T) {
	m := guest(t)
	pf := m.pf(t, layout.RoleMain)
	vf := pf.VFs[3]
	knob := "/sys/bus/pci/devices/" + pf.Address + "/sriov_drivers_autoprobe"
	if err := os.WriteFile(knob, []byte("0"), 0); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := os.WriteFile(knob, []byte("1"), 0); err != nil {
			t.Error(err)
		}
	}()
	before := m.vfState(t, pf, vf)
	c := claim("autoprobe", `{`+vfConfigHead+`,"vlan":5}`, vf)
	s := m.state(t, t.TempDir(), nil, c)
	ctx := context.Background()
	if err := prepareClaim(ctx, s, c); err != nil {
		t.Fatalf("prepare: %v", err)
	}
	m.checkPrepared(t, pf, vf, vflink.VFState{MAC: before.Link.MAC, VLAN: 5, SpoofChk: before.Link.SpoofChk, Trust: before.Link.Trust})
	if err := unprepareClaim(ctx, s, c); err != nil {
		t.Errorf("unprepare: %v", err)
	}
	m.checkRestored(t, pf, vf, before, false)
}
