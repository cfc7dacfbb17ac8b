package e2e

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"libvirt.org/go/libvirtxml"

	"github.com/vfnet-io/vfnet/driver/migration/attach"
	"github.com/vfnet-io/vfnet/driver/migration/vmiwatch"
	"github.com/vfnet-io/vfnet/driver/prepare"
	"github.com/vfnet-io/vfnet/pkg/contract/pciaddr"
	"github.com/vfnet-io/vfnet/test/lib/flow"
	"github.com/vfnet-io/vfnet/test/lib/libvirtfake"
	"github.com/vfnet-io/vfnet/test/lib/scrape"
)

// TestLiveMigration runs the live-migration loop of issue 7 on two simulated
// nodes, each with the real vfnet-driver (--simulate) and a kubelet stand-in:
// a VM with a template claim runs on one node, KubeVirt's migration target
// pod gets its own claim and VF on the other, and the test drives the VMI's
// status.migrationState as KubeVirt records it. Each launcher's libvirt is a
// fake session virtqemud on the pod's libvirt-runtime socket below the
// node's --kubelet-pods-dir.
//
//   - completed: the target node's driver attaches the target VF (prepared
//     with the VM's MAC) to the running domain; the source VF is released
//     when the source pod goes away.
//   - failed: the source node's driver re-attaches the original VF; the
//     target VF is released with the target pod.
func TestLiveMigration(t *testing.T) {
	t.Parallel()
	ctx, env := newEnv(t)
	if err := env.ApplyManifests(ctx); err != nil {
		t.Fatal(err)
	}
	if err := env.InstallKubeVirtCRDs(ctx); err != nil {
		t.Fatal(err)
	}
	nodes := map[string]*flow.Node{}
	for _, name := range []string{"node-a", "node-b"} {
		n, err := env.AddNode(ctx, flow.NodeOptions{Name: name, Spec: flow.DemoHost()})
		if err != nil {
			t.Fatal(err)
		}
		if err := n.StartDriver(ctx); err != nil {
			t.Fatal(err)
		}
		nodes[name] = n
	}
	for name := range nodes {
		if _, err := env.WaitSlices(ctx, name, 3, time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	var latencies []time.Duration
	for _, tc := range []struct {
		vm             string
		mac            string
		fail, failover bool
	}{
		{"vm-mig", "02:00:00:00:07:01", false, false},
		{"vm-fail", "02:00:00:00:07:02", true, false},
		{"vm-fo", "02:00:00:00:07:03", false, true},
		{"vm-fo-fail", "02:00:00:00:07:04", true, true},
	} {
		d := runMigration(ctx, t, env, nodes, tc.vm, tc.mac, tc.fail, tc.failover)
		latencies = append(latencies, d)
	}
	t.Logf("migration end (status update) -> VF attached: completed %s, failed %s; with failover: completed %s, failed %s", latencies[0], latencies[1], latencies[2], latencies[3])
	checkAttachMetrics(ctx, t, nodes)
	checkNotMigratableWarning(ctx, t, env)
	checkMACWarning(ctx, t, env, nodes)
	for name, n := range nodes {
		log := n.DriverLog(1 << 22)
		for _, bad := range []string{"panic", "Giving up attaching", "Live-migration re-attach stopped"} {
			if strings.Contains(log, bad) {
				t.Errorf("driver on %s logged %q:\n%s", name, bad, n.DriverLog(6000))
			}
		}
		if os.Getenv("VFNET_E2E_DRIVER_LOGS") != "" {
			t.Logf("--- driver log %s ---\n%s", name, log)
		}
	}
}

// runMigration migrates one VM and returns the time from the status update
// that ends the migration to the attach arriving at the fake libvirt.
//
// With failover (VFConfig.failover) it also checks the MAC choreography:
// the target VF is prepared with its MAC parked (zero); the source VF's
// MAC is parked once the source launcher detaches it; and the VF that is
// attached in the end has the VM's MAC back when the attach arrives.
func runMigration(ctx context.Context, t *testing.T, env *flow.Env, nodes map[string]*flow.Node, name, mac string, fail, failover bool) time.Duration {
	t.Helper()
	spec := flow.VMSpec{Name: name, DeviceClass: "vfnet-physnet-a", MAC: mac, VLAN: 100}
	if failover {
		spec.Settings = map[string]any{"failover": true}
	}
	vm, err := env.CreateVM(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	srcSched, err := env.WaitScheduled(ctx, vm, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	src, dst := nodes[srcSched.NodeName], otherNode(nodes, srcSched.NodeName)
	if _, err := src.Kubelet.WaitPrepared(ctx, vm.Pod.UID); err != nil {
		t.Fatal(err)
	}
	srcVF := vfRef(ctx, t, env, src.Name, srcSched.Device.Device)
	checkVF(t, src, srcVF, mac, "vfio-pci")
	domain := vmiwatch.DomainName(vm.VMI.Namespace, vm.VMI.Name)
	srcLibvirt := startLauncherLibvirt(t, src, vm.Pod.UID, domain)
	if failover {
		// The VM runs with its VF: the source launcher detaches it below.
		plugHostdev(t, srcLibvirt, domain, srcVF, "net1")
	}

	// KubeVirt runs the VM on the source node.
	vmi := vm.VMI
	vmi.Status.Phase = kubevirtv1.Running
	vmi.Status.NodeName = src.Name
	vmi.Status.ActivePods = map[types.UID]string{vm.Pod.UID: src.Name}
	// virt-controller labels the VMI with its node; the drivers watch only
	// their node's VMIs by these labels (KubeVirt v1.9.0).
	vmi.Labels = map[string]string{kubevirtv1.NodeNameLabel: src.Name}
	vmi = updateVMIStatus(ctx, t, env, vmi)

	// virt-controller creates the target pod: the same spec, pinned away
	// from the source; its template claim becomes a new claim and VF.
	target := targetPod(vm.Pod, dst.Name)
	if target, err = env.Client.CoreV1().Pods(target.Namespace).Create(ctx, target, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	dstSched, err := env.WaitScheduled(ctx, &flow.VM{Spec: vm.Spec, VMI: vm.VMI, Pod: target}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if dstSched.NodeName != dst.Name || dstSched.Claim.Name == srcSched.Claim.Name {
		t.Fatalf("target pod on %s with claim %s; want node %s and a claim of its own", dstSched.NodeName, dstSched.Claim.Name, dst.Name)
	}
	if _, err := dst.Kubelet.WaitPrepared(ctx, target.UID); err != nil {
		t.Fatal(err)
	}
	dstVF := vfRef(ctx, t, env, dst.Name, dstSched.Device.Device)
	// Same MAC on both sides: the target claim is prepared with the VMI
	// interface's macAddress; a failover VF gets it only at its attach.
	if failover {
		checkVF(t, dst, dstVF, parkedMAC, "vfio-pci")
	} else {
		checkVF(t, dst, dstVF, mac, "vfio-pci")
	}
	dstLibvirt := startLauncherLibvirt(t, dst, target.UID, domain)

	// The migration runs (virt-controller / virt-handler status updates).
	ms := &kubevirtv1.VirtualMachineInstanceMigrationState{
		MigrationUID: types.UID("mig-" + name), StartTimestamp: now(),
		SourceNode: src.Name, SourcePod: vm.Pod.Name, TargetNode: dst.Name, TargetPod: target.Name,
		TargetNodeAddress: "127.0.0.1", Mode: kubevirtv1.MigrationPreCopy,
	}
	vmi.Status.MigrationState = ms
	// virt-controller hands the VMI to the target's virt-handler by label.
	vmi.Labels[kubevirtv1.MigrationTargetNodeNameLabel] = dst.Name
	vmi = updateVMIStatus(ctx, t, env, vmi)
	ms = ms.DeepCopy()
	ms.TargetNodeDomainDetected, ms.TargetNodeDomainReadyTimestamp = true, now()
	vmi.Status.MigrationState = ms
	vmi = updateVMIStatus(ctx, t, env, vmi)
	if failover {
		// KubeVirt's source launcher unplugs every SR-IOV hostdev before
		// migrating; the source driver parks the VF's MAC at once.
		t1 := time.Now()
		if err := srcLibvirt.Detach(domain, attach.Alias("net1")); err != nil {
			t.Fatal(err)
		}
		waitVFMAC(ctx, t, src, srcVF, parkedMAC)
		t.Logf("%s: source VF %s detached -> MAC parked in %s", name, srcVF.BDF, time.Since(t1))
		checkVF(t, dst, dstVF, parkedMAC, "vfio-pci")
	}

	// ... and ends.
	ms = ms.DeepCopy()
	ms.Completed, ms.EndTimestamp = true, now()
	// winner keeps the VM: the target on success, the source on failure.
	winner, want, wantVF, quiet := dst, dstLibvirt, dstVF, srcLibvirt
	if fail {
		ms.Failed, ms.FailureReason = true, "Live migration failed: simulated by the e2e test"
		winner, want, wantVF, quiet = src, srcLibvirt, srcVF, dstLibvirt
		// The target's virt-handler drops the VMI: the target node no
		// longer sees it.
		delete(vmi.Labels, kubevirtv1.MigrationTargetNodeNameLabel)
	} else {
		vmi.Status.NodeName = dst.Name
		vmi.Status.ActivePods = map[types.UID]string{vm.Pod.UID: src.Name, target.UID: dst.Name}
		// The target's virt-handler acknowledges the completion by moving
		// the node label (migration-target.go ackMigrationCompletion): the
		// source node no longer sees the VMI.
		vmi.Labels[kubevirtv1.NodeNameLabel] = dst.Name
	}
	vmi.Status.MigrationState = ms
	// The VF must carry the VM's MAC when it is plugged: the guest's VF
	// driver reads it then.
	macAtAttach := make(chan string, 1)
	want.OnAttach(func(libvirtfake.Attach) {
		st, err := winner.VFState(wantVF)
		if err != nil {
			macAtAttach <- err.Error()
			return
		}
		macAtAttach <- st.Link.MAC.String()
	})
	t0 := time.Now()
	vmi = updateVMIStatus(ctx, t, env, vmi)
	var got libvirtfake.Attach
	select {
	case got = <-want.Notify():
	case <-time.After(time.Minute):
		t.Fatalf("%s: no VF attach on %s within a minute\n--- driver log ---\n%s", name, winner.Name, winner.DriverLog(6000))
	}
	latency := got.At.Sub(t0)
	checkAttach(t, want, domain, got, wantVF, "net1")
	if m := <-macAtAttach; m != mac {
		t.Errorf("%s: VF %s had MAC %s when its attach arrived, want %s", name, wantVF.BDF, m, mac)
	}
	if !fail {
		// ... and then finalizes it, dropping the target label: the VMI
		// moves from one of the target driver's informers to the other
		// and must not be attached again.
		delete(vmi.Labels, kubevirtv1.MigrationTargetNodeNameLabel)
		vmi = updateVMIStatus(ctx, t, env, vmi)
	}

	// Nothing reaches the other side's domain, and the live domain holds
	// exactly the one VF.
	waitEvent(ctx, t, env, vmi, vmiwatch.ReasonAttached, wantVF.BDF)
	if n := len(quiet.Attaches()); n != 0 {
		t.Errorf("%s: the other launcher received %d attaches", name, n)
	}
	if n := len(want.Attaches()); n != 1 {
		t.Errorf("%s: launcher received %d attaches, want 1", name, n)
	}

	// The pod that lost (source on success, target on failure) goes away
	// and its VF is released.
	gone, goneNode, goneVF := vm.Pod, src, srcVF
	if fail {
		gone, goneNode, goneVF = target, dst, dstVF
	}
	if err := env.Client.CoreV1().Pods(gone.Namespace).Delete(ctx, gone.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := goneNode.Kubelet.WaitUnprepared(ctx, gone.UID); err != nil {
		t.Fatal(err)
	}
	st, err := goneNode.VFState(goneVF)
	if err != nil {
		t.Fatal(err)
	}
	if st.Driver == "vfio-pci" {
		t.Errorf("%s: VF %s on %s still bound to vfio-pci after its pod went away", name, goneVF.BDF, goneNode.Name)
	}
	checkVF(t, winner, wantVF, mac, "vfio-pci")
	t.Logf("%s (failed=%v): VF %s attached on %s %s after the migration ended", name, fail, wantVF.BDF, winner.Name, latency)
	// The VM stops: its VF goes back to the pool for the next case.
	kept := vm.Pod
	if !fail {
		kept = target
	}
	if err := env.Client.CoreV1().Pods(kept.Namespace).Delete(ctx, kept.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := winner.Kubelet.WaitUnprepared(ctx, kept.UID); err != nil {
		t.Fatal(err)
	}
	return latency
}

// parkedMAC is a failover VF's MAC while it is out of the guest.
const parkedMAC = "00:00:00:00:00:00"

// plugHostdev puts the VF into the running domain as the vfnet binding
// writes it at VM start.
func plugHostdev(t *testing.T, srv *libvirtfake.Server, domain string, vf flow.VFRef, iface string) {
	t.Helper()
	a, err := pciaddr.Parse(vf.BDF)
	if err != nil {
		t.Fatal(err)
	}
	x, err := attach.Hostdev{Interface: iface, Source: a}.XML()
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Plug(domain, x); err != nil {
		t.Fatal(err)
	}
}

func waitVFMAC(ctx context.Context, t *testing.T, n *flow.Node, ref flow.VFRef, mac string) {
	t.Helper()
	var last string
	err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		st, err := n.VFState(ref)
		if err != nil {
			return false, err
		}
		last = st.Link.MAC.String()
		return last == mac, nil
	})
	if err != nil {
		t.Fatalf("VF %s on %s: MAC %s, want %s: %v\n--- driver log ---\n%s", ref.BDF, n.Name, last, mac, err, n.DriverLog(6000))
	}
}

func otherNode(nodes map[string]*flow.Node, name string) *flow.Node {
	for n, node := range nodes {
		if n != name {
			return node
		}
	}
	return nil
}

func now() *metav1.Time {
	t := metav1.NewTime(time.Now())
	return &t
}

func vfRef(ctx context.Context, t *testing.T, env *flow.Env, node, device string) flow.VFRef {
	t.Helper()
	ref, err := env.Ref(ctx, node, device)
	if err != nil {
		t.Fatal(err)
	}
	if a, err := pciaddr.ParseDeviceName(device); err != nil || a.String() != ref.BDF {
		t.Fatalf("device %s: BDF %v from its name, %q published (%v)", device, a, ref.BDF, err)
	}
	return ref
}

func checkVF(t *testing.T, n *flow.Node, ref flow.VFRef, mac, driver string) {
	t.Helper()
	st, err := n.VFState(ref)
	if err != nil {
		t.Fatal(err)
	}
	if st.Driver != driver || st.Link.MAC.String() != mac {
		t.Errorf("VF %s on %s: driver %q MAC %s, want %q and %s", ref.BDF, n.Name, st.Driver, st.Link.MAC, driver, mac)
	}
}

// startLauncherLibvirt serves a fake session virtqemud in the pod's
// libvirt-runtime emptyDir, with the VM's domain running and no vfnet
// hostdev: on the source KubeVirt detached it before migrating, on the
// target the domain arrived without it.
func startLauncherLibvirt(t *testing.T, n *flow.Node, uid types.UID, domain string) *libvirtfake.Server {
	t.Helper()
	dir := attach.RuntimeDir(n.PodsDir, string(uid))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	srv, err := libvirtfake.Listen(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	if err := srv.DefineRunning(strings.Replace(flow.DemoDomainXML, "<name>default_vm-a</name>", "<name>"+domain+"</name>", 1)); err != nil {
		t.Fatal(err)
	}
	return srv
}

func checkAttach(t *testing.T, srv *libvirtfake.Server, domain string, got libvirtfake.Attach, vf flow.VFRef, iface string) {
	t.Helper()
	var hd libvirtxml.DomainHostdev
	if err := hd.Unmarshal(got.XML); err != nil {
		t.Fatal(err)
	}
	if got.Domain != domain || hd.Managed != "no" || hd.Alias == nil || hd.Alias.Name != attach.Alias(iface) || hd.SubsysPCI == nil {
		t.Fatalf("attach %+v", got)
	}
	a := hd.SubsysPCI.Source.Address
	if src := (pciaddr.Address{Domain: *a.Domain, Bus: *a.Bus, Slot: *a.Slot, Function: *a.Function}).String(); src != vf.BDF {
		t.Fatalf("attached VF %s, want %s", src, vf.BDF)
	}
	live, err := srv.DomainXML(domain)
	if err != nil {
		t.Fatal(err)
	}
	if err := libvirtfake.ValidateDomain(live); err != nil && (os.Getenv("CI") != "" || !errors.Is(err, libvirtfake.ErrNoValidator)) {
		t.Fatal(err)
	}
}

// targetPod renders the migration target pod as virt-controller does for
// the parts vfnet depends on: the source pod's spec (same pod claim names,
// hence a new claim from the same template), a new name, the migration
// label and an affinity that keeps it off the source node (here: onto dst).
func targetPod(src *corev1.Pod, dst string) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{
		GenerateName: src.GenerateName, Namespace: src.Namespace,
		Labels: map[string]string{}, Annotations: src.Annotations, OwnerReferences: src.OwnerReferences,
	}}
	for k, v := range src.Labels {
		p.Labels[k] = v
	}
	p.Labels["kubevirt.io/migrationJobUID"] = "mig-" + src.Name
	p.Spec = *src.Spec.DeepCopy()
	p.Spec.NodeName = ""
	p.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
		RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
			MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{dst}}},
		}}},
	}}
	return p
}

