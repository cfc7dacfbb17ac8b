package driver

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/vfnet-io/vfnet/driver/kernel/sysfs"
	"github.com/vfnet-io/vfnet/driver/standby"
	"github.com/vfnet-io/vfnet/test/lib/pfnetns"
	"github.com/vfnet-io/vfnet/test/lib/simhost"
)

// standbyBridge refuses, naming the PF, the field and the fix: a PF
// without standby.bridge, a bridge that is not on the node, and (bridge
// there) a runtime whose NRI the driver is not connected to.
func TestStandbyBridgeRefusals(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("network namespaces need root") // make test-unit runs as root
	}
	h, err := simhost.Build(t.TempDir(), simhost.E810Host())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	sys := sysfs.New(h.Root())
	pfs, err := sys.Discover(t.Context())
	if err != nil || len(pfs) < 2 {
		t.Fatalf("simulated E810: %d PFs, %v", len(pfs), err)
	}
	a, b := pfs[0], pfs[1]
	hostNs, err := pfnetns.New(t, "br-phys")
	if err != nil {
		t.Fatal(err)
	}
	ns, err := netns.GetFromPath(hostNs)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	nh, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer nh.Close()
	if err := nh.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth-not-br"}, PeerName: "eth-peer"}); err != nil {
		t.Fatal(err)
	}
	cfgPath := filepath.Join(t.TempDir(), "node-config.yaml")
	doc := "apiVersion: vfnet.io/v1alpha1\nkind: NodeConfig\npfs:\n" +
		"- {pfName: " + a.Uplink() + ", network: net-a, standby: {bridge: br-phys}}\n" +
		"- {pfName: " + b.Uplink() + ", network: net-b}\n"
	if err := os.WriteFile(cfgPath, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	d := &Driver{cfg: Config{ConfigPath: cfgPath, Host: &Host{Sysfs: sys}}, plumber: standby.Netlink{HostNetns: hostNs},
		nri: &standby.NRI{Socket: "/nonexistent/nri.sock"}}
	check := func(pf sysfs.PF, wants ...string) {
		t.Helper()
		_, err := d.standbyBridge(t.Context(), pf.Address, pf.Uplink())
		for _, w := range wants {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("PF %s: %v, want an error containing %q", pf.Address, err, w)
			}
		}
	}
	check(b, b.Address, b.Uplink(), "has no standby bridge", "pfs[1].standby.bridge", cfgPath, "net-b")
	// The bridge is there, NRI is not.
	check(a, "/nonexistent/nri.sock", "[plugins.'io.containerd.nri.v1.nri']")
	// Renamed to a netdev that is not a bridge, then to one that is absent.
	for bridge, why := range map[string]string{"eth-not-br": "is a veth device, not a bridge", "br-gone": "Link not found"} {
		if err := os.WriteFile(cfgPath, []byte(strings.Replace(doc, "bridge: br-phys", "bridge: "+bridge, 1)), 0o644); err != nil {
			t.Fatal(err)
		}
		check(a, a.Address, why, "standby bridge "+bridge, "pfs[0].standby.bridge", "create it on the node")
	}
}
