package standby

import (
	"errors"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/vfnet-io/vfnet/test/lib/pfnetns"
)

// The node's namespace holds the admin's bridge; the pod's is a second
// private namespace. Both are this test's own (test/lib/pfnetns); the
// machine's network is never touched.
type env struct {
	t           *testing.T
	host, pod   string
	hostH, podH *netlink.Handle
	plumber     Netlink
	markers     int // sendFrom's marker MACs so far
}

const adminBridge = "br-phys"

func newEnv(t *testing.T) *env {
	t.Helper()
	if os.Geteuid() != 0 {
		// make test-unit runs as root; a skip there fails the tier.
		t.Skip("network namespaces need root")
	}
	host, err := pfnetns.New(t, adminBridge)
	if err != nil {
		t.Fatal(err)
	}
	pod, err := pfnetns.New(t)
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, host: host, pod: pod, plumber: Netlink{HostNetns: host}}
	e.hostH, e.podH = handle(t, host), handle(t, pod)
	br, err := e.hostH.LinkByName(adminBridge)
	if err != nil {
		t.Fatal(err)
	}
	// A jumbo physical network: every standby device must follow it.
	if err := e.hostH.LinkSetMTU(br, 9000); err != nil {
		t.Fatal(err)
	}
	return e
}

func handle(t *testing.T, path string) *netlink.Handle {
	t.Helper()
	ns, err := netns.GetFromPath(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Close() })
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	return h
}

func (e *env) attachment(iface string) Attachment {
	return Attachment{PodUID: "0b7c4f7e-1111-4a2b-9c3d-" + iface, Netns: e.pod, Interface: iface, Bridge: adminBridge}
}

// links returns name -> link of a namespace.
func links(t *testing.T, h *netlink.Handle) map[string]netlink.Link {
	t.Helper()
	ls, err := h.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]netlink.Link{}
	for _, l := range ls {
		out[l.Attrs().Name] = l
	}
	return out
}

// checkPlumbed asserts the whole topology of a from the outside.
func (e *env) checkPlumbed(a Attachment) {
	t := e.t
	t.Helper()
	n := NamesFor(a)
	for _, name := range []string{n.Tap, n.PodBridge, n.PodVeth, n.HostVeth} {
		if len(name) > 15 {
			t.Errorf("name %q is longer than IFNAMSIZ-1", name)
		}
	}
	pod, host := links(t, e.podH), links(t, e.hostH)
	br, ok := pod[n.PodBridge].(*netlink.Bridge)
	if !ok {
		t.Fatalf("pod has no bridge %s: %v", n.PodBridge, keys(pod))
	}
	tap, ok := pod[n.Tap].(*netlink.Tuntap)
	if !ok {
		t.Fatalf("pod has no tap %s: %v", n.Tap, keys(pod))
	}
	if tap.Mode != netlink.TUNTAP_MODE_TAP || tap.Owner != QEMUUser || tap.Group != QEMUUser || tap.NonPersist {
		t.Errorf("tap %s: mode %v owner %d:%d non-persistent %t, want a persistent tap owned by 107:107", n.Tap, tap.Mode, tap.Owner, tap.Group, tap.NonPersist)
	}
	if tap.Flags&netlink.TUNTAP_MULTI_QUEUE != 0 {
		t.Errorf("tap %s is multi-queue; libvirt opens a single queue for an interface without <driver queues>", n.Tap)
	}
	pv, ok := pod[n.PodVeth].(*netlink.Veth)
	if !ok {
		t.Fatalf("pod has no veth %s: %v", n.PodVeth, keys(pod))
	}
	hv, ok := host[n.HostVeth].(*netlink.Veth)
	if !ok {
		t.Fatalf("node has no veth %s: %v", n.HostVeth, keys(host))
	}
	adm := host[adminBridge]
	if tap.Attrs().MasterIndex != br.Attrs().Index || pv.Attrs().MasterIndex != br.Attrs().Index {
		t.Errorf("tap master %d, pod veth master %d, want the pod bridge %d", tap.Attrs().MasterIndex, pv.Attrs().MasterIndex, br.Attrs().Index)
	}
	if hv.Attrs().MasterIndex != adm.Attrs().Index {
		t.Errorf("node veth %s master %d, want %s (%d)", n.HostVeth, hv.Attrs().MasterIndex, adminBridge, adm.Attrs().Index)
	}
	if pv.Attrs().ParentIndex != hv.Attrs().Index || hv.Attrs().ParentIndex != pv.Attrs().Index {
		t.Errorf("veths %s and %s are not one pair (peer indexes %d, %d)", n.PodVeth, n.HostVeth, pv.Attrs().ParentIndex, hv.Attrs().ParentIndex)
	}
	if pi, err := e.podH.LinkGetProtinfo(pv); err != nil || pi.Learning {
		t.Errorf("pod veth %s learns (%+v, %v): the VM's MAC must only ever be learned behind the tap", n.PodVeth, pi, err)
	}
	if hv.Attrs().Alias != n.HostAlias {
		t.Errorf("node veth alias %q, want %q", hv.Attrs().Alias, n.HostAlias)
	}
	for _, l := range []netlink.Link{br, tap, pv, hv} {
		if l.Attrs().Flags&unix.IFF_UP == 0 {
			t.Errorf("%s is not up", l.Attrs().Name)
		}
		if l.Attrs().MTU != 9000 {
			t.Errorf("%s has MTU %d, want the node bridge's 9000", l.Attrs().Name, l.Attrs().MTU)
		}
	}
}

