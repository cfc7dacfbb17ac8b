package discovery

import (
	"context"
	"slices"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/deviceattribute"

	"github.com/vfnet-io/vfnet/driver/kernel/sysfs"
	"github.com/vfnet-io/vfnet/driver/kernel/vfioholders"
	"github.com/vfnet-io/vfnet/driver/kernel/vflink"
	"github.com/vfnet-io/vfnet/pkg/api/nodeconfig"
	"github.com/vfnet-io/vfnet/pkg/contract/pciaddr"
	"github.com/vfnet-io/vfnet/test/lib/simhost"
)

func mixedPFs(t *testing.T) []sysfs.PF {
	t.Helper()
	h, err := simhost.Build(t.TempDir(), simhost.MixedHost())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	pfs, err := h.Sysfs().Discover(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return pfs
}

func pfAt(t *testing.T, pfs []sysfs.PF, addr string) sysfs.PF {
	t.Helper()
	for _, pf := range pfs {
		if pf.Address == addr {
			return pf
		}
	}
	t.Fatalf("fixture has no PF %s", addr)
	return sysfs.PF{}
}

func config(t *testing.T, body string) *nodeconfig.Config {
	t.Helper()
	cfg, err := nodeconfig.Parse([]byte("apiVersion: vfnet.io/v1alpha1\nkind: NodeConfig\n"+body), "node.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func names(devs []Device) string {
	var out []string
	for _, d := range devs {
		out = append(out, d.Name)
	}
	return strings.Join(out, " ")
}

func TestBuildMixedHost(t *testing.T) {
	t.Parallel()
	pfs := mixedPFs(t)
	// Listed out of address order on purpose: output follows PF address.
	cfg := config(t, `pfs:
- pfName: ens8f0np0
  network: physnet-b
- vendorID: "8086"
  deviceID: "1593"
  network: physnet-a
- pciAddress: "0000:01:00.0"
  network: physnet-c
  vfs: [1]
- pfName: enp2s0
  network: plain
`)
	res, err := Build(pfs, cfg, Options{})
	if err != nil {
		t.Fatal(err)
	}
	// I350 (bus 01) VF 1 only; E810 port 0 VFs 0,1,3 (VF 2 is on vfio-pci,
	// port 1 has numvfs=0); ConnectX-6 Dx (bus d8) VFs 0-3. The plain NIC has
	// no SR-IOV and is not a PF at all.
	var want []string
	for _, pf := range pfs {
		for _, vf := range pf.VFs {
			n, _ := pciaddr.DeviceName(vf.Address)
			switch {
			case pf.Address == "0000:01:00.0" && vf.Index == 1,
				pf.Address == "0000:3b:00.0" && vf.Index != 2,
				pf.Address == "0000:d8:00.0":
				want = append(want, n)
			}
		}
	}
	if got := names(res.Devices); got != strings.Join(want, " ") || len(want) != 8 {
		t.Fatalf("devices\n got %s\nwant %s", got, strings.Join(want, " "))
	}
	if res.Why != "" {
		t.Errorf("Why = %q with devices", res.Why)
	}
	if len(res.Skipped) != 1 || !strings.Contains(res.Skipped[0].Reason, "vfio-pci") {
		t.Errorf("Skipped = %+v, want the vfio-pci VF", res.Skipped)
	}

	byPF := map[string]Device{}
	for _, d := range res.Devices {
		byPF[d.PFAddress] = d
		a, err := pciaddr.ParseDeviceName(d.Name)
		if err != nil || a.String() != d.Address {
			t.Errorf("ParseDeviceName(%s) = %v, %v; want %s", d.Name, a, err, d.Address)
		}
	}
	igb := byPF["0000:01:00.0"]
	attrs := igb.Attributes()
	if _, ok := attrs["resource.kubernetes.io/numaNode"]; ok {
		t.Errorf("numa_node -1 must not publish numaNode: %v", attrs)
	}
	checkString(t, attrs, "vfnet.io/network", "physnet-c")
	checkString(t, attrs, "vfnet.io/pfName", "enp1s0f0")
	checkString(t, attrs, "vfnet.io/vendorID", "8086")
	checkString(t, attrs, "vfnet.io/deviceID", "1520")
	checkInt(t, attrs, "vfnet.io/vfIndex", 1)

	cx := byPF["0000:d8:00.0"]
	attrs = cx.Attributes()
	checkInt(t, attrs, "resource.kubernetes.io/numaNode", 1)
	checkString(t, attrs, "resource.kubernetes.io/pciBusID", cx.Address)
	checkString(t, attrs, "resource.kubernetes.io/pcieRoot", "pci0000:d7")
	checkString(t, attrs, "vfnet.io/pfPciAddress", "0000:d8:00.0")
	checkString(t, attrs, "vfnet.io/deviceID", "101e")
	checkString(t, attrs, "vfnet.io/vendorID", "15b3")
	checkString(t, attrs, "vfnet.io/network", "physnet-b")
	checkInt(t, attrs, "vfnet.io/vfIndex", 3)
	if len(attrs) != maxAttributes {
		t.Errorf("ConnectX VF has %d attributes, want all %d: %v", len(attrs), maxAttributes, attrs)
	}
}

func checkString(t *testing.T, attrs map[resourceapi.QualifiedName]resourceapi.DeviceAttribute, name, want string) {
	t.Helper()
	a, ok := attrs[resourceapi.QualifiedName(name)]
	if !ok || a.StringValue == nil || *a.StringValue != want {
		t.Errorf("attribute %s = %+v, want string %q", name, a, want)
	}
}

func checkInt(t *testing.T, attrs map[resourceapi.QualifiedName]resourceapi.DeviceAttribute, name string, want int64) {
	t.Helper()
	a, ok := attrs[resourceapi.QualifiedName(name)]
	if !ok || a.IntValue == nil || *a.IntValue != want {
		t.Errorf("attribute %s = %+v, want int %d", name, a, want)
	}
}

func TestBuildOwnedVFIOVFIsOffered(t *testing.T) {
	t.Parallel()
	pfs := mixedPFs(t)
	cfg := config(t, "pfs:\n- pfName: enp59s0f0\n  network: a\n")
	e810 := pfAt(t, pfs, "0000:3b:00.0")
	vfio := e810.VFs[2].Address
	if e810.VFs[2].Driver != VFIODriver {
		t.Fatalf("fixture changed: %+v", e810.VFs[2])
	}
	res, err := Build(pfs, cfg, Options{Owned: func(a string) bool { return a == vfio }})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Devices) != 4 || len(res.Skipped) != 0 || res.Devices[2].Address != vfio {
		t.Fatalf("owned vfio-pci VF must stay offered: %s, skipped %+v", names(res.Devices), res.Skipped)
	}
}

func TestBuildNothing(t *testing.T) {
	t.Parallel()
	pfs := mixedPFs(t)
	for name, tc := range map[string]struct {
		cfg  *nodeconfig.Config
		want string
	}{
		"no config":        {nil, "no node configuration given"},
		"selects no PF":    {config(t, "pfs:\n- pfName: eth9\n  network: a\n"), "node.yaml selects none of the 4 SR-IOV PFs"},
		"empty list":       {config(t, "pfs: []\n"), "selects none"},
		"numvfs zero":      {config(t, "pfs:\n- pfName: enp59s0f1\n  network: a\n"), "none has an offerable VF"},
		"vfs beyond count": {config(t, "pfs:\n- pfName: enp59s0f0\n  network: a\n  vfs: [\"10-20\"]\n"), "none has an offerable VF"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			res, err := Build(pfs, tc.cfg, Options{})
			if err != nil {
				t.Fatal(err)
			}
			if len(res.Devices) != 0 || !strings.Contains(res.Why, tc.want) || strings.Contains(res.Why, "\n") {
				t.Fatalf("devices %s, Why %q; want one line containing %q", names(res.Devices), res.Why, tc.want)
			}
		})
	}
}

