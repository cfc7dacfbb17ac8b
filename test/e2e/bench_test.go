package e2e

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"k8s.io/klog/v2/ktesting"

	"github.com/vfnet-io/vfnet/test/lib/controlplane"
	"github.com/vfnet-io/vfnet/test/lib/flow"
)

// BenchmarkPodToPreparedVF measures, on the real control plane with the real
// driver, the time from creating a virt-launcher-shaped pod to its VF being
// prepared (claim from template, scheduling, NodePrepareResources with MAC
// lookup, vfio-pci bind, VLAN, CDI, metadata). Teardown is not timed.
func BenchmarkPodToPreparedVF(b *testing.B) {
	_, ctx := ktesting.NewTestContext(b)
	plane, err := controlplane.Start(ctx, controlplane.Options{HandleSignals: true})
	if err != nil {
		b.Fatal(err)
	}
	defer plane.Stop()
	dir, err := flow.WorkDir()
	if err != nil {
		b.Fatal(err)
	}
	defer os.RemoveAll(dir)
	env, err := flow.NewEnv(plane, dir, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer env.Close()
	if err := env.ApplyManifests(ctx); err != nil {
		b.Fatal(err)
	}
	if err := env.InstallKubeVirtCRDs(ctx); err != nil {
		b.Fatal(err)
	}
	node, err := env.AddNode(ctx, flow.NodeOptions{Name: "node-1", Spec: flow.DemoHost()})
	if err != nil {
		b.Fatal(err)
	}
	if err := node.StartDriver(ctx); err != nil {
		b.Fatal(err)
	}
	if _, err := env.WaitSlices(ctx, node.Name, 3, time.Minute); err != nil {
		b.Fatal(err)
	}
	i := 0
	for b.Loop() {
		i++
		vm, err := env.CreateVM(ctx, flow.VMSpec{Name: fmt.Sprintf("vm-%d", i), DeviceClass: "vfnet-physnet-a", MAC: "02:00:00:00:01:01", VLAN: 100})
		if err != nil {
			b.Fatal(err)
		}
		wctx, cancel := context.WithTimeout(ctx, time.Minute)
		if _, err := node.Kubelet.WaitPrepared(wctx, vm.Pod.UID); err != nil {
			b.Fatal(err)
		}
		cancel()
		b.StopTimer()
		sched, err := env.WaitScheduled(ctx, vm, time.Minute)
		if err != nil {
			b.Fatal(err)
		}
		if err := env.DeleteVM(ctx, vm, sched.Claim.Name, time.Minute); err != nil {
			b.Fatal(err)
		}
		wctx, cancel = context.WithTimeout(ctx, time.Minute)
		if _, err := node.Kubelet.WaitUnprepared(wctx, vm.Pod.UID); err != nil {
			b.Fatal(err)
		}
		cancel()
		b.StartTimer()
	}
}