func keys(m map[string]netlink.Link) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

func TestAttachPlumbsTheStandby(t *testing.T) {
	e := newEnv(t)
	a := e.attachment("physnet-a")
	if err := e.plumber.Attach(t.Context(), a); err != nil {
		t.Fatal(err)
	}
	e.checkPlumbed(a)
	if got := NamesFor(a).Tap; !strings.HasPrefix(got, "vfsb") {
		t.Errorf("tap %q does not have the sidecar's name", got)
	}
	openTapAsQEMU(t, e.pod, NamesFor(a).Tap)

	// The check can fail: a tap owned by root is refused to uid 107.
	root := &netlink.Tuntap{LinkAttrs: netlink.LinkAttrs{Name: "vfsbroot"}, Mode: netlink.TUNTAP_MODE_TAP, Flags: netlink.TUNTAP_NO_PI | netlink.TUNTAP_VNET_HDR}
	ns, err := netns.GetFromPath(e.pod)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	if err := inNetns(ns, func() error { return netlink.LinkAdd(root) }); err != nil {
		t.Fatal(err)
	}
	if err := tapAsQEMU(e.pod, "vfsbroot"); !errors.Is(err, unix.EPERM) {
		t.Errorf("uid 107 attaching to a root-owned tap: %v, want EPERM", err)
	}
}

// openTapAsQEMU attaches to the tap as libvirt in the unprivileged
// launcher does: TUNSETIFF with IFF_TAP, IFF_NO_PI and IFF_VNET_HDR on the
// existing device, with effective uid/gid 107 and so no effective
// capabilities (the kernel's tun_not_capable then lets only the tap's
// owner in). /dev/net/tun itself is opened before the switch: its mode is
// the node's (0666 on a standard host, where KubeVirt's tun device plugin
// hands it to the launcher; 0600 on this test machine). The thread keeps
// uid 0 as its real and saved ids, so it switches back, and leaves the
// namespace before it is unlocked.
func openTapAsQEMU(t *testing.T, podNs, tap string) {
	t.Helper()
	if err := tapAsQEMU(podNs, tap); err != nil {
		t.Fatalf("uid 107 cannot attach to tap %s as libvirt does: %v", tap, err)
	}
}

func tapAsQEMU(podNs, tap string) error {
	ns, err := netns.GetFromPath(podNs)
	if err != nil {
		return err
	}
	defer ns.Close()
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			errc <- err
			runtime.UnlockOSThread()
			return
		}
		defer orig.Close()
		restored := false
		defer func() {
			if restored {
				runtime.UnlockOSThread()
			} // else the thread ends with the goroutine
		}()
		errc <- func() error {
			if err := netns.Set(ns); err != nil {
				return err
			}
			fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
			if err != nil {
				return err
			}
			defer unix.Close(fd)
			if _, _, e := unix.RawSyscall(unix.SYS_SETRESGID, ^uintptr(0), QEMUUser, ^uintptr(0)); e != 0 {
				return e
			}
			if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, ^uintptr(0), QEMUUser, ^uintptr(0)); e != 0 {
				return e
			}
			var req [unix.IFNAMSIZ + 64]byte
			copy(req[:], tap)
			*(*uint16)(unsafe.Pointer(&req[unix.IFNAMSIZ])) = unix.IFF_TAP | unix.IFF_NO_PI | unix.IFF_VNET_HDR
			_, _, ioErr := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.TUNSETIFF, uintptr(unsafe.Pointer(&req[0])))
			_, _, e1 := unix.RawSyscall(unix.SYS_SETRESUID, ^uintptr(0), 0, ^uintptr(0))
			_, _, e2 := unix.RawSyscall(unix.SYS_SETRESGID, ^uintptr(0), 0, ^uintptr(0))
			restored = e1 == 0 && e2 == 0 && netns.Set(orig) == nil
			if ioErr != 0 {
				return ioErr
			}
			return nil
		}()
	}()
	return <-errc
}

