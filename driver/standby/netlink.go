package standby

import (
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"

	"golang.org/x/sys/unix"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"k8s.io/klog/v2"
)

// Netlink is the Plumber of the kernel: netlink sockets opened in the node's
// and the pod's network namespace files, and the tap made on a thread that
// entered the pod's namespace (/dev/net/tun creates in the caller's).
type Netlink struct {
	// HostNetns is the node's network namespace file, where the admin's
	// bridges are (the driver's --standby-netns).
	HostNetns string
	// TapUID and TapGID own the tap; zero: QEMUUser.
	TapUID, TapGID uint32
}

func (n Netlink) owner() (uint32, uint32) {
	uid, gid := n.TapUID, n.TapGID
	if uid == 0 {
		uid = QEMUUser
	}
	if gid == 0 {
		gid = QEMUUser
	}
	return uid, gid
}

// openNs opens a namespace file and a netlink handle in it.
func openNs(path, what string) (netns.NsHandle, *netlink.Handle, error) {
	ns, err := netns.GetFromPath(path)
	if err != nil {
		return 0, nil, fmt.Errorf("open the %s network namespace %s: %w", what, path, err)
	}
	// Links only: without a family list the handle also opens xfrm and
	// netfilter sockets, which fail where xfrm_user or nfnetlink cannot
	// be loaded ("protocol not supported").
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	if err != nil {
		ns.Close()
		return 0, nil, fmt.Errorf("netlink in the %s network namespace %s: %w", what, path, err)
	}
	return ns, h, nil
}

// Bridge checks that name is a bridge in the node's namespace and returns
// its MTU; prepare calls it so a missing bridge is refused before the VM
// is scheduled to start.
func (n Netlink) Bridge(name string) (int, error) {
	ns, h, err := openNs(n.HostNetns, "node's")
	if err != nil {
		return 0, err
	}
	defer ns.Close()
	defer h.Close()
	br, err := bridgeIn(h, name)
	if err != nil {
		return 0, err
	}
	return br.Attrs().MTU, nil
}

func bridgeIn(h *netlink.Handle, name string) (netlink.Link, error) {
	l, err := h.LinkByName(name)
	if err != nil {
		return nil, fmt.Errorf("node bridge %s: %w", name, err)
	}
	if _, ok := l.(*netlink.Bridge); !ok {
		return nil, fmt.Errorf("node bridge %s is a %s device, not a bridge", name, l.Type())
	}
	return l, nil
}

func notFound(err error) bool {
	var nf netlink.LinkNotFoundError
	return errors.As(err, &nf)
}

