package plugin

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/klog/v2/ktesting"
	drahealthv1 "k8s.io/kubelet/pkg/apis/dra-health/v1"

	"github.com/vfnet-io/vfnet/driver/discovery"
	"github.com/vfnet-io/vfnet/driver/health"
	"github.com/vfnet-io/vfnet/pkg/api/nodeconfig"
	"github.com/vfnet-io/vfnet/test/lib/simhost"
)

// TestHealthOverGRPC acts as the kubelet on the plugin's DRA socket: the
// health stream starts with every VF healthy and turns them unhealthy when
// the PF link goes down.
func TestHealthOverGRPC(t *testing.T) {
	t.Parallel()
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	const node = "node-h"
	h, err := simhost.Build(t.TempDir(), simhost.E810Host())
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	cfg, err := nodeconfig.Parse([]byte("apiVersion: vfnet.io/v1alpha1\nkind: NodeConfig\npfs:\n- pfName: enp59s0f0\n  network: a\n"), "node.yaml")
	if err != nil {
		t.Fatal(err)
	}
	sock, err := os.MkdirTemp("", "vf")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(sock)
	if err := os.Mkdir(filepath.Join(sock, "r"), 0o700); err != nil {
		t.Fatal(err)
	}
	monitor := health.NewMonitor(health.Options{PoolName: node})
	p, err := Start(ctx, Options{NodeName: node, KubeClient: newFakeClient(node), Health: monitor,
		RegistrarDir: filepath.Join(sock, "r"), PluginDir: filepath.Join(sock, "p"), CDIDir: filepath.Join(sock, "c")})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Stop()
	observe := func() {
		pfs, err := h.Sysfs().Discover(ctx)
		if err != nil {
			t.Fatal(err)
		}
		res, err := discovery.Build(pfs, cfg, discovery.Options{})
		if err != nil {
			t.Fatal(err)
		}
		monitor.Observe(pfs, res.Devices)
	}
	observe()

	conn, err := grpc.NewClient("unix://"+filepath.Join(sock, "p", "dra.sock"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	sctx, scancel := context.WithTimeout(ctx, 30*time.Second)
	defer scancel()
	stream, err := drahealthv1.NewDRAResourceHealthClient(conn).NodeWatchResources(sctx, &drahealthv1.NodeWatchResourcesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	count := func(r *drahealthv1.NodeWatchResourcesResponse, want drahealthv1.HealthStatus) int {
		n := 0
		for _, d := range r.Devices {
			if d.Device.PoolName == node && d.Health == want {
				n++
			}
		}
		return n
	}
	first, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if len(first.Devices) != 4 || count(first, drahealthv1.HealthStatus_HEALTHY) != 4 {
		t.Fatalf("first report: %v", first.Devices)
	}
	if err := h.SetOperState("enp59s0f0", "down"); err != nil {
		t.Fatal(err)
	}
	observe()
	next, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if count(next, drahealthv1.HealthStatus_UNHEALTHY) != 4 {
		t.Fatalf("after link down: %v", next.Devices)
	}
}