// A repeated call (the runtime's retry, a restarted driver's Synchronize)
// changes nothing; a lost node end is repaired.
func TestAttachIsIdempotent(t *testing.T) {
	e := newEnv(t)
	a := e.attachment("physnet-a")
	if err := e.plumber.Attach(t.Context(), a); err != nil {
		t.Fatal(err)
	}
	before := indexes(links(t, e.podH), links(t, e.hostH))
	if err := e.plumber.Attach(t.Context(), a); err != nil {
		t.Fatalf("second Attach: %v", err)
	}
	after := indexes(links(t, e.podH), links(t, e.hostH))
	if len(before) != len(after) {
		t.Fatalf("second Attach changed the devices: %v -> %v", before, after)
	}
	for k, v := range before {
		if after[k] != v {
			t.Errorf("%s was made anew (ifindex %d -> %d)", k, v, after[k])
		}
	}
	e.checkPlumbed(a)

	// Someone removed the node end (and so the pair): made again.
	hv, err := e.hostH.LinkByName(NamesFor(a).HostVeth)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.hostH.LinkDel(hv); err != nil {
		t.Fatal(err)
	}
	if err := e.plumber.Attach(t.Context(), a); err != nil {
		t.Fatalf("Attach after the veth was lost: %v", err)
	}
	e.checkPlumbed(a)

	// A second interface of the same pod gets its own devices.
	b := a
	b.Interface = "physnet-b"
	if err := e.plumber.Attach(t.Context(), b); err != nil {
		t.Fatal(err)
	}
	e.checkPlumbed(a)
	e.checkPlumbed(b)
}

func indexes(ms ...map[string]netlink.Link) map[string]int {
	out := map[string]int{}
	for i, m := range ms {
		for name, l := range m {
			out[string(rune('0'+i))+"/"+name] = l.Attrs().Index
		}
	}
	return out
}

// A failure part-way leaves nothing of this call behind, in either
// namespace; what existed before it stays.
func TestAttachRollsBack(t *testing.T) {
	e := newEnv(t)
	a := e.attachment("physnet-a")
	n := NamesFor(a)
	// Something that is not a tap holds the tap's name: the last step fails.
	if err := e.podH.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: n.Tap}}); err != nil {
		t.Fatal(err)
	}
	podBefore, hostBefore := links(t, e.podH), links(t, e.hostH)
	err := e.plumber.Attach(t.Context(), a)
	if err == nil || !strings.Contains(err.Error(), n.Tap) || !strings.Contains(err.Error(), "not a tap") {
		t.Fatalf("Attach = %v, want an error naming %s as not a tap", err, n.Tap)
	}
	if got, want := keys(links(t, e.podH)), keys(podBefore); len(got) != len(want) {
		t.Errorf("pod devices after the failed Attach %v, want as before %v", got, want)
	}
	if got, want := keys(links(t, e.hostH)), keys(hostBefore); len(got) != len(want) {
		t.Errorf("node devices after the failed Attach %v, want as before %v", got, want)
	}
	if _, ok := links(t, e.podH)[n.Tap]; !ok {
		t.Errorf("the pre-existing %s was removed", n.Tap)
	}

	// No node bridge: refused before anything is made, naming it.
	bad := a
	bad.Bridge = "br-missing"
	err = e.plumber.Attach(t.Context(), bad)
	if err == nil || !strings.Contains(err.Error(), "br-missing") {
		t.Fatalf("Attach to a missing bridge = %v, want an error naming it", err)
	}
	if len(links(t, e.hostH)) != len(hostBefore) {
		t.Errorf("a refused Attach changed the node")
	}
	if _, err := e.plumber.Bridge("br-missing"); err == nil || !strings.Contains(err.Error(), "br-missing") {
		t.Errorf("Bridge(br-missing) = %v", err)
	}
	if mtu, err := e.plumber.Bridge(adminBridge); err != nil || mtu != 9000 {
		t.Errorf("Bridge(%s) = %d, %v; want 9000", adminBridge, mtu, err)
	}
}

