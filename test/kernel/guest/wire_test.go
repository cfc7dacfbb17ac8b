//go:build kernelguest

package guest

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math/bits"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/vfnet-io/vfnet/driver/kernel/sysfs"
	"github.com/vfnet-io/vfnet/test/kernel/layout"
)

// The wire case (issue 36 item 4, Spike 0): what QEMU's emulated igb does
// with real frames when a VF's MAC is held, parked (zero) and restored
// through the PF, with the VF driven by igbvf and without a driver (as
// once unplugged from its VM), and two stand-ins for the failover
// standby on the PF's VLAN device: a bridge (the PF promiscuous) and a
// macvlan (M in the PF's own filter). The wire PF (layout.WirePF) shares
// a QEMU hub with a peer NIC in a namespace of its own.
const (
	wireVLAN = 100
	// wireFrames are sent per direction and phase, wireGap apart: far
	// below anything that could fill a ring, so a missing frame was
	// steered elsewhere, not dropped for load.
	wireFrames = 40
	wireGap    = 10 * time.Millisecond
	// wireEtherType is IEEE 802's local experimental EtherType: nothing in
	// the guest answers or sends it.
	wireEtherType = 0x88b5
)

// wireMAC is M, the VM's MAC: the VF's administrative MAC and the
// standby's.
var wireMAC = net.HardwareAddr{0x02, 0x00, 0x00, 0x00, 0x36, 0x01}

var wireMagic = []byte("vfnet-wire")

// Senders, carried in each frame.
const (
	fromPeer    = 'P'
	fromVF      = 'V'
	fromStandby = 'S'
)

// wirePort is an AF_PACKET socket on one netdev, made in that netdev's
// network namespace, counting the case's frames it receives by phase and
// sender.
type wirePort struct {
	who     string
	ifindex int
	mac     net.HardwareAddr
	fd      int
	done    chan struct{}
	mu      sync.Mutex
	got     map[string]int
	seqs    map[string]map[uint16]bool
	tagged  int // frames that still carried an 802.1Q tag
	sendErr int
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// inNetns runs f on a thread in ns. The thread stays locked and ends with
// its goroutine, so no other goroutine runs in ns by accident.
func inNetns(ns netns.NsHandle, f func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := netns.Set(ns); err != nil {
			errc <- fmt.Errorf("enter network namespace: %w", err)
			return
		}
		errc <- f()
	}()
	return <-errc
}

// newNetns makes a network namespace with its loopback up; it lives until
// the handle and every socket made in it are closed.
func newNetns(t *testing.T, name string) netns.NsHandle {
	t.Helper()
	ch := make(chan netns.NsHandle, 1)
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: this thread is in the new namespace
		ns, err := netns.New()
		if err == nil {
			var lo netlink.Link
			if lo, err = netlink.LinkByName("lo"); err == nil {
				err = netlink.LinkSetUp(lo)
			}
		}
		if err != nil {
			errc <- fmt.Errorf("network namespace %s: %w", name, err)
			return
		}
		ch <- ns
	}()
	select {
	case err := <-errc:
		t.Fatal(err)
	case ns := <-ch:
		t.Cleanup(func() { ns.Close() })
		return ns
	}
	return 0
}

// openPort opens the case's socket on ifname in ns and starts counting.
func openPort(t *testing.T, ns netns.NsHandle, who, ifname string) *wirePort {
	t.Helper()
	p := &wirePort{who: who, done: make(chan struct{}), got: map[string]int{}, seqs: map[string]map[uint16]bool{}}
	err := inNetns(ns, func() error {
		l, err := netlink.LinkByName(ifname)
		if err != nil {
			return err
		}
		p.ifindex, p.mac = l.Attrs().Index, l.Attrs().HardwareAddr
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, int(htons(unix.ETH_P_ALL)))
		if err != nil {
			return err
		}
		if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: p.ifindex}); err != nil {
			unix.Close(fd)
			return err
		}
		// The reader wakes up to see whether the case is over.
		tv := unix.NsecToTimeval((200 * time.Millisecond).Nanoseconds())
		if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
			unix.Close(fd)
			return err
		}
		p.fd = fd
		return nil
	})
	if err != nil {
		t.Fatalf("packet socket on %s (%s): %v", ifname, who, err)
	}
	stopped := make(chan struct{})
	go p.read(stopped)
	t.Cleanup(func() { close(p.done); <-stopped; unix.Close(p.fd) })
	return p
}

func (p *wirePort) read(stopped chan struct{}) {
	defer close(stopped)
	buf := make([]byte, 2048)
	for {
		select {
		case <-p.done:
			return
		default:
		}
		n, from, err := unix.Recvfrom(p.fd, buf, 0)
		if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
			continue // the timeout: look at done again
		}
		if err != nil {
			// The netdev went (igbvf unbound): wait for the case's end.
			time.Sleep(100 * time.Millisecond)
			continue
		}
		if ll, ok := from.(*unix.SockaddrLinklayer); ok && ll.Pkttype == unix.PACKET_OUTGOING {
			continue // our own sends
		}
		p.count(buf[:n])
	}
}