func updateVMIStatus(ctx context.Context, t *testing.T, env *flow.Env, vmi *kubevirtv1.VirtualMachineInstance) *kubevirtv1.VirtualMachineInstance {
	t.Helper()
	obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(vmi)
	if err != nil {
		t.Fatal(err)
	}
	// KubeVirt's VMI CRD has no status subresource (virt-controller and
	// virt-handler update the whole object); use /status where a CRD has it.
	res := env.Dynamic.Resource(flow.VMIResource).Namespace(vmi.Namespace)
	u, err := res.UpdateStatus(ctx, &unstructured.Unstructured{Object: obj}, metav1.UpdateOptions{})
	if apierrors.IsNotFound(err) {
		u, err = res.Update(ctx, &unstructured.Unstructured{Object: obj}, metav1.UpdateOptions{})
	}
	if err != nil {
		t.Fatalf("update VMI %s status: %v", vmi.Name, err)
	}
	out := &kubevirtv1.VirtualMachineInstance{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, out); err != nil {
		t.Fatal(err)
	}
	return out
}

// waitEvent waits for an Event on the VMI with reason and a message
// containing substr, as the driver's ServiceAccount recorded it.
func waitEvent(ctx context.Context, t *testing.T, env *flow.Env, vmi *kubevirtv1.VirtualMachineInstance, reason, substr string) {
	t.Helper()
	var seen []string
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		list, err := env.Client.CoreV1().Events(vmi.Namespace).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + vmi.Name})
		if err != nil && !apierrors.IsNotFound(err) {
			return false, err
		}
		seen = seen[:0]
		for _, e := range list.Items {
			seen = append(seen, e.Reason+": "+e.Message)
			if e.Reason == reason && strings.Contains(e.Message, substr) && e.InvolvedObject.UID == vmi.UID {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("no %s event on VMI %s mentioning %s: %v; events: %q", reason, vmi.Name, substr, err, seen)
	}
}