func TestBuildOverlapIsError(t *testing.T) {
	t.Parallel()
	pfs := mixedPFs(t)
	_, err := Build(pfs, config(t, "pfs:\n- pfName: enp59s0f0\n  network: a\n- pciAddress: \"0000:3b:00.0\"\n  network: b\n"), Options{})
	if err == nil || !strings.Contains(err.Error(), "matched by pfs[0] and pfs[1]") {
		t.Fatalf("err = %v", err)
	}
}

func TestBuildPFWithoutNetdevSkipped(t *testing.T) {
	t.Parallel()
	pfs := []sysfs.PF{{Function: sysfs.Function{Address: "0000:3b:00.0", VendorID: "8086", DeviceID: "1593", Driver: "vfio-pci"}, TotalVFs: 4, NumVFs: 1,
		VFs: []sysfs.VF{{Function: sysfs.Function{Address: "0000:3b:01.0"}, Index: 0, PFAddress: "0000:3b:00.0"}}}}
	res, err := Build(pfs, config(t, "pfs:\n- pciAddress: \"0000:3b:00.0\"\n  network: a\n"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Devices) != 0 || len(res.Skipped) != 1 || !strings.Contains(res.Skipped[0].Reason, "no netdev") {
		t.Fatalf("res = %+v", res)
	}
}

func TestPCIBusIDMatchesUpstreamHelper(t *testing.T) {
	t.Parallel()
	d := Device{Address: "0000:3b:02.1", NUMANode: 1}
	want, err := deviceattribute.GetPCIBusIDAttribute(d.Address)
	if err != nil {
		t.Fatal(err)
	}
	got, ok := d.Attributes()[want.Name]
	if !ok || *got.StringValue != *want.Value.StringValue {
		t.Fatalf("pciBusID = %+v, upstream helper says %+v", got, want)
	}
	wantNUMA, _ := deviceattribute.GetNUMANodeAttribute(1, deviceattribute.ScalarAttribute)
	if gotNUMA := d.Attributes()[wantNUMA.Name]; *gotNUMA.IntValue != *wantNUMA.Value.IntValue {
		t.Fatalf("numaNode = %+v, want %+v", gotNUMA, wantNUMA)
	}
}

func TestFind(t *testing.T) {
	t.Parallel()
	pfs := mixedPFs(t)
	vf := pfAt(t, pfs, "0000:3b:00.0").VFs[3]
	name, _ := pciaddr.DeviceName(vf.Address)
	ref, err := Find(pfs, name)
	if err != nil || ref.PFAddress != "0000:3b:00.0" || ref.PFName != "enp59s0f0" || ref.VFIndex != 3 || ref.Address != vf.Address {
		t.Fatalf("Find = %+v, %v", ref, err)
	}
	if _, err := Find(pfs, "vf-0000-ff-00-0"); err == nil || !strings.Contains(err.Error(), "no VF at 0000:ff:00.0") {
		t.Fatalf("Find of a missing VF: %v", err)
	}
}

func hostPFs(t *testing.T, spec simhost.Spec) (*simhost.Host, []sysfs.PF) {
	t.Helper()
	h, err := simhost.Build(simhost.TempDir(t), spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	pfs, err := h.Sysfs().Discover(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return h, pfs
}

func reasons(s []Skipped) string {
	var out []string
	for _, x := range s {
		out = append(out, x.Address+": "+x.Reason)
	}
	return strings.Join(out, "\n")
}

// Behind a root port without ACS the VFs share a group with the PFs: none
// is offered, and the reason names the group, the other devices and the fix.
func TestBuildSharedIOMMUGroupNotOffered(t *testing.T) {
	t.Parallel()
	_, pfs := hostPFs(t, simhost.NoACSHost())
	res, err := Build(pfs, config(t, "pfs:\n- vendorID: \"8086\"\n  network: a\n"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Devices) != 0 || len(res.Skipped) != 8 {
		t.Fatalf("devices %s, skipped:\n%s", names(res.Devices), reasons(res.Skipped))
	}
	want := "IOMMU group " + pfs[0].IOMMUGroup + " also holds 0000:3b:00.0 (ice), 0000:3b:00.1 (ice), 0000:3b:02.1 (iavf) and 6 more"
	if r := res.Skipped[0].Reason; !strings.Contains(r, want) || !strings.Contains(r, "enable ACS on the upstream bridge or put the device in its own slot") ||
		strings.Contains(r, "0000:3a:00.0") {
		t.Fatalf("reason %q\nwant it to contain %q and the fix, and not the pcieport root port", r, want)
	}
}

func TestBuildNoIOMMU(t *testing.T) {
	t.Parallel()
	h, pfs := hostPFs(t, simhost.NoIOMMUHost())
	on := h.Sysfs().NoIOMMUMode()
	if !on {
		t.Fatal("fixture: noiommu mode off")
	}
	sel := "pfs:\n- pfName: enp59s0f0\n  network: a\n"
	res, err := Build(pfs, config(t, sel), Options{NoIOMMUMode: on})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Devices) != 0 || len(res.Skipped) != 4 || !strings.Contains(res.Skipped[0].Reason, "allowUnsafeNoIOMMU: true") {
		t.Fatalf("without opt-in: devices %s, skipped:\n%s", names(res.Devices), reasons(res.Skipped))
	}
	res, err = Build(pfs, config(t, "allowUnsafeNoIOMMU: true\n"+sel), Options{NoIOMMUMode: on})
	if err != nil || len(res.Devices) != 4 {
		t.Fatalf("with opt-in: devices %s, %v, skipped:\n%s", names(res.Devices), err, reasons(res.Skipped))
	}
	// IOMMU off and no noiommu mode: the opt-in does not help, vfio-pci
	// would refuse the bind.
	res, err = Build(pfs, config(t, "allowUnsafeNoIOMMU: true\n"+sel), Options{NoIOMMUMode: false})
	if err != nil || len(res.Devices) != 0 || !strings.Contains(res.Skipped[0].Reason, "intel_iommu=on") {
		t.Fatalf("IOMMU off: devices %s, %v, skipped:\n%s", names(res.Devices), err, reasons(res.Skipped))
	}
}

func TestBuildSwitchdev(t *testing.T) {
	t.Parallel()
	_, pfs := hostPFs(t, simhost.SwitchdevHost())
	res, err := Build(pfs, config(t, "pfs:\n- pciAddress: \"0000:d8:00.0\"\n  network: a\n- pfName: ens8f1np1\n  network: b\n"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Devices) != 4 || res.Devices[0].PFAddress != "0000:d8:00.1" || len(res.Skipped) != 1 ||
		!strings.Contains(res.Skipped[0].Reason, "switchdev mode (VF representors ens8f0_0,ens8f0_1,ens8f0_2,ens8f0_3)") ||
		!strings.Contains(res.Skipped[0].Reason, "allowSwitchdev: true on pfs[0] in node.yaml") {
		t.Fatalf("devices %s, skipped:\n%s", names(res.Devices), reasons(res.Skipped))
	}
	res, err = Build(pfs, config(t, "pfs:\n- pciAddress: \"0000:d8:00.0\"\n  network: a\n  allowSwitchdev: true\n"), Options{})
	if err != nil || len(res.Devices) != 4 {
		t.Fatalf("opted in: devices %s, %v, skipped:\n%s", names(res.Devices), err, reasons(res.Skipped))
	}
	// The representor ens8f0_0 sorts first under the PF; the uplink is the PF's name.
	checkString(t, res.Devices[0].Attributes(), "vfnet.io/pfName", "ens8f0np0")
	ref, err := Find(pfs, res.Devices[0].Name)
	if err != nil || ref.PFName != "ens8f0np0" {
		t.Fatalf("Find = %+v, %v", ref, err)
	}
}

func TestBuildInfinibandNotOffered(t *testing.T) {
	t.Parallel()
	_, pfs := hostPFs(t, simhost.InfinibandHost())
	res, err := Build(pfs, config(t, "pfs:\n- pfName: ibp216s0f0\n  network: a\n"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Devices) != 0 || len(res.Skipped) != 1 || !strings.Contains(res.Skipped[0].Reason, "InfiniBand") ||
		!strings.Contains(res.Skipped[0].Reason, "GUIDs") || !strings.Contains(res.Skipped[0].Reason, "Ethernet mode") {
		t.Fatalf("devices %s, skipped:\n%s", names(res.Devices), reasons(res.Skipped))
	}
}

// A PF whose netdev is neither Ethernet nor InfiniBand is not offered either,
// so every published device is an Ethernet VF.
func TestBuildOtherLinkTypeNotOffered(t *testing.T) {
	t.Parallel()
	_, pfs := hostPFs(t, simhost.E810Host())
	for i := range pfs {
		if pfs[i].NetDev == "enp59s0f0" {
			pfs[i].LinkType = sysfs.LinkTypeFromARPHRD(24) // ARPHRD_IEEE1394
		}
	}
	res, err := Build(pfs, config(t, "pfs:\n- pfName: enp59s0f0\n  network: a\n"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Devices) != 0 || len(res.Skipped) != 1 || !strings.Contains(res.Skipped[0].Reason, `link type "arphrd 24"`) ||
		!strings.Contains(res.Skipped[0].Reason, "class/net/enp59s0f0/type") {
		t.Fatalf("devices %s, skipped:\n%s", names(res.Devices), reasons(res.Skipped))
	}
}

// Without numa_node files (CONFIG_NUMA=n) the VFs are offered without a
// numaNode attribute.
func TestBuildWithoutNUMAFile(t *testing.T) {
	t.Parallel()
	_, pfs := hostPFs(t, simhost.NoNUMAHost())
	res, err := Build(pfs, config(t, "pfs:\n- pfName: enp59s0f0\n  network: a\n"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Devices) != 4 {
		t.Fatalf("devices %s, skipped:\n%s", names(res.Devices), reasons(res.Skipped))
	}
	attrs := res.Devices[0].Attributes()
	if _, ok := attrs["resource.kubernetes.io/numaNode"]; ok {
		t.Fatalf("numaNode published without a numa_node file: %v", attrs)
	}
	checkString(t, attrs, "resource.kubernetes.io/pcieRoot", "pci0000:3a")
}

// A VF left on vfio-pci (e.g. by sriov-network-device-plugin) is offered
// when nobody holds its group node, and not while someone does.
func TestBuildVFIOTakeover(t *testing.T) {
	t.Parallel()
	h, pfs := hostPFs(t, simhost.MixedHost())
	vf := pfAt(t, pfs, "0000:3b:00.0").VFs[2]
	scanner := vfioholders.Scanner{ProcRoot: h.ProcRoot(), DevRoot: h.DevRoot()}
	opts := Options{Holders: func(nodes []string) (map[string][]string, error) {
		got, err := scanner.Holders(nodes)
		out := map[string][]string{}
		for n, hs := range got {
			for _, x := range hs {
				out[n] = append(out[n], x.String())
			}
		}
		return out, err
	}}
	cfg := config(t, "pfs:\n- pfName: enp59s0f0\n  network: a\n")
	res, err := Build(pfs, cfg, opts)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Devices) != 4 || res.Devices[2].Address != vf.Address || len(res.Skipped) != 0 ||
		len(res.Notes) != 1 || !strings.Contains(res.Notes[0].Reason, "not held open by any process") {
		t.Fatalf("free vfio-pci VF: devices %s, skipped:\n%s\nnotes:\n%s", names(res.Devices), reasons(res.Skipped), reasons(res.Notes))
	}
	release, err := h.HoldVFIOGroup(vf.IOMMUGroup, 4242, "qemu-kvm")
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	res, err = Build(pfs, cfg, opts)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Devices) != 3 || len(res.Skipped) != 1 || !strings.Contains(res.Skipped[0].Reason, "held open by pid 4242 (qemu-kvm)") {
		t.Fatalf("held vfio-pci VF: devices %s, skipped:\n%s", names(res.Devices), reasons(res.Skipped))
	}
	if err := CheckVF(h.Sysfs(), vf.Address, Policy{}, opts.Holders); err == nil || !strings.Contains(err.Error(), "pid 4242") {
		t.Fatalf("CheckVF of a held VF: %v", err)
	}
	// Without a way to tell, the VF is not offered.
	res, _ = Build(pfs, cfg, Options{})
	if len(res.Devices) != 3 || !strings.Contains(reasons(res.Skipped), "cannot be told") {
		t.Fatalf("no holder check: devices %s, skipped:\n%s", names(res.Devices), reasons(res.Skipped))
	}
}

// CheckVF re-reads the host: a group that became shared, or a missing
// group without the opt-in, fails with the reason.
func TestCheckVF(t *testing.T) {
	t.Parallel()
	h, _ := hostPFs(t, simhost.NoACSHost())
	if err := CheckVF(h.Sysfs(), "0000:3b:02.1", Policy{}, nil); err == nil || !strings.Contains(err.Error(), "also holds 0000:3b:00.0") {
		t.Fatalf("shared group: %v", err)
	}
	h2, _ := hostPFs(t, simhost.E810Host())
	if err := CheckVF(h2.Sysfs(), "0000:3b:02.1", Policy{}, nil); err != nil {
		t.Fatalf("isolated VF: %v", err)
	}
	h3, _ := hostPFs(t, simhost.NoIOMMUHost())
	if err := CheckVF(h3.Sysfs(), "0000:3b:02.1", Policy{}, nil); err == nil || !strings.Contains(err.Error(), "allowUnsafeNoIOMMU") {
		t.Fatalf("noiommu without opt-in: %v", err)
	}
	if err := CheckVF(h3.Sysfs(), "0000:3b:02.1", Policy{AllowUnsafeNoIOMMU: true}, nil); err != nil {
		t.Fatalf("noiommu with opt-in: %v", err)
	}
}

func resolver(l vflink.Links) func(string) error {
	return func(nd string) error { _, err := l.Resolve(nd); return err }
}

// A driver whose link layer looks in another network namespace than the
// host's (its pod's own: no hostPID) sees the PFs in sysfs but could not
// prepare one VF; it must offer none, and say why once.
func TestBuildWrongNetnsPublishesNothing(t *testing.T) {
	t.Parallel()
	h, pfs := hostPFs(t, simhost.E810Host())
	cfg := config(t, "pfs:\n- pfName: enp59s0f0\n  network: a\n- pfName: enp59s0f1\n  network: b\n")
	good, err := Build(pfs, cfg, Options{Resolve: resolver(h.Links())})
	if err != nil || len(good.Devices) == 0 || len(good.Skipped) != 0 {
		t.Fatalf("host namespace: devices %s, err %v, skipped:\n%s", names(good.Devices), err, reasons(good.Skipped))
	}
	podNs, err := h.AddNetns("driver-pod")
	if err != nil {
		t.Fatal(err)
	}
	pod, err := h.LinksAt(podNs)
	if err != nil {
		t.Fatal(err)
	}
	res, err := Build(pfs, cfg, Options{Resolve: resolver(pod)})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Devices) != 0 || len(res.Skipped) != 2 {
		t.Fatalf("wrong namespace: devices %s, skipped:\n%s", names(res.Devices), reasons(res.Skipped))
	}
	for i, pf := range []string{"enp59s0f0", "enp59s0f1"} {
		if r := res.Skipped[i].Reason; !strings.Contains(r, "PF netdev "+pf+" not found in network namespace "+podNs) ||
			!strings.Contains(r, "hostPID: true") {
			t.Errorf("reason %d: %s", i, r)
		}
	}
	if !strings.Contains(res.Why, "none of the 2 selected PF netdevs is in network namespace "+podNs) || !strings.Contains(res.Why, "--host-netns") {
		t.Errorf("why: %s", res.Why)
	}
}

// Every offered VF carries its PF's driver and what that driver applies,
// and a DeviceClass selector on them picks exactly the right PFs.
func TestPFSupportAttributes(t *testing.T) {
	t.Parallel()
	h, err := simhost.Build(t.TempDir(), simhost.PFDriverHost())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	pfs, err := h.Sysfs().Discover(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	cfg := config(t, "pfs:\n- vendorID: \"8086\"\n  network: intel\n- vendorID: \"15b3\"\n  network: nvidia\n- vendorID: \"14e4\"\n  network: broadcom\n")
	res, err := Build(pfs, cfg, Options{})
	if err != nil {
		t.Fatal(err)
	}
	type row struct {
		driver                                      string
		vlan8021ad, linkState, minTxRate, maxTxRate bool
	}
	want := map[string]row{
		"0000:01:00.0": {"igb", false, false, false, true},  // 82576: rate limit while the link is up
		"0000:02:00.0": {"igb", false, false, false, false}, // I350
		"0000:3b:00.0": {"ice", true, true, true, true},
		"0000:5e:00.0": {"i40e", false, true, false, true},
		"0000:af:00.0": {"bnxt_en", true, true, true, true},
		"0000:d8:00.0": {"mlx5_core", false, true, true, true},
	}
	seen := map[string]int{}
	for _, d := range res.Devices {
		w, ok := want[d.PFAddress]
		if !ok {
			t.Fatalf("unexpected device %s of %s", d.Name, d.PFAddress)
		}
		seen[d.PFAddress]++
		attrs := d.Attributes()
		checkString(t, attrs, "vfnet.io/pfDriver", w.driver)
		for name, v := range map[resourceapi.QualifiedName]bool{
			AttrSupportsVlan8021ad: w.vlan8021ad, AttrSupportsLinkState: w.linkState,
			AttrSupportsMinTxRate: w.minTxRate, AttrSupportsMaxTxRate: w.maxTxRate,
		} {
			if a, ok := attrs[name]; !ok || a.BoolValue == nil || *a.BoolValue != v {
				t.Errorf("%s (%s): %s = %+v, want %v", d.Name, w.driver, name, a, v)
			}
		}
	}
	if len(seen) != len(want) {
		t.Errorf("devices per PF %v, want every PF of %v", seen, want)
	}

	// The selectors README shows, evaluated as the scheduler does.
	for expr, wantPFs := range map[string]string{
		`device.attributes["vfnet.io"].supportsVlan8021ad`:                                                   "0000:3b:00.0 0000:af:00.0",
		`device.attributes["vfnet.io"].supportsLinkState && device.attributes["vfnet.io"].supportsMaxTxRate`: "0000:3b:00.0 0000:5e:00.0 0000:af:00.0 0000:d8:00.0",
		`device.attributes["vfnet.io"].pfDriver == "igb"`:                                                    "0000:01:00.0 0000:02:00.0",
	} {
		c := cel.GetCompiler(cel.Features{}).CompileCELExpression(expr, cel.Options{})
		if c.Error != nil {
			t.Fatalf("%s: %v", expr, c.Error)
		}
		var got []string
		for _, d := range res.Devices {
			ok, _, err := c.DeviceMatches(t.Context(), cel.Device{Driver: DriverName, Attributes: d.Attributes()})
			if err != nil {
				t.Fatalf("%s on %s: %v", expr, d.Name, err)
			}
			if ok && !slices.Contains(got, d.PFAddress) {
				got = append(got, d.PFAddress)
			}
		}
		if strings.Join(got, " ") != wantPFs {
			t.Errorf("%s selects PFs %v, want %s", expr, got, wantPFs)
		}
	}
}

// A PF in a PCI domain beyond ffff (behind Intel VMD) is modelled by sysfs
// as the kernel names it, selected like any PF, and refused here with the
// reason and the fix: QEMU's vfio-pci cannot open its VFs (pciaddr's one
// domain rule). The PF in domain 0000 next to it is offered as usual.
func TestBuildRefusesVMDDomainPF(t *testing.T) {
	t.Parallel()
	_, pfs := hostPFs(t, simhost.VMDHost())
	vmd := pfAt(t, pfs, simhost.VMDPFAddress)
	if len(vmd.VFs) != 4 || vmd.VFs[0].Address != "10000:e1:02.0" {
		t.Fatalf("sysfs model of the VMD PF: %d VFs, first %+v; want 4 from 10000:e1:02.0", len(vmd.VFs), vmd.VFs)
	}
	for _, sel := range []string{"vendorID: \"8086\"\n  deviceID: \"1593\"", "pfName: ens10f0", `pciAddress: "10000:E1:00.0"`} {
		cfg := config(t, "pfs:\n- "+sel+"\n  network: physnet-a\n")
		res, err := Build(pfs, cfg, Options{})
		if err != nil {
			t.Fatalf("%s: %v", sel, err)
		}
		var skipped *Skipped
		for i, s := range res.Skipped {
			if s.Address == simhost.VMDPFAddress {
				skipped = &res.Skipped[i]
			}
		}
		if skipped == nil {
			t.Fatalf("%s: Skipped = %+v, want the VMD PF", sel, res.Skipped)
		}
		for _, want := range []string{"ens10f0", "domain 10000", "QEMU's vfio-pci", "none of its 4 VFs", "disable VMD"} {
			if !strings.Contains(skipped.Reason, want) {
				t.Errorf("%s: reason %q does not say %q", sel, skipped.Reason, want)
			}
		}
		for _, d := range res.Devices {
			if d.PFAddress == simhost.VMDPFAddress || strings.HasPrefix(d.Address, "10000:") {
				t.Errorf("%s: offered %s (%s) beyond domain ffff", sel, d.Name, d.Address)
			}
			if _, err := pciaddr.Parse(d.Address); err != nil {
				t.Errorf("%s: offered %s: %v", sel, d.Address, err)
			}
		}
		if strings.HasPrefix(sel, "vendorID") && names(res.Devices) != "vf-0000-3b-02-0 vf-0000-3b-02-1 vf-0000-3b-02-2 vf-0000-3b-02-3" {
			t.Errorf("devices = %s, want the domain-0000 PF's four VFs", names(res.Devices))
		}
	}
	if _, err := Find(pfs, "vf-10000-e1-02-0"); err == nil {
		t.Error("Find resolved a device name beyond domain ffff")
	}
}
