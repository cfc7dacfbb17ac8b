package driver

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/types"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/vfnet-io/vfnet/driver/checkpoint"
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

// fakePark is prepare.State's park as failoverMACs sees it.
type fakePark struct {
	cp     *checkpoint.File
	parked map[string]bool
	err    error
}

func (f *fakePark) IsFailover(bdf string) bool { return true }
func (f *fakePark) Snapshot() *checkpoint.File { return f.cp }
func (f *fakePark) SetMACParked(_ context.Context, bdf string, parked bool) (bool, error) {
	if f.err != nil {
		return false, f.err
	}
	changed := f.parked[bdf] != parked
	f.parked[bdf] = parked
	return changed, nil
}

// A park steers the node bridge to each reserving pod's standby and a
// restore hands it back; a failed park and a VF without a standby steer
// nothing; a steering error leaves the park standing.
func TestFailoverParkSteersTheBridge(t *testing.T) {
	const bdf, other = "0000:01:10.0", "0000:01:10.2"
	cp := &checkpoint.File{Claims: map[types.UID]*checkpoint.Claim{"uid-a": {
		Namespace: "default", Name: "vm-a",
		Devices: []checkpoint.Device{
			{BDF: bdf, Standby: &checkpoint.Standby{PodUIDs: []types.UID{"pod-1"}, Interface: "physnet-a", MAC: "02:00:00:00:00:01", Bridge: "br-phys"}},
			{BDF: other},
		},
	}}}
	type call struct{ pod, iface, bridge, mac string }
	var calls []call
	steerErr := error(nil)
	park := &fakePark{cp: cp, parked: map[string]bool{}}
	var unsteered []call
	f := failoverMACs{state: park, steer: func(_ context.Context, pod, iface, bridge string, mac net.HardwareAddr) error {
		calls = append(calls, call{pod, iface, bridge, mac.String()})
		return steerErr
	}, unsteer: func(_ context.Context, pod, iface, bridge string, mac net.HardwareAddr) error {
		unsteered = append(unsteered, call{pod, iface, bridge, mac.String()})
		return nil
	}}
	if changed, err := f.SetMACParked(t.Context(), bdf, true); err != nil || !changed {
		t.Fatalf("park: %v, %v", changed, err)
	}
	want := []call{{"pod-1", "physnet-a", "br-phys", "02:00:00:00:00:01"}}
	if !reflect.DeepEqual(calls, want) {
		t.Fatalf("steered %+v, want %+v", calls, want)
	}
	calls = nil
	if _, err := f.SetMACParked(t.Context(), bdf, false); err != nil || len(calls) != 0 || !reflect.DeepEqual(unsteered, want) {
		t.Errorf("restore: %v, steered %+v, unsteered %+v; want no steering and %+v unsteered", err, calls, unsteered, want)
	}
	if _, err := f.SetMACParked(t.Context(), other, true); err != nil || len(calls) != 0 {
		t.Errorf("VF without standby: %v, steered %+v; want no steering", err, calls)
	}
	steerErr = errors.New("no veth")
	if changed, err := f.SetMACParked(t.Context(), bdf, true); err != nil || !changed {
		t.Errorf("park with a steering error: %v, %v; want the park to stand", changed, err)
	}
	park.err = errors.New("checkpoint locked")
	calls = nil
	if _, err := f.SetMACParked(t.Context(), bdf, true); err == nil || len(calls) != 0 {
		t.Errorf("failed park: %v, steered %+v; want the error and no steering", err, calls)
	}
	if (failoverMACs{state: park}).IsFailover(bdf) != true {
		t.Error("IsFailover does not pass through")
	}
}