// count records a frame of the case: EtherType wireEtherType, after an
// 802.1Q tag when the NIC left one, then magic, phase, sender, sequence.
func (p *wirePort) count(f []byte) {
	if len(f) < 14 {
		return
	}
	typ, body, tagged := binary.BigEndian.Uint16(f[12:14]), f[14:], false
	if typ == unix.ETH_P_8021Q && len(body) >= 4 {
		typ, body, tagged = binary.BigEndian.Uint16(body[2:4]), body[4:], true
	}
	if typ != wireEtherType || !bytes.HasPrefix(body, wireMagic) || len(body) < len(wireMagic)+4 {
		return
	}
	r := body[len(wireMagic):]
	phase, sender, seq := r[0], r[1], binary.BigEndian.Uint16(r[2:4])
	key := fmt.Sprintf("%c/%c", phase, sender)
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.seqs[key] == nil {
		p.seqs[key] = map[uint16]bool{}
	}
	if p.seqs[key][seq] {
		return // a duplicate would be a fact too, but counts stay per frame sent
	}
	p.seqs[key][seq] = true
	p.got[key]++
	if tagged {
		p.tagged++
	}
}

// received is how many distinct frames of phase from sender arrived.
func (p *wirePort) received(phase, sender byte) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.got[fmt.Sprintf("%c/%c", phase, sender)]
}

// send sends wireFrames frames from src to dst, marked with phase and the
// port's sender letter.
func (p *wirePort) send(t *testing.T, phase, sender byte, src, dst net.HardwareAddr) {
	t.Helper()
	to := &unix.SockaddrLinklayer{Protocol: htons(wireEtherType), Ifindex: p.ifindex, Halen: 6}
	copy(to.Addr[:], dst)
	for i := 0; i < wireFrames; i++ {
		f := make([]byte, 0, 64)
		f = append(f, dst...)
		f = append(f, src...)
		f = binary.BigEndian.AppendUint16(f, wireEtherType)
		f = append(f, wireMagic...)
		f = append(f, phase, sender)
		f = binary.BigEndian.AppendUint16(f, uint16(i))
		for len(f) < 60 {
			f = append(f, 0)
		}
		if err := unix.Sendto(p.fd, f, 0, to); err != nil {
			p.sendErr++
			t.Logf("%s: send %d of phase %c: %v", p.who, i, phase, err)
		}
		time.Sleep(wireGap)
	}
}

// settle waits until no port's counts changed for a while (the frames in
// flight have landed), at most 10 s: nothing is asserted on how long.
func settle(ports ...*wirePort) {
	snapshot := func() string {
		var b strings.Builder
		for _, p := range ports {
			p.mu.Lock()
			fmt.Fprint(&b, p.got)
			p.mu.Unlock()
		}
		return b.String()
	}
	last, stable := snapshot(), time.Now()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
		time.Sleep(100 * time.Millisecond)
		if s := snapshot(); s != last {
			last, stable = s, time.Now()
		} else if time.Since(stable) > 700*time.Millisecond {
			return
		}
	}
}

// wireResult is one phase's counts, printed as JSON on the case's summary
// line (layout.MarkWire) for the benchmark record.
type wireResult struct {
	Phase string `json:"phase"`
	// Standby is the standby stand-in: "bridge" (br0 with pf.100, which
	// makes the PF promiscuous) or "macvlan" (on pf.100: M in the PF's
	// unicast filter, the PF not promiscuous).
	Standby string `json:"standby"`
	// VFMAC is the VF's MAC as the PF reports it during the phase;
	// VFDriver is false while igbvf is unbound (the VF out of the guest).
	VFMAC    string `json:"vfMAC"`
	VFDriver bool   `json:"vfDriver"`
	// Peer -> M: frames the VF (-1: no driver to count them) and the
	// standby received.
	PeerToM   int `json:"peerToM"`
	AtVF      int `json:"atVF"`
	AtStandby int `json:"atStandby"`
	// Frames the peer received from the VF and from the standby (-1: not
	// sent in this phase).
	VFToPeer      int `json:"vfToPeer"`
	StandbyToPeer int `json:"standbyToPeer"`
	// VFPoolRx is how many frames QEMU counted into the VF's pool
	// (PVFGPRC) during the phase, -1 when unreadable.
	VFPoolRx int64 `json:"vfPoolRx"`
}

// wire is the case's machine: the VF and its namespace, the peer, the
// standby stand-ins.
type wire struct {
	t          *testing.T
	m          *machine
	pfDev      string
	pfAddr     string
	vfIndex    int
	vfAddr     string
	root, vmNS netns.NsHandle
	vf         *wirePort // nil while igbvf is unbound
	peer       *wirePort
	standby    *wirePort
	standbyIs  string
	regs       *pfRegs
	results    []wireResult
}

// attachVF binds igbvf to the VF (igbvf asks the PF for its MAC only at
// probe, as a guest's driver would), moves its netdev into the vm
// namespace and counts what it receives.
func (w *wire) attachVF() { w.bindVF(false) }

