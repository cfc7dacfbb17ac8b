package node

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/vfnet-io/vfnet/driver/checkpoint"
	"github.com/vfnet-io/vfnet/driver/standby"
	contract "github.com/vfnet-io/vfnet/pkg/contract/standby"
)

const (
	// standbyBridge is the admin's node bridge of the standby step, made
	// in the tier's network namespace.
	standbyBridge = "br-standby"
	standbyVM     = "vm-standby"
	standbyTmpl   = "vf-physnet-a-failover"
	standbyMAC    = "02:00:00:00:5b:01"
)

// testStandby: containerd 2.4.2 with NRI on (node.go) and the Helm-installed
// driver upgraded to plumb failover standbys into this tier's network
// namespace (--standby-netns; a simulated driver has none by default) with
// physnet-a's PF given the node bridge br-standby. A launcher-like pod (a
// pause container owned by a VMI whose vfnet interface sets a MAC, with a
// claim from a failover ResourceClaimTemplate) starts: prepare records the
// standby, and at RunPodSandbox the driver, as containerd's NRI plugin,
// makes the tap the sidecar names. Checked from outside: the tap
// vfsb… exists in the pod's network namespace, owned by 107:107, on a
// bridge whose veth's peer is on br-standby in the node's namespace.
// Deleting the pod leaves nothing of it on the node. The release is then
// upgraded back to the HelmUpgrade step's values.
func (e *env) testStandby(t *testing.T) {
	ctx := e.ctx(t)
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: standbyBridge, MTU: 1500}}
	if err := netlink.LinkAdd(br); err != nil {
		t.Fatalf("create node bridge %s in the tier's namespace: %v", standbyBridge, err)
	}
	t.Cleanup(func() { _ = netlink.LinkDel(br) })
	if err := netlink.LinkSetUp(br); err != nil {
		t.Fatal(err)
	}
	adm, err := netlink.LinkByName(standbyBridge)
	if err != nil {
		t.Fatal(err)
	}

	// The driver pod shares the host's PID namespace (hostPID), in which
	// this process runs, so it reaches the tier's network namespace here.
	hostNetns := "/proc/" + strconv.Itoa(os.Getpid()) + "/ns/net"
	e.upgradeForStandby(ctx, t, hostNetns)
	defer e.upgradeBack(ctx, t)

	dyn, err := dynamic.NewForConfig(e.Plane.AdminRESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	pod, iface := e.standbyLauncher(ctx, t, dyn)
	defer func() {
		_ = dyn.Resource(vmiGVR()).Namespace(pod.Namespace).Delete(context.WithoutCancel(ctx), standbyVM, metav1.DeleteOptions{})
		_ = e.Kube.ResourceV1().ResourceClaimTemplates(pod.Namespace).Delete(context.WithoutCancel(ctx), standbyTmpl, metav1.DeleteOptions{})
	}()

	// Prepare recorded what the plumbing needs.
	cp, err := (checkpoint.Store{Path: filepath.Join(pluginDir, checkpoint.FileName)}).Load()
	if err != nil {
		t.Fatal(err)
	}
	var rec *checkpoint.Standby
	for _, c := range cp.Claims {
		for _, d := range c.Devices {
			if d.Standby != nil && slices.Contains(d.Standby.PodUIDs, pod.UID) {
				rec = d.Standby
			}
		}
	}
	if rec == nil || rec.Interface != iface || rec.Bridge != standbyBridge || rec.MAC != standbyMAC {
		t.Errorf("checkpoint standby for pod %s: %+v, want interface %s, bridge %s, MAC %s", pod.UID, rec, iface, standbyBridge, standbyMAC)
	}

	// From outside: the pod's namespace through its container's process.
	pid, err := e.ContainerPID(ctx, pod, "c")
	if err != nil {
		t.Fatal(err)
	}
	podNs, err := netns.GetFromPath("/proc/" + strconv.Itoa(pid) + "/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	defer podNs.Close()
	ph, err := netlink.NewHandleAt(podNs)
	if err != nil {
		t.Fatal(err)
	}
	defer ph.Close()
	tapName := contract.TargetDev(iface)
	l, err := ph.LinkByName(tapName)
	if err != nil {
		t.Fatalf("no tap %s (the sidecar's target dev for interface %s) in the pod's network namespace: %v\ndriver log:\n%s", tapName, iface, err, tailLines(e.standbyDriverLog(ctx, t), 30))
	}
	tap, ok := l.(*netlink.Tuntap)
	if !ok || tap.Mode != netlink.TUNTAP_MODE_TAP || tap.Owner != standby.QEMUUser || tap.Group != standby.QEMUUser {
		t.Errorf("%s in the pod: %s %+v, want a tap owned by 107:107", tapName, l.Type(), l)
	}
	podLinks, err := ph.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	var podBr, podVeth netlink.Link
	for _, pl := range podLinks {
		if pl.Attrs().Index == l.Attrs().MasterIndex {
			podBr = pl
		}
	}
	if _, isBr := podBr.(*netlink.Bridge); !isBr {
		t.Fatalf("tap %s is enslaved to %v, want a bridge in the pod", tapName, podBr)
	}
	for _, pl := range podLinks {
		if pl.Type() == "veth" && pl.Attrs().MasterIndex == podBr.Attrs().Index {
			podVeth = pl
		}
	}
	if podVeth == nil {
		t.Fatalf("no veth on the pod's bridge %s: %v", podBr.Attrs().Name, linkNames(podLinks))
	}
	hostEnd, err := netlink.LinkByIndex(podVeth.Attrs().ParentIndex)
	if err != nil || hostEnd.Type() != "veth" || hostEnd.Attrs().ParentIndex != podVeth.Attrs().Index {
		t.Fatalf("the peer of %s (index %d) is not a veth in the node's namespace: %v %v", podVeth.Attrs().Name, podVeth.Attrs().ParentIndex, hostEnd, err)
	}
	if hostEnd.Attrs().MasterIndex != adm.Attrs().Index {
		t.Errorf("node veth %s is on master %d, want %s (%d)", hostEnd.Attrs().Name, hostEnd.Attrs().MasterIndex, standbyBridge, adm.Attrs().Index)
	}
	if !strings.Contains(hostEnd.Attrs().Alias, string(pod.UID)) {
		t.Errorf("node veth %s alias %q does not name pod %s", hostEnd.Attrs().Name, hostEnd.Attrs().Alias, pod.UID)
	}
	t.Logf("standby plumbed: pod %s: %s on %s, veth %s; node: %s on %s", pod.Name, tapName, podBr.Attrs().Name, podVeth.Attrs().Name, hostEnd.Attrs().Name, standbyBridge)

	// The pod goes: nothing of it stays on the node.
	e.deletePod(ctx, t, pod.Namespace, pod.Name)
	var left []string
	err = wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		left = nil
		all, err := netlink.LinkList()
		if err != nil {
			return false, err
		}
		for _, nl := range all {
			if strings.Contains(nl.Attrs().Alias, string(pod.UID)) || nl.Attrs().MasterIndex == adm.Attrs().Index {
				left = append(left, nl.Attrs().Name)
			}
		}
		return len(left) == 0, nil
	})
	if err != nil {
		t.Errorf("after the pod was deleted the node still has %v (alias naming the pod or on %s): %v", left, standbyBridge, err)
	}
}

