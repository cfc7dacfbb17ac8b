package vflink

import (
	"fmt"
	"math"
	"net"

	"github.com/vishvananda/netlink"
)

// Ethertypes of the VLAN protocols in host order, as
// netlink.LinkSetVfVlanQosProto takes them.
const (
	ethTypeQ  = 0x8100
	ethTypeAD = 0x88a8
)

// Netlink changes VF settings through the kernel's rtnetlink interface,
// like `ip link set <pf> vf <n> ...`. It needs CAP_NET_ADMIN in the PF's
// network namespace.
type Netlink struct{}

var _ Links = Netlink{}

func (Netlink) link(pfName string) (netlink.Link, error) {
	l, err := netlink.LinkByName(pfName)
	if err != nil {
		return nil, fmt.Errorf("find PF netdev %q: %w", pfName, err)
	}
	return l, nil
}

// VF implements Links.
func (n Netlink) VF(pfName string, vf int) (VFState, error) {
	l, err := n.link(pfName)
	if err != nil {
		return VFState{}, err
	}
	for _, info := range l.Attrs().Vfs {
		if info.ID == vf {
			return stateFromInfo(info), nil
		}
	}
	return VFState{}, fmt.Errorf("PF %s reports no VF %d (it has %d VFs)", pfName, vf, len(l.Attrs().Vfs))
}

func stateFromInfo(info netlink.VfInfo) VFState {
	s := VFState{
		MAC:           append(net.HardwareAddr(nil), info.Mac...),
		VLAN:          info.Vlan,
		QoS:           info.Qos,
		VLANProto:     VLANProto8021Q,
		SpoofChk:      info.Spoofchk,
		Trust:         info.Trust == 1,
		MinTxRateMbps: int(info.MinTxRate),
		MaxTxRateMbps: int(info.MaxTxRate),
	}
	// The library hands the protocol over as the raw (network order)
	// field; accept either byte order.
	switch info.VlanProto {
	case ethTypeAD, 0xa888:
		s.VLANProto = VLANProto8021AD
	}
	switch info.LinkState {
	case 1:
		s.LinkState = LinkStateEnable
	case 2:
		s.LinkState = LinkStateDisable
	default:
		s.LinkState = LinkStateAuto
	}
	return s
}

// SetMAC implements Links.
func (n Netlink) SetMAC(pfName string, vf int, mac net.HardwareAddr) error {
	l, err := n.link(pfName)
	if err != nil {
		return err
	}
	if err := netlink.LinkSetVfHardwareAddr(l, vf, mac); err != nil {
		return fmt.Errorf("set %s vf %d mac %s: %w", pfName, vf, mac, err)
	}
	return nil
}

// SetVLAN implements Links.
func (n Netlink) SetVLAN(pfName string, vf int, vlan, qos int, proto string) error {
	l, err := n.link(pfName)
	if err != nil {
		return err
	}
	p := ethTypeQ
	switch proto {
	case VLANProto8021Q, "":
	case VLANProto8021AD:
		p = ethTypeAD
	default:
		return fmt.Errorf("set %s vf %d vlan: protocol %q; allowed %q or %q", pfName, vf, proto, VLANProto8021Q, VLANProto8021AD)
	}
	if err := netlink.LinkSetVfVlanQosProto(l, vf, vlan, qos, p); err != nil {
		return fmt.Errorf("set %s vf %d vlan %d qos %d proto %s: %w", pfName, vf, vlan, qos, proto, err)
	}
	return nil
}

// SetSpoofChk implements Links.
func (n Netlink) SetSpoofChk(pfName string, vf int, on bool) error {
	l, err := n.link(pfName)
	if err != nil {
		return err
	}
	if err := netlink.LinkSetVfSpoofchk(l, vf, on); err != nil {
		return fmt.Errorf("set %s vf %d spoofchk %v: %w", pfName, vf, on, err)
	}
	return nil
}

// SetTrust implements Links.
func (n Netlink) SetTrust(pfName string, vf int, on bool) error {
	l, err := n.link(pfName)
	if err != nil {
		return err
	}
	if err := netlink.LinkSetVfTrust(l, vf, on); err != nil {
		return fmt.Errorf("set %s vf %d trust %v: %w", pfName, vf, on, err)
	}
	return nil
}

// SetLinkState implements Links.
func (n Netlink) SetLinkState(pfName string, vf int, state string) error {
	l, err := n.link(pfName)
	if err != nil {
		return err
	}
	var s uint32
	switch state {
	case LinkStateAuto:
		s = 0
	case LinkStateEnable:
		s = 1
	case LinkStateDisable:
		s = 2
	default:
		return fmt.Errorf("set %s vf %d state: %q; allowed %q, %q or %q", pfName, vf, state, LinkStateAuto, LinkStateEnable, LinkStateDisable)
	}
	if err := netlink.LinkSetVfState(l, vf, s); err != nil {
		return fmt.Errorf("set %s vf %d state %s: %w", pfName, vf, state, err)
	}
	return nil
}

// SetRate implements Links.
func (n Netlink) SetRate(pfName string, vf int, minMbps, maxMbps int) error {
	l, err := n.link(pfName)
	if err != nil {
		return err
	}
	// IFLA_VF_RATE holds u32 rates and the library casts without a check:
	// 4294967396 would reach the NIC as 100.
	for _, r := range []int{minMbps, maxMbps} {
		if r < 0 || int64(r) > math.MaxUint32 {
			return fmt.Errorf("set %s vf %d min_tx_rate %d max_tx_rate %d: rates must be 0-%d Mbps (the kernel's fields are 32 bits)", pfName, vf, minMbps, maxMbps, uint64(math.MaxUint32))
		}
	}
	if err := netlink.LinkSetVfRate(l, vf, minMbps, maxMbps); err != nil {
		return fmt.Errorf("set %s vf %d min_tx_rate %d max_tx_rate %d: %w", pfName, vf, minMbps, maxMbps, err)
	}
	return nil
}
