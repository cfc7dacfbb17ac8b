package metadata_test

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/utils/ptr"

	"github.com/vfnet-io/vfnet/pkg/contract/metadata"
	"github.com/vfnet-io/vfnet/test/lib/kubevirtvmi"
	"github.com/vfnet-io/vfnet/test/lib/metadatatest"
)

func TestPaths(t *testing.T) {
	t.Parallel()
	if got, want := metadata.ClaimPath("/r", "rc-1", "vf"), "/r/resourceclaims/rc-1/vf/sriov.vfnet.io-metadata.json"; got != want {
		t.Errorf("ClaimPath = %s, want %s", got, want)
	}
	if got, want := metadata.TemplateClaimPath("/r", "net", "vf"), "/r/resourceclaimtemplates/net/vf/sriov.vfnet.io-metadata.json"; got != want {
		t.Errorf("TemplateClaimPath = %s, want %s", got, want)
	}
	direct := kubevirtvmi.ClaimInterface{PodClaimName: "pod-claim", RequestName: "vf", ResourceClaimName: ptr.To("rc-object")}
	if got, want := metadata.PathFor("/r", direct), "/r/resourceclaims/rc-object/vf/sriov.vfnet.io-metadata.json"; got != want {
		t.Errorf("PathFor(direct) = %s, want %s (keyed by the ResourceClaim name)", got, want)
	}
	tmpl := kubevirtvmi.ClaimInterface{PodClaimName: "pod-claim", RequestName: "vf", ResourceClaimTemplateName: ptr.To("tmpl")}
	if got, want := metadata.PathFor("/r", tmpl), "/r/resourceclaimtemplates/pod-claim/vf/sriov.vfnet.io-metadata.json"; got != want {
		t.Errorf("PathFor(template) = %s, want %s", got, want)
	}
}

var claim = metadatatest.Claim{Namespace: "vms", Name: "vm-a-net-x7k2", UID: "u-1", PodClaimName: "net", Request: "vf"}

func TestReadOneDevice(t *testing.T) {
	t.Parallel()
	path := metadata.TemplateClaimPath(t.TempDir(), "net", "vf")
	if err := metadatatest.Write(path, metadatatest.Stream(claim, metadatatest.VF("0000:3b:02.1", "02:00:00:00:00:01"))); err != nil {
		t.Fatal(err)
	}
	d, err := metadata.Read(path)
	if err != nil {
		t.Fatal(err)
	}
	if d.PCIBusID != "0000:3b:02.1" || d.HardwareAddress() != "02:00:00:00:00:01" || d.Request != "vf" ||
		d.ClaimName != "vm-a-net-x7k2" || d.ClaimNamespace != "vms" || d.PodClaimName != "net" || d.Name != "vf-0000:3b:02.1" {
		t.Errorf("decoded %+v", d)
	}
}

// The failover attribute decodes into Device.Failover; without it (every
// device of a claim that does not ask for failover) Failover is false.
func TestDecodeFailover(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		dev  metadatatest.Device
		want bool
	}{
		{metadatatest.VF("0000:3b:02.1", "02:00:00:00:00:01"), false},
		{metadatatest.Device{Name: "vf-x", PCIBusID: "0000:3b:02.1", Failover: true}, true},
		{metadatatest.Device{Name: "vf-x", PCIBusID: "0000:3b:02.1",
			Extra: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{metadata.FailoverAttribute: {BoolValue: ptr.To(false)}}}, false},
	} {
		d, err := metadata.Decode(metadatatest.Stream(claim, c.dev))
		if err != nil {
			t.Fatal(err)
		}
		if d.Failover != c.want {
			t.Errorf("device %+v: Failover = %v, want %v", c.dev, d.Failover, c.want)
		}
	}
}

// The v1alpha1-only stream (older writers) decodes too; unknown future
// versions before it are skipped by devicemetadata.
func TestDecodeAlphaOnlyAndUnknownVersion(t *testing.T) {
	t.Parallel()
	s := metadatatest.Stream(claim, metadatatest.VF("0000:3b:02.1", ""))
	lines := bytes.SplitN(s, []byte("\n"), 2)
	alpha := lines[1]
	future := []byte(`{"kind":"DeviceMetadata","apiVersion":"metadata.resource.k8s.io/v9","requests":[]}` + "\n")
	d, err := metadata.Decode(append(future, alpha...))
	if err != nil {
		t.Fatal(err)
	}
	if d.PCIBusID != "0000:3b:02.1" || d.HardwareAddress() != "" {
		t.Errorf("decoded %+v", d)
	}
}

func TestDecodeErrors(t *testing.T) {
	t.Parallel()
	cases := map[string]struct {
		data []byte
		want string
	}{
		"no device":    {metadatatest.Stream(claim), "lists no device"},
		"two devices":  {metadatatest.Stream(claim, metadatatest.VF("0000:3b:02.1", ""), metadatatest.VF("0000:3b:02.2", "")), "2 devices"},
		"other driver": {metadatatest.Stream(claim, metadatatest.Device{Driver: "sriovnetwork.k8snetworkplumbingwg.io", Name: "x", PCIBusID: "0000:3b:02.1"}), `from driver "sriovnetwork.k8snetworkplumbingwg.io"`},
		"no pciBusID":  {metadatatest.Stream(claim, metadatatest.Device{Name: "vf-x"}), "no string attribute resource.kubernetes.io/pciBusID"},
		"garbage":      {[]byte("{not json"), "decode"},
		"bad slot":     {metadatatest.Stream(claim, metadatatest.Device{Name: "vf-x", PCIBusID: "0000:3b:22.1"}), `pciBusID "0000:3b:22.1": PCI slot 22 is beyond 1f`},
		"upper case":   {metadatatest.Stream(claim, metadatatest.Device{Name: "vf-x", PCIBusID: "0000:3B:02.1"}), "want the lower-case form"},
		// The domain rule (pciaddr): an address beyond domain ffff is never
		// published, so a file naming one is refused before the sidecar
		// writes a hostdev QEMU would refuse.
		"VMD domain": {metadatatest.Stream(claim, metadatatest.Device{Name: "vf-x", PCIBusID: "10000:3b:02.1"}), `pciBusID "10000:3b:02.1": PCI domain 10000 is beyond ffff`},
		"empty":      {nil, "no metadata objects"},
		"failover not a bool": {metadatatest.Stream(claim, metadatatest.Device{Name: "vf-x", PCIBusID: "0000:3b:02.1",
			Extra: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{metadata.FailoverAttribute: {StringValue: ptr.To("true")}}}), "attribute vfnet.io/failover is not a boolean"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			_, err := metadata.Decode(c.data)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("err = %v, want it to contain %q", err, c.want)
			}
		})
	}
}

func TestReadMissingAndHuge(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	_, err := metadata.Read(filepath.Join(dir, "nope", metadata.FileName))
	if !metadata.IsNotExist(err) || !strings.Contains(err.Error(), filepath.Join(dir, "nope")) {
		t.Errorf("missing file: err = %v, want not-exist naming the path", err)
	}
	huge := filepath.Join(dir, "huge.json")
	if err := os.WriteFile(huge, bytes.Repeat([]byte(" "), 2<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := metadata.Read(huge); err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Errorf("huge file: err = %v", err)
	}
}
