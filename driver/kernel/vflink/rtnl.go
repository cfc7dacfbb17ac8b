package vflink

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"syscall"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// Extended-info filters for IFLA_EXT_MASK (linux/rtnetlink.h).
const (
	// RTEXTFilterVF asks for IFLA_NUM_VF and IFLA_VFINFO_LIST.
	RTEXTFilterVF = 1 << 0
	// RTEXTFilterSkipStats leaves out statistics, the per-VF IFLA_VF_STATS
	// nest included (which roughly halves the VF list; kernels older than
	// that filter ignore the bit and the sized receive still reads all).
	RTEXTFilterSkipStats = 1 << 3
)

// vfReadMask is what a VF read asks for: VF info without statistics.
const vfReadMask = RTEXTFilterVF | RTEXTFilterSkipStats

// Conn is a route netlink socket as the reader uses it: one datagram per
// kernel reply.
type Conn interface {
	Send(msg []byte) error
	// Recv reads the next datagram into b and returns its full length,
	// as recvfrom(2) with MSG_TRUNC does: a length above len(b) means the
	// datagram was cut. With peek the datagram stays queued.
	Recv(b []byte, peek bool) (int, error)
}

// Reader reads links over a Conn with its own RTM_GETLINK requests instead
// of netlink.LinkByName: the library receives into a fixed 64 KiB buffer
// and asks for per-VF statistics, so a PF with more than about 220 VFs
// (296 bytes each with statistics) overflows it (vishvananda/netlink
// #960). Here the request leaves statistics out and the receive buffer is
// sized to the reply. A Reader is not safe for concurrent use.
type Reader struct {
	Conn Conn
	// Netns names the namespace Conn is in, for errors.
	Netns string
	seq   uint32
	buf   []byte
}

// linkRequest is an RTM_GETLINK request for the netdev name with the
// extended-info mask mask.
func linkRequest(name string, mask uint32, seq uint32) []byte {
	req := nl.NewNetlinkRequest(unix.RTM_GETLINK, 0)
	req.Seq = seq
	req.AddData(nl.NewIfInfomsg(unix.AF_UNSPEC))
	req.AddData(nl.NewRtAttr(unix.IFLA_EXT_MASK, nl.Uint32Attr(mask)))
	attr := unix.IFLA_IFNAME
	if len(name) > unix.IFNAMSIZ-1 {
		attr = unix.IFLA_ALT_IFNAME
	}
	req.AddData(nl.NewRtAttr(attr, nl.ZeroTerminated(name)))
	return req.Serialize()
}

// vfReadRequest is the RTM_GETLINK request a VF read sends.
func vfReadRequest(name string, seq uint32) []byte { return linkRequest(name, vfReadMask, seq) }

// recvWhole receives one datagram whole: it peeks at the length first and
// grows buf to fit.
func recvWhole(c Conn, buf []byte) ([]byte, error) {
	for {
		n, err := c.Recv(nil, true)
		if err != nil {
			return buf, err
		}
		if n > cap(buf) {
			buf = make([]byte, n)
		}
		buf = buf[:cap(buf)]
		m, err := c.Recv(buf, false)
		if err != nil {
			return buf, err
		}
		if m <= len(buf) {
			return buf[:m], nil
		}
		// Another datagram than the one peeked at (cannot happen with one
		// reader per socket): read again with its size.
	}
}

// linkReply is the part of an RTM_NEWLINK message the driver uses.
type linkReply struct {
	Index  int
	Name   string
	NumVFs int // -1 when the reply has no IFLA_NUM_VF
	VFs    []netlink.VfInfo
}

// get sends an RTM_GETLINK for name with mask and returns the reply.
func (r *Reader) get(name string, mask uint32) (linkReply, error) {
	r.seq++
	seq := r.seq
	if err := r.Conn.Send(linkRequest(name, mask, seq)); err != nil {
		return linkReply{}, fmt.Errorf("send RTM_GETLINK for %s: %w", name, err)
	}
	for {
		var err error
		r.buf, err = recvWhole(r.Conn, r.buf)
		if err != nil {
			return linkReply{}, fmt.Errorf("receive RTM_GETLINK reply for %s: %w", name, err)
		}
		msgs, err := syscall.ParseNetlinkMessage(r.buf)
		if err != nil {
			return linkReply{}, fmt.Errorf("RTM_GETLINK reply for %s (%d bytes): %w", name, len(r.buf), err)
		}
		for _, m := range msgs {
			if m.Header.Seq != seq {
				continue // a late answer to an earlier request
			}
			switch m.Header.Type {
			case unix.NLMSG_ERROR:
				if len(m.Data) < 4 {
					return linkReply{}, fmt.Errorf("RTM_GETLINK for %s: short NLMSG_ERROR", name)
				}
				errno := syscall.Errno(-int32(binary.NativeEndian.Uint32(m.Data[:4])))
				if errno == syscall.ENODEV {
					return linkReply{}, &LinkNotFoundError{Name: name, Netns: r.Netns}
				}
				if errno == 0 {
					continue // an ACK
				}
				return linkReply{}, fmt.Errorf("RTM_GETLINK for %s: %w", name, errno)
			case unix.RTM_NEWLINK:
				rep, err := parseLink(m.Data)
				if err != nil {
					return linkReply{}, fmt.Errorf("RTM_NEWLINK for %s: %w", name, err)
				}
				return rep, nil
			}
		}
	}
}