func linkNames(ls []netlink.Link) []string {
	var out []string
	for _, l := range ls {
		out = append(out, l.Attrs().Name+"("+l.Type()+")")
	}
	return out
}

// standbyValues are the tier's Helm values plus the standby: the node's
// namespace for the driver, physnet-a's PF with the node bridge, and the
// HelmUpgrade step's log verbosity (so upgradeBack restores that release).
func (e *env) standbyValues(t *testing.T, hostNetns string) string {
	t.Helper()
	b, err := os.ReadFile(e.helmValues())
	if err != nil {
		t.Fatal(err)
	}
	var base struct {
		Driver struct {
			ExtraArgs []string `json:"extraArgs"`
		} `json:"driver"`
	}
	if err := yaml.Unmarshal(b, &base); err != nil {
		t.Fatal(err)
	}
	vals := map[string]any{
		"driver": map[string]any{"logVerbosity": 4, "extraArgs": append(base.Driver.ExtraArgs, "--standby-netns="+hostNetns)},
		// The chart's default node config, physnet-a's PF with a standby.
		"nodeConfig": map[string]any{"pfs": []any{
			map[string]any{"pfName": "enp59s0f0", "network": "physnet-a", "standby": map[string]any{"bridge": standbyBridge}},
			map[string]any{"pfName": "enp59s0f1", "network": "physnet-b"},
		}},
	}
	out, err := yaml.Marshal(vals)
	if err != nil {
		t.Fatal(err)
	}
	f := filepath.Join(e.Dir, "standby-values.yaml")
	if err := os.WriteFile(f, out, 0o644); err != nil {
		t.Fatal(err)
	}
	return f
}