// Detach removes the pod's node ends (and so the pairs); Prune removes
// those of pods not kept and leaves the kept ones and foreign links alone.
func TestDetachAndPrune(t *testing.T) {
	e := newEnv(t)
	a := e.attachment("physnet-a")
	b := e.attachment("physnet-b") // another pod UID (the name is in it)
	for _, x := range []Attachment{a, b} {
		if err := e.plumber.Attach(t.Context(), x); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.plumber.Detach(t.Context(), a.PodUID); err != nil {
		t.Fatal(err)
	}
	host, pod := links(t, e.hostH), links(t, e.podH)
	if _, ok := host[NamesFor(a).HostVeth]; ok {
		t.Errorf("node veth of the detached pod remains")
	}
	if _, ok := pod[NamesFor(a).PodVeth]; ok {
		t.Errorf("its peer in the pod remains")
	}
	if _, ok := host[NamesFor(b).HostVeth]; !ok {
		t.Errorf("Detach removed another pod's veth")
	}
	if err := e.plumber.Detach(t.Context(), a.PodUID); err != nil {
		t.Errorf("repeated Detach: %v", err)
	}
	if err := e.plumber.Prune(t.Context(), map[string]bool{b.PodUID: true}); err != nil {
		t.Fatal(err)
	}
	if _, ok := links(t, e.hostH)[NamesFor(b).HostVeth]; !ok {
		t.Errorf("Prune removed a kept pod's veth")
	}
	if err := e.plumber.Prune(t.Context(), nil); err != nil {
		t.Fatal(err)
	}
	host = links(t, e.hostH)
	if _, ok := host[NamesFor(b).HostVeth]; ok {
		t.Errorf("Prune left the veth of a pod not kept")
	}
	if _, ok := host[adminBridge]; !ok {
		t.Errorf("Prune removed the admin's bridge")
	}
}

// The bridge learned the VM's MAC on its uplink (the NIC looped the VF's
// broadcasts back to the promiscuous PF); once the MAC is parked, Steer
// moves the entry to the standby's veth, dynamic like a learned one.
func TestSteerMovesTheMACToTheStandby(t *testing.T) {
	e := newEnv(t)
	a := e.attachment("physnet-a")
	if err := e.plumber.Attach(t.Context(), a); err != nil {
		t.Fatal(err)
	}
	br, err := e.hostH.LinkByName(adminBridge)
	if err != nil {
		t.Fatal(err)
	}
	// A veth stands for the PF's VLAN device (no dummy module here).
	uplink := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "uplink", MasterIndex: br.Attrs().Index}, PeerName: "uplink-wire"}
	if err := e.hostH.LinkAdd(uplink); err != nil {
		t.Fatal(err)
	}
	up, err := e.hostH.LinkByName("uplink")
	if err != nil {
		t.Fatal(err)
	}
	wire, err := e.hostH.LinkByName("uplink-wire")
	if err != nil {
		t.Fatal(err)
	}
	// A port learns only while it forwards: with carrier, on a bridge
	// that is up.
	for _, l := range []netlink.Link{br, up, wire} {
		if err := e.hostH.LinkSetUp(l); err != nil {
			t.Fatal(err)
		}
	}
	mac, _ := net.ParseMAC("02:00:00:00:00:01")
	learned := &netlink.Neigh{LinkIndex: up.Attrs().Index, Family: unix.AF_BRIDGE, Flags: netlink.NTF_MASTER, State: netlink.NUD_REACHABLE, HardwareAddr: mac}
	// Carrier comes through the kernel's link watch, up to a second later.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		err := e.hostH.NeighSet(learned)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("learn %s on the uplink: %v", mac, err)
		}
	}
	if port, _ := fdbEntry(t, e.hostH, br, mac); port != "uplink" {
		t.Fatalf("set-up: the bridge forwards %s to %q, want uplink", mac, port)
	}
	if err := e.plumber.Steer(t.Context(), a.PodUID, a.Interface, adminBridge, mac); err != nil {
		t.Fatal(err)
	}
	port, state := fdbEntry(t, e.hostH, br, mac)
	if port != NamesFor(a).HostVeth {
		t.Errorf("after Steer the bridge forwards %s to %q, want the standby's veth %s", mac, port, NamesFor(a).HostVeth)
	}
	if state&(netlink.NUD_PERMANENT|netlink.NUD_NOARP) != 0 {
		t.Errorf("the entry is static (state %#x): it must age and be relearned like a learned one", state)
	}
	// Sticky: the standby's own broadcast, reflected back on the uplink,
	// must not move it.
	e.sendFrom(br, "uplink-wire", "uplink", mac)
	if port, _ := fdbEntry(t, e.hostH, br, mac); port != NamesFor(a).HostVeth {
		t.Errorf("a frame from %s on the uplink moved the steered entry to %q", mac, port)
	}
	// Idempotent: the watcher may park again after a restart.
	if err := e.plumber.Steer(t.Context(), a.PodUID, a.Interface, adminBridge, mac); err != nil {
		t.Errorf("repeated Steer: %v", err)
	}
	// Unsteer gives the MAC back to learning; a repeat finds nothing.
	for i := 0; i < 2; i++ {
		if err := e.plumber.Unsteer(t.Context(), a.PodUID, a.Interface, adminBridge, mac); err != nil {
			t.Fatalf("Unsteer %d: %v", i+1, err)
		}
	}
	if port, _ := fdbEntry(t, e.hostH, br, mac); port == NamesFor(a).HostVeth {
		t.Errorf("after Unsteer the bridge still forwards %s to the standby", mac)
	}
	e.sendFrom(br, "uplink-wire", "uplink", mac)
	if port, _ := fdbEntry(t, e.hostH, br, mac); port != "uplink" {
		t.Errorf("after Unsteer the bridge did not learn %s on the uplink again: %q", mac, port)
	}
	// A pod without plumbing: the error names the veth and the cause.
	err = e.plumber.Steer(t.Context(), "no-such-pod", "physnet-a", adminBridge, mac)
	if err == nil || !strings.Contains(err.Error(), NamesFor(Attachment{PodUID: "no-such-pod", Interface: "physnet-a"}).HostVeth) || !strings.Contains(err.Error(), "NRI plumbing") {
		t.Errorf("Steer for a pod without plumbing: %v; want an error naming its veth and the missing NRI plumbing", err)
	}
}

