package node

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	virtv1 "kubevirt.io/api/core/v1"
	"libvirt.org/go/libvirtxml"

	"github.com/vfnet-io/vfnet/driver/migration/attach"
	"github.com/vfnet-io/vfnet/driver/migration/vmiwatch"
	"github.com/vfnet-io/vfnet/pkg/contract/pciaddr"
	"github.com/vfnet-io/vfnet/test/lib/flow"
	"github.com/vfnet-io/vfnet/test/lib/libvirtfake"
	"github.com/vfnet-io/vfnet/test/lib/simhost"
)

// exampleIface is the example VM's vfnet interface (manifests/examples).
const exampleIface = "physnet-a"

// testLiveMigration: a second node joins (its own kubelet, containerd, CNI
// bridge and simulated SR-IOV host, in a nested mount namespace) and gets
// the chart's driver pod; the example VM runs on the first node; two
// VirtualMachineInstanceMigrations, driven by the real virt-controller
// v1.9.0, with the virt-handler stand-ins of both nodes writing only what
// virt-handler writes (virthandler_migration.go):
//
//   - completed, first node to second: virt-controller creates the target
//     launcher pod on the second node with a new claim from the template;
//     the scheduler allocates a VF there, the second node's driver prepares
//     it; on completed, that driver attaches the target VF (its PCI address,
//     alias ua-sriov-physnet-a) to the domain served on the target pod's
//     libvirt socket, the VF carries the VMI's MAC, VFNetAttached is
//     recorded on the VMI.
//   - failed, second node to first: the target pod and its VF on the first
//     node come and go; on failed, the second (source) node's driver plugs
//     its VF back into the source domain.
//
// The launchers' libvirt is test/lib/libvirtfake on each pod's
// libvirt-runtime socket (the launcher stand-in runs no libvirt).
func (e *env) testLiveMigration(t *testing.T) {
	ctx := e.ctx(t)
	dyn, err := dynamic.NewForConfig(e.Plane.AdminRESTConfig())
	if err != nil {
		t.Fatal(err)
	}

	begin := time.Now()
	n2 := e.addSecondNode(ctx, t)
	t.Logf("LiveMigration: node %s Ready with its driver's 8 VFs published %s after start (%v)", n2.Spec.Name, time.Since(begin).Round(100*time.Millisecond), n2.Timings)

	h1 := &VirtHandlerStandIn{Node: e.Node}
	if err := h1.Start(ctx, kubevirtNS); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h1.Stop)

	// The VM starts on the first node: the second is not schedulable for
	// launchers until its handler stand-in labels it.
	begin = time.Now()
	ns, name, _, src, sidecar := e.startExampleVM(ctx, t, dyn)
	if src.Spec.NodeName != NodeName {
		t.Fatalf("launcher pod %s on %q, want %s", src.Name, src.Spec.NodeName, NodeName)
	}
	e.waitDomain(ctx, t, src, sidecar)
	srcVF := e.claimVFOn(ctx, t, e.Node, src, src.Spec.ResourceClaims[0].Name)
	checkPreparedOn(t, e.Node, srcVF, exampleMAC)
	e.waitVMIPhase(ctx, t, dyn, ns, name, virtv1.Scheduled)
	if err := h1.ReportDomainRunning(ctx, ns, name); err != nil {
		t.Fatal(err)
	}
	e.waitVMStatus(ctx, t, dyn, ns, name, virtv1.VirtualMachineStatusRunning)
	t.Logf("LiveMigration: VM running on %s %s after kubectl apply", NodeName, time.Since(begin).Round(100*time.Millisecond))

	h2 := &VirtHandlerStandIn{Node: n2}
	if err := h2.Start(ctx, kubevirtNS); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h2.Stop)

	domain := vmiwatch.DomainName(ns, name)
	// KubeVirt's source unplugs ua-sriov-* hostdevs before migrating: the
	// source's domain has none.
	srcLibvirt := serveLauncherLibvirt(t, e.Node, src, domain)

	begin = time.Now()
	m := migration{e: e, dyn: dyn, ns: ns, vmi: name, domain: domain}
	dst, dstVF, dstLibvirt := m.run(ctx, t, "vfnet-migrate-1", src, h1, h2, n2, false)
	got := e.waitAttach(ctx, t, dstLibvirt, n2)
	checkAttach(t, dstLibvirt, domain, got, dstVF)
	checkPreparedOn(t, n2, dstVF, exampleMAC)
	e.waitVFNetEvent(ctx, t, ns, name, dstVF.bdf, n2.Spec.Name, "completed")
	m.waitPhase(ctx, t, "vfnet-migrate-1", virtv1.MigrationSucceeded)
	if n := len(srcLibvirt.Attaches()); n != 0 {
		t.Errorf("completed migration: the source's libvirt received %d attaches, want 0", n)
	}
	t.Logf("LiveMigration: completed migration, VMIM to the target VF attached on %s: %s", n2.Spec.Name, time.Since(begin).Round(100*time.Millisecond))

	// The source's domain is gone after a completed migration and its
	// launcher exits; the pod's deletion stands in for that exit (no QEMU
	// runs in it). The first node's driver then releases the source VF.
	begin = time.Now()
	e.deletePod(ctx, t, ns, src.Name)
	checkReleased(ctx, t, e.Node, srcVF)

	// Second migration, back to the first node, fails. The now-source
	// launcher unplugs the VF again before migrating: a fresh libvirt with
	// the domain without it.
	if err := dstLibvirt.Close(); err != nil {
		t.Fatal(err)
	}
	srcLibvirt = serveLauncherLibvirt(t, n2, dst, domain)
	back, backVF, backLibvirt := m.run(ctx, t, "vfnet-migrate-2", dst, h2, h1, e.Node, true)
	got = e.waitAttach(ctx, t, srcLibvirt, n2)
	checkAttach(t, srcLibvirt, domain, got, dstVF)
	checkPreparedOn(t, n2, dstVF, exampleMAC)
	e.waitVFNetEvent(ctx, t, ns, name, dstVF.bdf, n2.Spec.Name, "failed")
	m.waitPhase(ctx, t, "vfnet-migrate-2", virtv1.MigrationFailed)
	if n := len(backLibvirt.Attaches()); n != 0 {
		t.Errorf("failed migration: the target's libvirt received %d attaches, want 0", n)
	}
	t.Logf("LiveMigration: failed migration, VMIM to the source VF re-attached on %s: %s", n2.Spec.Name, time.Since(begin).Round(100*time.Millisecond))

	// The failed target's launcher exits (its domain never ran); the
	// pod's deletion stands in for that, and its VF is released. Then the
	// VM is deleted.
	begin = time.Now()
	e.deletePod(ctx, t, ns, back.Name)
	checkReleased(ctx, t, e.Node, backVF)
	for _, mig := range []string{"vfnet-migrate-1", "vfnet-migrate-2"} {
		if err := dyn.Resource(vmimResource()).Namespace(ns).Delete(ctx, mig, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Error(err)
		}
	}
	e.deleteVM(ctx, t, dyn, h2, ns, name, dst)
	checkReleased(ctx, t, n2, dstVF)
	t.Logf("LiveMigration: cleanup until both VFs are released: %s", time.Since(begin).Round(100*time.Millisecond))
}