// upgradeForStandby upgrades the release and waits until this node's new
// driver pod is connected to containerd's NRI.
func (e *env) upgradeForStandby(ctx context.Context, t *testing.T, hostNetns string) {
	t.Helper()
	begin := time.Now()
	if out, err := e.Helm(ctx, "upgrade", helmRelease, e.chartDir(), "-n", helmNS, "-f", e.helmValues(), "-f", e.standbyValues(t, hostNetns)); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	want := "--standby-netns=" + hostNetns
	var pod *corev1.Pod
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, podTimeout, true, func(ctx context.Context) (bool, error) {
		pod = e.nodeDriverPod(ctx, func(p *corev1.Pod) bool { return slices.Contains(p.Spec.Containers[0].Args, want) })
		return pod != nil && strings.Contains(PodLog(pod, "driver"), "Connected to the container runtime's NRI"), nil
	})
	if err != nil {
		log := ""
		if pod != nil {
			log = tailLines(PodLog(pod, "driver"), 40)
		}
		t.Fatalf("no driver pod on %s with %s connected to containerd's NRI: %v\n%s\ncontainerd log:\n%s", e.Spec.Name, want, err, log, Tail(e.LogFile("containerd"), 20))
	}
	t.Logf("driver with the standby plumbing Ready and connected to NRI %s after helm upgrade", time.Since(begin).Round(100*time.Millisecond))
}

// upgradeBack restores the HelmUpgrade step's release.
func (e *env) upgradeBack(ctx context.Context, t *testing.T) {
	t.Helper()
	ctx = context.WithoutCancel(ctx)
	if out, err := e.Helm(ctx, "upgrade", helmRelease, e.chartDir(), "-n", helmNS, "-f", e.helmValues(), "--set", "driver.logVerbosity=4"); err != nil {
		t.Errorf("%v\n%s", err, out)
		return
	}
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, podTimeout, true, func(ctx context.Context) (bool, error) {
		pods, err := e.driverPods(ctx)
		if err != nil {
			return false, err
		}
		for i := range pods {
			p := &pods[i]
			if p.Spec.NodeName == e.Spec.Name && (!PodReady(p) || slices.ContainsFunc(p.Spec.Containers[0].Args, func(a string) bool { return strings.HasPrefix(a, "--standby-netns") })) {
				return false, nil
			}
		}
		return e.nodeDriverPod(ctx, func(*corev1.Pod) bool { return true }) != nil, nil
	})
	if err != nil {
		t.Errorf("release not back to the HelmUpgrade step's values: %v", err)
	}
}

// nodeDriverPod is this node's Ready driver pod that ok accepts, or nil.
func (e *env) nodeDriverPod(ctx context.Context, ok func(*corev1.Pod) bool) *corev1.Pod {
	pods, err := e.driverPods(ctx)
	if err != nil {
		return nil
	}
	for i := range pods {
		p := &pods[i]
		if p.Spec.NodeName == e.Spec.Name && p.DeletionTimestamp == nil && PodReady(p) && ok(p) {
			return p
		}
	}
	return nil
}

func (e *env) standbyDriverLog(ctx context.Context, t *testing.T) string {
	if p := e.nodeDriverPod(ctx, func(*corev1.Pod) bool { return true }); p != nil {
		return PodLog(p, "driver")
	}
	return ""
}

