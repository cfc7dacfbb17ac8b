package vflink

import (
	"errors"
	"fmt"
	"math"
	"net"
	"sync"
	"syscall"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Ethertypes of the VLAN protocols in host order, as
// netlink.LinkSetVfVlanQosProto takes them.
const (
	ethTypeQ  = 0x8100
	ethTypeAD = 0x88a8
)

// Netlink changes VF settings through the kernel's rtnetlink interface,
// like `ip -n <ns> link set <pf> vf <n> ...`, in the network namespace it
// was opened on (Open). It needs CAP_NET_ADMIN there.
//
// The PFs live in the host's network namespace, and the driver's pod has
// its own. The driver reaches them with netlink sockets opened in the
// host's namespace (through /proc/1/ns/net, visible because the DaemonSet
// already runs with hostPID) rather than by running the pod with
// hostNetwork: the pod keeps its own network, binds no port on the node
// (its health endpoint cannot clash with the node's services), needs no
// dnsPolicy change to keep resolving the API server, and every goroutine
// stays in one namespace, since only the sockets are made in the other.
type Netlink struct {
	netns string
	h     *netlink.Handle
	sock  *nl.NetlinkSocket
	mu    sync.Mutex // one request at a time on sock
	r     Reader
}

var _ Links = (*Netlink)(nil)

// Open returns a link layer whose netlink sockets are in the network
// namespace of the file nsPath (DefaultHostNetns on a node). Close it.
func Open(nsPath string) (*Netlink, error) {
	ns, err := netns.GetFromPath(nsPath)
	if err != nil {
		return nil, &NamespaceError{Path: nsPath, Err: err}
	}
	defer ns.Close()
	// setns would fail with a bare EINVAL deep in the library; ask the
	// file what it is first (NS_GET_NSTYPE: ENOTTY if not a namespace).
	if typ, err := unix.IoctlRetInt(int(ns), unix.NS_GET_NSTYPE); err != nil || typ != unix.CLONE_NEWNET {
		return nil, &NamespaceError{Path: nsPath, Err: syscall.EINVAL}
	}
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	if err != nil {
		return nil, &NamespaceError{Path: nsPath, Err: err}
	}
	sock, err := nl.GetNetlinkSocketAt(ns, netns.None(), unix.NETLINK_ROUTE)
	if err != nil {
		h.Close()
		return nil, &NamespaceError{Path: nsPath, Err: err}
	}
	n := &Netlink{netns: nsPath, h: h, sock: sock}
	n.r = Reader{Conn: fdConn{fd: sock.GetFd(), timeout: 10_000}, Netns: nsPath}
	return n, nil
}

// Netns is the namespace file the link layer was opened on.
func (n *Netlink) Netns() string { return n.netns }

// Close releases the sockets.
func (n *Netlink) Close() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.h != nil {
		n.h.Close()
		n.sock.Close()
		n.h, n.sock = nil, nil
	}
	return nil
}

// Resolve implements Links.
func (n *Netlink) Resolve(name string) (Netdev, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.h == nil {
		return Netdev{}, errors.New("vflink: link layer is closed")
	}
	return n.r.Resolve(name)
}

// link resolves the PF's index and holds the lock until unlock: the
// library's setters take a Link and would otherwise look it up with
// LinkByName, which reads every VF with statistics into a 64 KiB buffer.
func (n *Netlink) link(pfName string) (l netlink.Link, unlock func(), err error) {
	n.mu.Lock()
	if n.h == nil {
		n.mu.Unlock()
		return nil, nil, errors.New("vflink: link layer is closed")
	}
	d, err := n.r.Resolve(pfName)
	if err != nil {
		n.mu.Unlock()
		return nil, nil, fmt.Errorf("find PF netdev %q: %w", pfName, err)
	}
	return &netlink.Device{LinkAttrs: netlink.LinkAttrs{Name: d.Name, Index: d.Index}}, n.mu.Unlock, nil
}