// Resolve looks the netdev up without its VF list.
func (r *Reader) Resolve(name string) (Netdev, error) {
	rep, err := r.get(name, RTEXTFilterSkipStats)
	if err != nil {
		return Netdev{}, err
	}
	return Netdev{Name: rep.Name, Index: rep.Index}, nil
}

// VFs reads every VF of the PF netdev pf in one request.
func (r *Reader) VFs(pf string) ([]VFState, error) {
	rep, err := r.get(pf, vfReadMask)
	if err != nil {
		return nil, err
	}
	out := make([]VFState, len(rep.VFs))
	for i, info := range rep.VFs {
		out[i] = stateFromInfo(info)
	}
	return out, nil
}

// VF reads one VF of the PF netdev pf.
func (r *Reader) VF(pf string, vf int) (VFState, error) {
	rep, err := r.get(pf, vfReadMask)
	if err != nil {
		return VFState{}, err
	}
	for _, info := range rep.VFs {
		if info.ID == vf {
			return stateFromInfo(info), nil
		}
	}
	// EINVAL, as the kernel answers a set on a VF index it does not have.
	return VFState{}, fmt.Errorf("PF %s reports no VF %d (it reports %d VFs): %w", pf, vf, len(rep.VFs), syscall.EINVAL)
}

// attrType strips the nested and byte-order flags (NLA_F_NESTED,
// NLA_F_NET_BYTEORDER) off an attribute type.
func attrType(t uint16) uint16 { return t &^ (1<<15 | 1<<14) }

func align4(n int) int { return (n + unix.NLA_ALIGNTO - 1) &^ (unix.NLA_ALIGNTO - 1) }

// parseLink decodes an RTM_NEWLINK payload (ifinfomsg and attributes).
//
// The kernel closes a nest by storing its length in the 16-bit nla_len, so
// an IFLA_VFINFO_LIST longer than 65535 bytes (more than about 334 VFs of
// 196 bytes each even without statistics) carries its length modulo 65536.
// The list is therefore walked entry by entry (each IFLA_VF_INFO is small
// and exact) up to IFLA_NUM_VF entries, and its end is the last entry
// boundary the wrapped length agrees with.
func parseLink(b []byte) (linkReply, error) {
	rep := linkReply{NumVFs: -1}
	if len(b) < unix.SizeofIfInfomsg {
		return rep, fmt.Errorf("%d bytes, shorter than ifinfomsg", len(b))
	}
	rep.Index = int(int32(binary.NativeEndian.Uint32(b[4:8])))
	pos := align4(unix.SizeofIfInfomsg)
	for pos+unix.SizeofRtAttr <= len(b) {
		alen := int(binary.NativeEndian.Uint16(b[pos:]))
		typ := attrType(binary.NativeEndian.Uint16(b[pos+2:]))
		if typ == unix.IFLA_VFINFO_LIST {
			end, vfs, err := parseVFList(b, pos, alen, rep.NumVFs)
			if err != nil {
				return rep, err
			}
			rep.VFs = vfs
			pos = end
			continue
		}
		if alen < unix.SizeofRtAttr || pos+alen > len(b) {
			return rep, fmt.Errorf("attribute %d at offset %d has length %d, past the message end (%d bytes)", typ, pos, alen, len(b))
		}
		val := b[pos+unix.SizeofRtAttr : pos+alen]
		switch typ {
		case unix.IFLA_IFNAME:
			rep.Name = nl.BytesToString(val)
		case unix.IFLA_NUM_VF:
			if len(val) >= 4 {
				rep.NumVFs = int(binary.NativeEndian.Uint32(val))
			}
		}
		pos += align4(alen)
	}
	return rep, nil
}

