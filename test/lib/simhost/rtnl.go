package simhost

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/vfnet-io/vfnet/driver/kernel/vflink"
)

// Network namespaces. A namespace is named by a file, as on Linux
// (/proc/<pid>/ns/net, a bind mount under /run/netns); here the file
// holds the namespace's identity ("net:[4026531840]", what readlink of
// the real file shows). Every netdev of the simulated host is in the
// host's namespace, whose file is <proc root>/1/ns/net; AddNetns makes
// other ones, which hold only their loopback device, like a pod's
// namespace before its CNI plugin runs.
const hostNetnsID = "net:[4026531840]"

// HostNetns is the file naming the host's network namespace
// (--host-netns of a driver on this host).
func (h *Host) HostNetns() string { return filepath.Join(h.ProcRoot(), "1", "ns", "net") }

func (h *Host) ensureHostNetns() error {
	p := h.HostNetns()
	if _, err := os.Stat(p); err == nil {
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	return os.WriteFile(p, []byte(hostNetnsID+"\n"), 0o444)
}

// AddNetns creates another network namespace and returns the path of its
// file (next to the sysfs root, under netns/).
func (h *Host) AddNetns(name string) (string, error) {
	if name == "" || strings.ContainsRune(name, '/') {
		return "", fmt.Errorf("network namespace name %q: want a non-empty name without /", name)
	}
	dir := filepath.Join(filepath.Dir(h.t.root), "netns")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return "", err
	}
	p := filepath.Join(dir, name)
	id := fmt.Sprintf("net:[%d]", 4026532000+len(ents))
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o444)
	if err != nil {
		return "", fmt.Errorf("add network namespace: %w", err)
	}
	defer f.Close()
	if _, err := f.WriteString(id + "\n"); err != nil {
		return "", err
	}
	return p, nil
}

// LinksAt is the simulated VF link layer opened on the namespace file
// nsPath, as vflink.Open(nsPath) is on a real host: it sees only that
// namespace's netdevs. A missing file or one that is not a namespace fails
// like vflink.Open.
func (h *Host) LinksAt(nsPath string) (*Links, error) {
	b, err := os.ReadFile(nsPath)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			err = syscall.ENOENT
		}
		return nil, &vflink.NamespaceError{Path: nsPath, Err: err}
	}
	id := strings.TrimSpace(string(b))
	if !strings.HasPrefix(id, "net:[") || !strings.HasSuffix(id, "]") {
		return nil, &vflink.NamespaceError{Path: nsPath, Err: syscall.EINVAL}
	}
	return &Links{h: h, netns: nsPath, nsID: id}, nil
}

// Netns is the namespace file the link layer was opened on.
func (l *Links) Netns() string { return l.netns }

// inHostNetns reports whether the link layer sees the host's netdevs.
func (l *Links) inHostNetns() bool { return l.nsID == hostNetnsID }

// notFound is the kernel's ENODEV for a netdev this namespace lacks.
func (l *Links) notFound(name string) error {
	return &vflink.LinkNotFoundError{Name: name, Netns: l.netns}
}

// rtnlConn is a simulated route netlink socket in the link layer's
// namespace: Send hands a request to the simulated kernel, which queues
// its reply as one datagram; Recv has recvfrom's MSG_TRUNC and MSG_PEEK
// semantics, so a reader with too small a buffer gets a cut message, as
// from the kernel. The caller holds the host lock.
type rtnlConn struct {
	l     *Links
	queue [][]byte
}

var _ vflink.Conn = (*rtnlConn)(nil)

func (c *rtnlConn) Send(msg []byte) error {
	reply, err := c.l.answer(msg)
	if err != nil {
		return err
	}
	c.queue = append(c.queue, reply)
	return nil
}

func (c *rtnlConn) Recv(b []byte, peek bool) (int, error) {
	if len(c.queue) == 0 {
		return 0, syscall.EAGAIN
	}
	d := c.queue[0]
	copy(b, d)
	if !peek {
		c.queue = c.queue[1:]
	}
	return len(d), nil
}

// reader is vflink's reader over a simulated socket (caller holds the lock).
func (l *Links) reader() *vflink.Reader {
	return &vflink.Reader{Conn: &rtnlConn{l: l}, Netns: l.netns}
}