// standbyLauncher creates the failover ResourceClaimTemplate, a VMI (the
// example's, renamed, with a MAC and the failover template; no controller
// acts on it: the tier's KubeVirt CRDs are hand-applied here) and a pause
// pod it owns, pinned to this node, and returns the Ready pod and the VMI
// interface name.
func (e *env) standbyLauncher(ctx context.Context, t *testing.T, dyn dynamic.Interface) (*corev1.Pod, string) {
	t.Helper()
	b, err := os.ReadFile(e.art.VMI)
	if err != nil {
		t.Fatal(err)
	}
	vmi := &unstructured.Unstructured{}
	if err := json.Unmarshal(b, &vmi.Object); err != nil {
		t.Fatal(err)
	}
	ns := vmi.GetNamespace()
	if ns == "" {
		ns = "default"
	}
	vmi.SetName(standbyVM)
	vmi.SetNamespace(ns)
	vmi.SetUID("")
	vmi.SetResourceVersion("")
	vmi.SetOwnerReferences(nil)
	delete(vmi.Object, "status")
	ifaces, _, _ := unstructured.NestedSlice(vmi.Object, "spec", "domain", "devices", "interfaces")
	claims, _, _ := unstructured.NestedSlice(vmi.Object, "spec", "resourceClaims")
	if len(ifaces) != 1 || len(claims) != 1 {
		t.Fatalf("the example VMI has %d interfaces and %d resource claims, want 1 each", len(ifaces), len(claims))
	}
	iface := ifaces[0].(map[string]any)
	iface["macAddress"] = standbyMAC
	podClaim := claims[0].(map[string]any)
	podClaim["resourceClaimTemplateName"] = standbyTmpl
	if err := unstructured.SetNestedSlice(vmi.Object, ifaces, "spec", "domain", "devices", "interfaces"); err != nil {
		t.Fatal(err)
	}
	if err := unstructured.SetNestedSlice(vmi.Object, claims, "spec", "resourceClaims"); err != nil {
		t.Fatal(err)
	}

	// The example template with failover on.
	tmpl, err := e.Kube.ResourceV1().ResourceClaimTemplates("default").Get(ctx, claimTmpl, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the example ResourceClaimTemplate (applied by the VFPod step): %v", err)
	}
	tmpl = tmpl.DeepCopy()
	tmpl.ObjectMeta = metav1.ObjectMeta{Name: standbyTmpl, Namespace: ns}
	for i := range tmpl.Spec.Spec.Devices.Config {
		if o := tmpl.Spec.Spec.Devices.Config[i].Opaque; o != nil {
			var p map[string]any
			if err := json.Unmarshal(o.Parameters.Raw, &p); err != nil {
				t.Fatal(err)
			}
			p["failover"] = true
			if o.Parameters.Raw, err = json.Marshal(p); err != nil {
				t.Fatal(err)
			}
		}
	}
	if _, err := e.Kube.ResourceV1().ResourceClaimTemplates(ns).Create(ctx, tmpl, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	created, err := dyn.Resource(vmiGVR()).Namespace(ns).Create(ctx, vmi, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create VMI: %v", err)
	}
	name := podClaim["name"].(string)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "virt-launcher-" + standbyVM, Namespace: ns,
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "kubevirt.io/v1", Kind: "VirtualMachineInstance", Name: standbyVM,
				UID: created.GetUID(), Controller: ptr.To(true)}}},
		Spec: corev1.PodSpec{
			AutomountServiceAccountToken:  ptr.To(false),
			TerminationGracePeriodSeconds: ptr.To[int64](5),
			Affinity: &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
				NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchFields: []corev1.NodeSelectorRequirement{{
					Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{e.Spec.Name}}}}}}}},
			ResourceClaims: []corev1.PodResourceClaim{{Name: name, ResourceClaimTemplateName: ptr.To(standbyTmpl)}},
			Containers: []corev1.Container{{
				Name: "c", Image: PauseImage, ImagePullPolicy: corev1.PullNever,
				Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: name}}},
			}},
		},
	}
	begin := time.Now()
	if _, err := e.Kube.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ready, err := e.WaitPod(ctx, ns, pod.Name, podTimeout, "Ready", PodReady)
	if err != nil {
		t.Fatalf("%v\nevents:\n%s\ndriver log:\n%s", err, e.Events(ctx, ns, pod.Name), tailLines(e.standbyDriverLog(ctx, t), 30))
	}
	t.Logf("failover launcher pod Ready %s after create", time.Since(begin).Round(100*time.Millisecond))
	return ready, fmt.Sprint(iface["name"])
}