// Attach implements Plumber. Order: the pod's bridge, the veth pair (made
// in the pod's namespace with its peer created directly in the node's, so
// no half-moved pair is ever visible), the node end on the admin's bridge,
// the tap on the pod's bridge; each up, with the admin bridge's MTU.
func (n Netlink) Attach(ctx context.Context, a Attachment) (err error) {
	logger := klog.FromContext(ctx).WithValues("pod", a.PodUID, "interface", a.Interface, "bridge", a.Bridge)
	names := NamesFor(a)
	hostNs, host, err := openNs(n.HostNetns, "node's")
	if err != nil {
		return err
	}
	defer hostNs.Close()
	defer host.Close()
	podNs, pod, err := openNs(a.Netns, "pod's")
	if err != nil {
		return err
	}
	defer podNs.Close()
	defer pod.Close()
	adminBr, err := bridgeIn(host, a.Bridge)
	if err != nil {
		return err
	}
	mtu := adminBr.Attrs().MTU

	// undo removes, newest first, what this call created: a failure
	// leaves the pod and the node as they were before it.
	var undo []func() error
	defer func() {
		if err == nil {
			return
		}
		for i := len(undo) - 1; i >= 0; i-- {
			if uerr := undo[i](); uerr != nil {
				logger.Error(uerr, "Rolling back a partly made failover standby failed")
			}
		}
	}()

	br, err := pod.LinkByName(names.PodBridge)
	switch {
	case notFound(err):
		if err = pod.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: names.PodBridge, MTU: mtu}}); err != nil {
			return fmt.Errorf("create bridge %s in the pod: %w", names.PodBridge, err)
		}
		undo = append(undo, func() error { return delByName(pod, names.PodBridge) })
		if br, err = pod.LinkByName(names.PodBridge); err != nil {
			return fmt.Errorf("read bridge %s in the pod: %w", names.PodBridge, err)
		}
	case err != nil:
		return fmt.Errorf("read bridge %s in the pod: %w", names.PodBridge, err)
	default:
		if _, ok := br.(*netlink.Bridge); !ok {
			return fmt.Errorf("%s in the pod is a %s device, not vfnet's standby bridge: remove it", names.PodBridge, br.Type())
		}
	}
	if err = upWithMTU(pod, br, mtu); err != nil {
		return fmt.Errorf("bridge %s in the pod: %w", names.PodBridge, err)
	}

	podVeth, hostVeth, created, err := ensureVeth(pod, host, hostNs, names, mtu)
	if err != nil {
		return err
	}
	if created {
		// Deleting one end deletes the pair.
		undo = append(undo, func() error { return delByName(pod, names.PodVeth) })
	}
	if err = host.LinkSetAlias(hostVeth, names.HostAlias); err != nil {
		return fmt.Errorf("name veth %s on the node: %w", names.HostVeth, err)
	}
	if err = host.LinkSetMaster(hostVeth, adminBr); err != nil {
		return fmt.Errorf("put veth %s on node bridge %s: %w", names.HostVeth, a.Bridge, err)
	}
	if err = upWithMTU(host, hostVeth, mtu); err != nil {
		return fmt.Errorf("veth %s on the node: %w", names.HostVeth, err)
	}
	if err = pod.LinkSetMaster(podVeth, br); err != nil {
		return fmt.Errorf("put veth %s on bridge %s in the pod: %w", names.PodVeth, names.PodBridge, err)
	}
	// The VM's MAC only ever sits behind the tap. Learning it on the veth
	// (the VF's own broadcasts, looped back by the NIC to its promiscuous
	// PF, come back through the node bridge) made this bridge drop the
	// frames for it that the node bridge sent, for 18 s of a ping in the
	// real-kernel tier; without learning there, they reach the tap.
	if err = pod.LinkSetLearning(podVeth, false); err != nil {
		return fmt.Errorf("turn off learning on veth %s in the pod: %w", names.PodVeth, err)
	}
	if err = upWithMTU(pod, podVeth, mtu); err != nil {
		return fmt.Errorf("veth %s in the pod: %w", names.PodVeth, err)
	}

	tap, tapCreated, err := n.ensureTap(pod, podNs, names.Tap)
	if tapCreated {
		undo = append(undo, func() error { return delByName(pod, names.Tap) })
	}
	if err != nil {
		return err
	}
	if err = pod.LinkSetMaster(tap, br); err != nil {
		return fmt.Errorf("put tap %s on bridge %s in the pod: %w", names.Tap, names.PodBridge, err)
	}
	if err = upWithMTU(pod, tap, mtu); err != nil {
		return fmt.Errorf("tap %s in the pod: %w", names.Tap, err)
	}
	logger.V(2).Info("Failover standby plumbed", "tap", names.Tap, "podBridge", names.PodBridge, "hostVeth", names.HostVeth, "mtu", mtu)
	return nil
}

// ensureVeth returns the pod's and the node's end of the pair, creating
// it when either end is missing (a lone end is a leftover and is removed).
func ensureVeth(pod, host *netlink.Handle, hostNs netns.NsHandle, names Names, mtu int) (podEnd, hostEnd netlink.Link, created bool, err error) {
	podEnd, perr := pod.LinkByName(names.PodVeth)
	hostEnd, herr := host.LinkByName(names.HostVeth)
	if perr != nil && !notFound(perr) {
		return nil, nil, false, fmt.Errorf("read veth %s in the pod: %w", names.PodVeth, perr)
	}
	if herr != nil && !notFound(herr) {
		return nil, nil, false, fmt.Errorf("read veth %s on the node: %w", names.HostVeth, herr)
	}
	if perr == nil && herr == nil {
		// Both ends exist; they are one pair when each is the other's peer.
		if podEnd.Type() == "veth" && hostEnd.Type() == "veth" && podEnd.Attrs().ParentIndex == hostEnd.Attrs().Index && hostEnd.Attrs().ParentIndex == podEnd.Attrs().Index {
			return podEnd, hostEnd, false, nil
		}
	}
	if perr == nil {
		if err := pod.LinkDel(podEnd); err != nil {
			return nil, nil, false, fmt.Errorf("remove stale %s in the pod: %w", names.PodVeth, err)
		}
	}
	if herr == nil {
		if err := host.LinkDel(hostEnd); err != nil && !notFound(err) {
			return nil, nil, false, fmt.Errorf("remove stale veth %s on the node: %w", names.HostVeth, err)
		}
	}
	v := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: names.PodVeth, MTU: mtu}, PeerName: names.HostVeth,
		PeerMTU: uint32(mtu), PeerNamespace: netlink.NsFd(hostNs)}
	if err := pod.LinkAdd(v); err != nil {
		return nil, nil, false, fmt.Errorf("create veth pair %s (pod) / %s (node): %w", names.PodVeth, names.HostVeth, err)
	}
	if podEnd, err = pod.LinkByName(names.PodVeth); err != nil {
		_ = delByName(pod, names.PodVeth)
		return nil, nil, false, fmt.Errorf("read veth %s in the pod: %w", names.PodVeth, err)
	}
	if hostEnd, err = host.LinkByName(names.HostVeth); err != nil {
		_ = delByName(pod, names.PodVeth)
		return nil, nil, false, fmt.Errorf("read veth %s on the node: %w", names.HostVeth, err)
	}
	return podEnd, hostEnd, true, nil
}

