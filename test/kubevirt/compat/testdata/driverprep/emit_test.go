// Package driverprep emits the metadata file vfnet-driver's prepare path
// writes, for test/kubevirt/compat. test/kubevirt/compat copies it into a
// temporary module that requires the product module (k8s.io/* v0.37, which
// the KubeVirt test module cannot import); it is never built in place. Its
// one test is a helper process: it does nothing unless VFNET_PREPARED_OUT
// names an output directory.
package driverprep

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	drapb "k8s.io/kubelet/pkg/apis/dra/v1"

	"github.com/vfnet-io/vfnet/test/lib/preparetest"
	"github.com/vfnet-io/vfnet/test/lib/simhost"
)

const (
	envOut = "VFNET_PREPARED_OUT"
	// containerDir is where the kubelet mounts metadata in a container.
	containerDir = "/var/run/kubernetes.io/dra-device-attributes"
)

// Result tells the caller what was prepared.
type Result struct {
	// MetadataFile is the copy, at the container-relative path under the
	// output's "root" directory.
	MetadataFile string `json:"metadataFile"`
	// ContainerPath is where the helper's CDI spec mounts it.
	ContainerPath string `json:"containerPath"`
	Device        string `json:"device"`
}

// TestEmitPreparedMetadata prepares one template claim for VMI default/q35-single
// (interface dra-net, pod claim vf-claim, request vf, MAC 02:00:00:00:00:01)
// on the simulated E810 host through vfnet's kubelet plugin, then copies the
// metadata file the kubeletplugin helper wrote to the path its CDI spec
// mounts it at, below $VFNET_PREPARED_OUT/root.
func TestEmitPreparedMetadata(t *testing.T) {
	out := os.Getenv(envOut)
	if out == "" {
		t.Skip("helper for test/kubevirt/compat; set " + envOut)
	}
	dir, err := os.MkdirTemp("", "vf")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	e := preparetest.NewEnv(t, dir, simhost.E810Host())
	pod := e.AddVM(t, "default", "q35-single", "vf-claim", "02:00:00:00:00:01")
	const device = "vf-0000-3b-02-1"
	claim := preparetest.ReserveFor(preparetest.Claim("default", "virt-launcher-q35-single-vf-claim-x7k2p", "uid-q35", []string{device}), pod, "vf-claim")
	e.AddClaim(t, claim)
	_, kl := preparetest.StartPlugin(t, e, e.NewState(t, nil))
	resp, err := kl.DRA.NodePrepareResources(context.Background(), &drapb.NodePrepareResourcesRequest{Claims: []*drapb.Claim{preparetest.Ref(claim)}})
	if err != nil {
		t.Fatal(err)
	}
	if r := resp.Claims[string(claim.UID)]; r == nil || r.Error != "" {
		t.Fatalf("prepare: %+v", resp)
	}

	hostPath, containerPath := metadataMount(t, e.CDIRoot)
	rel, ok := strings.CutPrefix(containerPath, containerDir+"/")
	if !ok {
		t.Fatalf("CDI mounts metadata at %s, outside %s", containerPath, containerDir)
	}
	data, err := os.ReadFile(hostPath)
	if err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(out, "root", rel)
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, data, 0o644); err != nil {
		t.Fatal(err)
	}
	res, _ := json.Marshal(Result{MetadataFile: dst, ContainerPath: containerPath, Device: device})
	if err := os.WriteFile(filepath.Join(out, "result.json"), res, 0o644); err != nil {
		t.Fatal(err)
	}
}

// metadataMount finds the one CDI mount whose container path is below the
// metadata directory.
func metadataMount(t *testing.T, cdiRoot string) (hostPath, containerPath string) {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(cdiRoot, "*.json"))
	if err != nil {
		t.Fatal(err)
	}
	type spec struct {
		Devices []struct {
			ContainerEdits struct {
				Mounts []struct {
					HostPath      string `json:"hostPath"`
					ContainerPath string `json:"containerPath"`
				} `json:"mounts"`
			} `json:"containerEdits"`
		} `json:"devices"`
	}
	var found [][2]string
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var s spec
		if err := json.Unmarshal(data, &s); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		for _, d := range s.Devices {
			for _, m := range d.ContainerEdits.Mounts {
				if strings.HasPrefix(m.ContainerPath, containerDir+"/") {
					found = append(found, [2]string{m.HostPath, m.ContainerPath})
				}
			}
		}
	}
	if len(found) != 1 {
		t.Fatalf("want one metadata mount in CDI specs under %s, found %v", cdiRoot, found)
	}
	return found[0][0], found[0][1]
}
