package prepare

import (
	"context"
	"path/filepath"
	"slices"
	"testing"
	"time"

	drapb "k8s.io/kubelet/pkg/apis/dra/v1"

	"github.com/vfnet-io/vfnet/test/lib/preparetest"
	"github.com/vfnet-io/vfnet/test/lib/simhost"
)

// BenchmarkPrepareUnprepareGRPC is one claim (one VF, a VFConfig and a VM
// MAC lookup) prepared and unprepared through the kubelet's gRPC API on the
// synthetic host, whose /dev/vfio node appears immediately. The host,
// plugin and CDI directories are on tmpfs when available, so the numbers
// are the driver's own overhead; the Disk variant adds real fsync cost.
func BenchmarkPrepareUnprepareGRPC(b *testing.B) { benchPrepare(b, "") }

// BenchmarkPrepareUnprepareGRPCDisk keeps the simulated sysfs on tmpfs (as
// the real one is in memory) but the plugin directory (checkpoint, metadata
// files) and the CDI directory on the test's temp directory, a real disk
// here: what the driver's fsyncs cost on such a node.
func BenchmarkPrepareUnprepareGRPCDisk(b *testing.B) { benchPrepare(b, b.TempDir()) }

func benchPrepare(b *testing.B, stateDir string) {
	e := preparetest.NewEnv(b, preparetest.FastDir(), simhost.E810Host())
	if stateDir != "" {
		e.PluginDir, e.CDIRoot = filepath.Join(stateDir, "plugin"), filepath.Join(stateDir, "cdi")
	}
	e.UseSimpleClient()
	pod := e.AddVM(b, "ns", "vm1", "vf-claim", "02:00:00:00:00:07")
	claim := preparetest.ReserveFor(preparetest.Claim("ns", "bench", "uid-bench", []string{"vf-0000-3b-02-1"},
		preparetest.Config("FromClass", `{"apiVersion":"vfnet.io/v1alpha1","kind":"VFConfig","vlan":300,"trust":true}`)), pod, "vf-claim")
	e.AddClaim(b, claim)
	_, kl := preparetest.StartPlugin(b, e, e.NewState(b, nil))
	ctx := context.Background()
	req := &drapb.NodePrepareResourcesRequest{Claims: []*drapb.Claim{preparetest.Ref(claim)}}
	ureq := &drapb.NodeUnprepareResourcesRequest{Claims: []*drapb.Claim{preparetest.Ref(claim)}}
	durs := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for b.Loop() {
		t0 := time.Now()
		resp, err := kl.DRA.NodePrepareResources(ctx, req)
		if err != nil || resp.Claims[string(claim.UID)].Error != "" {
			b.Fatalf("prepare: %v %v", err, resp)
		}
		uresp, err := kl.DRA.NodeUnprepareResources(ctx, ureq)
		if err != nil || uresp.Claims[string(claim.UID)].Error != "" {
			b.Fatalf("unprepare: %v %v", err, uresp)
		}
		durs = append(durs, time.Since(t0))
	}
	b.StopTimer()
	slices.Sort(durs)
	if len(durs) > 0 {
		b.ReportMetric(float64(durs[len(durs)/2].Microseconds())/1000, "p50-ms")
		b.ReportMetric(float64(durs[min(len(durs)-1, len(durs)*99/100)].Microseconds())/1000, "p99-ms")
	}
}