// parseVFList walks the IFLA_VFINFO_LIST nest at off, whose (16-bit)
// length field says alen, and returns the offset after it and its VFs.
func parseVFList(b []byte, off, alen, numVFs int) (int, []netlink.VfInfo, error) {
	start := off + unix.SizeofRtAttr
	type entry struct{ at, end int }
	var entries []entry
	for p := start; p+unix.SizeofRtAttr <= len(b) && (numVFs < 0 || len(entries) < numVFs); {
		elen := int(binary.NativeEndian.Uint16(b[p:]))
		if attrType(binary.NativeEndian.Uint16(b[p+2:])) != nl.IFLA_VF_INFO || elen < unix.SizeofRtAttr || p+elen > len(b) {
			break
		}
		entries = append(entries, entry{p, p + elen})
		p += align4(elen)
	}
	// The list ends at the last entry boundary whose length agrees with
	// the 16-bit field.
	k := -1
	for i := len(entries); i >= 0; i-- {
		end := start
		if i > 0 {
			end = align4(entries[i-1].end)
		}
		if (end-off)&0xffff == alen&0xffff {
			k = i
			break
		}
	}
	if k < 0 {
		return 0, nil, fmt.Errorf("IFLA_VFINFO_LIST at offset %d: its length field (%d) matches no boundary of its %d VF entries", off, alen, len(entries))
	}
	vfs := make([]netlink.VfInfo, 0, k)
	for _, e := range entries[:k] {
		vf, err := parseVFInfo(b[e.at+unix.SizeofRtAttr : e.end])
		if err != nil {
			return 0, nil, fmt.Errorf("IFLA_VF_INFO at offset %d: %w", e.at, err)
		}
		vfs = append(vfs, vf)
	}
	end := start
	if k > 0 {
		end = align4(entries[k-1].end)
	}
	return end, vfs, nil
}

// parseVFInfo decodes one IFLA_VF_INFO nest with the library's helpers.
// The VF number comes from the entries themselves (ifla_vf_mac.vf), not
// from the position: the kernel skips a VF whose driver cannot report it.
func parseVFInfo(b []byte) (netlink.VfInfo, error) {
	attrs, err := nl.ParseRouteAttr(b)
	if err != nil {
		return netlink.VfInfo{}, err
	}
	vf := netlink.VfInfo{ID: -1}
	for _, a := range attrs {
		v := a.Value
		if need := vfAttrSize(attrType(a.Attr.Type)); len(v) < need {
			return vf, fmt.Errorf("attribute %d has %d bytes, want %d", a.Attr.Type, len(v), need)
		}
		switch attrType(a.Attr.Type) {
		case nl.IFLA_VF_MAC:
			m := nl.DeserializeVfMac(v)
			vf.ID = int(m.Vf)
			vf.Mac = append(net.HardwareAddr(nil), m.Mac[:6]...)
		case nl.IFLA_VF_VLAN:
			vl := nl.DeserializeVfVlan(v)
			vf.Vlan, vf.Qos = int(vl.Vlan), int(vl.Qos)
		case nl.IFLA_VF_VLAN_LIST:
			list, err := nl.DeserializeVfVlanList(v)
			if err != nil {
				return vf, err
			}
			vf.VlanProto = int(list[0].VlanProto)
		case nl.IFLA_VF_SPOOFCHK:
			vf.Spoofchk = nl.DeserializeVfSpoofchk(v).Setting != 0
		case nl.IFLA_VF_LINK_STATE:
			vf.LinkState = nl.DeserializeVfLinkState(v).LinkState
		case nl.IFLA_VF_RATE:
			r := nl.DeserializeVfRate(v)
			vf.MinTxRate, vf.MaxTxRate = r.MinTxRate, r.MaxTxRate
		case nl.IFLA_VF_TRUST:
			vf.Trust = nl.DeserializeVfTrust(v).Setting
		}
	}
	if vf.ID < 0 {
		return vf, errors.New("no IFLA_VF_MAC (the VF number)")
	}
	return vf, nil
}

// vfAttrSize is the payload size the library's Deserialize helper for a
// VF attribute reads (0: no fixed size).
func vfAttrSize(t uint16) int {
	switch t {
	case nl.IFLA_VF_MAC:
		return nl.SizeofVfMac
	case nl.IFLA_VF_VLAN:
		return nl.SizeofVfVlan
	case nl.IFLA_VF_SPOOFCHK:
		return nl.SizeofVfSpoofchk
	case nl.IFLA_VF_LINK_STATE:
		return nl.SizeofVfLinkState
	case nl.IFLA_VF_RATE:
		return nl.SizeofVfRate
	case nl.IFLA_VF_TRUST:
		return nl.SizeofVfTrust
	}
	return 0
}

// fdConn is a Conn over a socket file descriptor.
type fdConn struct {
	fd      int
	timeout int // milliseconds
}

func (c fdConn) Send(msg []byte) error {
	return unix.Sendto(c.fd, msg, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK})
}

func (c fdConn) Recv(b []byte, peek bool) (int, error) {
	for {
		fds := []unix.PollFd{{Fd: int32(c.fd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, c.timeout)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return 0, err
		}
		if n == 0 {
			return 0, fmt.Errorf("no reply from the kernel within %d ms", c.timeout)
		}
		flags := unix.MSG_TRUNC
		if peek {
			flags |= unix.MSG_PEEK
		}
		n, _, err = unix.Recvfrom(c.fd, b, flags)
		if errors.Is(err, unix.EINTR) || errors.Is(err, unix.EAGAIN) {
			continue
		}
		return n, err
	}
}