func (w *wire) bindVF(retry bool) {
	t := w.t
	t.Helper()
	if err := os.WriteFile("/sys/bus/pci/drivers/igbvf/bind", []byte(w.vfAddr), 0); err != nil {
		t.Fatalf("bind %s to igbvf: %v", w.vfAddr, err)
	}
	dev, err := waitNetdev("/sys/bus/pci/devices/"+w.vfAddr, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	moveLink(t, dev, w.vmNS, w.root)
	inNS(t, w.vmNS, func() error {
		l, err := netlink.LinkByName(dev)
		if err == nil {
			err = netlink.LinkSetUp(l)
		}
		return err
	})
	if err := operUp(w.vmNS, dev, 30*time.Second); err != nil {
		// Seen in two boots of the first nine: igbvf waited for the PF's
		// answer on the mailbox ("PF still resetting") and its link never
		// came up; unbinding and binding again did not help. That is the
		// harness's VF, not vfnet's code: reset it and probe once more
		// (the reset has not been needed since it was added).
		if retry {
			t.Fatal(err)
		}
		t.Logf("igbvf's link did not come up, resetting the VF and probing it again: %v", err)
		if err := os.WriteFile("/sys/bus/pci/drivers/igbvf/unbind", []byte(w.vfAddr), 0); err != nil {
			t.Fatalf("unbind %s from igbvf: %v", w.vfAddr, err)
		}
		w.resetVF()
		w.bindVF(true)
		return
	}
	w.vf = openPort(t, w.vmNS, "vf", dev)
}

// detachVF unbinds igbvf: the VF is then as vfnet's VF is once KubeVirt
// unplugged it from the VM, with no driver behind its pool.
func (w *wire) detachVF() {
	w.t.Helper()
	if err := os.WriteFile("/sys/bus/pci/drivers/igbvf/unbind", []byte(w.vfAddr), 0); err != nil {
		w.t.Fatalf("unbind %s from igbvf: %v", w.vfAddr, err)
	}
	w.vf = nil
}

// resetVF resets the VF (FLR), as vfio-pci does when a VM lets go of it:
// igb then resets its record of the VF and answers the next probe's
// mailbox handshake afresh.
func (w *wire) resetVF() {
	if err := os.WriteFile("/sys/bus/pci/devices/"+w.vfAddr+"/reset", []byte("1"), 0); err != nil {
		w.t.Fatalf("reset VF %s: %v", w.vfAddr, err)
	}
}

func (w *wire) setMAC(mac net.HardwareAddr) {
	w.t.Helper()
	if err := w.m.links.SetMAC(w.pfDev, w.vfIndex, mac); err != nil {
		w.t.Fatalf("VF %d MAC %s through %s: %v", w.vfIndex, mac, w.pfDev, err)
	}
}

// phase sends the peer's frames to M (after the standby's from M, when
// standbySends, as QEMU's announce-self would first) and the VF's to the
// peer (when it has a driver), and records where they landed.
func (w *wire) phase(id byte, name string, standbySends bool) wireResult {
	t := w.t
	t.Helper()
	st, err := w.m.links.VF(w.pfDev, w.vfIndex)
	if err != nil {
		t.Fatal(err)
	}
	r := wireResult{Phase: name, Standby: w.standbyIs, VFMAC: st.MAC.String(), VFDriver: w.vf != nil,
		PeerToM: wireFrames, AtVF: -1, VFToPeer: -1, StandbyToPeer: -1, VFPoolRx: -1}
	poolBefore, poolOK := w.regs.vfPoolRx(w.vfIndex)
	if standbySends {
		w.standby.send(t, id, fromStandby, wireMAC, w.peer.mac)
	}
	w.peer.send(t, id, fromPeer, w.peer.mac, wireMAC)
	ports := []*wirePort{w.peer, w.standby}
	if w.vf != nil {
		w.vf.send(t, id, fromVF, w.vf.mac, w.peer.mac)
		ports = append(ports, w.vf)
	}
	settle(ports...)
	r.AtStandby = w.standby.received(id, fromPeer)
	if w.vf != nil {
		r.AtVF, r.VFToPeer = w.vf.received(id, fromPeer), w.peer.received(id, fromVF)
	}
	if standbySends {
		r.StandbyToPeer = w.peer.received(id, fromStandby)
	}
	if after, ok := w.regs.vfPoolRx(w.vfIndex); ok && poolOK {
		r.VFPoolRx = int64(after - poolBefore)
	}
	t.Logf("phase %c %s (standby %s, VF MAC through the PF %s, igbvf bound %v): peer -> M %d sent: %s at the VF, %d at the standby, %d counted into VF %d's pool; VF -> peer %s; standby (source M) -> peer %s",
		id, name, w.standbyIs, r.VFMAC, r.VFDriver, wireFrames, ofSent(r.AtVF), r.AtStandby, r.VFPoolRx, w.vfIndex, ofSent(r.VFToPeer), ofSent(r.StandbyToPeer))
	t.Logf("phase %c PF filters: %s", id, w.regs.filters())
	w.results = append(w.results, r)
	return r
}

func TestWire(t *testing.T) {
	m := guest(t)
	if m.lay.Peer == "" {
		t.Fatal("the machine has no wire: the harness adds layout.WirePF when the wire case is selected (layout.NeedsWire)")
	}
	start := time.Now()
	loadWireModules(t)
	pf := m.pf(t, layout.RoleWire)
	if len(pf.VFs) == 0 {
		t.Fatalf("main PF %s has no VFs", pf.Address)
	}
	vf := pf.VFs[0]
	before := m.vfState(t, pf, vf)
	t.Logf("PF %s (%s), VF %d %s before: %s", pf.Address, pf.NetDev, vf.Index, vf.Address, before)
	root, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { root.Close() })
	w := &wire{t: t, m: m, pfDev: pf.NetDev, pfAddr: pf.Address, vfIndex: vf.Index, vfAddr: vf.Address, root: root}
	w.regs = openPFRegs(t, pf.Address)

	// The VF as vfnet prepares it (MAC M, VLAN 100, through the PF), kept
	// on igbvf so the guest can send and receive on it.
	w.setMAC(wireMAC)
	if err := m.links.SetVLAN(pf.NetDev, vf.Index, wireVLAN, 0, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.restoreWireVF(t, pf, vf, before) })

	// Namespaces: vm holds the VF's netdev (the guest's side), peer the
	// NIC at the wire's far end, sb and mv the standby stand-ins' ends.
	w.vmNS = newNetns(t, "vm")
	peerNS, sbNS, mvNS := newNetns(t, "peer"), newNetns(t, "sb"), newNetns(t, "mv")
	if err := os.WriteFile("/sys/bus/pci/drivers/igbvf/unbind", []byte(vf.Address), 0); err != nil {
		t.Fatalf("unbind %s from igbvf: %v", vf.Address, err)
	}
	w.attachVF()
	if !bytes.Equal(w.vf.mac, wireMAC) {
		t.Fatalf("VF netdev after igbvf's probe has MAC %s; want %s from the PF", w.vf.mac, wireMAC)
	}
	peerVLAN := wirePeer(t, m, peerNS, root)
	w.peer = openPort(t, peerNS, "peer", peerVLAN)

	// Standby 1, the topology of docs T2: br0 with the PF's VLAN 100
	// device and a veth whose other end (MAC M) stands for the standby
	// virtio NIC's tap. A bridge makes its ports, and so the PF,
	// promiscuous.
	br := vlanBridge(t, pf.NetDev, "br0")
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "sb0"}, PeerName: "sb1", PeerHardwareAddr: wireMAC}
	addLinks(t, veth)
	l, err := netlink.LinkByName("sb0")
	if err == nil {
		err = netlink.LinkSetMaster(l, br)
	}
	if err == nil {
		err = netlink.LinkSetUp(l)
	}
	if err != nil {
		t.Fatalf("sb0 into br0: %v", err)
	}
	moveLink(t, "sb1", sbNS, root)
	inNS(t, sbNS, func() error {
		l, err := netlink.LinkByName("sb1")
		if err == nil {
			err = netlink.LinkSetUp(l)
		}
		return err
	})
	waitOperUp(t, sbNS, "sb1")
	waitOperUp(t, root, "br0")
	waitForwarding(t, "pf.100")
	waitForwarding(t, "sb0")
	w.standby, w.standbyIs = openPort(t, sbNS, "bridge standby", "sb1"), "bridge"
	t.Logf("set-up took %s; VF netdev (%s), peer %s (%s), standby sb1 (%s) on br0 with pf.100; PF promiscuous %v",
		time.Since(start).Round(time.Millisecond), w.vf.mac, peerVLAN, w.peer.mac, w.standby.mac, promiscuous(t, pf.NetDev))

	// Most of each expected count: the frames are far apart, so a loss
	// beyond a frame or two is steering, not load; the exact counts are
	// logged and recorded.
	most := wireFrames * 9 / 10
	zero := net.HardwareAddr{0, 0, 0, 0, 0, 0}

	// a: the VF holds M: both directions flow through the VF.
	a := w.phase('a', "vf-holds-M", false)
	if a.AtVF < most || a.AtStandby != 0 || a.VFToPeer < most {
		t.Errorf("a (VF holds M): peer -> M reached the VF %d and the standby %d times of %d, VF -> peer %d; want the VF path only, both ways",
			a.AtVF, a.AtStandby, wireFrames, a.VFToPeer)
	}

	// c: the standby transmits from M while the VF still holds M
	// ("failover on, MAC not cleared"): the NIC's filter for M, not any
	// learning, steers the peer's frames.
	c := w.phase('c', "standby-and-vf-hold-M", true)
	if c.StandbyToPeer < most {
		t.Errorf("c: the standby's frames from M reached the peer %d times of %d; want them to leave through the PF", c.StandbyToPeer, wireFrames)
	}
	if c.AtVF < most || c.AtStandby != 0 {
		t.Errorf("c (VF holds M, standby sent from M): peer -> M reached the VF %d and the standby %d times of %d; want the VF only",
			c.AtVF, c.AtStandby, wireFrames)
	}

	// b: park, as vfnet does (driver/prepare's SetMACParked sets zero
	// through the PF), the VF still driven by igbvf.
	w.setMAC(zero)
	line := ipVF(t, pf.NetDev, vf.Index)
	t.Logf("parked, ip: %s", line)
	if !strings.Contains(line, "link/ether 00:00:00:00:00:00") {
		t.Errorf("iproute2 does not report the parked MAC: %s", line)
	}
	b := w.phase('b', "vf-parked-igbvf-bound", true)
	if b.VFMAC != zero.String() {
		t.Errorf("b: the PF reports VF MAC %s after the park; want %s", b.VFMAC, zero)
	}
	if b.StandbyToPeer < most {
		t.Errorf("b: the standby's frames reached the peer %d times of %d", b.StandbyToPeer, wireFrames)
	}
	// QEMU, not the hardware: while the PF is promiscuous (igb then sets
	// every unicast hash (UTA) bit), QEMU's igb_receive_assign gives a
	// unicast frame that matches no exact filter to every pool whose
	// VMOLR.ROMPE (the multicast hash bit, which igb sets for a VF whose
	// driver joined multicast groups) is set, before its default-pool
	// fallback: igbvf's pool still gets M after the park. Its pool counter
	// shows the same for the frames the VF and the standby send to the
	// peer (looped back to it). The VF's own driver is what keeps it.
	// (QEMU 10.0.2 reads the UTA back as zero through the BAR; the counts
	// are what show it.)
	if b.AtVF < most || b.AtStandby != 0 {
		t.Errorf("b (parked, igbvf bound, PF promiscuous): peer -> M reached the VF %d and the standby %d times of %d; QEMU 10.0's igb gave them to the VF (unmatched unicast -> ROMPE pools while the PF is promiscuous): has its receive filter changed?",
			b.AtVF, b.AtStandby, wireFrames)
	}
	// Whether a parked VF can still send from M is logged, not asserted:
	// QEMU's igb has no transmit anti-spoofing (hardware with spoof
	// checking on drops those frames).
	t.Logf("b: the parked VF sending from M reached the peer %s (QEMU's igb does not check the source MAC)", ofSent(b.VFToPeer))

	// The VF leaves the guest (igbvf unbound, as KubeVirt's unplug
	// removes the guest's driver). igbvf's teardown resets the VF through
	// the mailbox and may set its own MAC again, which igb accepts once no
	// MAC is set administratively (seen in some runs, not all): a VF
	// parked while its driver still runs can get M back, which is why
	// vfnet parks after the unplug. Logged and recorded, not asserted.
	w.detachVF()
	var reclaimed net.HardwareAddr
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		st, err := m.links.VF(pf.NetDev, vf.Index)
		if err != nil {
			t.Fatal(err)
		}
		if !isZeroMAC(st.MAC) {
			reclaimed = st.MAC
			break
		}
	}
	if reclaimed != nil {
		t.Logf("igbvf's teardown set the parked VF's MAC back: the PF reports %s", reclaimed)
	} else {
		t.Logf("the VF stayed parked through igbvf's teardown (the PF reports 00:00:00:00:00:00 for 3 s)")
	}

	// c2: the ablation as it happens: the VF out of the guest and still
	// holding M (failover on, MAC not cleared). The frames go to a pool
	// nobody reads: QEMU drops them at the disabled queue.
	w.setMAC(wireMAC)
	c2 := w.phase('C', "vf-holds-M-no-driver", true)
	if c2.AtStandby != 0 || c2.StandbyToPeer < most {
		t.Errorf("c2 (VF holds M, no VF driver, standby sent from M): peer -> M reached the standby %d times of %d, the standby's reached the peer %d; want none to the standby, all to the peer",
			c2.AtStandby, wireFrames, c2.StandbyToPeer)
	}

	// b2: the park as vfnet does it, after the unplug: nothing matches M
	// any more, QEMU puts the frames in the default pool (the PF's), and
	// the bridge hands them to the standby.
	w.setMAC(zero)
	b2 := w.phase('B', "vf-parked-no-driver", true)
	if b2.VFMAC != zero.String() {
		t.Errorf("b2: the PF reports VF MAC %s after the park; want %s", b2.VFMAC, zero)
	}
	if b2.AtStandby < most {
		t.Errorf("b2 (parked, no VF driver): peer -> M reached the standby %d times of %d; want all: the standby path once the VF is out and parked",
			b2.AtStandby, wireFrames)
	}

	// d: M back on the VF, then igbvf probes (the re-attach), as vfnet
	// sets the MAC before each attach.
	w.setMAC(wireMAC)
	w.attachVF()
	d := w.phase('d', "vf-restored", false)
	if d.VFMAC != wireMAC.String() {
		t.Errorf("d: the PF reports VF MAC %s; want %s", d.VFMAC, wireMAC)
	}
	if d.AtVF < most || d.AtStandby != 0 || d.VFToPeer < most {
		t.Errorf("d (M restored): peer -> M reached the VF %d and the standby %d times of %d, VF -> peer %d; want the VF path only, both ways",
			d.AtVF, d.AtStandby, wireFrames, d.VFToPeer)
	}

	// Standby 2: a macvlan (macvtap's netdev half) with MAC M on pf.100
	// instead of the bridge: M enters the PF's own unicast filter and the
	// PF is not promiscuous.
	if l, err := netlink.LinkByName("br0"); err == nil {
		if err := netlink.LinkDel(l); err != nil {
			t.Fatal(err)
		}
	}
	mv := &netlink.Macvlan{LinkAttrs: netlink.LinkAttrs{Name: "mv0", ParentIndex: mustIndex(t, "pf.100"), HardwareAddr: wireMAC}, Mode: netlink.MACVLAN_MODE_BRIDGE}
	if err := netlink.LinkAdd(mv); err != nil {
		t.Fatalf("macvlan on pf.100: %v", err)
	}
	t.Cleanup(func() {
		_ = inNetns(mvNS, func() error {
			if l, err := netlink.LinkByName("mv0"); err == nil {
				return netlink.LinkDel(l)
			}
			return nil
		})
	})
	if l, err := netlink.LinkByName("pf.100"); err == nil {
		_ = netlink.LinkSetUp(l)
	}
	moveLink(t, "mv0", mvNS, root)
	inNS(t, mvNS, func() error {
		l, err := netlink.LinkByName("mv0")
		if err == nil {
			err = netlink.LinkSetUp(l)
		}
		return err
	})
	waitOperUp(t, mvNS, "mv0")
	w.standby, w.standbyIs = openPort(t, mvNS, "macvlan standby", "mv0"), "macvlan"
	t.Logf("macvlan standby mv0 (%s) on pf.100; PF promiscuous %v", w.standby.mac, promiscuous(t, pf.NetDev))

	// e: the VF and the PF's filter both hold M: QEMU's igb gives a frame
	// to every pool whose exact filter matches.
	e := w.phase('e', "vf-and-pf-filter-hold-M", true)
	if e.AtVF < most || e.AtStandby < most {
		t.Errorf("e (VF holds M, M in the PF's filter): peer -> M reached the VF %d and the standby %d times of %d; QEMU 10.0's igb gave them to both (every matching RAR's pool): has its receive filter changed?",
			e.AtVF, e.AtStandby, wireFrames)
	}
	// f: parked with the PF not promiscuous: the standby only.
	w.setMAC(zero)
	f := w.phase('f', "vf-parked-pf-filter-holds-M", true)
	if f.AtStandby < most || f.AtVF != 0 {
		t.Errorf("f (parked, M in the PF's filter): peer -> M reached the standby %d and the VF %d times of %d; want the standby only",
			f.AtStandby, f.AtVF, wireFrames)
	}
	// g: restored: both again.
	w.setMAC(wireMAC)
	g := w.phase('g', "vf-restored-pf-filter-holds-M", false)
	if g.AtVF < most || g.AtStandby < most {
		t.Errorf("g (M restored, M in the PF's filter): peer -> M reached the VF %d and the standby %d times of %d; want both, as in e",
			g.AtVF, g.AtStandby, wireFrames)
	}

	for _, p := range []*wirePort{w.peer, w.standby, w.vf} {
		if p != nil && p.sendErr > 0 {
			t.Errorf("%s: %d sends failed", p.who, p.sendErr)
		}
	}
	t.Logf("frames read still tagged: peer %d, macvlan standby %d (VLAN 100 is stripped before the sockets otherwise)", w.peer.tagged, w.standby.tagged)
	out, _ := json.Marshal(map[string]any{"frames": wireFrames, "phases": w.results, "teardownSetMAC": reclaimed.String(), "seconds": time.Since(start).Seconds()})
	console("%s %s", layout.MarkWire, out)
}

