package simhost

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/vfnet-io/vfnet/driver/kernel/hostevents"
)

// The simulated kernel's notifications. A real kernel multicasts kobject
// uevents and rtnetlink link notifications to every socket subscribed to
// the group; here each listener binds a unix datagram socket in
// <root>/.simhost/notify/ (uevent-* or rtnl-*), and every change the
// simulation makes is sent to each of them in the kernel's own wire format:
// uevents as "ACTION@DEVPATH" and KEY=VALUE strings, link notifications as
// RTM_NEWLINK/RTM_DELLINK messages built as for the simulated rtnetlink
// socket (rtnl.go). So the driver's decoders (hostevents.ParseUevent,
// hostevents.ParseLinkMessage) read the same bytes from a simulated host as
// from a real one, and every simulated test runs the event path.
//
// Modelled: a probe or release sends bind or unbind (with the netdevs it
// created or removed: net add/remove); a sriov_numvfs write sends remove
// for each VF it took away, add (and bind when autoprobed) for each it
// made, then change on the PF; a PF's removal sends remove for its VFs and
// the PF; a netdev rename sends move (DEVPATH_OLD) and a link notification;
// an operstate change and every VF setting sent through the PF send a link
// notification of the PF. A listener that does not read fast enough loses
// notifications, as a real socket does (ENOBUFS): the sender marks it, and
// the listener reports hostevents.Lost.

const notifyDir = stateDir + "/notify"

// hostSnapshot is what the kernel's uevents are about: PCI functions and
// their drivers, and netdevs.
type hostSnapshot struct {
	fns     map[string]string // bdf -> bound driver ("" none)
	netdevs map[string]string // netdev -> its device's sysfs dir
}

func (h *Host) takeSnapshot() hostSnapshot {
	s := hostSnapshot{fns: map[string]string{}, netdevs: map[string]string{}}
	ents, _ := os.ReadDir(h.t.abs(pciDevices))
	for _, e := range ents {
		dir, err := h.t.readlink(pciDevices + "/" + e.Name())
		if err != nil || !h.t.exists(dir) {
			continue
		}
		s.fns[e.Name()] = h.boundDriver(dir)
	}
	nets, _ := os.ReadDir(h.t.abs(classNet))
	for _, e := range nets {
		if dir, err := h.t.readlink(classNet + "/" + e.Name()); err == nil {
			s.netdevs[e.Name()] = dir
		}
	}
	return s
}

// emitDiff sends the uevents that take the host from before to now, in the
// kernel's order: removals (netdevs, then functions), additions (functions,
// then netdevs), driver changes; then change on pf when a sriov_numvfs
// write made them ("" otherwise).
func (h *Host) emitDiff(before hostSnapshot, pf string) {
	if !h.hasListeners("uevent-") {
		return
	}
	after := h.takeSnapshot()
	for _, n := range sortedKeys(before.netdevs) {
		if _, ok := after.netdevs[n]; !ok {
			h.uevent("remove", before.netdevs[n]+"/net/"+n, "SUBSYSTEM=net", "INTERFACE="+n)
		}
	}
	for _, b := range sortedKeys(before.fns) {
		if _, ok := after.fns[b]; !ok {
			if drv := before.fns[b]; drv != "" {
				h.uevent("unbind", "", "SUBSYSTEM=pci", "PCI_SLOT_NAME="+b)
			}
			h.uevent("remove", "", "SUBSYSTEM=pci", "PCI_SLOT_NAME="+b)
		}
	}
	for _, b := range sortedKeys(after.fns) {
		old, existed := before.fns[b]
		if !existed {
			h.uevent("add", h.devpath(b), "SUBSYSTEM=pci", "PCI_SLOT_NAME="+b)
		}
		switch drv := after.fns[b]; {
		case drv == old:
		case drv == "":
			h.uevent("unbind", h.devpath(b), "SUBSYSTEM=pci", "PCI_SLOT_NAME="+b)
		default:
			if old != "" {
				h.uevent("unbind", h.devpath(b), "SUBSYSTEM=pci", "PCI_SLOT_NAME="+b)
			}
			h.uevent("bind", h.devpath(b), "SUBSYSTEM=pci", "DRIVER="+drv, "PCI_SLOT_NAME="+b)
		}
	}
	for _, n := range sortedKeys(after.netdevs) {
		if _, ok := before.netdevs[n]; !ok {
			h.uevent("add", after.netdevs[n]+"/net/"+n, "SUBSYSTEM=net", "INTERFACE="+n)
		}
	}
	if pf != "" {
		h.uevent("change", h.devpath(pf), "SUBSYSTEM=pci", "PCI_SLOT_NAME="+pf)
	}
}

// devpath is a function's sysfs path below the root, "" when it is gone.
func (h *Host) devpath(bdf string) string {
	dir, err := h.t.readlink(pciDevices + "/" + bdf)
	if err != nil {
		return ""
	}
	return dir
}

// uevent sends one kobject uevent; an empty devpath is filled from the
// function named by PCI_SLOT_NAME (for a function already gone, the
// devices/ path it had is not known, so its address stands in).
func (h *Host) uevent(action, devpath string, fields ...string) {
	if devpath == "" {
		for _, f := range fields {
			if b, ok := strings.CutPrefix(f, "PCI_SLOT_NAME="); ok {
				devpath = "devices/" + b
			}
		}
	}
	devpath = "/" + strings.TrimPrefix(devpath, "/")
	var b strings.Builder
	b.WriteString(action + "@" + devpath + "\x00")
	b.WriteString("ACTION=" + action + "\x00")
	b.WriteString("DEVPATH=" + devpath + "\x00")
	for _, f := range fields {
		b.WriteString(f + "\x00")
	}
	b.WriteString("SEQNUM=" + strconv.FormatUint(h.ueventSeq.Add(1), 10) + "\x00")
	h.send("uevent-", []byte(b.String()))
}

