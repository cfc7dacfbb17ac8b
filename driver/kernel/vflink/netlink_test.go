package vflink

import (
	"errors"
	"net"
	"strings"
	"syscall"
	"testing"

	"github.com/vishvananda/netlink"
)

func TestStateFromInfo(t *testing.T) {
	t.Parallel()
	mac := net.HardwareAddr{2, 0, 0, 0, 0, 1}
	for _, tc := range []struct {
		info netlink.VfInfo
		want VFState
	}{
		{netlink.VfInfo{Mac: mac, Vlan: 10, Qos: 2, VlanProto: 0x0081, Spoofchk: true, Trust: 1, LinkState: 1, MinTxRate: 5, MaxTxRate: 100},
			VFState{MAC: mac, VLAN: 10, QoS: 2, VLANProto: VLANProto8021Q, SpoofChk: true, Trust: true, LinkState: LinkStateEnable, MinTxRateMbps: 5, MaxTxRateMbps: 100}},
		{netlink.VfInfo{Mac: mac, VlanProto: 0xa888, LinkState: 2, Trust: 0},
			VFState{MAC: mac, VLANProto: VLANProto8021AD, LinkState: LinkStateDisable}},
		{netlink.VfInfo{Mac: mac, VlanProto: 0x88a8, Trust: 0xffffffff},
			VFState{MAC: mac, VLANProto: VLANProto8021AD, LinkState: LinkStateAuto}},
	} {
		got := stateFromInfo(tc.info)
		if got.MAC.String() != tc.want.MAC.String() || got.VLAN != tc.want.VLAN || got.QoS != tc.want.QoS || got.VLANProto != tc.want.VLANProto ||
			got.SpoofChk != tc.want.SpoofChk || got.Trust != tc.want.Trust || got.LinkState != tc.want.LinkState ||
			got.MinTxRateMbps != tc.want.MinTxRateMbps || got.MaxTxRateMbps != tc.want.MaxTxRateMbps {
			t.Errorf("stateFromInfo(%+v) = %+v, want %+v", tc.info, got, tc.want)
		}
	}
}

// The real calls need SR-IOV hardware; without a PF the error must name
// the netdev and the namespace, and be a LinkNotFoundError (ENODEV).
func TestMissingPF(t *testing.T) {
	t.Parallel()
	l, err := Open("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	_, err = l.VF("vfnet-nope0", 0)
	if err == nil || !strings.Contains(err.Error(), `"vfnet-nope0"`) || !strings.Contains(err.Error(), "/proc/self/ns/net") ||
		!IsLinkNotFound(err) || !errors.Is(err, syscall.ENODEV) {
		t.Fatalf("VF on missing PF: %v", err)
	}
	if err := l.SetVLAN("lo", 0, 1, 0, "802.1x"); err == nil || !strings.Contains(err.Error(), "802.1x") {
		t.Fatalf("bad proto: %v", err)
	}
}

// IFLA_VF_RATE's fields are u32 and netlink casts without a check: a rate
// that does not fit must be refused before anything is sent (on a NIC,
// 4294967396 Mbps would become a 100 Mbps cap).
func TestSetRateRefusesWhatTheKernelCannotHold(t *testing.T) {
	t.Parallel()
	l, err := Open("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for _, r := range [][2]int{{0, 4294967396}, {4294967296, 0}, {-1, 0}, {0, -5}} {
		err := l.SetRate("lo", 0, r[0], r[1])
		if err == nil || !strings.Contains(err.Error(), "rates must be 0-4294967295 Mbps") || !strings.Contains(err.Error(), "set lo vf 0") {
			t.Errorf("SetRate(lo, 0, %d, %d) = %v, want the 32-bit bound named", r[0], r[1], err)
		}
	}
}