// VF implements Links.
func (n *Netlink) VF(pfName string, vf int) (VFState, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.h == nil {
		return VFState{}, errors.New("vflink: link layer is closed")
	}
	st, err := n.r.VF(pfName, vf)
	if err != nil {
		return VFState{}, fmt.Errorf("read VF %d of PF netdev %q: %w", vf, pfName, err)
	}
	return st, nil
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
func (n *Netlink) SetMAC(pfName string, vf int, mac net.HardwareAddr) error {
	l, unlock, err := n.link(pfName)
	if err != nil {
		return err
	}
	defer unlock()
	if err := n.h.LinkSetVfHardwareAddr(l, vf, mac); err != nil {
		return fmt.Errorf("set %s vf %d mac %s: %w", pfName, vf, mac, err)
	}
	return nil
}

// SetVLAN implements Links.
func (n *Netlink) SetVLAN(pfName string, vf int, vlan, qos int, proto string) error {
	l, unlock, err := n.link(pfName)
	if err != nil {
		return err
	}
	defer unlock()
	p := ethTypeQ
	switch proto {
	case VLANProto8021Q, "":
	case VLANProto8021AD:
		p = ethTypeAD
	default:
		return fmt.Errorf("set %s vf %d vlan: protocol %q; allowed %q or %q", pfName, vf, proto, VLANProto8021Q, VLANProto8021AD)
	}
	if err := n.h.LinkSetVfVlanQosProto(l, vf, vlan, qos, p); err != nil {
		return fmt.Errorf("set %s vf %d vlan %d qos %d proto %s: %w", pfName, vf, vlan, qos, proto, err)
	}
	return nil
}

// SetSpoofChk implements Links.
func (n *Netlink) SetSpoofChk(pfName string, vf int, on bool) error {
	l, unlock, err := n.link(pfName)
	if err != nil {
		return err
	}
	defer unlock()
	if err := n.h.LinkSetVfSpoofchk(l, vf, on); err != nil {
		return fmt.Errorf("set %s vf %d spoofchk %v: %w", pfName, vf, on, err)
	}
	return nil
}

// SetTrust implements Links.
func (n *Netlink) SetTrust(pfName string, vf int, on bool) error {
	l, unlock, err := n.link(pfName)
	if err != nil {
		return err
	}
	defer unlock()
	if err := n.h.LinkSetVfTrust(l, vf, on); err != nil {
		return fmt.Errorf("set %s vf %d trust %v: %w", pfName, vf, on, err)
	}
	return nil
}

// SetLinkState implements Links.
func (n *Netlink) SetLinkState(pfName string, vf int, state string) error {
	l, unlock, err := n.link(pfName)
	if err != nil {
		return err
	}
	defer unlock()
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
	if err := n.h.LinkSetVfState(l, vf, s); err != nil {
		return fmt.Errorf("set %s vf %d state %s: %w", pfName, vf, state, err)
	}
	return nil
}

// SetRate implements Links.
func (n *Netlink) SetRate(pfName string, vf int, minMbps, maxMbps int) error {
	l, unlock, err := n.link(pfName)
	if err != nil {
		return err
	}
	defer unlock()
	// IFLA_VF_RATE holds u32 rates and the library casts without a check:
	// 4294967396 would reach the NIC as 100.
	for _, r := range []int{minMbps, maxMbps} {
		if r < 0 || int64(r) > math.MaxUint32 {
			return fmt.Errorf("set %s vf %d min_tx_rate %d max_tx_rate %d: rates must be 0-%d Mbps (the kernel's fields are 32 bits)", pfName, vf, minMbps, maxMbps, uint64(math.MaxUint32))
		}
	}
	if err := n.h.LinkSetVfRate(l, vf, minMbps, maxMbps); err != nil {
		return fmt.Errorf("set %s vf %d min_tx_rate %d max_tx_rate %d: %w", pfName, vf, minMbps, maxMbps, err)
	}
	return nil
}