// addSecondNode starts the second node with its simulated SR-IOV host (the
// same E810 as the first's) and waits for the DaemonSet's driver pod there
// to publish its VFs.
func (e *env) addSecondNode(ctx context.Context, t *testing.T) *Node {
	t.Helper()
	n2, err := e.AddNode(ctx, SecondNode(), e.art.Images, func(n *Node) error {
		h, err := simhost.Build(n.Path(SimRoot), simhost.E810Host(), simhost.WithCharDevNodes())
		if err != nil {
			return fmt.Errorf("simulated host: %w", err)
		}
		return h.Close()
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := n2.checkNestedMountNS(); err != nil {
		t.Fatal(err)
	}
	e.waitSlicesOf(ctx, t, n2.Spec.Name)
	return n2
}

// migration drives VirtualMachineInstanceMigrations of one VMI.
type migration struct {
	e       *env
	dyn     dynamic.Interface
	ns, vmi string
	domain  string
}

func vmimResource() schema.GroupVersionResource {
	return schema.GroupVersionResource{Group: "kubevirt.io", Version: "v1", Resource: "virtualmachineinstancemigrations"}
}

// run creates the VMIM and plays both handlers (hs on the source, ht on
// the target) until it ends (failed or completed): virt-controller creates the target pod on target, the
// scheduler allocates it a VF there, the target's driver prepares it; a
// fake libvirt serves the target pod's socket. It returns the target pod,
// its VF and that libvirt.
func (m *migration) run(ctx context.Context, t *testing.T, name string, src *corev1.Pod, hs, ht *VirtHandlerStandIn, target *Node, fail bool) (*corev1.Pod, vf, *launcherLibvirt) {
	t.Helper()
	e := m.e
	vmim := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstanceMigration",
		"metadata": map[string]any{"name": name, "namespace": m.ns},
		"spec":     map[string]any{"vmiName": m.vmi},
	}}
	created, err := m.dyn.Resource(vmimResource()).Namespace(m.ns).Create(ctx, vmim, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create VirtualMachineInstanceMigration %s (virt-api admits it): %v", name, err)
	}
	// virt-controller's target pod carries the migration's UID.
	sel := virtv1.MigrationJobLabel + "=" + string(created.GetUID())
	var pod *corev1.Pod
	err = wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, podTimeout, true, func(ctx context.Context) (bool, error) {
		pods, err := e.Kube.CoreV1().Pods(m.ns).List(ctx, metav1.ListOptions{LabelSelector: sel})
		if err != nil || len(pods.Items) != 1 || pods.Items[0].Spec.NodeName == "" {
			return false, nil
		}
		pod = &pods.Items[0]
		return true, nil
	})
	if err != nil {
		t.Fatalf("virt-controller created no scheduled migration target pod (%s): %v\nVMIM events:\n%s\nVMI events:\n%s\n%s",
			sel, err, e.Events(ctx, m.ns, name), e.Events(ctx, m.ns, m.vmi), e.describeKubeVirt())
	}
	if pod.Spec.NodeName != target.Spec.Name {
		t.Fatalf("migration target pod %s scheduled on %q, want %s", pod.Name, pod.Spec.NodeName, target.Spec.Name)
	}
	if len(pod.Spec.ResourceClaims) != 1 || pod.Spec.ResourceClaims[0].ResourceClaimTemplateName == nil {
		t.Fatalf("migration target pod %s claims %+v, want the VM's template claim", pod.Name, pod.Spec.ResourceClaims)
	}
	pod = e.waitLauncherRunning(ctx, t, pod)
	podVF := e.claimVFOn(ctx, t, target, pod, pod.Spec.ResourceClaims[0].Name)
	srcClaims := src.Status.ResourceClaimStatuses
	if len(srcClaims) == 1 && srcClaims[0].ResourceClaimName != nil && *srcClaims[0].ResourceClaimName == podVF.claim.Name {
		t.Fatalf("target pod %s shares the source's claim %s, want a new one from the template", pod.Name, podVF.claim.Name)
	}
	// Prepared with the VMI interface's MAC, read through the pod's owner
	// (the example's VF is no failover VF, whose MAC would stay parked).
	checkPreparedOn(t, target, podVF, exampleMAC)
	lv := serveLauncherLibvirt(t, target, pod, m.domain)

	// virt-controller hands the migration to the target's handler once the
	// target pod is ready.
	m.waitMigrationState(ctx, t, "handed off to "+target.Spec.Name, func(ms *virtv1.VirtualMachineInstanceMigrationState) bool {
		return ms.MigrationUID == created.GetUID() && ms.TargetNode == target.Spec.Name && ms.TargetPod == pod.Name && ms.SourcePod == src.Name
	})
	for _, step := range []func(context.Context, string, string) error{ht.TargetPrepared, ht.TargetDomainReady} {
		if err := step(ctx, m.ns, m.vmi); err != nil {
			t.Fatal(err)
		}
	}
	m.waitPhase(ctx, t, name, virtv1.MigrationTargetReady)
	if err := hs.SourceStarted(ctx, m.ns, m.vmi); err != nil {
		t.Fatal(err)
	}
	m.waitPhase(ctx, t, name, virtv1.MigrationRunning)
	if fail {
		err = hs.SourceFailed(ctx, m.ns, m.vmi, "Live migration failed: the real-node tier's virt-handler stand-in reports it")
	} else {
		err = ht.TargetAckCompleted(ctx, m.ns, m.vmi)
	}
	if err != nil {
		t.Fatal(err)
	}
	return pod, podVF, lv
}