// checkNotMigratableWarning: a VM whose vfnet network uses a named
// ResourceClaim starts migrating from node-a; node-a's driver records
// VFNetNotMigratable on the VMI (with the driver's own RBAC).
func checkNotMigratableWarning(ctx context.Context, t *testing.T, env *flow.Env) {
	t.Helper()
	claim := "shared-vf"
	vmi := &kubevirtv1.VirtualMachineInstance{
		TypeMeta: metav1.TypeMeta{APIVersion: "kubevirt.io/v1", Kind: "VirtualMachineInstance"},
		ObjectMeta: metav1.ObjectMeta{Name: "vm-named-claim", Namespace: "default",
			Labels: map[string]string{kubevirtv1.NodeNameLabel: "node-a"}},
		Spec: kubevirtv1.VirtualMachineInstanceSpec{
			Domain: kubevirtv1.DomainSpec{Devices: kubevirtv1.Devices{Interfaces: []kubevirtv1.Interface{{
				Name: "net1", Binding: &kubevirtv1.PluginBinding{Name: "vfnet"}, MacAddress: "02:00:00:00:07:03",
			}}}},
			Networks: []kubevirtv1.Network{{Name: "net1", NetworkSource: kubevirtv1.NetworkSource{
				ResourceClaim: &kubevirtv1.ClaimRequest{ClaimName: "vf", RequestName: "vf"},
			}}},
			ResourceClaims: []kubevirtv1.VirtualMachineInstanceResourceClaim{{Name: "vf", ResourceClaimName: &claim}},
		},
	}
	obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(vmi)
	if err != nil {
		t.Fatal(err)
	}
	u, err := env.Dynamic.Resource(flow.VMIResource).Namespace("default").Create(ctx, &unstructured.Unstructured{Object: obj}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, vmi); err != nil {
		t.Fatal(err)
	}
	vmi.Status.Phase, vmi.Status.NodeName = kubevirtv1.Running, "node-a"
	vmi.Status.MigrationState = &kubevirtv1.VirtualMachineInstanceMigrationState{
		MigrationUID: "mig-named", StartTimestamp: now(), SourceNode: "node-a", SourcePod: "virt-launcher-vm-named-claim-x",
		TargetNode: "node-b", TargetPod: "virt-launcher-vm-named-claim-y",
	}
	vmi = updateVMIStatus(ctx, t, env, vmi)
	waitEvent(ctx, t, env, vmi, vmiwatch.ReasonNotMigratable, "net1")
}

