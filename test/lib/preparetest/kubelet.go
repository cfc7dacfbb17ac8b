package preparetest

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/vfnet-io/vfnet/driver/discovery"
	"github.com/vfnet-io/vfnet/driver/plugin"
	"github.com/vfnet-io/vfnet/driver/prepare"
)

// Kubelet plays the kubelet against a started plugin over its real unix
// sockets.
type Kubelet struct {
	Info *registerapi.PluginInfo
	DRA  drapb.DRAPluginClient
}

// StartPlugin starts vfnet's kubelet plugin (driver/plugin) with state as
// its preparer, registrar and plugin sockets in e's directories, and
// returns a Kubelet that has completed registration.
func StartPlugin(tb testing.TB, e *Env, state *prepare.State, extra ...kubeletplugin.Option) (*plugin.Plugin, *Kubelet) {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	tb.Cleanup(cancel)
	regDir := filepath.Join(e.Dir, "reg")
	if err := os.MkdirAll(regDir, 0o755); err != nil {
		tb.Fatal(err)
	}
	p, err := plugin.Start(ctx, plugin.Options{
		NodeName: Node, KubeClient: e.Kube,
		RegistrarDir: regDir, PluginDir: e.PluginDir, CDIDir: e.CDIRoot,
		Preparer: state,
		Extra:    extra,
	})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(p.Stop)

	reg := dial(tb, filepath.Join(regDir, discovery.DriverName+"-reg.sock"))
	rc := registerapi.NewRegistrationClient(reg)
	info, err := rc.GetInfo(ctx, &registerapi.InfoRequest{})
	if err != nil {
		tb.Fatal(err)
	}
	if _, err := rc.NotifyRegistrationStatus(ctx, &registerapi.RegistrationStatus{PluginRegistered: true}); err != nil {
		tb.Fatal(err)
	}
	return p, &Kubelet{Info: info, DRA: drapb.NewDRAPluginClient(dial(tb, info.Endpoint))}
}

func dial(tb testing.TB, path string) *grpc.ClientConn {
	tb.Helper()
	conn, err := grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { conn.Close() })
	return conn
}

// Ref is the kubelet's reference to a claim.
func Ref(c *resourceapi.ResourceClaim) *drapb.Claim {
	return &drapb.Claim{Namespace: c.Namespace, Name: c.Name, Uid: string(c.UID)}
}
