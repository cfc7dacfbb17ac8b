package hostevents

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"path"
	"strings"
	"syscall"

	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/vfnet-io/vfnet/pkg/contract/pciaddr"
)

// ParseUevent decodes one kobject uevent as the kernel sends it on
// NETLINK_KOBJECT_UEVENT: "ACTION@DEVPATH" then KEY=VALUE fields, each
// NUL-terminated. ok is false for what is not a kernel uevent (udevd's
// re-broadcasts start with "libudev", and go to another group anyway) and
// for the subsystems the driver does not care about: only PCI functions and
// netdevs change what it offers.
func ParseUevent(msg []byte) (e Event, ok bool) {
	head, rest, found := bytes.Cut(msg, []byte{0})
	if !found || !bytes.Contains(head, []byte{'@'}) || bytes.HasPrefix(head, []byte("libudev")) {
		return Event{}, false
	}
	fields := map[string]string{}
	for len(rest) > 0 {
		var kv []byte
		kv, rest, _ = bytes.Cut(rest, []byte{0})
		if k, v, ok := strings.Cut(string(kv), "="); ok {
			fields[k] = v
		}
	}
	e = Event{Kind: Uevent, Action: fields["ACTION"], Subsystem: fields["SUBSYSTEM"]}
	switch e.Subsystem {
	case "pci":
		e.Device = fields["PCI_SLOT_NAME"]
		if e.Device == "" {
			e.Device = path.Base(fields["DEVPATH"])
		}
		e.Detail = fields["DRIVER"]
	case "net":
		e.Device = fields["INTERFACE"]
		e.Function = netdevFunction(fields["DEVPATH"])
		if old := fields["DEVPATH_OLD"]; old != "" {
			e.Detail = "was " + path.Base(old)
		}
	default:
		return Event{}, false
	}
	if e.Action == "" {
		return Event{}, false
	}
	return e, true
}

// netdevFunction is the PCI function in a netdev's DEVPATH
// (/devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0/net/ens1f0): the path
// element before "net", when it is a PCI address.
func netdevFunction(devpath string) string {
	parts := strings.Split(devpath, "/")
	for i := len(parts) - 1; i > 0; i-- {
		if parts[i] == "net" {
			if _, err := pciaddr.ParseKernelName(parts[i-1]); err == nil {
				return parts[i-1]
			}
			return ""
		}
	}
	return ""
}

// uevent socket settings: the kernel's multicast group of kernel uevents,
// and a receive buffer big enough for a sriov_numvfs burst (each uevent is
// a few hundred bytes; the kernel drops what does not fit, and says so with
// ENOBUFS).
const (
	ueventGroup   = 1
	ueventBufSize = 4 << 20
)

// pollTimeout is how often a wait for a datagram checks for cancellation.
const pollTimeout = 500 // ms

// UeventSource listens to kobject uevents in the network namespace of the
// file Netns. PCI uevents reach every namespace of the initial user
// namespace; a netdev's only the namespace it is in, which is why the
// socket is opened in the host's, where the PFs are.
type UeventSource struct{ Netns string }

// Name implements Source.
func (s UeventSource) Name() string { return "kobject uevents in " + s.Netns }

// Run implements Source.
func (s UeventSource) Run(ctx context.Context, out chan<- Event) error {
	ns, err := netns.GetFromPath(s.Netns)
	if err != nil {
		return fmt.Errorf("open network namespace %s for kobject uevents: %w", s.Netns, err)
	}
	sock, err := nl.SubscribeAt(ns, netns.None(), unix.NETLINK_KOBJECT_UEVENT, ueventGroup)
	ns.Close()
	if err != nil {
		return fmt.Errorf("subscribe to kobject uevents in %s (needs CAP_NET_ADMIN there): %w", s.Netns, err)
	}
	defer sock.Close()
	fd := sock.GetFd()
	// SO_RCVBUFFORCE passes the system's rmem_max (CAP_NET_ADMIN); a
	// failure leaves the default, and an overflow is then reported as Lost.
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, ueventBufSize); err != nil {
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, ueventBufSize)
	}
	return ReadDatagrams(ctx, fd, func(b []byte) {
		if e, ok := ParseUevent(b); ok {
			send(ctx, out, e)
		}
	}, out)
}

// ReadDatagrams waits for datagrams on fd (blocking or not: it polls,
// never spins) and hands each to fn until ctx ends. An overflow (ENOBUFS)
// is sent to out as a Lost event: the host changed in ways no event told.
func ReadDatagrams(ctx context.Context, fd int, fn func([]byte), out chan<- Event) error {
	buf := make([]byte, 64<<10)
	pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	for ctx.Err() == nil {
		ready, err := unix.Poll(pfd, pollTimeout)
		if errors.Is(err, syscall.EINTR) || ready == 0 {
			continue
		}
		if err != nil {
			return fmt.Errorf("poll: %w", err)
		}
		n, _, err := unix.Recvfrom(fd, buf, unix.MSG_DONTWAIT)
		switch {
		case err == nil:
			fn(buf[:n])
		case errors.Is(err, syscall.EAGAIN), errors.Is(err, syscall.EINTR):
		case errors.Is(err, syscall.ENOBUFS):
			send(ctx, out, Event{Kind: Lost, Detail: "receive buffer overflowed"})
		default:
			return fmt.Errorf("receive: %w", err)
		}
	}
	return nil
}

func send(ctx context.Context, out chan<- Event, e Event) {
	select {
	case out <- e:
	case <-ctx.Done():
	}
}