// ensureTap returns the tap, creating it persistent, single-queue (what
// libvirt opens for an interface without <driver queues>), with
// IFF_NO_PI|IFF_VNET_HDR and owned by the launcher's user. An existing
// device of that name must be such a tap.
func (n Netlink) ensureTap(pod *netlink.Handle, podNs netns.NsHandle, name string) (netlink.Link, bool, error) {
	uid, gid := n.owner()
	l, err := pod.LinkByName(name)
	if err == nil {
		t, ok := l.(*netlink.Tuntap)
		if !ok || t.Mode != netlink.TUNTAP_MODE_TAP {
			return nil, false, fmt.Errorf("%s in the pod is a %s device, not a tap: remove it", name, l.Type())
		}
		if t.Owner != uid || t.Group != gid || t.Flags&netlink.TUNTAP_MULTI_QUEUE != 0 {
			return nil, false, fmt.Errorf("tap %s in the pod is owned by %d:%d (multi-queue %t), want %d:%d single-queue: remove it so vfnet makes it anew",
				name, t.Owner, t.Group, t.Flags&netlink.TUNTAP_MULTI_QUEUE != 0, uid, gid)
		}
		return l, false, nil
	}
	if !notFound(err) {
		return nil, false, fmt.Errorf("read tap %s in the pod: %w", name, err)
	}
	tap := &netlink.Tuntap{LinkAttrs: netlink.LinkAttrs{Name: name}, Mode: netlink.TUNTAP_MODE_TAP,
		Flags: netlink.TUNTAP_NO_PI | netlink.TUNTAP_VNET_HDR, Owner: uid, Group: gid}
	if err := inNetns(podNs, func() error { return netlink.LinkAdd(tap) }); err != nil {
		return nil, false, fmt.Errorf("create tap %s owned by %d:%d in the pod: %w", name, uid, gid, err)
	}
	l, err = pod.LinkByName(name)
	if err != nil {
		return nil, true, fmt.Errorf("read tap %s in the pod: %w", name, err)
	}
	return l, true, nil
}

// inNetns runs fn on an OS thread inside the namespace ns, then moves the
// thread back and unlocks it. A thread that cannot move back stays locked
// and ends with its goroutine, so no other goroutine ever runs in the
// pod's namespace. (Letting every such thread end instead would kill
// children started with Pdeathsig from it.)
func inNetns(ns netns.NsHandle, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("read the driver's network namespace: %w", err)
			return
		}
		defer orig.Close()
		if err := netns.Set(ns); err != nil {
			errc <- fmt.Errorf("enter the pod's network namespace: %w", err)
			return
		}
		err = fn()
		if netns.Set(orig) == nil {
			runtime.UnlockOSThread()
		}
		errc <- err
	}()
	return <-errc
}

func upWithMTU(h *netlink.Handle, l netlink.Link, mtu int) error {
	if mtu > 0 && l.Attrs().MTU != mtu {
		if err := h.LinkSetMTU(l, mtu); err != nil {
			return fmt.Errorf("set MTU %d: %w", mtu, err)
		}
	}
	if err := h.LinkSetUp(l); err != nil {
		return fmt.Errorf("set up: %w", err)
	}
	return nil
}

func delByName(h *netlink.Handle, name string) error {
	l, err := h.LinkByName(name)
	if notFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if err := h.LinkDel(l); err != nil && !notFound(err) {
		return fmt.Errorf("remove %s: %w", name, err)
	}
	return nil
}

// Detach implements Plumber.
func (n Netlink) Detach(ctx context.Context, podUID string) error {
	return n.removeHostEnds(ctx, func(uid string) bool { return uid == podUID })
}

// Prune implements Plumber.
func (n Netlink) Prune(ctx context.Context, keep map[string]bool) error {
	return n.removeHostEnds(ctx, func(uid string) bool { return !keep[uid] })
}