// checkMACWarning: a VM whose template-claim interface has no macAddress
// (and no VFConfig.mac) is prepared; the node's driver records
// VFNetMACNotMigratable on the VMI while preparing, with the driver's own
// RBAC (pods: get only).
func checkMACWarning(ctx context.Context, t *testing.T, env *flow.Env, nodes map[string]*flow.Node) {
	t.Helper()
	vm, err := env.CreateVM(ctx, flow.VMSpec{Name: "vm-nomac", DeviceClass: "vfnet-physnet-a", VLAN: 100})
	if err != nil {
		t.Fatal(err)
	}
	sched, err := env.WaitScheduled(ctx, vm, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := nodes[sched.NodeName].Kubelet.WaitPrepared(ctx, vm.Pod.UID); err != nil {
		t.Fatal(err)
	}
	waitEvent(ctx, t, env, vm.VMI, prepare.ReasonMACNotMigratable, `interface "net1"`)
}

// checkAttachMetrics scrapes both drivers' /metrics: the completed migration
// was one successful attach on its target, the failed one one successful
// re-attach on its source, and nothing failed. It polls briefly: a driver
// records the attach just after the domain shows the VF.
func checkAttachMetrics(ctx context.Context, t *testing.T, nodes map[string]*flow.Node) {
	t.Helper()
	const name = "vfnet_driver_migration_attach_duration_seconds" // a histogram: Sum counts samples
	want := map[[2]string]float64{{"target", "success"}: 2, {"source", "success"}: 2, {"target", "error"}: 0, {"source", "error"}: 0}
	var why error
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		got := map[[2]string]float64{}
		for _, node := range nodes {
			f, err := scrape.Get(ctx, http.DefaultClient, node.MetricsURL())
			if err != nil {
				return false, err
			}
			for k := range want {
				got[k] += f.Sum(name, map[string]string{"side": k[0], "result": k[1]})
			}
		}
		why = nil
		for k, w := range want {
			if got[k] != w {
				why = fmt.Errorf("%s{side=%q,result=%q} summed over both drivers = %v, want %v", name, k[0], k[1], got[k], w)
			}
		}
		return why == nil, nil
	})
	if err != nil {
		t.Errorf("attach metrics: %v (%v)", why, err)
	}
}
