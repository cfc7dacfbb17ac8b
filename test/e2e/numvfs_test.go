package e2e

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/vfnet-io/vfnet/driver/vfcount"
	"github.com/vfnet-io/vfnet/test/lib/flow"
)

const numVFsConfig = `apiVersion: vfnet.io/v1alpha1
kind: NodeConfig
pfs:
- pfName: enp59s0f0
  network: physnet-a
  numVFs: %d
- pfName: enp59s0f1
  network: physnet-b
`

// countTaints maps node's physnet-a devices (in a complete pool) to their
// vfnet.io/vf-count-change taint value ("" when untainted).
func countTaints(ctx context.Context, env *flow.Env, node string) (map[string]string, error) {
	ss, complete, err := pool(ctx, env, node)
	if err != nil || !complete {
		return nil, err
	}
	out := map[string]string{}
	for _, s := range ss {
		for _, d := range s.Spec.Devices {
			if a := d.Attributes["vfnet.io/pfName"]; a.StringValue == nil || *a.StringValue != "enp59s0f0" {
				continue
			}
			out[d.Name] = ""
			for _, t := range d.Taints {
				if t.Key == vfcount.TaintKey && t.Effect == resourceapi.DeviceTaintEffectNoSchedule {
					out[d.Name] = t.Value
				}
			}
		}
	}
	return out, nil
}

// TestNumVFsWithScheduler runs the real driver (with the DaemonSet's
// ServiceAccount and RBAC) and kube-scheduler: raising numVFs on a PF whose
// VF a running VM holds waits, publishing every VF of the PF with the
// vfnet.io/vf-count-change taint, so a second VM on that network is not
// allocated the free VF; a Warning Event on the Node names the VM's claim.
// Once the first VM is gone the PF is brought to the new count, the taints
// go, and the waiting VM is scheduled on one of the new VFs.
func TestNumVFsWithScheduler(t *testing.T) {
	t.Parallel()
	ctx, env := newEnv(t)
	install(ctx, t, env)
	n, _ := startNode(ctx, t, env, flow.NodeOptions{Name: "node-a", Spec: flow.DemoHost(), NodeConfig: fmt.Sprintf(numVFsConfig, 2),
		ExtraDriverArgs: []string{"--vf-count-retry-interval=1s"}}, 3)
	vmA, err := env.CreateVM(ctx, flow.VMSpec{Name: "vm-a", DeviceClass: "vfnet-physnet-a", MAC: "02:00:00:00:0f:01"})
	if err != nil {
		t.Fatal(err)
	}
	schedA, err := env.WaitScheduled(ctx, vmA, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	claimA := schedA.Claim.Namespace + "/" + schedA.Claim.Name

	// numVFs 2 -> 3 while vm-a holds a VF: the change waits, every VF of
	// the PF is tainted "recreating".
	if err := os.WriteFile(n.NodeConfig, []byte(fmt.Sprintf(numVFsConfig, 3)), 0o644); err != nil {
		t.Fatal(err)
	}
	var last map[string]string
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		if last, err = countTaints(ctx, env, n.Name); err != nil || len(last) != 2 {
			return false, err
		}
		for _, v := range last {
			if v != vfcount.TaintRecreating {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("physnet-a VFs %v, want both tainted %s: %v\n%s", last, vfcount.TaintRecreating, err, n.DriverLog(3000))
	}
	var blockedMsg string
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		evs, err := env.Client.CoreV1().Events("").List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		for _, ev := range evs.Items {
			if ev.InvolvedObject.Kind == "Node" && ev.InvolvedObject.Name == n.Name && ev.Reason == vfcount.ReasonBlocked && strings.Contains(ev.Message, claimA) {
				blockedMsg = ev.Message
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("no %s Event on the Node naming %s: %v\n%s", vfcount.ReasonBlocked, claimA, err, n.DriverLog(3000))
	}
	t.Logf("Node Event: %s", blockedMsg)

	// A second VM on physnet-a: the free VF is tainted, so it waits.
	vmB, err := env.CreateVM(ctx, flow.VMSpec{Name: "vm-b", DeviceClass: "vfnet-physnet-a", MAC: "02:00:00:00:0f:02"})
	if err != nil {
		t.Fatal(err)
	}
	msg, err := env.WaitUnschedulable(ctx, vmB, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("vm-b while the change waits: %s", msg)
	pfs, err := n.Host.Sysfs().Discover(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if pfs[0].NumVFs != 2 {
		t.Fatalf("PF changed to %d VFs under vm-a", pfs[0].NumVFs)
	}

	// vm-a goes: unprepared, its claim deleted; the PF gets 3 VFs and vm-b
	// one of them.
	t0 := time.Now()
	if err := env.DeleteVM(ctx, vmA, schedA.Claim.Name, time.Minute); err != nil {
		t.Fatal(err)
	}
	schedB, err := env.WaitScheduled(ctx, vmB, 2*time.Minute)
	if err != nil {
		t.Fatalf("%v\n%s", err, n.DriverLog(3000))
	}
	t.Logf("measured: vm-a's claim deleted -> vm-b scheduled on %s: %v", schedB.Device.Device, time.Since(t0).Round(100*time.Millisecond))
	if pfs, err = n.Host.Sysfs().Discover(ctx); err != nil || pfs[0].NumVFs != 3 || len(pfs[0].VFs) != 3 {
		t.Fatalf("after vm-a: PF %+v, %v; want 3 VFs", pfs[0], err)
	}
	if last, err = countTaints(ctx, env, n.Name); err != nil || len(last) != 3 {
		t.Fatalf("physnet-a devices %v (%v), want 3 untainted", last, err)
	}
	for d, v := range last {
		if v != "" {
			t.Errorf("device %s still tainted %s", d, v)
		}
	}
	if bad := n.ForbiddenLogLines(); len(bad) > 0 {
		t.Errorf("driver was refused: %q", bad)
	}
}