// loadWireModules loads the modules only a machine with the wire carries
// (layout.WireModuleOrder).
func loadWireModules(t *testing.T) {
	t.Helper()
	order, err := os.ReadFile(layout.WireModuleOrder)
	if err != nil {
		t.Fatalf("the wire's modules: %v", err)
	}
	for _, p := range strings.Fields(string(order)) {
		if err := loadModule(p); err != nil {
			t.Fatal(err)
		}
	}
}

// wirePeer moves the wire's peer NIC (layout.Peer) into ns and makes its
// VLAN wireVLAN device there, up; it returns that device's name.
func wirePeer(t *testing.T, m *machine, ns, root netns.NsHandle) string {
	t.Helper()
	peerDev := netdevOf(t, m.lay.Peer)
	moveLink(t, peerDev, ns, root)
	peerVLAN := "peer.100"
	inNS(t, ns, func() error {
		parent, err := netlink.LinkByName(peerDev)
		if err != nil {
			return err
		}
		if err := netlink.LinkSetUp(parent); err != nil {
			return err
		}
		v := &netlink.Vlan{LinkAttrs: netlink.LinkAttrs{Name: peerVLAN, ParentIndex: parent.Attrs().Index}, VlanId: wireVLAN}
		if err := netlink.LinkAdd(v); err != nil {
			return fmt.Errorf("VLAN device %s: %w", peerVLAN, err)
		}
		return netlink.LinkSetUp(v)
	})
	waitOperUp(t, ns, peerVLAN)
	return peerVLAN
}

