package prepare

import (
	"context"
	"fmt"
	"syscall"
	"testing"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	"github.com/vfnet-io/vfnet/driver/discovery"
	"github.com/vfnet-io/vfnet/driver/kernel/vflink"
	"github.com/vfnet-io/vfnet/driver/publish"
	"github.com/vfnet-io/vfnet/pkg/api/nodeconfig"
	"github.com/vfnet-io/vfnet/test/lib/preparetest"
	"github.com/vfnet-io/vfnet/test/lib/simhost"
)

// TestLargePFsEndToEnd runs 4 PFs x 256 VFs through discovery, slices,
// prepare and unprepare on the simulated host, whose rtnetlink builds each
// PF's reply as the kernel does: with per-VF statistics (what
// netlink.LinkByName asks for) a 256-VF PF's reply is past the library's
// 64 KiB receive buffer (vishvananda/netlink #960), so the driver's old
// link reads failed on every PF; vflink's reads leave statistics out and
// size the buffer to the reply.
func TestLargePFsEndToEnd(t *testing.T) {
	t.Parallel()
	e := preparetest.NewEnv(t, preparetest.FastDir(), simhost.LargeHost())
	links := e.Host.Links()
	pfs, err := e.Host.Sysfs().Discover(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := nodeconfig.Parse([]byte("apiVersion: vfnet.io/v1alpha1\nkind: NodeConfig\npfs:\n- deviceID: \"1593\"\n  network: big\n"), "node.yaml")
	if err != nil {
		t.Fatal(err)
	}
	res, err := discovery.Build(pfs, cfg, discovery.Options{Resolve: func(nd string) error { _, err := links.Resolve(nd); return err }})
	if err != nil || len(res.Devices) != 1024 || len(res.Skipped) != 0 {
		t.Fatalf("%d devices, err %v, skipped %v", len(res.Devices), err, res.Skipped)
	}
	out := publish.ResourceSlices(discovery.DriverName, preparetest.Node, publish.DriverResources(preparetest.Node, res.Devices, nil))
	if len(out) != 8 {
		t.Fatalf("%d slices, want 8", len(out))
	}

	// The read the library makes fails on every PF of this host.
	for _, pf := range pfs {
		if err := libraryRead(links.Conn(), pf.Uplink()); err == nil {
			t.Fatalf("PF %s: a 64 KiB receive of its VFs with statistics works; the test proves nothing", pf.Uplink())
		}
	}

	before := e.Snapshot(t)
	s := e.NewState(t, nil)
	var claims []types.UID
	for i, pf := range pfs {
		var dev string
		for _, d := range res.Devices {
			if d.PFAddress == pf.Address && d.VFIndex == 255 {
				dev = d.Name
			}
		}
		uid := types.UID(fmt.Sprintf("uid-%d", i))
		c := preparetest.Claim("ns", fmt.Sprintf("big-%d", i), uid, []string{dev},
			preparetest.Config("FromClaim", fmt.Sprintf(`{"apiVersion":"vfnet.io/v1alpha1","kind":"VFConfig","mac":"02:00:00:00:0%d:ff","vlan":%d}`, i, 100+i)))
		e.AddClaim(t, c)
		r, err := s.Prepare(context.Background(), []*resourceapi.ResourceClaim{c})
		if err != nil || r[uid].Err != nil {
			t.Fatalf("prepare %s on %s: %v %v", dev, pf.Uplink(), err, r[uid].Err)
		}
		st, err := links.VF(pf.Uplink(), 255)
		if err != nil || st.VLAN != 100+i || st.MAC.String() != fmt.Sprintf("02:00:00:00:0%d:ff", i) {
			t.Fatalf("VF 255 of %s after prepare: %+v %v", pf.Uplink(), st, err)
		}
		all, err := links.VFs(pf.Uplink())
		if err != nil || len(all) != 256 || all[255].VLAN != 100+i || all[254].VLAN != 0 {
			t.Fatalf("all VFs of %s: %d, %v", pf.Uplink(), len(all), err)
		}
		claims = append(claims, uid)
	}
	for i, uid := range claims {
		r, err := s.Unprepare(context.Background(), []kubeletplugin.NamespacedObject{{UID: uid, NamespacedName: types.NamespacedName{Namespace: "ns", Name: fmt.Sprintf("big-%d", i)}}})
		if err != nil || r[uid] != nil {
			t.Fatalf("unprepare %s: %v %v", uid, err, r[uid])
		}
	}
	if after := e.Snapshot(t); after.String() != before.String() {
		t.Fatalf("host differs after unprepare")
	}
}

// libraryRead is netlink.LinkByName's read (v1.3.1): VF info with
// statistics, received into one 64 KiB buffer.
func libraryRead(c vflink.Conn, name string) error {
	req := nl.NewNetlinkRequest(unix.RTM_GETLINK, unix.NLM_F_ACK)
	req.AddData(nl.NewIfInfomsg(unix.AF_UNSPEC))
	req.AddData(nl.NewRtAttr(unix.IFLA_EXT_MASK, nl.Uint32Attr(nl.RTEXT_FILTER_VF)))
	req.AddData(nl.NewRtAttr(unix.IFLA_IFNAME, nl.ZeroTerminated(name)))
	if err := c.Send(req.Serialize()); err != nil {
		return err
	}
	buf := make([]byte, nl.RECEIVE_BUFFER_SIZE)
	n, err := c.Recv(buf, false)
	if err != nil {
		return err
	}
	_, err = syscall.ParseNetlinkMessage(buf[:min(n, len(buf))])
	return err
}