// waitMigrationState waits for the VMI's status.migrationState to satisfy ok.
func (m *migration) waitMigrationState(ctx context.Context, t *testing.T, what string, ok func(*virtv1.VirtualMachineInstanceMigrationState) bool) {
	t.Helper()
	var last string
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, podTimeout, true, func(ctx context.Context) (bool, error) {
		u, err := m.dyn.Resource(vmiResource()).Namespace(m.ns).Get(ctx, m.vmi, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		st, _, _ := unstructured.NestedMap(u.Object, "status", "migrationState")
		last = fmt.Sprint(st)
		vmi := &virtv1.VirtualMachineInstance{}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, vmi); err != nil || vmi.Status.MigrationState == nil {
			return false, nil
		}
		return ok(vmi.Status.MigrationState), nil
	})
	if err != nil {
		t.Fatalf("VMI %s/%s migrationState not %s (last: %s): %v\nevents:\n%s", m.ns, m.vmi, what, last, err, m.e.Events(ctx, m.ns, m.vmi))
	}
}

// waitPhase waits for the VMIM's status.phase, which virt-controller sets.
func (m *migration) waitPhase(ctx context.Context, t *testing.T, name string, want virtv1.VirtualMachineInstanceMigrationPhase) {
	t.Helper()
	var phase string
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, podTimeout, true, func(ctx context.Context) (bool, error) {
		u, err := m.dyn.Resource(vmimResource()).Namespace(m.ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		phase, _, _ = unstructured.NestedString(u.Object, "status", "phase")
		return phase == string(want), nil
	})
	if err != nil {
		t.Fatalf("VMIM %s/%s phase %q, want %s (virt-controller): %v\nevents:\n%s", m.ns, name, phase, want, err, m.e.Events(ctx, m.ns, name))
	}
}

