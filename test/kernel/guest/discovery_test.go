//go:build kernelguest

package guest

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/dynamic-resource-allocation/deviceattribute"
	"sigs.k8s.io/yaml"

	"github.com/vfnet-io/vfnet/driver/discovery"
	"github.com/vfnet-io/vfnet/driver/kernel/sysfs"
	"github.com/vfnet-io/vfnet/pkg/api/nodeconfig"
	"github.com/vfnet-io/vfnet/pkg/contract/pciaddr"
	"github.com/vfnet-io/vfnet/test/kernel/layout"
)

var metaCreate = metav1.CreateOptions{}

// Intel 82576 PF and VF device IDs (igb, igbvf).
const (
	intelVendor = "8086"
	dev82576    = "10c9"
	dev82576VF  = "10ca"
)

// networks maps each PF role to the network the node config gives it.
func networks() map[string]string {
	return map[string]string{layout.RoleMain: "net-main", layout.RoleNUMA1: "net-numa1", layout.RoleSharedGroup: "net-shared", layout.RoleWire: "net-wire"}
}

// writeNodeConfig selects every PF of the layout by PCI address.
func (m *machine) writeNodeConfig(t *testing.T) string {
	t.Helper()
	var b strings.Builder
	b.WriteString("apiVersion: vfnet.io/v1alpha1\nkind: NodeConfig\npfs:\n")
	for _, pf := range m.lay.PFs {
		fmt.Fprintf(&b, "- pciAddress: %q\n  network: %s\n", pf.Address, networks()[pf.Role])
	}
	p := filepath.Join(t.TempDir(), "node-config.yaml")
	if err := os.WriteFile(p, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// Case 1: discovery reads the real kernel's PFs and VFs with the right
// standard and vfnet attributes, numaNode and pcieRoot included, and
// `vfnet-driver inspect` publishes exactly those.
func TestDiscoveryAndInspect(t *testing.T) {
	m := guest(t)
	rep, err := m.sysfs.DiscoverReport(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	// Every SR-IOV function of the guest is readable through sysfs: a skip
	// here means the reader misreads a real kernel's layout.
	for _, s := range rep.Skipped {
		t.Errorf("sysfs skipped %s: %s", s.Path, s.Reason)
	}
	byAddr := map[string]sysfs.PF{}
	for _, p := range rep.PFs {
		byAddr[p.Address] = p
	}
	groups := map[string]string{}
	for _, want := range m.lay.PFs {
		pf, ok := byAddr[want.Address]
		if !ok {
			t.Fatalf("%s PF %s not discovered (found %d PFs)", want.Role, want.Address, len(rep.PFs))
		}
		t.Logf("%s PF %s: netdev %s driver %s numa %d root %s group %s, %d/%d VFs", want.Role, pf.Address, pf.NetDev, pf.Driver, pf.NUMANode, pf.PCIeRoot, pf.IOMMUGroup, pf.NumVFs, pf.TotalVFs)
		if pf.VendorID != intelVendor || pf.DeviceID != dev82576 || pf.Driver != "igb" {
			t.Errorf("%s PF %s: vendor %s device %s driver %q, want %s %s igb", want.Role, pf.Address, pf.VendorID, pf.DeviceID, pf.Driver, intelVendor, dev82576)
		}
		if pf.TotalVFs != 7 || pf.NumVFs != want.VFs || len(pf.VFs) != want.VFs {
			t.Errorf("%s PF %s: sriov_totalvfs %d sriov_numvfs %d, %d VFs found; want 7, %d", want.Role, pf.Address, pf.TotalVFs, pf.NumVFs, len(pf.VFs), want.VFs)
		}
		if pf.NetDev == "" || pf.LinkType != "ethernet" || pf.Switchdev {
			t.Errorf("%s PF %s: netdev %q link type %q switchdev %v", want.Role, pf.Address, pf.NetDev, pf.LinkType, pf.Switchdev)
		}
		if pf.NUMANode != want.NUMANode || pf.PCIeRoot != want.PCIeRoot {
			t.Errorf("%s PF %s: numa node %d pcie root %s, want %d %s", want.Role, pf.Address, pf.NUMANode, pf.PCIeRoot, want.NUMANode, want.PCIeRoot)
		}
		for i, vf := range pf.VFs {
			t.Logf("  VF %d %s: driver %s netdevs %v group %s peers %v", vf.Index, vf.Address, vf.Driver, vf.NetDevs, vf.IOMMUGroup, vf.IOMMUPeers)
			if vf.Index != i || vf.PFAddress != pf.Address || vf.VendorID != intelVendor || vf.DeviceID != dev82576VF || vf.Driver != "igbvf" || len(vf.NetDevs) != 1 {
				t.Errorf("VF %s: index %d pf %s vendor %s device %s driver %q netdevs %v; want index %d of %s, %s %s igbvf with one netdev",
					vf.Address, vf.Index, vf.PFAddress, vf.VendorID, vf.DeviceID, vf.Driver, vf.NetDevs, i, pf.Address, intelVendor, dev82576VF)
			}
			if vf.NUMANode != want.NUMANode || vf.PCIeRoot != want.PCIeRoot {
				t.Errorf("VF %s: numa node %d pcie root %s, want %d %s", vf.Address, vf.NUMANode, vf.PCIeRoot, want.NUMANode, want.PCIeRoot)
			}
			if vf.IOMMUGroup == "" {
				t.Errorf("VF %s has no IOMMU group (is intel_iommu on?)", vf.Address)
			}
			if want.Role == layout.RoleSharedGroup {
				continue
			}
			if len(vf.IOMMUPeers) != 0 {
				t.Errorf("VF %s behind an ACS root port shares IOMMU group %s with %v", vf.Address, vf.IOMMUGroup, vf.IOMMUPeers)
			}
			if other, dup := groups[vf.IOMMUGroup]; dup {
				t.Errorf("VFs %s and %s are both in IOMMU group %s", other, vf.Address, vf.IOMMUGroup)
			}
			groups[vf.IOMMUGroup] = vf.Address
		}
	}

	cfgPath := m.writeNodeConfig(t)
	cfg, err := nodeconfig.Load(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	res, err := discovery.Build(rep.PFs, cfg, discovery.Options{})
	if err != nil {
		t.Fatal(err)
	}
	// What must be published: every VF of the PFs with an isolated group.
	want := map[string]map[resourceapi.QualifiedName]string{}
	for _, role := range []string{layout.RoleMain, layout.RoleNUMA1, layout.RoleWire} {
		lp, ok := m.lay.PF(role)
		if !ok {
			continue // the wire PF is there only with the wire
		}
		pf := byAddr[lp.Address]
		for _, vf := range pf.VFs {
			name, err := pciaddr.DeviceName(vf.Address)
			if err != nil {
				t.Fatal(err)
			}
			want[name] = map[resourceapi.QualifiedName]string{
				deviceattribute.StandardDeviceAttributePCIBusID: vf.Address,
				deviceattribute.StandardDeviceAttributePCIeRoot: lp.PCIeRoot,
				deviceattribute.StandardDeviceAttributeNUMANode: absent,
				discovery.AttrNetwork:                           networks()[role],
				discovery.AttrPFName:                            pf.NetDev,
				discovery.AttrPFPCIAddress:                      pf.Address,
				discovery.AttrVFIndex:                           fmt.Sprint(vf.Index),
				discovery.AttrVendorID:                          intelVendor,
				discovery.AttrDeviceID:                          dev82576VF,
				// Every offered VF is Ethernet: no link-type attribute.
				"vfnet.io/linkType": absent,
			}
			if lp.NUMANode >= 0 {
				want[name][deviceattribute.StandardDeviceAttributeNUMANode] = fmt.Sprint(lp.NUMANode)
			}
		}
	}
	got := map[string]map[resourceapi.QualifiedName]string{}
	for _, d := range res.Devices {
		got[d.Name] = attrStrings(d.Attributes())
	}
	compareDevices(t, "discovery.Build", got, want)
	// The shared-group PF's VFs, and nothing else, are skipped, for their group.
	shared, _ := m.lay.PF(layout.RoleSharedGroup)
	wantSkipped := map[string]string{} // VF address: its IOMMU group
	for _, vf := range byAddr[shared.Address].VFs {
		wantSkipped[vf.Address] = vf.IOMMUGroup
	}
	for _, sk := range res.Skipped {
		group, ok := wantSkipped[sk.Address]
		if !ok || !strings.Contains(sk.Reason, "IOMMU group "+group+" ") {
			t.Errorf("discovery.Build skipped %s: %s; want only the VFs of %s, for their shared IOMMU group", sk.Address, sk.Reason, shared.Address)
		}
		delete(wantSkipped, sk.Address)
	}
	for a := range wantSkipped {
		t.Errorf("discovery.Build offers or ignores %s, which shares an IOMMU group; want it skipped", a)
	}

	// The real binary, as an admin runs it on a node.
	cmd := exec.Command(layout.Driver, "inspect", "--sysfs-root", "/sys", "--config", cfgPath, "--node-name", nodeName,
		"--plugin-dir", t.TempDir())
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("vfnet-driver inspect: %v\n%s", err, stderr.String())
	}
	t.Logf("vfnet-driver inspect stderr:\n%s", stderr.String())
	got = map[string]map[resourceapi.QualifiedName]string{}
	for _, doc := range strings.Split(stdout.String(), "\n---\n") {
		var s resourceapi.ResourceSlice
		if err := yaml.UnmarshalStrict([]byte(doc), &s); err != nil {
			t.Fatalf("inspect printed a slice that does not parse: %v\n%s", err, doc)
		}
		if s.Spec.Driver != discovery.DriverName || s.Spec.Pool.Name != nodeName || s.Spec.NodeName == nil || *s.Spec.NodeName != nodeName {
			t.Errorf("slice %s: driver %s pool %s node %v", s.Name, s.Spec.Driver, s.Spec.Pool.Name, s.Spec.NodeName)
		}
		for _, d := range s.Spec.Devices {
			got[d.Name] = attrStrings(d.Attributes)
		}
	}
	compareDevices(t, "vfnet-driver inspect", got, want)
	for _, vf := range byAddr[shared.Address].VFs {
		if !strings.Contains(stderr.String(), "# not offered: "+vf.Address+": IOMMU group") {
			t.Errorf("inspect does not say why %s (shared IOMMU group) is not offered", vf.Address)
		}
	}
}

func attrStrings(a map[resourceapi.QualifiedName]resourceapi.DeviceAttribute) map[resourceapi.QualifiedName]string {
	out := map[resourceapi.QualifiedName]string{}
	for k, v := range a {
		switch {
		case v.StringValue != nil:
			out[k] = *v.StringValue
		case v.IntValue != nil:
			out[k] = fmt.Sprint(*v.IntValue)
		case v.BoolValue != nil:
			out[k] = fmt.Sprint(*v.BoolValue)
		case v.VersionValue != nil:
			out[k] = *v.VersionValue
		}
	}
	return out
}

// absent as a wanted attribute value means the attribute must not be there
// (numaNode for a device without NUMA affinity).
const absent = "<absent>"

// compareDevices checks that every wanted device is there with the wanted
// attribute values (attributes other helpers add are allowed), and that
// nothing else is.
func compareDevices(t *testing.T, who string, got, want map[string]map[resourceapi.QualifiedName]string) {
	t.Helper()
	for name, attrs := range want {
		g, ok := got[name]
		if !ok {
			t.Errorf("%s: device %s missing (has %d devices)", who, name, len(got))
			continue
		}
		for k, v := range attrs {
			if got, has := g[k]; v == absent && has {
				t.Errorf("%s: device %s has attribute %s = %q; the kernel reports no value for it", who, name, k, got)
				continue
			} else if v == absent {
				continue
			}
			if g[k] != v {
				t.Errorf("%s: device %s attribute %s = %q, want %q", who, name, k, g[k], v)
			}
		}
	}
	for name := range got {
		if _, ok := want[name]; !ok {
			t.Errorf("%s: offers %s, which it must not (attributes %v)", who, name, got[name])
		}
	}
}

// Case 8: the PF behind a root port without ACS shares one IOMMU group
// with its VFs; vfnet offers none of them, says why, and prepare refuses
// such a VF before changing anything.
func TestSharedIOMMUGroup(t *testing.T) {
	m := guest(t)
	pf := m.pf(t, layout.RoleSharedGroup)
	if len(pf.VFs) < 2 {
		t.Fatalf("shared-group PF %s has %d VFs", pf.Address, len(pf.VFs))
	}
	for _, vf := range pf.VFs {
		t.Logf("VF %s: group %s peers %v", vf.Address, vf.IOMMUGroup, vf.IOMMUPeers)
		if vf.IOMMUGroup != pf.IOMMUGroup {
			t.Errorf("VF %s is in IOMMU group %s, its PF in %s: the layout should make them share one", vf.Address, vf.IOMMUGroup, pf.IOMMUGroup)
		}
		peers := map[string]string{}
		for _, p := range vf.IOMMUPeers {
			peers[p.Address] = p.Driver
		}
		if peers[pf.Address] != "igb" {
			t.Errorf("VF %s: IOMMU peers %v lack the PF %s on igb", vf.Address, vf.IOMMUPeers, pf.Address)
		}
		if p := discovery.Problem(vf.Function, false, discovery.Policy{}); !strings.Contains(p, "IOMMU group "+vf.IOMMUGroup) {
			t.Errorf("VF %s: problem %q does not name its shared group", vf.Address, p)
		}
	}
	cfg, err := nodeconfig.Load(m.writeNodeConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	pfs, err := m.sysfs.Discover(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	res, err := discovery.Build(pfs, cfg, discovery.Options{})
	if err != nil {
		t.Fatal(err)
	}
	skipped := map[string]string{}
	for _, s := range res.Skipped {
		skipped[s.Address] = s.Reason
	}
	for _, d := range res.Devices {
		if d.PFAddress == pf.Address {
			t.Errorf("VF %s of the shared-group PF is offered", d.Address)
		}
	}
	for _, vf := range pf.VFs {
		if !strings.Contains(skipped[vf.Address], "IOMMU group") {
			t.Errorf("VF %s: skip reason %q, want the shared IOMMU group", vf.Address, skipped[vf.Address])
		}
	}

	// A claim naming such a VF anyway (a stale allocation) fails before
	// anything changes.
	vf := pf.VFs[0]
	before := m.vfState(t, pf, vf)
	dir := t.TempDir()
	c := claim("shared", `{"apiVersion":"vfnet.io/v1alpha1","kind":"VFConfig","vlan":7}`, vf)
	s := m.state(t, dir, nil, c)
	err = prepareClaim(context.Background(), s, c)
	if err == nil {
		t.Fatalf("prepare of %s in a shared IOMMU group succeeded", vf.Address)
	}
	t.Logf("prepare refused: %v", err)
	if !strings.Contains(err.Error(), "IOMMU group") {
		t.Errorf("prepare error does not name the IOMMU group: %v", err)
	}
	if after := m.vfState(t, pf, vf); after.String() != before.String() {
		t.Errorf("refused prepare changed VF %s:\nbefore %s\nafter  %s", vf.Address, before, after)
	}
}
