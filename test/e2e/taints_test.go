package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/vfnet-io/vfnet/driver/publish"
	"github.com/vfnet-io/vfnet/test/lib/flow"
)

// pool is the newest complete generation of a node's publish.
func pool(ctx context.Context, env *flow.Env, node string) ([]resourceapi.ResourceSlice, bool, error) {
	all, err := env.Slices(ctx, node)
	if err != nil {
		return nil, false, err
	}
	gen, count := int64(-1), int64(0)
	for _, s := range all {
		if s.Spec.Pool.Generation > gen {
			gen, count = s.Spec.Pool.Generation, s.Spec.Pool.ResourceSliceCount
		}
	}
	var out []resourceapi.ResourceSlice
	for _, s := range all {
		if s.Spec.Pool.Generation == gen {
			out = append(out, s)
		}
	}
	return out, count > 0 && int64(len(out)) == count, nil
}

// taintsOf maps device names to their vfnet taint ("" when untainted) and
// fails on any other taint.
func taintsOf(t *testing.T, ss []resourceapi.ResourceSlice) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, s := range ss {
		for _, d := range s.Spec.Devices {
			out[d.Name] = ""
			for _, taint := range d.Taints {
				if taint.Key != publish.TaintKey || taint.Effect != resourceapi.DeviceTaintEffectNoSchedule || taint.TimeAdded == nil {
					t.Fatalf("device %s taint %+v: want %s, NoSchedule, TimeAdded set by the API server", d.Name, taint, publish.TaintKey)
				}
				out[d.Name] = taint.Value
			}
		}
	}
	return out
}