// sendFrom sends one broadcast frame from src out of ifname in the node's
// namespace, whose veth peer port is a port of br, and returns once br
// has processed it: a marker frame from another MAC follows on the same
// path, and the bridge has learned the marker on port.
func (e *env) sendFrom(br netlink.Link, ifname, port string, src net.HardwareAddr) {
	t := e.t
	t.Helper()
	l, err := e.hostH.LinkByName(ifname)
	if err != nil {
		t.Fatal(err)
	}
	ns, err := netns.GetFromPath(e.host)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	e.markers++
	marker := net.HardwareAddr{0x02, 0, 0, 0, 0xfe, byte(e.markers)}
	err = inNetns(ns, func() error {
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		for _, from := range []net.HardwareAddr{src, marker} {
			frame := append(append([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, from...), 0x88, 0xb5)
			frame = append(frame, make([]byte, 46)...)
			if err := unix.Sendto(fd, frame, 0, &unix.SockaddrLinklayer{Ifindex: l.Attrs().Index, Halen: 6}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("send a frame from %s on %s: %v", src, ifname, err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if got, _ := fdbEntry(t, e.hostH, br, marker); got == port {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("bridge never learned the marker %s on %s", marker, port)
		}
	}
}

// fdbEntry is the port bridge br forwards mac to, and the entry's state.
func fdbEntry(t *testing.T, h *netlink.Handle, br netlink.Link, mac net.HardwareAddr) (string, int) {
	t.Helper()
	neighs, err := h.NeighList(0, unix.AF_BRIDGE)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range neighs {
		if n.MasterIndex != br.Attrs().Index || n.HardwareAddr.String() != mac.String() {
			continue
		}
		l, err := h.LinkByIndex(n.LinkIndex)
		if err != nil {
			t.Fatal(err)
		}
		return l.Attrs().Name, n.State
	}
	return "", 0
}

// The pod's namespace going away (its last process exits) takes the pod
// side and with it the node's veth end: nothing of the pod stays on the
// node even without Detach.
func TestPodNetnsGoneRemovesNodeEnd(t *testing.T) {
	e := newEnv(t)
	holder := exec.Command("sleep", "infinity")
	holder.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET, Pdeathsig: syscall.SIGKILL}
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = holder.Process.Kill(); _ = holder.Wait() })
	podNs := "/proc/" + strconv.Itoa(holder.Process.Pid) + "/ns/net"
	a := Attachment{PodUID: "pod-gone", Netns: podNs, Interface: "physnet-a", Bridge: adminBridge}
	if err := e.plumber.Attach(t.Context(), a); err != nil {
		t.Fatal(err)
	}
	if _, err := e.hostH.LinkByName(NamesFor(a).HostVeth); err != nil {
		t.Fatal(err)
	}
	_ = holder.Process.Kill()
	_ = holder.Wait()
	// The kernel dismantles a namespace in a work queue: wait for it (the
	// bound only ends a hung test).
	deadline := time.Now().Add(time.Minute)
	for {
		_, err := e.hostH.LinkByName(NamesFor(a).HostVeth)
		if notFound(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("node veth %s remains a minute after its pod's namespace went: %v", NamesFor(a).HostVeth, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