// Kernel structure sizes the replies are built from (x86-64).
const (
	sizeofLinkStats64 = 25 * 8 // struct rtnl_link_stats64 (6.x)
	sizeofLinkStats   = 24 * 4 // struct rtnl_link_stats
)

// answer is the simulated kernel's rtnetlink: it handles RTM_GETLINK by
// name or index with IFLA_EXT_MASK, and answers anything else with
// EOPNOTSUPP (caller holds the lock).
func (l *Links) answer(req []byte) ([]byte, error) {
	msgs, err := syscall.ParseNetlinkMessage(req)
	if err != nil || len(msgs) != 1 {
		return nil, syscall.EINVAL // sendmsg of a malformed message
	}
	m := msgs[0]
	errReply := func(errno syscall.Errno) []byte {
		b := make([]byte, unix.NLMSG_HDRLEN+4+unix.NLMSG_HDRLEN)
		putHdr(b, len(b), unix.NLMSG_ERROR, m.Header.Seq)
		binary.NativeEndian.PutUint32(b[unix.NLMSG_HDRLEN:], uint32(-int32(errno)))
		copy(b[unix.NLMSG_HDRLEN+4:], req[:unix.NLMSG_HDRLEN])
		return b
	}
	if m.Header.Type != unix.RTM_GETLINK || len(m.Data) < unix.SizeofIfInfomsg {
		return errReply(syscall.EOPNOTSUPP), nil
	}
	index := int(int32(binary.NativeEndian.Uint32(m.Data[4:8])))
	attrs, err := nl.ParseRouteAttr(m.Data[unix.SizeofIfInfomsg:])
	if err != nil {
		return errReply(syscall.EINVAL), nil
	}
	var name string
	var mask uint32
	for _, a := range attrs {
		switch a.Attr.Type {
		case unix.IFLA_IFNAME, unix.IFLA_ALT_IFNAME:
			name = nl.BytesToString(a.Value)
		case unix.IFLA_EXT_MASK:
			if len(a.Value) >= 4 {
				mask = binary.NativeEndian.Uint32(a.Value)
			}
		}
	}
	if mask&vflink.RTEXTFilterVF != 0 {
		if errno, ok := takeFail(l.fails, func(o string) bool { return o == OpVF }); ok {
			return errReply(errno), nil
		}
	}
	dev, ok := l.netdevs().find(name, index)
	if !ok {
		return errReply(syscall.ENODEV), nil
	}
	b, err := l.linkMessage(dev, mask, m.Header.Seq)
	if err != nil {
		return nil, err
	}
	return b, nil
}

func putHdr(b []byte, length int, typ uint16, seq uint32) {
	binary.NativeEndian.PutUint32(b[0:], uint32(length))
	binary.NativeEndian.PutUint16(b[4:], typ)
	binary.NativeEndian.PutUint16(b[6:], 0)
	binary.NativeEndian.PutUint32(b[8:], seq)
	binary.NativeEndian.PutUint32(b[12:], 0)
}

// simNetdev is a netdev as the simulated rtnetlink shows it.
type simNetdev struct {
	name  string
	index int
	dir   string // tree path of the netdev ("" for loopback)
}

type netdevList []simNetdev

func (ds netdevList) find(name string, index int) (simNetdev, bool) {
	for _, d := range ds {
		if (name != "" && d.name == name) || (name == "" && index > 0 && d.index == index) {
			return d, true
		}
	}
	return simNetdev{}, false
}

// netdevs lists the netdevs of the link layer's namespace. Every
// namespace has lo (index 1); the host's also has every class/net entry,
// numbered in name order from 2 (the simulation keeps no ifindex; a rename
// may renumber, which nothing here depends on).
func (l *Links) netdevs() netdevList {
	out := netdevList{{name: "lo", index: 1}}
	if !l.inHostNetns() {
		return out
	}
	ents, _ := os.ReadDir(l.h.t.abs(classNet))
	names := make([]string, 0, len(ents))
	for _, e := range ents {
		names = append(names, e.Name())
	}
	sort.Strings(names)
	for i, n := range names {
		nd, err := l.h.t.readlink(classNet + "/" + n)
		if err != nil || !l.h.t.exists(nd) {
			continue
		}
		out = append(out, simNetdev{name: n, index: 2 + i, dir: nd})
	}
	return out
}