// vlanBridge makes, in the case's namespace, the PF's VLAN wireVLAN device
// pf.100 and bridge name with it as a port, both up (docs T2: the node
// bridge a standby connects to). A bridge makes its ports, and so the PF,
// promiscuous.
func vlanBridge(t *testing.T, pfDev, name string) *netlink.Bridge {
	t.Helper()
	pfLink, err := netlink.LinkByName(pfDev)
	if err != nil {
		t.Fatal(err)
	}
	pfVLAN := &netlink.Vlan{LinkAttrs: netlink.LinkAttrs{Name: "pf.100", ParentIndex: pfLink.Attrs().Index}, VlanId: wireVLAN}
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: name}}
	addLinks(t, pfVLAN, br)
	if err := netlink.LinkSetMaster(pfVLAN, br); err != nil {
		t.Fatalf("pf.100 into %s: %v", name, err)
	}
	for _, l := range []netlink.Link{pfVLAN, br} {
		if err := netlink.LinkSetUp(l); err != nil {
			t.Fatalf("set %s up: %v", l.Attrs().Name, err)
		}
	}
	return br
}

// addLinks adds links and deletes them when the case ends.
func addLinks(t *testing.T, links ...netlink.Link) {
	t.Helper()
	for _, l := range links {
		if err := netlink.LinkAdd(l); err != nil {
			t.Fatalf("add %s: %v", l.Attrs().Name, err)
		}
		name := l.Attrs().Name
		t.Cleanup(func() {
			if l, err := netlink.LinkByName(name); err == nil {
				_ = netlink.LinkDel(l)
			}
		})
	}
}