// removeHostEnds deletes every node-side veth of ours (by its ifalias)
// whose pod remove selects.
func (n Netlink) removeHostEnds(ctx context.Context, remove func(podUID string) bool) error {
	ns, h, err := openNs(n.HostNetns, "node's")
	if err != nil {
		return err
	}
	defer ns.Close()
	defer h.Close()
	links, err := h.LinkList()
	if errors.Is(err, netlink.ErrDumpInterrupted) {
		// The link table changed during the dump: read it again.
		links, err = h.LinkList()
	}
	if err != nil {
		return fmt.Errorf("list links in the node's network namespace %s: %w", n.HostNetns, err)
	}
	var errs []error
	for _, l := range links {
		uid, ours := podOfAlias(l.Attrs().Alias)
		if !ours || l.Type() != "veth" || !remove(uid) {
			continue
		}
		if err := h.LinkDel(l); err != nil && !notFound(err) {
			errs = append(errs, fmt.Errorf("remove standby veth %s of pod %s on the node: %w", l.Attrs().Name, uid, err))
			continue
		}
		klog.FromContext(ctx).V(2).Info("Removed failover standby veth on the node", "veth", l.Attrs().Name, "pod", uid)
	}
	return errors.Join(errs...)
}

// Steer points the node bridge's forwarding entry for mac at the
// standby's node-side veth of pod podUID and VMI interface iface. The
// migration source calls it when it parks a failover VF's MAC: the NIC
// then hands the VM's inbound frames to the bridge's uplink, and a bridge
// that learned mac on that uplink (NICs loop a VF's broadcasts back to a
// promiscuous PF) would drop them there until the guest happens to send
// through the standby. The entry is sticky, so a frame from mac that comes
// back on the uplink cannot move it (QEMU's igb reflected the standby's own
// broadcasts to the PF: rehearsal 72 read the entry on the uplink right
// after a steer), and dynamic, so it ages once the standby goes quiet;
// Unsteer removes it when the MAC is restored.
func (n Netlink) Steer(ctx context.Context, podUID, iface, bridge string, mac net.HardwareAddr) error {
	return n.standbyEntry(ctx, podUID, iface, bridge, mac, true)
}

// Unsteer removes the entry Steer made, if the bridge still has it on the
// standby's veth, so the bridge learns mac wherever the VM sends from
// once its VF is back. Nothing to remove is no error.
func (n Netlink) Unsteer(ctx context.Context, podUID, iface, bridge string, mac net.HardwareAddr) error {
	return n.standbyEntry(ctx, podUID, iface, bridge, mac, false)
}

// standbyEntry sets (Steer) or removes (Unsteer) the node bridge's entry
// for mac on the standby's node-side veth.
func (n Netlink) standbyEntry(ctx context.Context, podUID, iface, bridge string, mac net.HardwareAddr, steer bool) error {
	names := NamesFor(Attachment{PodUID: podUID, Interface: iface})
	logger := klog.FromContext(ctx).V(2).WithValues("bridge", bridge, "mac", mac.String(), "veth", names.HostVeth, "pod", podUID)
	ns, h, err := openNs(n.HostNetns, "node's")
	if err != nil {
		return err
	}
	defer ns.Close()
	defer h.Close()
	veth, err := h.LinkByName(names.HostVeth)
	switch {
	case notFound(err) && !steer:
		return nil // the pod is gone, and its entry with its veth
	case notFound(err):
		return fmt.Errorf("the standby of pod %s interface %s has no node-side veth %s in %s (its NRI plumbing is missing): %w", podUID, iface, names.HostVeth, n.HostNetns, err)
	case err != nil:
		return fmt.Errorf("read standby veth %s: %w", names.HostVeth, err)
	}
	entry := &netlink.Neigh{LinkIndex: veth.Attrs().Index, Family: unix.AF_BRIDGE, Flags: netlink.NTF_MASTER, HardwareAddr: mac}
	if !steer {
		if err := h.NeighDel(entry); err != nil && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("remove bridge %s's entry for %s on standby veth %s: %w", bridge, mac, names.HostVeth, err)
		}
		logger.Info("Node bridge learns the VM's MAC again")
		return nil
	}
	br, err := bridgeIn(h, bridge)
	if err != nil {
		return err
	}
	if veth.Attrs().MasterIndex != br.Attrs().Index {
		return fmt.Errorf("standby veth %s is not a port of node bridge %s", names.HostVeth, bridge)
	}
	entry.Flags |= netlink.NTF_STICKY
	entry.State = netlink.NUD_REACHABLE
	if err := h.NeighSet(entry); err != nil {
		return fmt.Errorf("point bridge %s's entry for %s at standby veth %s: %w", bridge, mac, names.HostVeth, err)
	}
	logger.Info("Node bridge steers the VM's MAC to its standby")
	return nil
}