// linkMessage builds the RTM_NEWLINK reply for dev with the attributes the
// kernel's rtnl_fill_ifinfo puts in for mask, in its layout: for a PF with
// RTEXT_FILTER_VF, IFLA_NUM_VF and an IFLA_VFINFO_LIST of one IFLA_VF_INFO
// nest per VF (196 bytes each, 296 with the IFLA_VF_STATS nest that
// RTEXT_FILTER_SKIP_STATS leaves out). Nest lengths are 16-bit, so a list
// above 65535 bytes wraps as the kernel's does.
func (l *Links) linkMessage(dev simNetdev, mask uint32, seq uint32) ([]byte, error) {
	t := l.h.t
	ifi := nl.NewIfInfomsg(unix.AF_UNSPEC)
	ifi.Index = int32(dev.index)
	ifi.Type = unix.ARPHRD_LOOPBACK
	var attrs []*nl.RtAttr
	add := func(typ int, data []byte) *nl.RtAttr {
		a := nl.NewRtAttr(typ, data)
		attrs = append(attrs, a)
		return a
	}
	add(unix.IFLA_IFNAME, nl.ZeroTerminated(dev.name))
	add(unix.IFLA_MTU, nl.Uint32Attr(1500))
	mac := make([]byte, 6)
	var pfDir string
	numVFs := 0
	isIB := false
	if dev.dir != "" {
		ifi.Type = unix.ARPHRD_ETHER
		if typ, _ := t.read(dev.dir + "/type"); typ == "32" {
			ifi.Type, isIB = unix.ARPHRD_INFINIBAND, true
		}
		op, _ := t.read(dev.dir + "/operstate")
		if op == "up" {
			ifi.Flags |= unix.IFF_UP | unix.IFF_RUNNING
		}
		// IFLA_OPERSTATE as rtnl_fill_ifinfo puts it in (RFC 2863 values).
		add(unix.IFLA_OPERSTATE, []byte{operState(op)})
		if a, err := t.read(dev.dir + "/address"); err == nil {
			if hw, err := net.ParseMAC(a); err == nil {
				mac = hw
			}
		}
		pfDir = dev.dir[:strings.LastIndex(dev.dir, "/net/")]
		if n, err := t.read(pfDir + "/sriov_numvfs"); err == nil {
			numVFs, _ = strconv.Atoi(n)
		} else {
			pfDir = "" // not an SR-IOV PF: no ndo_get_vf_config
		}
	}
	add(unix.IFLA_ADDRESS, mac)
	add(unix.IFLA_STATS64, make([]byte, sizeofLinkStats64))
	add(unix.IFLA_STATS, make([]byte, sizeofLinkStats))
	if mask&vflink.RTEXTFilterVF != 0 && dev.dir != "" {
		add(unix.IFLA_NUM_VF, nl.Uint32Attr(uint32(numVFs)))
		if pfDir != "" {
			m, err := l.load()
			if err != nil {
				return nil, err
			}
			rt, err := l.h.loadRuntime()
			if err != nil {
				return nil, err
			}
			list := add(unix.IFLA_VFINFO_LIST, nil)
			for i := range numVFs {
				addVFInfo(list, i, l.reported(m, rt, dev.name, pfDir, i), isIB, mask&vflink.RTEXTFilterSkipStats == 0)
			}
		}
	}
	size := unix.NLMSG_HDRLEN + ifi.Len()
	for _, a := range attrs {
		size += align4(a.Len())
	}
	b := make([]byte, unix.NLMSG_HDRLEN, size)
	putHdr(b, size, unix.RTM_NEWLINK, seq)
	b = append(b, ifi.Serialize()...)
	for _, a := range attrs {
		s := a.Serialize()
		b = append(b, s...)
		b = append(b, make([]byte, align4(len(s))-len(s))...)
	}
	return b, nil
}

// operState is the IF_OPER_* value of a sysfs operstate string.
func operState(s string) byte {
	switch s {
	case "up":
		return byte(netlink.OperUp)
	case "down":
		return byte(netlink.OperDown)
	case "lowerlayerdown":
		return byte(netlink.OperLowerLayerDown)
	case "dormant":
		return byte(netlink.OperDormant)
	case "notpresent":
		return byte(netlink.OperNotPresent)
	case "testing":
		return byte(netlink.OperTesting)
	}
	return byte(netlink.OperUnknown)
}

func align4(n int) int { return (n + 3) &^ 3 }

