package vflink

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"syscall"
	"testing"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// The VF read asks for VF info without statistics (IFLA_EXT_MASK), by
// name; the running kernel accepts the request.
func TestVFReadRequest(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		nameAttr uint16
	}{{"enp59s0f0", unix.IFLA_IFNAME}, {"a-very-long-altname0", unix.IFLA_ALT_IFNAME}} {
		msgs, err := syscall.ParseNetlinkMessage(vfReadRequest(tc.name, 7))
		if err != nil || len(msgs) != 1 {
			t.Fatalf("%d messages: %v", len(msgs), err)
		}
		m := msgs[0]
		if m.Header.Type != unix.RTM_GETLINK || m.Header.Flags != unix.NLM_F_REQUEST || m.Header.Seq != 7 {
			t.Fatalf("header %+v", m.Header)
		}
		attrs, err := nl.ParseRouteAttr(m.Data[unix.SizeofIfInfomsg:])
		if err != nil {
			t.Fatal(err)
		}
		got := map[uint16][]byte{}
		for _, a := range attrs {
			got[a.Attr.Type] = a.Value
		}
		mask, ok := got[unix.IFLA_EXT_MASK]
		if !ok || binary.NativeEndian.Uint32(mask) != RTEXTFilterVF|RTEXTFilterSkipStats {
			t.Errorf("%s: IFLA_EXT_MASK %v, want VF|SKIP_STATS (%#x)", tc.name, mask, RTEXTFilterVF|RTEXTFilterSkipStats)
		}
		if nl.BytesToString(got[tc.nameAttr]) != tc.name {
			t.Errorf("%s: name attribute %d = %q", tc.name, tc.nameAttr, got[tc.nameAttr])
		}
	}

	needNetns(t)
	if err := <-inFreshNetns(func(string) error {
		fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
			return err
		}
		r := Reader{Conn: fdConn{fd: fd, timeout: 10_000}, Netns: "fresh"}
		if d, err := r.Resolve("lo"); err != nil || d.Index != 1 || d.Name != "lo" {
			return fmt.Errorf("resolve lo: %+v %v", d, err)
		}
		if vfs, err := r.VFs("lo"); err != nil || len(vfs) != 0 {
			return fmt.Errorf("VF read of lo: %d VFs, %v", len(vfs), err)
		}
		if _, err := r.VFs("nope0"); !IsLinkNotFound(err) {
			return fmt.Errorf("VF read of a missing link: %v", err)
		}
		return nil
	}, nil); err != nil {
		t.Fatal(err)
	}
}

// A datagram larger than 64 KiB (a PF with a few hundred VFs) is received
// whole; the library's single 64 KiB receive cuts it and it no longer
// parses. A unix datagram socket has the same MSG_PEEK|MSG_TRUNC semantics
// as a netlink one.
func TestRecvWholeLargeReply(t *testing.T) {
	t.Parallel()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fds[0])
	defer unix.Close(fds[1])
	if err := unix.SetsockoptInt(fds[0], unix.SOL_SOCKET, unix.SO_SNDBUF, 1<<20); err != nil {
		t.Fatal(err)
	}
	const size = 200_000
	msg := make([]byte, size)
	binary.NativeEndian.PutUint32(msg[0:], size)
	binary.NativeEndian.PutUint16(msg[4:], unix.RTM_NEWLINK)
	for i := unix.NLMSG_HDRLEN; i < size; i++ {
		msg[i] = byte(i * 7)
	}
	send := func() {
		t.Helper()
		if _, err := unix.Write(fds[0], msg); err != nil {
			t.Fatalf("send %d bytes: %v", size, err)
		}
	}
	send()
	c := fdConn{fd: fds[1], timeout: 10_000}
	got, err := recvWhole(c, make([]byte, 4096))
	if err != nil || !bytes.Equal(got, msg) {
		t.Fatalf("received %d of %d bytes: %v", len(got), size, err)
	}
	if ms, err := syscall.ParseNetlinkMessage(got); err != nil || len(ms) != 1 {
		t.Fatalf("whole message does not parse: %v", err)
	}
	send()
	buf := make([]byte, nl.RECEIVE_BUFFER_SIZE)
	n, _, err := unix.Recvfrom(fds[1], buf, 0)
	if err != nil || n != len(buf) {
		t.Fatalf("library-style receive: %d bytes, %v", n, err)
	}
	if _, err := syscall.ParseNetlinkMessage(buf[:n]); err == nil {
		t.Fatal("a message cut at 64 KiB parses")
	}
}
