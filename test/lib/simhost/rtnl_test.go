package simhost

import (
	"encoding/binary"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/vfnet-io/vfnet/driver/kernel/vflink"
)

// The link layer sees the netdevs of the namespace it was opened on: the
// host's has the PFs, another only its loopback; files that are missing
// or not namespaces fail like vflink.Open.
func TestLinksAtNamespace(t *testing.T) {
	t.Parallel()
	h, err := Build(TempDir(t), E810Host())
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	host, err := h.LinksAt(h.HostNetns())
	if err != nil {
		t.Fatal(err)
	}
	if d, err := host.Resolve("enp59s0f0"); err != nil || d.Name != "enp59s0f0" || d.Index < 2 {
		t.Fatalf("host namespace: %+v %v", d, err)
	}
	if _, err := host.VF("enp59s0f0", 3); err != nil {
		t.Fatal(err)
	}
	podNs, err := h.AddNetns("pod")
	if err != nil {
		t.Fatal(err)
	}
	pod, err := h.LinksAt(podNs)
	if err != nil {
		t.Fatal(err)
	}
	if d, err := pod.Resolve("lo"); err != nil || d.Index != 1 {
		t.Fatalf("pod loopback: %+v %v", d, err)
	}
	_, rerr := pod.Resolve("enp59s0f0")
	_, verr := pod.VF("enp59s0f0", 3)
	serr := pod.SetMAC("enp59s0f0", 3, net.HardwareAddr{2, 0, 0, 0, 0, 9})
	for i, err := range []error{rerr, verr, serr} {
		var nf *vflink.LinkNotFoundError
		if !errors.As(err, &nf) || nf.Netns != podNs || !errors.Is(err, syscall.ENODEV) || !strings.Contains(err.Error(), "enp59s0f0 not found in network namespace "+podNs) {
			t.Errorf("op %d in the pod namespace: %v", i, err)
		}
	}
	if st, _ := h.VFState("enp59s0f0", 3); !isZeroMAC(st.MAC) {
		t.Fatalf("a set in the wrong namespace changed the VF: %+v", st)
	}
	if _, err := h.AddNetns("pod"); err == nil {
		t.Fatal("AddNetns twice with one name")
	}
	missing := filepath.Join(t.TempDir(), "1", "ns", "net")
	var nse *vflink.NamespaceError
	if _, err := h.LinksAt(missing); !errors.As(err, &nse) || !errors.Is(err, os.ErrNotExist) || !strings.Contains(err.Error(), "hostPID: true") {
		t.Fatalf("missing namespace file: %v", err)
	}
	plain := filepath.Join(t.TempDir(), "net")
	if err := os.WriteFile(plain, []byte("hello\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := h.LinksAt(plain); !errors.As(err, &nse) || !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("not a namespace file: %v", err)
	}
	// Another process reopening the tree finds the same host namespace.
	h2, err := Open(h.Root())
	if err != nil {
		t.Fatal(err)
	}
	defer h2.Close()
	if l, err := h2.LinksAt(h.HostNetns()); err != nil || !l.inHostNetns() {
		t.Fatalf("reopened host namespace: %v", err)
	}
}

// libraryRequest is the RTM_GETLINK netlink.LinkByName (v1.3.1) sends: VF
// info with statistics.
func libraryRequest(name string) []byte {
	req := nl.NewNetlinkRequest(unix.RTM_GETLINK, unix.NLM_F_ACK)
	req.AddData(nl.NewIfInfomsg(unix.AF_UNSPEC))
	req.AddData(nl.NewRtAttr(unix.IFLA_EXT_MASK, nl.Uint32Attr(nl.RTEXT_FILTER_VF)))
	req.AddData(nl.NewRtAttr(unix.IFLA_IFNAME, nl.ZeroTerminated(name)))
	return req.Serialize()
}

// replySize is the size of the reply to a GETLINK of name with mask.
func replySize(t *testing.T, c vflink.Conn, name string, mask uint32) int {
	t.Helper()
	req := nl.NewNetlinkRequest(unix.RTM_GETLINK, 0)
	req.AddData(nl.NewIfInfomsg(unix.AF_UNSPEC))
	req.AddData(nl.NewRtAttr(unix.IFLA_EXT_MASK, nl.Uint32Attr(mask)))
	req.AddData(nl.NewRtAttr(unix.IFLA_IFNAME, nl.ZeroTerminated(name)))
	if err := c.Send(req.Serialize()); err != nil {
		t.Fatal(err)
	}
	n, err := c.Recv(nil, false)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestLinksReplySize measures the simulated kernel's RTM_NEWLINK for a PF
// with and without per-VF statistics: 296 and 196 bytes per VF (the
// layout of rtnl_fill_vfinfo), so 64 KiB holds about 220 VFs with
// statistics, as netlink.LinkByName reads them, and about 330 without.
// The library's way of reading (statistics, one 64 KiB receive) fails on a
// 256-VF PF; vflink's (no statistics, buffer sized to the reply) reads it.
func TestLinksReplySize(t *testing.T) {
	t.Parallel()
	spec := Spec{PFs: []PFSpec{E810PF("0000:3b:00.0", "", 256), E810PF("0000:3b:00.1", "", 0)}}
	spec.PFs[0].TotalVFs = 256
	spec.PFs[1].VFOffset = defaultOffset + 256 - 1 // after PF0's VFs
	h, err := Build(TempDir(t), spec)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	c := h.Links().Conn()
	per := map[string]int{}
	for _, m := range []struct {
		name string
		mask uint32
	}{{"with stats", vflink.RTEXTFilterVF}, {"without stats", vflink.RTEXTFilterVF | vflink.RTEXTFilterSkipStats}} {
		full, empty := replySize(t, c, "enp59s0f0", m.mask), replySize(t, c, "enp59s0f1", m.mask)
		per[m.name] = (full - empty) / 256
		t.Logf("%s: 256-VF PF reply %d bytes, 0-VF PF %d bytes, %d bytes per VF, %d VFs fit in 64 KiB",
			m.name, full, empty, per[m.name], (65536-empty)/per[m.name])
	}
	if per["with stats"] != 296 || per["without stats"] != 196 {
		t.Fatalf("bytes per VF %v, want 296 with statistics and 196 without (kernel layout)", per)
	}

	// The library's receive: one 64 KiB buffer.
	if err := c.Send(libraryRequest("enp59s0f0")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, nl.RECEIVE_BUFFER_SIZE)
	n, err := c.Recv(buf, false)
	if err != nil {
		t.Fatal(err)
	}
	if n <= len(buf) {
		t.Fatalf("the 256-VF reply with statistics (%d bytes) fits in 64 KiB", n)
	}
	if _, err := syscall.ParseNetlinkMessage(buf); err == nil {
		t.Fatal("a reply cut at 64 KiB parses")
	}
	r := vflink.Reader{Conn: c, Netns: h.HostNetns()}
	vfs, err := r.VFs("enp59s0f0")
	if err != nil || len(vfs) != 256 {
		t.Fatalf("vflink reads %d VFs: %v", len(vfs), err)
	}
}

// Above 65535 bytes the kernel's 16-bit nest length of IFLA_VFINFO_LIST
// wraps (here 400 VFs x 196 bytes): the library's parser then misreads the
// list; vflink walks it by its entries and reads every VF, the last one
// included.
func TestVFListWrapsAboveLimit(t *testing.T) {
	t.Parallel()
	pf := ConnectX6DxPF("0000:3b:00.0", "ens1f0np0", 400)
	pf.TotalVFs = 512
	h, err := Build(TempDir(t), Spec{PFs: []PFSpec{pf}})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	const name = "ens1f0np0"
	l := h.Links()
	mac := net.HardwareAddr{2, 0, 0, 0, 1, 0x8f}
	if err := l.SetMAC(name, 399, mac); err != nil {
		t.Fatal(err)
	}
	if err := l.SetVLAN(name, 399, 1234, 5, vflink.VLANProto8021Q); err != nil {
		t.Fatal(err)
	}
	if err := l.SetTrust(name, 0, true); err != nil {
		t.Fatal(err)
	}

	// The raw reply: the list's length field is the real length mod 64 Ki.
	c := l.Conn()
	if err := c.Send(libraryRequestMask(name, vflink.RTEXTFilterVF|vflink.RTEXTFilterSkipStats)); err != nil {
		t.Fatal(err)
	}
	n, _ := c.Recv(nil, true)
	b := make([]byte, n)
	if _, err := c.Recv(b, false); err != nil {
		t.Fatal(err)
	}
	declared, real := vfListLengths(t, b)
	if real <= 65535 || declared != real%65536 {
		t.Fatalf("IFLA_VFINFO_LIST is %d bytes, length field %d: not wrapped", real, declared)
	}
	t.Logf("400 VFs without statistics: IFLA_VFINFO_LIST %d bytes, nla_len %d", real, declared)
	// What the library makes of it.
	if link, err := netlink.LinkDeserialize(nil, b[unix.NLMSG_HDRLEN:]); err == nil && len(link.Attrs().Vfs) == 400 {
		t.Fatal("the library reads a wrapped VF list whole; the workaround is not needed")
	}

	vfs, err := l.VFs(name)
	if err != nil || len(vfs) != 400 {
		t.Fatalf("read %d VFs: %v", len(vfs), err)
	}
	if !vfs[0].Trust || vfs[399].MAC.String() != mac.String() || vfs[399].VLAN != 1234 || vfs[399].QoS != 5 || vfs[399].VLANProto != vflink.VLANProto8021Q {
		t.Fatalf("VF 0 %+v, VF 399 %+v", vfs[0], vfs[399])
	}
	if st, err := l.VF(name, 399); err != nil || st.MAC.String() != mac.String() {
		t.Fatalf("VF 399: %+v %v", st, err)
	}
}

func libraryRequestMask(name string, mask uint32) []byte {
	req := nl.NewNetlinkRequest(unix.RTM_GETLINK, 0)
	req.AddData(nl.NewIfInfomsg(unix.AF_UNSPEC))
	req.AddData(nl.NewRtAttr(unix.IFLA_EXT_MASK, nl.Uint32Attr(mask)))
	req.AddData(nl.NewRtAttr(unix.IFLA_IFNAME, nl.ZeroTerminated(name)))
	return req.Serialize()
}

// vfListLengths finds IFLA_VFINFO_LIST in an RTM_NEWLINK message and
// returns its length field and its real length (up to the next attribute
// that is not an IFLA_VF_INFO entry).
func vfListLengths(t *testing.T, b []byte) (declared, real int) {
	t.Helper()
	pos := unix.NLMSG_HDRLEN + unix.SizeofIfInfomsg
	for pos+4 <= len(b) {
		alen := int(binary.NativeEndian.Uint16(b[pos:]))
		typ := binary.NativeEndian.Uint16(b[pos+2:])
		if typ == unix.IFLA_VFINFO_LIST {
			p := pos + 4
			for p+4 <= len(b) && binary.NativeEndian.Uint16(b[p+2:]) == nl.IFLA_VF_INFO {
				p += align4(int(binary.NativeEndian.Uint16(b[p:])))
			}
			return alen, p - pos
		}
		pos += align4(alen)
	}
	t.Fatal("no IFLA_VFINFO_LIST in the reply")
	return 0, 0
}
