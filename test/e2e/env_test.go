// Package e2e runs vfnet against a real control plane (etcd, kube-apiserver,
// kube-scheduler, kube-controller-manager v1.37.2): the install manifests,
// RBAC and admission policy, and the whole VM flow on simulated nodes.
// The control-plane binaries come from test/builds/kubernetes/build.sh (`make test`
// builds them first); without them the tests fail and say how to build them.
package e2e

import (
	"context"
	"os"
	"testing"
	"time"

	"k8s.io/klog/v2/ktesting"

	"github.com/vfnet-io/vfnet/test/lib/controlplane"
	"github.com/vfnet-io/vfnet/test/lib/flow"
)

// newEnv starts a control plane for t and wraps it in a flow.Env whose
// directory is short enough for unix sockets.
func newEnv(t *testing.T) (context.Context, *flow.Env) {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	plane := controlplane.StartForTest(t, controlplane.Options{})
	dir, err := flow.WorkDir()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	env, err := flow.NewEnv(plane, dir, testWriter{t})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := env.Close(); err != nil {
			t.Errorf("close env: %v", err)
		}
	})
	return ctx, env
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(string(p))
	return len(p), nil
}

// install applies manifests/ and KubeVirt's CRDs, as a cluster admin
// installs vfnet on a KubeVirt cluster.
func install(ctx context.Context, t *testing.T, env *flow.Env) {
	t.Helper()
	if err := env.ApplyManifests(ctx); err != nil {
		t.Fatal(err)
	}
	if err := env.InstallKubeVirtCRDs(ctx); err != nil {
		t.Fatal(err)
	}
}

// startNode adds a node, starts its driver and waits until the API server
// shows devices devices in its ResourceSlices.
func startNode(ctx context.Context, t *testing.T, env *flow.Env, o flow.NodeOptions, devices int) (*flow.Node, []flow.VFRef) {
	t.Helper()
	n, err := env.AddNode(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.StartDriver(ctx); err != nil {
		t.Fatal(err)
	}
	refs, err := env.WaitSlices(ctx, n.Name, devices, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	return n, refs
}
