//go:build kernelguest

package guest

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	"github.com/vfnet-io/vfnet/driver/checkpoint"
	"github.com/vfnet-io/vfnet/driver/kernel/sysfs"
	"github.com/vfnet-io/vfnet/driver/kernel/vflink"
	"github.com/vfnet-io/vfnet/driver/prepare"
	"github.com/vfnet-io/vfnet/pkg/contract/pciaddr"
	"github.com/vfnet-io/vfnet/test/kernel/layout"
	"github.com/vfnet-io/vfnet/test/lib/preparetest"
)

// machine is the guest as a case sees it.
type machine struct {
	lay   layout.Layout
	sysfs *sysfs.Host
	links vflink.Links
}

// guest skips outside the guest's case children and returns the machine.
func guest(t *testing.T) *machine {
	t.Helper()
	if os.Getenv(envCase) != "1" {
		t.Skip("runs only inside the real-kernel guest (test/kernel)")
	}
	lay, err := readLayout()
	if err != nil {
		t.Fatal(err)
	}
	links, err := vflink.Open(vflink.DefaultHostNetns)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { links.Close() })
	return &machine{lay: lay, sysfs: sysfs.New("/sys"), links: links}
}

func readLayout() (layout.Layout, error) {
	var lay layout.Layout
	data, err := os.ReadFile(layout.File)
	if err != nil {
		return lay, err
	}
	if err := json.Unmarshal(data, &lay); err != nil {
		return lay, fmt.Errorf("%s: %w", layout.File, err)
	}
	return lay, nil
}

// pf finds the PF of role as discovery reads it.
func (m *machine) pf(t *testing.T, role string) sysfs.PF {
	t.Helper()
	want, ok := m.lay.PF(role)
	if !ok {
		t.Fatalf("layout has no %s PF", role)
	}
	pfs, err := m.sysfs.Discover(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pfs {
		if p.Address == want.Address {
			return p
		}
	}
	t.Fatalf("discovery found no PF at %s (%s); found %d PFs", want.Address, role, len(pfs))
	return sysfs.PF{}
}

// vfState is everything prepare may change about one VF, read from the
// kernel (driver and override in sysfs, settings through the PF).
type vfState struct {
	Driver   string
	Override string
	Link     vflink.VFState
	DevNodes []string
}

func (m *machine) vfState(t *testing.T, pf sysfs.PF, vf sysfs.VF) vfState {
	t.Helper()
	fn, err := m.sysfs.Function(vf.Address)
	if err != nil {
		t.Fatal(err)
	}
	link, err := m.links.VF(pf.NetDev, vf.Index)
	if err != nil {
		t.Fatal(err)
	}
	ents, _ := os.ReadDir("/dev/vfio")
	var nodes []string
	for _, e := range ents {
		nodes = append(nodes, e.Name())
	}
	return vfState{Driver: fn.Driver, Override: fn.DriverOverride, Link: link, DevNodes: nodes}
}

func (s vfState) String() string {
	return fmt.Sprintf("driver=%q override=%q mac=%s vlan=%d qos=%d proto=%s spoofchk=%v trust=%v state=%s rate=%d/%d /dev/vfio=%v",
		s.Driver, s.Override, s.Link.MAC, s.Link.VLAN, s.Link.QoS, s.Link.VLANProto, s.Link.SpoofChk, s.Link.Trust,
		s.Link.LinkState, s.Link.MinTxRateMbps, s.Link.MaxTxRateMbps, s.DevNodes)
}

// ipVF is iproute2's own report of VF n of pf ("vf 0     link/ether ..."),
// an independent reader of what the PF says.
func ipVF(t *testing.T, pf string, n int) string {
	t.Helper()
	out, err := exec.Command(layout.IP, "link", "show", "dev", pf).CombinedOutput()
	if err != nil {
		t.Fatalf("%s link show dev %s: %v\n%s", layout.IP, pf, err, out)
	}
	prefix := fmt.Sprintf("vf %d ", n)
	for _, l := range strings.Split(string(out), "\n") {
		if l = strings.TrimSpace(l); strings.HasPrefix(l, prefix) {
			return l
		}
	}
	t.Fatalf("ip link show dev %s has no line for VF %d:\n%s", pf, n, out)
	return ""
}

// nodeName is the node (and pool) name the cases use.
const nodeName = preparetest.Node

// state is a prepare.State on the real kernel, with a fake API server
// holding claims (prepare only reads claims from its caller and writes
// their status).
func (m *machine) state(t *testing.T, dir string, hook func(string), claims ...*resourceapi.ResourceClaim) *prepare.State {
	t.Helper()
	kube := fake.NewClientset()
	for _, c := range claims {
		if _, err := kube.ResourceV1().ResourceClaims(c.Namespace).Create(context.Background(), c, metaCreate); err != nil {
			t.Fatal(err)
		}
	}
	s, err := prepare.New(prepare.Options{
		NodeName: nodeName, Sysfs: m.sysfs, Writer: sysfs.RootWriter{Root: "/sys"}, Links: m.links,
		DevRoot: "/dev", CheckpointPath: filepath.Join(dir, checkpoint.FileName), CDIRoot: filepath.Join(dir, "cdi"),
		Kube: kube, Hook: hook,
	})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// claim is an allocated claim for the VFs with VFConfig params ("" = none).
func claim(name string, params string, vfs ...sysfs.VF) *resourceapi.ResourceClaim {
	var names []string
	for _, vf := range vfs {
		n, err := pciaddr.DeviceName(vf.Address)
		if err != nil {
			panic(err)
		}
		names = append(names, n)
	}
	var cfg []resourceapi.DeviceAllocationConfiguration
	if params != "" {
		cfg = append(cfg, preparetest.Config(resourceapi.AllocationConfigSourceClaim, params))
	}
	return preparetest.Claim("default", name, types.UID("uid-"+name), names, cfg...)
}

func prepareClaim(ctx context.Context, s *prepare.State, c *resourceapi.ResourceClaim) error {
	res, err := s.Prepare(ctx, []*resourceapi.ResourceClaim{c})
	if err != nil {
		return err
	}
	return res[c.UID].Err
}

func unprepareClaim(ctx context.Context, s *prepare.State, c *resourceapi.ResourceClaim) error {
	res, err := s.Unprepare(ctx, []kubeletplugin.NamespacedObject{{NamespacedName: types.NamespacedName{Namespace: c.Namespace, Name: c.Name}, UID: c.UID}})
	if err != nil {
		return err
	}
	return res[c.UID]
}