func mustIndex(t *testing.T, name string) int {
	t.Helper()
	l, err := netlink.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	return l.Attrs().Index
}

// promiscuous reports whether netdev is in promiscuous mode.
func promiscuous(t *testing.T, netdev string) bool {
	t.Helper()
	l, err := netlink.LinkByName(netdev)
	if err != nil {
		t.Fatal(err)
	}
	return l.Attrs().Promisc != 0 || l.Attrs().RawFlags&unix.IFF_PROMISC != 0
}

func ofSent(n int) string {
	if n < 0 {
		return "not sent"
	}
	return fmt.Sprintf("%d of %d", n, wireFrames)
}

func inNS(t *testing.T, ns netns.NsHandle, f func() error) {
	t.Helper()
	if err := inNetns(ns, f); err != nil {
		t.Fatal(err)
	}
}

// netdevOf is the netdev of the PCI device at addr (pciAddressOf).
func netdevOf(t *testing.T, addr string) string {
	t.Helper()
	ents, _ := os.ReadDir("/sys/class/net")
	for _, e := range ents {
		if pciAddressOf(e.Name()) == addr {
			return e.Name()
		}
	}
	t.Fatalf("no netdev of PCI device %s (the wire's peer NIC)", addr)
	return ""
}

// moveLink moves netdev name from the case's namespace into ns, and back
// to root when the case ends (a physical netdev would return by itself
// only once ns is torn down, asynchronously, after the next case began).
func moveLink(t *testing.T, name string, ns, root netns.NsHandle) {
	t.Helper()
	l, err := netlink.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkSetNsFd(l, int(ns)); err != nil {
		t.Fatalf("move %s into its namespace: %v", name, err)
	}
	t.Cleanup(func() {
		err := inNetns(ns, func() error {
			l, err := netlink.LinkByName(name)
			if err != nil {
				return nil // gone: igbvf unbound, or a veth end with its pair
			}
			_ = netlink.LinkSetDown(l)
			err = netlink.LinkSetNsFd(l, int(root))
			if errors.Is(err, unix.EEXIST) {
				// A rebound VF took the name meanwhile.
				if err = netlink.LinkSetName(l, fmt.Sprintf("wire%d", l.Attrs().Index)); err == nil {
					err = netlink.LinkSetNsFd(l, int(root))
				}
			}
			return err
		})
		if err != nil {
			t.Errorf("move %s back: %v", name, err)
		}
	})
}

