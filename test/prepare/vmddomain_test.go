package prepare

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
	"libvirt.org/go/libvirtxml"

	"github.com/vfnet-io/vfnet/driver/discovery"
	"github.com/vfnet-io/vfnet/driver/migration/attach"
	"github.com/vfnet-io/vfnet/pkg/api/nodeconfig"
	"github.com/vfnet-io/vfnet/pkg/contract/metadata"
	"github.com/vfnet-io/vfnet/pkg/contract/pciaddr"
	"github.com/vfnet-io/vfnet/sidecar/domain"
	"github.com/vfnet-io/vfnet/test/lib/kubevirtvmi"
	"github.com/vfnet-io/vfnet/test/lib/preparetest"
	"github.com/vfnet-io/vfnet/test/lib/sidecartest"
	"github.com/vfnet-io/vfnet/test/lib/simhost"
)

// TestVMDDomainVFEveryStep follows a VF in PCI domain 10000 (behind Intel
// VMD) from the simulated sysfs to the <hostdev>, next to a VF in domain
// 0000 on the same host, and checks pciaddr's one domain rule at each step:
// the kernel model lists it, discovery (and so inspect) refuses its PF with
// the reason, prepare refuses a claim that names it, the metadata reader and
// the sidecar refuse metadata that names it, and the migration attacher
// refuses its hostdev; the domain-0000 VF passes every step, and the
// attacher's hostdev is the one the sidecar wrote.
func TestVMDDomainVFEveryStep(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := preparetest.NewEnv(t, shortDir(t), simhost.VMDHost())
	const (
		vmdVF   = "10000:e1:02.0"
		vmdName = "vf-10000-e1-02-0" // the name a driver without the rule gave it
		okVF    = "0000:3b:02.0"
		okName  = "vf-0000-3b-02-0"
	)

	// sysfs: the kernel's names, every domain.
	pfs, err := e.Host.Sysfs().Discover(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var modelled bool
	for _, pf := range pfs {
		for _, vf := range pf.VFs {
			modelled = modelled || vf.Address == vmdVF
		}
	}
	if !modelled {
		t.Fatalf("sysfs model lacks VF %s: %+v", vmdVF, pfs)
	}
	if _, err := pciaddr.Parse(vmdVF); !errors.Is(err, pciaddr.ErrDomain) {
		t.Fatalf("pciaddr.Parse(%s) = %v, want ErrDomain", vmdVF, err)
	}

	// discovery: the VMD PF is not offered, with the reason and the fix.
	cfg, err := nodeconfig.Parse([]byte("apiVersion: vfnet.io/v1alpha1\nkind: NodeConfig\npfs:\n- vendorID: \"8086\"\n  network: physnet-a\n"), "node.yaml")
	if err != nil {
		t.Fatal(err)
	}
	res, err := discovery.Build(pfs, cfg, discovery.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var reason string
	for _, s := range res.Skipped {
		if s.Address == simhost.VMDPFAddress {
			reason = s.Reason
		}
	}
	if !strings.Contains(reason, "QEMU's vfio-pci") || !strings.Contains(reason, "disable VMD") {
		t.Fatalf("discovery skipped %+v, want %s refused with the domain rule's reason and fix", res.Skipped, simhost.VMDPFAddress)
	}
	t.Logf("discovery: not offered: %s: %s", simhost.VMDPFAddress, reason)
	offered := map[string]bool{}
	for _, d := range res.Devices {
		offered[d.Name] = true
		if a, err := pciaddr.Parse(d.Address); err != nil || a.DeviceName() != d.Name {
			t.Errorf("offered %s at %s: %v", d.Name, d.Address, err)
		}
	}
	if !offered[okName] || offered[vmdName] || len(res.Devices) != 4 {
		t.Fatalf("offered %v, want the four domain-0000 VFs", offered)
	}

	// prepare, over the kubelet's socket: a claim naming the VMD VF (as a
	// driver without the rule published it) fails and leaves the host as
	// it was; the domain-0000 VF prepares and its metadata names it.
	_, kl := preparetest.StartPlugin(t, e, e.NewState(t, nil))
	before := e.Snapshot(t)
	bad := preparetest.Claim("ns", "vmd", "uid-vmd", []string{vmdName})
	e.AddClaim(t, bad)
	resp, err := kl.DRA.NodePrepareResources(ctx, &drapb.NodePrepareResourcesRequest{Claims: []*drapb.Claim{preparetest.Ref(bad)}})
	if err != nil {
		t.Fatal(err)
	}
	if r := resp.Claims[string(bad.UID)]; r == nil || !strings.Contains(r.Error, "device "+vmdName+": PCI domain 10000 is beyond ffff") || len(r.Devices) != 0 {
		t.Fatalf("prepare of %s: %+v, want an error naming the device and the domain rule", vmdName, r)
	} else {
		t.Logf("prepare: %s", r.Error)
	}
	if got := e.Snapshot(t); got.String() != before.String() {
		t.Fatalf("host after the refused prepare:\n%s\nwant\n%s", got, before)
	}
	good := preparetest.Claim("ns", "ok", "uid-ok", []string{okName})
	e.AddClaim(t, good)
	resp, err = kl.DRA.NodePrepareResources(ctx, &drapb.NodePrepareResourcesRequest{Claims: []*drapb.Claim{preparetest.Ref(good)}})
	if err != nil {
		t.Fatal(err)
	}
	if r := resp.Claims[string(good.UID)]; r == nil || r.Error != "" || len(r.Devices) != 1 || r.Devices[0].DeviceName != okName {
		t.Fatalf("prepare of %s: %+v", okName, r)
	}
	written, err := os.ReadFile(filepath.Join(e.PluginDir, "dra-device-metadata", "ns_"+good.Name, "vf", "metadata.json"))
	if err != nil {
		t.Fatal(err)
	}

	// metadata: the file the kubelet helper wrote, where the kubelet
	// mounts it in the pod; and the same file naming the VMD VF, as a
	// writer without the rule would have left it.
	root := t.TempDir()
	install := func(claimName string, data []byte) {
		t.Helper()
		p := metadata.ClaimPath(root, claimName, "vf")
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	install(good.Name, written)
	install(bad.Name, bytes.ReplaceAll(bytes.ReplaceAll(written, []byte(`"`+okVF+`"`), []byte(`"`+vmdVF+`"`)), []byte(okName), []byte(vmdName)))
	if d, err := metadata.Read(metadata.ClaimPath(root, good.Name, "vf")); err != nil || d.PCIBusID != okVF {
		t.Fatalf("metadata of %s: %+v, %v", okName, d, err)
	}
	if _, err := metadata.Read(metadata.ClaimPath(root, bad.Name, "vf")); !errors.Is(err, pciaddr.ErrDomain) {
		t.Fatalf("metadata naming %s: err = %v, want ErrDomain", vmdVF, err)
	}

	// sidecar: the domain-0000 VF becomes the hostdev; the VMD one fails
	// the VM's define with the interface, the attribute and the rule.
	domainXML := sidecartest.ReadFile(t, filepath.Join("..", "..", "sidecar", "domain", "testdata", "q35.xml"))
	sidecar := func(claimName string) ([]byte, error) {
		vmi := sidecartest.NewVMI().VFNet("dra-net", "net", "vf", nil).Direct("net", claimName).Build()
		ifaces, err := kubevirtvmi.View(vmi).BindingInterfaces(sidecartest.Binding)
		if err != nil {
			return nil, err
		}
		return domain.Apply(t.Context(), domainXML, ifaces, metadata.FileReader{Root: root}, nil)
	}
	out, err := sidecar(good.Name)
	if err != nil {
		t.Fatal(err)
	}
	sidecarSource := hostdevSource(t, out, "ua-sriov-dra-net")
	if sidecarSource.String() != okVF {
		t.Fatalf("sidecar hostdev source %s, want %s", sidecarSource, okVF)
	}
	_, err = sidecar(bad.Name)
	if !errors.Is(err, pciaddr.ErrDomain) || !strings.Contains(err.Error(), `interface "dra-net"`) || !strings.Contains(err.Error(), vmdVF) {
		t.Fatalf("sidecar with %s: err = %v, want ErrDomain naming the interface and the VF", vmdVF, err)
	}
	t.Logf("sidecar: %v", err)

	// migration attach: the hostdev from the allocated device name is the
	// sidecar's; from the VMD name, or with the VMD source, it is refused.
	src, err := pciaddr.ParseDeviceName(okName)
	if err != nil {
		t.Fatal(err)
	}
	x, err := attach.Hostdev{Interface: "dra-net", Source: src}.XML()
	if err != nil {
		t.Fatal(err)
	}
	if got := hostdevSource(t, []byte("<domain type='kvm'><name>x</name><devices>"+x+"</devices></domain>"), "ua-sriov-dra-net"); got != sidecarSource {
		t.Fatalf("attach hostdev source %s, sidecar's %s", got, sidecarSource)
	}
	if _, err := pciaddr.ParseDeviceName(vmdName); !errors.Is(err, pciaddr.ErrDomain) {
		t.Fatalf("ParseDeviceName(%s) = %v, want ErrDomain", vmdName, err)
	}
	vmd, err := pciaddr.ParseKernelName(vmdVF)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := (attach.Hostdev{Interface: "dra-net", Source: vmd}).XML(); !errors.Is(err, pciaddr.ErrDomain) {
		t.Fatalf("attach hostdev with source %s: err = %v, want ErrDomain", vmdVF, err)
	}
}

// hostdevSource is the source address of the hostdev with alias in doc.
func hostdevSource(t *testing.T, doc []byte, alias string) pciaddr.Address {
	t.Helper()
	var d libvirtxml.Domain
	if err := d.Unmarshal(string(doc)); err != nil {
		t.Fatal(err)
	}
	for _, h := range d.Devices.Hostdevs {
		if h.Alias == nil || h.Alias.Name != alias || h.SubsysPCI == nil || h.SubsysPCI.Source == nil || h.SubsysPCI.Source.Address == nil {
			continue
		}
		a := h.SubsysPCI.Source.Address
		if a.Domain == nil || a.Bus == nil || a.Slot == nil || a.Function == nil {
			t.Fatalf("hostdev %s: incomplete source address", alias)
		}
		return pciaddr.Address{Domain: *a.Domain, Bus: *a.Bus, Slot: *a.Slot, Function: *a.Function}
	}
	t.Fatalf("no PCI hostdev with alias %s in:\n%s", alias, doc)
	return pciaddr.Address{}
}