// waitTaints polls node's slices until want (device name -> taint value)
// holds for every device it names.
func waitTaints(ctx context.Context, t *testing.T, env *flow.Env, n *flow.Node, want map[string]string) []resourceapi.ResourceSlice {
	t.Helper()
	var last map[string]string
	var ss []resourceapi.ResourceSlice
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		var complete bool
		var err error
		if ss, complete, err = pool(ctx, env, n.Name); err != nil || !complete {
			return false, err
		}
		last = taintsOf(t, ss)
		for dev, v := range want {
			if got, ok := last[dev]; !ok || got != v {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("node %s: taints %v, want %v: %v\n--- driver log ---\n%s", n.Name, last, want, err, n.DriverLog(3000))
	}
	return ss
}

// TestPFUnhealthyTaint runs on the real control plane with the real
// driver and kube-scheduler: when a PF's link goes down its VFs are
// published with the vfnet.io/pf-unhealthy NoSchedule taint, a new VM is
// not allocated one, a claim that tolerates the taint is; the link coming
// back lifts the taint and the waiting VM is scheduled; a vanished PF's VF
// stays published, tainted "gone". A node with 200 VFs, half of them
// tainted, publishes slices the API server accepts (at most 64 devices in a
// slice with taints).
func TestPFUnhealthyTaint(t *testing.T) {
	t.Parallel()
	ctx, env := newEnv(t)
	install(ctx, t, env)
	n, refs := startNode(ctx, t, env, flow.NodeOptions{Name: "node-a", Spec: flow.DemoHost()}, 3)
	pfA, pfB := map[string]string{}, map[string]string{} // physnet-a (enp59s0f0, 2 VFs), physnet-b (1 VF)
	for _, r := range refs {
		if r.PFName == "enp59s0f0" {
			pfA[r.Device] = ""
		} else {
			pfB[r.Device] = ""
		}
	}
	if len(pfA) != 2 || len(pfB) != 1 {
		t.Fatalf("published %+v", refs)
	}
	with := func(m map[string]string, v string) map[string]string {
		out := map[string]string{}
		for k := range m {
			out[k] = v
		}
		return out
	}

	// The cable of physnet-a's PF is pulled.
	if err := n.Host.SetOperState("enp59s0f0", "down"); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	waitTaints(ctx, t, env, n, with(pfA, "link-down"))
	t.Logf("measured: link down -> VFs tainted in the API: %v", time.Since(t0).Round(100*time.Millisecond))
	waitTaints(ctx, t, env, n, pfB) // the other PF's VF stays untainted

	// A new VM needs a physnet-a VF: none is allocatable.
	vm, err := env.CreateVM(ctx, flow.VMSpec{Name: "vm-taint", DeviceClass: "vfnet-physnet-a", MAC: "02:00:00:00:0e:01", VLAN: 100})
	if err != nil {
		t.Fatal(err)
	}
	msg, err := env.WaitUnschedulable(ctx, vm, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("VM on a tainted network: %s", msg)

	// A claim that tolerates the taint gets one of them.
	claim := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "tolerant", Namespace: "default"},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
			Name: "vf", Exactly: &resourceapi.ExactDeviceRequest{
				DeviceClassName: "vfnet-physnet-a",
				Tolerations: []resourceapi.DeviceToleration{{
					Key: publish.TaintKey, Operator: resourceapi.DeviceTolerationOpExists, Effect: resourceapi.DeviceTaintEffectNoSchedule,
				}},
			},
		}}}},
	}
	if _, err := env.Client.ResourceV1().ResourceClaims("default").Create(ctx, claim, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "tolerant", Namespace: "default"},
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10",
				Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "vf"}}}}},
			ResourceClaims: []corev1.PodResourceClaim{{Name: "vf", ResourceClaimName: ptr.To("tolerant")}},
		},
	}
	if _, err := env.Client.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var got string
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		c, err := env.Client.ResourceV1().ResourceClaims("default").Get(ctx, "tolerant", metav1.GetOptions{})
		if err != nil || c.Status.Allocation == nil {
			return false, err
		}
		for _, r := range c.Status.Allocation.Devices.Results {
			got = r.Device
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("the tolerating claim was not allocated: %v", err)
	}
	if _, ok := pfA[got]; !ok {
		t.Fatalf("tolerating claim allocated %s, want a tainted physnet-a VF %v", got, pfA)
	}
	// The VM still waits.
	if p, err := env.Client.CoreV1().Pods("default").Get(ctx, vm.Pod.Name, metav1.GetOptions{}); err != nil || p.Spec.NodeName != "" {
		t.Fatalf("VM pod bound to %q (%v) while every physnet-a VF is tainted", p.Spec.NodeName, err)
	}

	// The link comes back: the taint goes, and the VM is scheduled.
	if err := n.Host.SetOperState("enp59s0f0", "up"); err != nil {
		t.Fatal(err)
	}
	waitTaints(ctx, t, env, n, with(pfA, ""))
	sched, err := env.WaitScheduled(ctx, vm, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := pfA[sched.Device.Device]; !ok || sched.Device.Device == got {
		t.Fatalf("VM got %s, want the other physnet-a VF than %s", sched.Device.Device, got)
	}

	// physnet-b's PF is hot-unplugged: its VF stays published, tainted.
	if err := n.Host.RemovePF("0000:3b:00.1"); err != nil {
		t.Fatal(err)
	}
	waitTaints(ctx, t, env, n, with(pfB, "gone"))

	// 200 VFs, the 100 of one PF tainted: slices the API server accepts.
	big := flow.DemoHost()
	big.PFs[0].NumVFs, big.PFs[1].NumVFs = 100, 100
	nb, err := env.AddNode(ctx, flow.NodeOptions{Name: "node-big", Spec: big})
	if err != nil {
		t.Fatal(err)
	}
	if err := nb.Host.SetOperState("enp59s0f1", "down"); err != nil {
		t.Fatal(err)
	}
	if err := nb.StartDriver(ctx); err != nil {
		t.Fatal(err)
	}
	bigRefs, err := env.WaitSlices(ctx, nb.Name, 200, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{}
	for _, r := range bigRefs {
		want[r.Device] = ""
		if r.PFName == "enp59s0f1" {
			want[r.Device] = "link-down"
		}
	}
	ss := waitTaints(ctx, t, env, nb, want)
	var sizes []string
	for _, s := range ss {
		tainted := 0
		for _, d := range s.Spec.Devices {
			if len(d.Taints) > 0 {
				tainted++
			}
		}
		sizes = append(sizes, fmt.Sprintf("%d(%d tainted)", len(s.Spec.Devices), tainted))
		if tainted > 0 && len(s.Spec.Devices) > resourceapi.ResourceSliceMaxDevicesWithAdvancedFeatures {
			t.Errorf("slice %s: %d devices with taints", s.Name, len(s.Spec.Devices))
		}
	}
	t.Logf("node-big slices: %s", strings.Join(sizes, ", "))
	for _, node := range []*flow.Node{n, nb} {
		if bad := node.ForbiddenLogLines(); len(bad) > 0 {
			t.Errorf("driver on %s was refused: %q", node.Name, bad)
		}
	}
}