// addVFInfo appends VF i's IFLA_VF_INFO nest as rtnl_fill_vfinfo does.
func addVFInfo(list *nl.RtAttr, i int, st vflink.VFState, ib, stats bool) {
	vf := uint32(i)
	info := list.AddRtAttr(nl.IFLA_VF_INFO, nil)
	vm := nl.VfMac{Vf: vf}
	copy(vm.Mac[:], st.MAC)
	info.AddRtAttr(nl.IFLA_VF_MAC, vm.Serialize())
	bc := make([]byte, 32) // struct ifla_vf_broadcast
	copy(bc, []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	info.AddRtAttr(unix.IFLA_VF_BROADCAST, bc)
	vl := nl.VfVlan{Vf: vf, Vlan: uint32(st.VLAN), Qos: uint32(st.QoS)}
	info.AddRtAttr(nl.IFLA_VF_VLAN, vl.Serialize())
	rate := nl.VfRate{Vf: vf, MinTxRate: uint32(st.MinTxRateMbps), MaxTxRate: uint32(st.MaxTxRateMbps)}
	info.AddRtAttr(nl.IFLA_VF_RATE, rate.Serialize())
	tx := nl.VfTxRate{Vf: vf, Rate: uint32(st.MaxTxRateMbps)}
	info.AddRtAttr(nl.IFLA_VF_TX_RATE, tx.Serialize())
	on := func(b bool) uint32 {
		if b {
			return 1
		}
		return 0
	}
	sp := nl.VfSpoofchk{Vf: vf, Setting: on(st.SpoofChk)}
	info.AddRtAttr(nl.IFLA_VF_SPOOFCHK, sp.Serialize())
	ls := nl.VfLinkState{Vf: vf}
	switch st.LinkState {
	case vflink.LinkStateEnable:
		ls.LinkState = nl.IFLA_VF_LINK_STATE_ENABLE
	case vflink.LinkStateDisable:
		ls.LinkState = nl.IFLA_VF_LINK_STATE_DISABLE
	}
	info.AddRtAttr(nl.IFLA_VF_LINK_STATE, ls.Serialize())
	rss := nl.VfRssQueryEn{Vf: vf}
	info.AddRtAttr(nl.IFLA_VF_RSS_QUERY_EN, rss.Serialize())
	tr := nl.VfTrust{Vf: vf, Setting: on(st.Trust)}
	info.AddRtAttr(nl.IFLA_VF_TRUST, tr.Serialize())
	if ib {
		// struct ifla_vf_guid {__u32 vf; __u64 guid;}: 16 bytes.
		for _, typ := range []int{nl.IFLA_VF_IB_NODE_GUID, nl.IFLA_VF_IB_PORT_GUID} {
			g := make([]byte, 16)
			binary.NativeEndian.PutUint32(g, vf)
			info.AddRtAttr(typ, g)
		}
	}
	// struct ifla_vf_vlan_info: vf, vlan, qos, __be16 proto (16 bytes).
	vi := make([]byte, 16)
	binary.NativeEndian.PutUint32(vi[0:], vf)
	binary.NativeEndian.PutUint32(vi[4:], uint32(st.VLAN))
	binary.NativeEndian.PutUint32(vi[8:], uint32(st.QoS))
	proto := uint16(unix.ETH_P_8021Q)
	if st.VLANProto == vflink.VLANProto8021AD {
		proto = unix.ETH_P_8021AD
	}
	binary.BigEndian.PutUint16(vi[12:], proto)
	info.AddRtAttr(nl.IFLA_VF_VLAN_LIST, nil).AddRtAttr(nl.IFLA_VF_VLAN_INFO, vi)
	if stats {
		s := info.AddRtAttr(nl.IFLA_VF_STATS, nil)
		// The kernel's numbering (6 is IFLA_VF_STATS_PAD, unused on
		// x86-64), from x/sys/unix: the nl package's constants skip it.
		for _, typ := range []int{unix.IFLA_VF_STATS_RX_PACKETS, unix.IFLA_VF_STATS_TX_PACKETS, unix.IFLA_VF_STATS_RX_BYTES,
			unix.IFLA_VF_STATS_TX_BYTES, unix.IFLA_VF_STATS_BROADCAST, unix.IFLA_VF_STATS_MULTICAST,
			unix.IFLA_VF_STATS_RX_DROPPED, unix.IFLA_VF_STATS_TX_DROPPED} {
			s.AddRtAttr(typ, make([]byte, 8))
		}
	}
}
