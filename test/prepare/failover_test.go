package prepare

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
	"libvirt.org/go/libvirtxml"

	"github.com/vfnet-io/vfnet/pkg/contract/metadata"
	"github.com/vfnet-io/vfnet/pkg/contract/standby"
	"github.com/vfnet-io/vfnet/sidecar/domain"
	"github.com/vfnet-io/vfnet/test/lib/kubevirtvmi"
	"github.com/vfnet-io/vfnet/test/lib/preparetest"
	"github.com/vfnet-io/vfnet/test/lib/sidecartest"
	"github.com/vfnet-io/vfnet/test/lib/simhost"
)

// TestFailoverPrepareToDomain follows VFConfig.failover from the claim over
// the kubelet's socket to the domain XML: a failover claim without a MAC is
// refused and leaves the host as it was; one with VFConfig.mac prepares,
// the metadata file the kubelet plugin helper writes carries
// vfnet.io/failover, and the sidecar reading that file writes the standby
// interface with the VF's MAC next to the hostdev, in a domain libvirt's
// schema accepts.
func TestFailoverPrepareToDomain(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := preparetest.NewEnv(t, shortDir(t), simhost.E810Host())
	const (
		hdr = `"apiVersion":"vfnet.io/v1alpha1","kind":"VFConfig"`
		dev = "vf-0000-3b-02-1"
		bdf = "0000:3b:02.1"
		mac = "02:aa:00:00:00:36"
	)
	_, kl := preparetest.StartPlugin(t, e, e.NewState(t, nil))
	prep := func(c *resourceapi.ResourceClaim) *drapb.NodePrepareResourceResponse {
		t.Helper()
		e.AddClaim(t, c)
		resp, err := kl.DRA.NodePrepareResources(ctx, &drapb.NodePrepareResourcesRequest{Claims: []*drapb.Claim{preparetest.Ref(c)}})
		if err != nil {
			t.Fatal(err)
		}
		r := resp.Claims[string(c.UID)]
		if r == nil {
			t.Fatalf("no result for claim %s", c.Name)
		}
		return r
	}

	before := e.Snapshot(t)
	noMAC := preparetest.Claim("ns", "fo-nomac", "uid-fo-nomac", []string{dev},
		preparetest.Config(resourceapi.AllocationConfigSourceClass, `{`+hdr+`,"failover":true}`))
	if r := prep(noMAC); !strings.Contains(r.Error, "VFConfig.failover is true but the VF has no fixed MAC") || len(r.Devices) != 0 {
		t.Fatalf("prepare of a failover claim without a MAC: %+v", r)
	}
	if got := e.Snapshot(t); got.String() != before.String() {
		t.Fatalf("host after the refused prepare:\n%s\nwant\n%s", got, before)
	}

	fo := preparetest.Claim("ns", "fo", "uid-fo", []string{dev},
		preparetest.Config(resourceapi.AllocationConfigSourceClaim, `{`+hdr+`,"failover":true,"mac":"`+mac+`"}`))
	if r := prep(fo); r.Error != "" || len(r.Devices) != 1 {
		t.Fatalf("prepare of %s: %+v", fo.Name, r)
	}
	written, err := os.ReadFile(filepath.Join(e.PluginDir, "dra-device-metadata", "ns_"+fo.Name, "vf", "metadata.json"))
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	p := metadata.ClaimPath(root, fo.Name, "vf")
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, written, 0o644); err != nil {
		t.Fatal(err)
	}
	d, err := metadata.Read(p)
	if err != nil {
		t.Fatal(err)
	}
	if !d.Failover || d.HardwareAddress() != mac || d.PCIBusID != bdf {
		t.Fatalf("metadata the helper wrote: failover=%v mac=%q pciBusID=%s, want true %s %s", d.Failover, d.HardwareAddress(), d.PCIBusID, mac, bdf)
	}

	vmi := sidecartest.NewVMI().VFNet("dra-net", "net", "vf", nil).Direct("net", fo.Name).Build()
	ifaces, err := kubevirtvmi.View(vmi).BindingInterfaces(sidecartest.Binding)
	if err != nil {
		t.Fatal(err)
	}
	out, err := domain.Apply(t.Context(), sidecartest.ReadFile(t, filepath.Join("..", "..", "sidecar", "domain", "testdata", "q35.xml")), ifaces, metadata.FileReader{Root: root}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if s := hostdevSource(t, out, "ua-sriov-dra-net"); s.String() != bdf {
		t.Errorf("hostdev source %s, want %s", s, bdf)
	}
	var dom libvirtxml.Domain
	if err := dom.Unmarshal(string(out)); err != nil {
		t.Fatal(err)
	}
	var found int
	for _, i := range dom.Devices.Interfaces {
		if i.Alias == nil || i.Alias.Name != standby.Alias("dra-net") {
			continue
		}
		found++
		if i.MAC == nil || i.MAC.Address != mac || i.Teaming == nil || i.Teaming.Type != "persistent" || i.Target == nil || i.Target.Dev != standby.TargetDev("dra-net") {
			t.Errorf("standby %+v: want MAC %s, teaming persistent, tap %s", i, mac, standby.TargetDev("dra-net"))
		}
	}
	if found != 1 {
		t.Errorf("%d standby interfaces, want 1:\n%s", found, out)
	}
	sidecartest.Validate(t, out)
}