// serveLauncherLibvirt serves a fake session virtqemud on the pod's
// libvirt-runtime socket on node n, with the VM's domain running and no
// vfnet hostdev (the source unplugged it; a target's domain arrives
// without it).
func serveLauncherLibvirt(t *testing.T, n *Node, pod *corev1.Pod, domain string) *launcherLibvirt {
	t.Helper()
	dir := n.Path(attach.RuntimeDir(attach.DefaultKubeletPodsDir, string(pod.UID)))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	ln, err := libvirtfake.Listen(dir)
	if err != nil {
		t.Fatal(err)
	}
	srv := &launcherLibvirt{Server: ln}
	t.Cleanup(func() { _ = srv.Close() })
	if err := srv.DefineRunning(strings.Replace(flow.DemoDomainXML, "<name>default_vm-a</name>", "<name>"+domain+"</name>", 1)); err != nil {
		t.Fatal(err)
	}
	return srv
}

// launcherLibvirt is a fake libvirt that may be closed early (the socket
// freed for the next) and again by the test's cleanup.
type launcherLibvirt struct {
	*libvirtfake.Server
	once sync.Once
	err  error
}

// Close closes the server once.
func (l *launcherLibvirt) Close() error {
	l.once.Do(func() { l.err = l.Server.Close() })
	return l.err
}

// waitAttach waits for the hot-plug at a fake libvirt on node n.
func (e *env) waitAttach(ctx context.Context, t *testing.T, srv *launcherLibvirt, n *Node) libvirtfake.Attach {
	t.Helper()
	select {
	case got := <-srv.Notify():
		return got
	case <-time.After(2 * time.Minute):
		t.Fatalf("no VF attach at %s on %s within 2 minutes\n--- driver log on %s (tail) ---\n%s",
			srv.Path(), n.Spec.Name, n.Spec.Name, tailLines(e.driverLogOn(ctx, n), 40))
	case <-ctx.Done():
		t.Fatal(ctx.Err())
	}
	return libvirtfake.Attach{}
}