// linkChanged sends the link notification of netdev name (RTM_NEWLINK, or
// RTM_DELLINK when it is gone), as the kernel's rtmsg_ifinfo does: no VF
// list (notifications carry no RTEXT_FILTER_VF).
func (h *Host) linkChanged(name string, deleted bool) {
	if !h.hasListeners("rtnl-") {
		return
	}
	l := &Links{h: h, nsID: hostNetnsID}
	dev, ok := l.netdevs().find(name, 0)
	if !ok {
		dev = simNetdev{name: name}
		deleted = true
	}
	msg, err := l.linkMessage(dev, 0, 0)
	if err != nil {
		return
	}
	if deleted && len(msg) >= unix.NLMSG_HDRLEN {
		msg[4] = byte(unix.RTM_DELLINK) // nlmsg_type, little endian
		msg[5] = byte(unix.RTM_DELLINK >> 8)
	}
	h.send("rtnl-", msg)
}

func (h *Host) hasListeners(prefix string) bool {
	ents, _ := os.ReadDir(filepath.Join(h.t.root, notifyDir))
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), prefix) && !strings.HasSuffix(e.Name(), overflowSuffix) {
			return true
		}
	}
	return false
}

const overflowSuffix = ".overflow"

// send delivers msg to every listener whose socket name starts with
// prefix, without blocking: a full socket marks the listener as having
// lost notifications; a dead one's socket is removed.
func (h *Host) send(prefix string, msg []byte) {
	dir := filepath.Join(h.t.root, notifyDir)
	dfd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return
	}
	defer unix.Close(dfd)
	ents, _ := os.ReadDir(dir)
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return
	}
	defer unix.Close(fd)
	for _, e := range ents {
		name := e.Name()
		if !strings.HasPrefix(name, prefix) || strings.HasSuffix(name, overflowSuffix) {
			continue
		}
		to := &unix.SockaddrUnix{Name: shortPath(dfd, name)}
		switch err := unix.Sendto(fd, msg, unix.MSG_DONTWAIT, to); {
		case err == nil:
		case errors.Is(err, syscall.EAGAIN):
			_ = os.WriteFile(filepath.Join(dir, name+overflowSuffix), nil, 0o644)
		case errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ENOENT):
			_ = os.Remove(filepath.Join(dir, name))
		}
	}
}

// shortPath names a file in the directory open as dfd through /proc, since
// a socket address holds at most 107 bytes and a test's directory may be
// longer.
func shortPath(dfd int, name string) string {
	return fmt.Sprintf("/proc/self/fd/%d/%s", dfd, name)
}

// EventSources are the host's notifications as the driver's event sources
// (driver.Host.Events): uevents, and link notifications of the netdevs
// watchLink accepts.
func (h *Host) EventSources(watchLink func(string) bool) []hostevents.Source {
	return []hostevents.Source{
		&listener{h: h, prefix: "uevent-", parse: func(b []byte) []hostevents.Event {
			if e, ok := hostevents.ParseUevent(b); ok {
				return []hostevents.Event{e}
			}
			return nil
		}},
		&listener{h: h, prefix: "rtnl-", parse: func(b []byte) []hostevents.Event {
			evs, _ := hostevents.ParseLinkMessage(b)
			var out []hostevents.Event
			for _, e := range evs {
				if watchLink == nil || watchLink(e.Device) {
					out = append(out, e)
				}
			}
			return out
		}},
	}
}

var listenerSeq atomic.Uint64

// listener is one subscriber socket of the simulated kernel.
type listener struct {
	h      *Host
	prefix string
	parse  func([]byte) []hostevents.Event
}

func (l *listener) Name() string {
	return "simulated " + strings.TrimSuffix(l.prefix, "-") + " notifications of " + l.h.t.root
}

// Run implements hostevents.Source.
func (l *listener) Run(ctx context.Context, out chan<- hostevents.Event) error {
	dir := filepath.Join(l.h.t.root, notifyDir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	dfd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(dfd)
	name := fmt.Sprintf("%s%d-%d", l.prefix, os.Getpid(), listenerSeq.Add(1))
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: shortPath(dfd, name)}); err != nil {
		return fmt.Errorf("bind simulated notification socket %s/%s: %w", dir, name, err)
	}
	defer os.Remove(filepath.Join(dir, name))
	defer os.Remove(filepath.Join(dir, name+overflowSuffix))
	overflow := filepath.Join(dir, name+overflowSuffix)
	return hostevents.ReadDatagrams(ctx, fd, func(b []byte) {
		if os.Remove(overflow) == nil {
			sendEvent(ctx, out, hostevents.Event{Kind: hostevents.Lost, Detail: "receive buffer overflowed"})
		}
		for _, e := range l.parse(b) {
			sendEvent(ctx, out, e)
		}
	}, out)
}

func sendEvent(ctx context.Context, out chan<- hostevents.Event, e hostevents.Event) {
	select {
	case out <- e:
	case <-ctx.Done():
	}
}
