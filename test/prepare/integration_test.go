package prepare

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/dynamic-resource-allocation/api/metadata"
	metadatav1alpha1 "k8s.io/dynamic-resource-allocation/api/metadata/v1alpha1"
	"k8s.io/dynamic-resource-allocation/devicemetadata"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"

	"github.com/vfnet-io/vfnet/driver/discovery"
	"github.com/vfnet-io/vfnet/test/lib/preparetest"
	"github.com/vfnet-io/vfnet/test/lib/simhost"
)

func TestKubeletOverSockets(t *testing.T) {
	t.Parallel()
	e := preparetest.NewEnv(t, shortDir(t), simhost.E810Host())
	pod := e.AddVM(t, "ns", "vm1", "vf-claim", "02:00:00:00:00:07")
	claim := preparetest.ReserveFor(preparetest.Claim("ns", "virt-launcher-vm1-vf-claim-abcde", "uid-int", []string{"vf-0000-3b-02-1"},
		preparetest.Config("FromClass", `{"apiVersion":"vfnet.io/v1alpha1","kind":"VFConfig","vlan":300}`)), pod, "vf-claim")
	e.AddClaim(t, claim)
	before := e.Snapshot(t)
	_, kl := preparetest.StartPlugin(t, e, e.NewState(t, nil))

	if kl.Info.Name != discovery.DriverName || !slices.Contains(kl.Info.SupportedVersions, drapb.DRAPluginService) {
		t.Fatalf("registration info %+v", kl.Info)
	}
	ctx := context.Background()
	resp, err := kl.DRA.NodePrepareResources(ctx, &drapb.NodePrepareResourcesRequest{Claims: []*drapb.Claim{preparetest.Ref(claim)}})
	if err != nil {
		t.Fatal(err)
	}
	r := resp.Claims[string(claim.UID)]
	if r == nil || r.Error != "" || len(r.Devices) != 1 {
		t.Fatalf("prepare response %+v", resp)
	}
	d := r.Devices[0]
	if d.DeviceName != "vf-0000-3b-02-1" || d.PoolName != preparetest.Node || !slices.Equal(d.RequestNames, []string{"vf"}) {
		t.Fatalf("device %+v", d)
	}
	// Our VFIO device plus the helper's metadata mount.
	if len(d.CdiDeviceIds) != 2 || d.CdiDeviceIds[0] != "sriov.vfnet.io/vf=uid-int-vf-0000-3b-02-1" || !strings.HasPrefix(d.CdiDeviceIds[1], "sriov.vfnet.io/metadata=") {
		t.Fatalf("CDI IDs %v", d.CdiDeviceIds)
	}
	link, _ := e.Host.VFState("enp59s0f0", 1)
	if link.MAC.String() != "02:00:00:00:00:07" || link.VLAN != 300 {
		t.Fatalf("VF link %+v", link)
	}

	// The metadata file the kubeletplugin helper wrote, decoded as readers do.
	mdPath := filepath.Join(e.PluginDir, "dra-device-metadata", "ns_"+claim.Name, "vf", "metadata.json")
	data, err := os.ReadFile(mdPath)
	if err != nil {
		t.Fatal(err)
	}
	var md metadata.DeviceMetadata
	var verr error
	var gvk schema.GroupVersionKind
	if err := devicemetadata.DecodeMetadataFromStream(json.NewDecoder(bytes.NewReader(data)), &md,
		devicemetadata.DecodeMetadataWithValidationResult(&verr), devicemetadata.DecodeMetadataStoreGVKResult(&gvk)); err != nil {
		t.Fatal(err)
	}
	if verr != nil {
		t.Fatalf("metadata does not validate: %v", verr)
	}
	if gvk.Version != "v1beta1" {
		t.Fatalf("first object is %v, want v1beta1", gvk)
	}
	if md.PodClaimName == nil || *md.PodClaimName != "vf-claim" || len(md.Requests) != 1 || len(md.Requests[0].Devices) != 1 {
		t.Fatalf("metadata %+v", md)
	}
	dev := md.Requests[0].Devices[0]
	if a := dev.Attributes["resource.kubernetes.io/pciBusID"]; a.StringValue == nil || *a.StringValue != "0000:3b:02.1" {
		t.Fatalf("attributes %+v", dev.Attributes)
	}
	if dev.NetworkData == nil || dev.NetworkData.HardwareAddress != "02:00:00:00:00:07" || dev.Driver != discovery.DriverName {
		t.Fatalf("device metadata %+v", dev)
	}
	// KubeVirt's reader only understands v1alpha1: the stream carries it.
	var old metadatav1alpha1.DeviceMetadata
	if err := devicemetadata.DecodeMetadataFromStream(json.NewDecoder(bytes.NewReader(data)), &old); err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(data, []byte(`"apiVersion": "metadata.resource.k8s.io/v1alpha1"`)) {
		t.Fatalf("no v1alpha1 object in the stream:\n%s", data)
	}
	if a := old.Requests[0].Devices[0].Attributes["resource.kubernetes.io/pciBusID"]; a.StringValue == nil || *a.StringValue != "0000:3b:02.1" {
		t.Fatalf("v1alpha1 attributes %+v", old.Requests[0].Devices[0].Attributes)
	}
	st := e.GetClaim(t, "ns", claim.Name).Status.Devices
	if len(st) != 1 || st[0].NetworkData == nil || st[0].NetworkData.HardwareAddress != "02:00:00:00:00:07" {
		t.Fatalf("claim status %+v", st)
	}

	uresp, err := kl.DRA.NodeUnprepareResources(ctx, &drapb.NodeUnprepareResourcesRequest{Claims: []*drapb.Claim{preparetest.Ref(claim)}})
	if err != nil || uresp.Claims[string(claim.UID)] == nil || uresp.Claims[string(claim.UID)].Error != "" {
		t.Fatalf("unprepare %+v %v", uresp, err)
	}
	if _, err := os.Stat(mdPath); !os.IsNotExist(err) {
		t.Fatalf("metadata file left: %v", err)
	}
	if got := e.Snapshot(t); got.String() != before.String() {
		t.Fatalf("host after unprepare:\n%s\nwant\n%s", got, before)
	}
	// Unknown claims succeed over the wire too.
	uresp, err = kl.DRA.NodeUnprepareResources(ctx, &drapb.NodeUnprepareResourcesRequest{Claims: []*drapb.Claim{{Namespace: "ns", Name: "gone", Uid: "uid-gone"}}})
	if err != nil || uresp.Claims["uid-gone"].Error != "" {
		t.Fatalf("unknown claim: %+v %v", uresp, err)
	}
}

// shortDir keeps unix socket paths far below 108 bytes.
func shortDir(t testing.TB) string {
	if d := preparetest.FastDir(); d != "" {
		return d
	}
	return os.TempDir()
}