// checkAttach: the hot-plug went to domain, unmanaged, with the binding's
// alias and v's PCI address, and the live domain holds it.
func checkAttach(t *testing.T, srv *launcherLibvirt, domain string, got libvirtfake.Attach, v vf) {
	t.Helper()
	var hd libvirtxml.DomainHostdev
	if err := hd.Unmarshal(got.XML); err != nil {
		t.Fatalf("attach XML: %v\n%s", err, got.XML)
	}
	if got.Domain != domain || hd.Managed != "no" || hd.Alias == nil || hd.Alias.Name != attach.Alias(exampleIface) || hd.SubsysPCI == nil || hd.SubsysPCI.Source == nil || hd.SubsysPCI.Source.Address == nil {
		t.Fatalf("attach to %q, want domain %s, an unmanaged PCI hostdev with alias %s:\n%s", got.Domain, domain, attach.Alias(exampleIface), got.XML)
	}
	a := hd.SubsysPCI.Source.Address
	if a.Domain == nil || a.Bus == nil || a.Slot == nil || a.Function == nil {
		t.Fatalf("attach names no full PCI address:\n%s", got.XML)
	}
	if bdf := (pciaddr.Address{Domain: *a.Domain, Bus: *a.Bus, Slot: *a.Slot, Function: *a.Function}).String(); bdf != v.bdf {
		t.Errorf("attached VF %s, want %s (claim %s)", bdf, v.bdf, v.claim.Name)
	}
	live, err := srv.DomainXML(domain)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(live, attach.Alias(exampleIface)) {
		t.Errorf("live domain lacks the attached hostdev:\n%s", live)
	}
}

// waitVFNetEvent waits for the driver's VFNetAttached Event on the VMI
// naming the VF, the node and the migration's outcome ("completed" or
// "failed").
func (e *env) waitVFNetEvent(ctx context.Context, t *testing.T, ns, vmi, bdf, node, outcome string) {
	t.Helper()
	var seen []string
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		list, err := e.Kube.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + vmi})
		if err != nil {
			return false, nil
		}
		seen = seen[:0]
		for _, ev := range list.Items {
			seen = append(seen, ev.Reason+": "+ev.Message)
			if ev.Reason == vmiwatch.ReasonAttached && strings.Contains(ev.Message, bdf) && strings.Contains(ev.Message, node+" after "+outcome) {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Errorf("no %s Event on VMI %s naming %s on %s after a %s migration: %v; events: %q", vmiwatch.ReasonAttached, vmi, bdf, node, outcome, err, seen)
	}
}

// checkReleased: the claim is gone and the VF back on iavf without VLAN on
// node n.
func checkReleased(ctx context.Context, t *testing.T, n *Node, v vf) {
	t.Helper()
	var last string
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		if _, err := n.Kube.ResourceV1().ResourceClaims(v.claim.Namespace).Get(ctx, v.claim.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			last = "claim " + v.claim.Name + " still there"
			return false, nil
		}
		h, err := simhost.Open(n.Path(filepath.Join(SimRoot, "sys")))
		if err != nil {
			return false, err
		}
		defer h.Close()
		fn, err := h.Sysfs().Function(v.bdf)
		if err != nil {
			return false, err
		}
		link, err := h.VFState(v.pf, v.index)
		if err != nil {
			return false, err
		}
		last = fmt.Sprintf("driver %q vlan %d", fn.Driver, link.VLAN)
		return fn.Driver == "iavf" && link.VLAN == 0, nil
	})
	if err != nil {
		t.Errorf("VF %s on %s not released (last: %s): %v", v.bdf, n.Spec.Name, last, err)
	}
}

// driverLogOn is the log of the driver pod on node n ("" if none).
func (e *env) driverLogOn(ctx context.Context, n *Node) string {
	pods, err := e.Kube.CoreV1().Pods(e.ns).List(ctx, metav1.ListOptions{LabelSelector: driverLabel, FieldSelector: "spec.nodeName=" + n.Spec.Name})
	if err != nil || len(pods.Items) == 0 {
		return fmt.Sprintf("(no driver pod on %s: %v)", n.Spec.Name, err)
	}
	return n.PodLog(&pods.Items[0], "driver")
}
