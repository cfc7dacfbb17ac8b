package compat

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	drautil "kubevirt.io/kubevirt/pkg/dra"

	"github.com/vfnet-io/vfnet/test/kubevirt/internal/golden"
	"github.com/vfnet-io/vfnet/test/kubevirt/internal/mountns"
	"github.com/vfnet-io/vfnet/test/kubevirt/internal/product"
)

// TestPreparedMetadataThroughKubeVirt closes the loop with the product's
// real prepare path: vfnet's kubelet plugin prepares a claim on a simulated
// host (driven over its sockets like the kubelet, in a module beside the
// product, see testdata/driverprep), and the metadata file the kubeletplugin
// helper wrote, placed where its CDI spec mounts it, is then
//   - read by KubeVirt v1.9.0's own pkg/dra reader, and
//   - turned into a hostdev by the real vfnet-binding, called through
//     KubeVirt's hook manager as in virt-launcher,
//
// and both must name the VF prepare chose.
func TestPreparedMetadataThroughKubeVirt(t *testing.T) {
	t.Parallel()
	bin := needBinding(t)
	needRoot(t, "the hook manager's mount namespace (see TestKubeVirtHookManagerDrivesBinding)")
	root, err := product.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "test", "lib", "preparetest")); err != nil {
		t.Fatalf("product has no test/lib/preparetest (%v): moved? update this test", err)
	}
	out := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	if _, err := product.RunInProductModule(ctx, "testdata/driverprep", "^TestEmitPreparedMetadata$",
		[]string{"VFNET_PREPARED_OUT=" + out}); err != nil {
		t.Fatal(err)
	}
	var res struct {
		MetadataFile, ContainerPath, Device string
	}
	data, err := os.ReadFile(filepath.Join(out, "result.json"))
	if err != nil {
		t.Fatalf("prepare helper wrote no result: %v", err)
	}
	if err := json.Unmarshal(data, &res); err != nil {
		t.Fatal(err)
	}
	// Device name vf-0000-3b-02-1 is the VF at 0000:3b:02.1.
	wantBDF := strings.Replace(strings.Replace(strings.TrimPrefix(res.Device, "vf-"), "-", ":", 2), "-", ".", 1)
	metaRoot := filepath.Join(out, "root")

	var c golden.Case
	for _, gc := range golden.Cases() {
		if gc.Name == "q35-single" {
			c = gc
		}
	}
	if !strings.HasSuffix(res.ContainerPath, "/resourceclaimtemplates/vf-claim/vf/sriov.vfnet.io-metadata.json") {
		t.Errorf("helper mounts metadata at %s, not where KubeVirt and vfnet-binding look for template claim vf-claim", res.ContainerPath)
	}
	bdf, err := drautil.GetPCIAddressForClaim(metaRoot, c.VMI.Spec.ResourceClaims, "vf-claim", "vf")
	if err != nil {
		t.Fatalf("KubeVirt's pkg/dra reader on the prepared metadata: %v", err)
	}
	if bdf != wantBDF {
		t.Fatalf("KubeVirt's reader says %s, prepare allocated %s (%s)", bdf, res.Device, wantBDF)
	}

	_, socketDir := startBinding(t, bin, metaRoot, golden.BindingName)
	outFile := filepath.Join(t.TempDir(), "domain.xml")
	cmd, err := mountns.Command(mountns.Spec{
		Role:  roleLauncher,
		Binds: []mountns.Bind{{Source: socketDir, Target: hookSidecarDir}},
	}, c.Name, outFile)
	if err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Run(); err != nil {
		t.Fatalf("launcher (KubeVirt hook manager): %v\n%s", err, logs.String())
	}
	dom, err := os.ReadFile(outFile)
	if err != nil {
		t.Fatal(err)
	}
	got, err := sriovHostDevices(dom)
	if err != nil {
		t.Fatal(err)
	}
	want, err := kubeVirtSRIOVHostDevices(c.VMI, golden.BindingName, metaRoot)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || describe(normalizeHostDevices(got)) != describe(normalizeHostDevices(want)) {
		t.Errorf("hostdevs from prepared metadata\n got: %s\nwant: %s", describe(got), describe(want))
	}
}