// waitOperUp waits for name in ns to have carrier and be up (igbvf's link
// follows the PF's after a watchdog tick).
func waitOperUp(t *testing.T, ns netns.NsHandle, name string) {
	t.Helper()
	if err := operUp(ns, name, 60*time.Second); err != nil {
		t.Fatal(err)
	}
}

func operUp(ns netns.NsHandle, name string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		var state string
		err := inNetns(ns, func() error {
			l, err := netlink.LinkByName(name)
			if err == nil {
				state = l.Attrs().OperState.String()
			}
			return err
		})
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		if state == "up" {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s is %s after %s; want up; the kernel's igb/igbvf messages:\n%s", name, state, timeout, kernelLog("igb"))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitForwarding waits for the bridge port name to forward.
func waitForwarding(t *testing.T, name string) {
	t.Helper()
	path := filepath.Join("/sys/class/net", name, "brport", "state")
	deadline := time.Now().Add(60 * time.Second)
	for {
		s, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if strings.TrimSpace(string(s)) == "3" { // BR_STATE_FORWARDING
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("bridge port %s is in state %s after 60s; want 3 (forwarding)", name, strings.TrimSpace(string(s)))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// rebindIgbvf binds the VF to igbvf afresh (unbinding it first when it is
// bound) and returns its new netdev: igbvf asks the PF for the VF's MAC
// only when it probes.
func rebindIgbvf(t *testing.T, bdf string) string {
	t.Helper()
	if _, err := os.Readlink("/sys/bus/pci/devices/" + bdf + "/driver"); err == nil {
		if err := os.WriteFile("/sys/bus/pci/drivers/igbvf/unbind", []byte(bdf), 0); err != nil {
			t.Fatalf("unbind %s from igbvf: %v", bdf, err)
		}
	}
	if err := os.WriteFile("/sys/bus/pci/drivers/igbvf/bind", []byte(bdf), 0); err != nil {
		t.Fatalf("bind %s to igbvf: %v", bdf, err)
	}
	n, err := waitNetdev("/sys/bus/pci/devices/"+bdf, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// restoreWireVF leaves the VF as the boot made it, and checks it: no
// VLAN, igbvf probed again, and the PF's record of the VF's MAC as it was
// (zero after the boot: igbvf's random MAC reached the PF only if it was
// set, so it is cleared again when it was zero).
func (m *machine) restoreWireVF(t *testing.T, pf sysfs.PF, vf sysfs.VF, before vfState) {
	var errs []error
	if err := m.links.SetVLAN(pf.NetDev, vf.Index, 0, 0, ""); err != nil {
		errs = append(errs, err)
	}
	// Zero first: it clears the administrative MAC, so igbvf may choose
	// its own at probe.
	if err := m.links.SetMAC(pf.NetDev, vf.Index, net.HardwareAddr{0, 0, 0, 0, 0, 0}); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		t.Errorf("restore VF %d of %s: %v", vf.Index, pf.NetDev, errors.Join(errs...))
		return
	}
	rebindIgbvf(t, vf.Address)
	if isZeroMAC(before.Link.MAC) {
		if err := m.links.SetMAC(pf.NetDev, vf.Index, before.Link.MAC); err != nil {
			t.Errorf("restore VF %d's MAC record: %v", vf.Index, err)
		}
	}
	after := m.vfState(t, pf, vf)
	if after.Driver != before.Driver || after.Link.VLAN != before.Link.VLAN ||
		(isZeroMAC(before.Link.MAC) && !isZeroMAC(after.Link.MAC)) {
		t.Errorf("VF %d after the case: %s; want as before: %s", vf.Index, after, before)
	}
	t.Logf("VF %d after the case: %s", vf.Index, ipVF(t, pf.NetDev, vf.Index))
}

func isZeroMAC(mac net.HardwareAddr) bool {
	return bytes.Equal(mac, net.HardwareAddr{0, 0, 0, 0, 0, 0})
}

// pfRegs is a read-only mapping of the PF's register BAR, to log the
// receive filters QEMU's igb steers by (82576 datasheet offsets). Reading
// these registers has no side effect. The guest boots with iomem=relaxed
// for the wire case, else the kernel refuses to map a BAR igb holds.
type pfRegs struct {
	mem []byte
	err error
}

// 82576 register offsets and bits (datasheet section 8).
const (
	regRCTL    = 0x00100
	regVTCTL   = 0x0581c
	regRAL0    = 0x05400 // RAL(n) = regRAL0 + 8n for n < 16
	regRAL16   = 0x054e0 // RAL(n) = regRAL16 + 8(n-16) for 16 <= n < 24
	regVMOLR0  = 0x05ad0
	regUTA     = 0x0a000
	regMTA     = 0x05200
	regPVFGPRC = 0x10010 // + 0x100 per pool
	igbBARSize = 128 << 10
)

func openPFRegs(t *testing.T, pfAddr string) *pfRegs {
	f, err := os.Open("/sys/bus/pci/devices/" + pfAddr + "/resource0")
	if err != nil {
		return &pfRegs{err: err}
	}
	defer f.Close()
	mem, err := unix.Mmap(int(f.Fd()), 0, igbBARSize, unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		t.Logf("the PF's registers cannot be mapped (%v): the phases log no filters", err)
		return &pfRegs{err: err}
	}
	t.Cleanup(func() { _ = unix.Munmap(mem) })
	return &pfRegs{mem: mem}
}

// reg reads one 32-bit register with a single 32-bit load.
func (r *pfRegs) reg(off int) uint32 {
	return atomic.LoadUint32((*uint32)(unsafe.Pointer(&r.mem[off])))
}

// vfPoolRx is QEMU's count of frames received into pool n (PVFGPRC).
func (r *pfRegs) vfPoolRx(n int) (uint32, bool) {
	if r.mem == nil {
		return 0, false
	}
	return r.reg(regPVFGPRC + 0x100*n), true
}

// filters summarises the receive filters: RCTL's promiscuous and VLAN
// filter bits, the default pool, every valid exact filter (RAR) with its
// pool bits, each pool's VMOLR accept bits, and how many of the 4096
// unicast hash (UTA) bits are set.
func (r *pfRegs) filters() string {
	if r.mem == nil {
		return fmt.Sprintf("unreadable (%v)", r.err)
	}
	var b strings.Builder
	rctl, vtctl := r.reg(regRCTL), r.reg(regVTCTL)
	fmt.Fprintf(&b, "RCTL UPE=%d MPE=%d VFE=%d; default pool %d (disabled %d); RAR", rctl>>3&1, rctl>>4&1, rctl>>18&1, vtctl>>7&7, vtctl>>29&1)
	for n := 0; n < 24; n++ {
		off := regRAL0 + 8*n
		if n >= 16 {
			off = regRAL16 + 8*(n-16)
		}
		lo, hi := r.reg(off), r.reg(off+4)
		if hi&(1<<31) == 0 {
			continue
		}
		mac := net.HardwareAddr{byte(lo), byte(lo >> 8), byte(lo >> 16), byte(lo >> 24), byte(hi), byte(hi >> 8)}
		fmt.Fprintf(&b, " %d=%s/pools=%#x", n, mac, hi>>18&0xff)
	}
	b.WriteString("; VMOLR")
	names := []struct {
		bit  uint32
		name string
	}{{1 << 24, "AUPE"}, {1 << 25, "ROMPE"}, {1 << 26, "ROPE"}, {1 << 27, "BAM"}, {1 << 28, "MPME"}}
	for n := 0; n < 8; n++ {
		v := r.reg(regVMOLR0 + 4*n)
		var set []string
		for _, nm := range names {
			if v&nm.bit != 0 {
				set = append(set, nm.name)
			}
		}
		fmt.Fprintf(&b, " %d=%s", n, strings.Join(set, "|"))
	}
	uta := 0
	for i := 0; i < 128; i++ {
		uta += bits.OnesCount32(r.reg(regUTA + 4*i))
	}
	mta := 0
	for i := 0; i < 128; i++ {
		mta += bits.OnesCount32(r.reg(regMTA + 4*i))
	}
	fmt.Fprintf(&b, "; UTA %d/4096 bits, MTA %d/4096 bits", uta, mta)
	return b.String()
}

// kernelLog is the kernel log's lines containing word (the console shows
// only warnings while the cases run).
func kernelLog(word string) string {
	buf := make([]byte, 1<<20)
	n, err := unix.Klogctl(unix.SYSLOG_ACTION_READ_ALL, buf)
	if err != nil {
		return fmt.Sprintf("(cannot read the kernel log: %v)", err)
	}
	var out []string
	for _, l := range strings.Split(string(buf[:n]), "\n") {
		if strings.Contains(l, word) {
			out = append(out, l)
		}
	}
	if len(out) > 40 {
		out = out[len(out)-40:]
	}
	return strings.Join(out, "\n")
}
