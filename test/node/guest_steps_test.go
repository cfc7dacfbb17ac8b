package node

import (
	"context"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	virtv1 "kubevirt.io/api/core/v1"

	"github.com/vfnet-io/vfnet/test/kernel"
	"github.com/vfnet-io/vfnet/test/kernel/layout"
	"github.com/vfnet-io/vfnet/test/lib/syncbuf"
)

// guestSteps are the subtests of a run with EnvGuest, in order; each needs
// the ones before.
func guestSteps() []string { return []string{"GuestNode", "GuestDriver", "GuestKubeVirt"} }

// guestVM is the running QEMU guest.
type guestVM struct {
	done    chan error
	cancel  context.CancelFunc
	console *syncbuf.Buffer
	log     *os.File
}

// kubeVirtLines are the kubevirt case's lines (layout.MarkKubeVirt) so far,
// without the mark.
func (g *guestVM) kubeVirtLines() []string {
	var out []string
	for _, l := range strings.Split(g.console.String(), "\n") {
		if i := strings.Index(l, layout.MarkKubeVirt+" "); i >= 0 {
			out = append(out, strings.TrimRight(l[i+len(layout.MarkKubeVirt)+1:], "\r"))
		}
	}
	return out
}

func (g *guestVM) tail(n int) string {
	lines := strings.Split(strings.TrimRight(g.console.String(), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// exited is the guest's end, if it has ended.
func (g *guestVM) exited() (error, bool) {
	select {
	case err := <-g.done:
		g.done <- err
		return err, true
	default:
		return nil, false
	}
}

// stop ends the kubevirt case (layout.GuestStop), which prints the node's
// logs and powers the guest off; QEMU is killed if it has not after 3
// minutes.
func (e *env) stopGuest(t *testing.T) {
	g := e.guest
	if g == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	if _, ended := g.exited(); !ended {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: layout.GuestStop, Namespace: "default"}}
		if _, err := e.Kube.CoreV1().ConfigMaps("default").Create(ctx, cm, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Logf("ask the guest to stop: %v", err)
		}
		select {
		case err := <-g.done:
			g.done <- err
		case <-time.After(3 * time.Minute):
			t.Logf("the guest did not power off 3 minutes after %s: killing QEMU", layout.GuestStop)
		}
	}
	g.cancel()
	err := <-g.done
	g.log.Close()
	t.Logf("guest ended (%v); its console: %s", err, e.guestArt.ConsoleLog)
}

// testGuestNode boots the real-kernel tier's guest with the kubevirt case:
// its containerd and kubelet join this cluster as node layout.GuestNode,
// which becomes Ready.
func (e *env) testGuestNode(t *testing.T) {
	ctx := e.ctxFor(t, 25*time.Minute)
	g := e.guestArt
	if g == nil {
		t.Fatal("the parent prepared no guest (EnvGuest)")
	}
	env, err := kernel.LoadEnv(g.KernelDir)
	if err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(e.Plane.URL)
	if err != nil {
		t.Fatal(err)
	}
	begin := time.Now()
	initrd := filepath.Join(e.Dir, "guest-initramfs.cpio")
	img := kernel.Image{Init: g.Init, Driver: g.Driver, Layout: GuestLayout(u.Port()), Kubeconfig: e.Plane.AdminKubeconfig, Node: g.Node, Wire: true}
	if err := env.BuildInitramfs(initrd, img); err != nil {
		t.Fatalf("build the guest's initramfs: %v", err)
	}
	st, _ := os.Stat(initrd)
	t.Logf("guest initramfs (%d MiB) built in %s", st.Size()>>20, time.Since(begin).Round(100*time.Millisecond))

	logf, err := os.Create(g.ConsoleLog)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithTimeout(context.Background(), 60*time.Minute)
	vm := &guestVM{done: make(chan error, 1), cancel: cancel, console: &syncbuf.Buffer{}, log: logf}
	e.guest = vm
	begin = time.Now()
	go func() {
		vm.done <- env.Run(runCtx, kernel.RunOptions{Initrd: initrd, Cases: img.Layout.Cases, UserNet: true,
			Console: io.MultiWriter(logf, vm.console), BootTimeout: guestBootTimeout})
	}()
	last, err := WaitNodeReady(ctx, e.Kube, layout.GuestNode, 20*time.Minute, func() error {
		if err, ended := vm.exited(); ended {
			return fmt.Errorf("the guest ended: %v", err)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("node %s not Ready (last: %s): %v\nthe guest's console:\n%s", layout.GuestNode, last, err, vm.tail(60))
	}
	t.Logf("guest node %s Ready %s after QEMU's start", layout.GuestNode, time.Since(begin).Round(time.Second))
	for _, l := range vm.kubeVirtLines() {
		t.Logf("guest: %s", l)
	}
}

// testGuestDriver installs the chart with the shipped driver on the guest's
// node only (testdata/guest-values.yaml): the driver pod becomes Ready
// there and publishes the wire PF's 4 real VFs.
func (e *env) testGuestDriver(t *testing.T) {
	ctx := e.ctxFor(t, 15*time.Minute)
	begin := time.Now()
	values := filepath.Join(e.repo, "test", "node", "testdata", "guest-values.yaml")
	if out, err := e.Helm(ctx, "install", helmRelease, e.chartDir(), "-n", helmNS, "--create-namespace", "-f", values); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	e.ns = helmNS
	pod := e.driverPod(ctx, t)
	if pod.Spec.NodeName != layout.GuestNode {
		t.Fatalf("driver pod %s runs on %q, want the guest's node %s", pod.Name, pod.Spec.NodeName, layout.GuestNode)
	}
	t.Logf("driver pod %s Ready on %s %s after helm install", pod.Name, layout.GuestNode, time.Since(begin).Round(100*time.Millisecond))
	devices, err := e.waitDevices(ctx, layout.GuestNode, 4, 5*time.Minute)
	if err != nil {
		t.Fatalf("slices of node %s list %v, want the wire PF's 4 VFs: %v\nthe guest's console:\n%s", layout.GuestNode, devices, err, e.guest.tail(40))
	}
	t.Logf("the guest's slices list %v", devices)
}

// testGuestKubeVirt: KubeVirt v1.9.0's virt-operator installs virt-handler
// on the guest's node (and virt-api and virt-controller on this one); the
// KubeVirt CR reaches Deployed. `kubectl apply` of the example VM, booting
// the real-kernel tier's VM kernel (kernelBoot): virt-controller's launcher
// pod runs on the guest with the VF vfnet prepared, the real virt-handler
// and virt-launcher start the domain that vfnet-binding rewrote, the VMI
// is Running, and the VM's own kernel reads the MAC the VMI asks for on
// the VF. Deleting the VM stops it and frees the claim.
func (e *env) testGuestKubeVirt(t *testing.T) {
	ctx := e.ctxFor(t, 40*time.Minute)
	dyn, err := dynamic.NewForConfig(e.Plane.AdminRESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	begin := time.Now()
	e.installKubeVirt(ctx, t, dyn, "-handler-node-selector", "kubernetes.io/hostname="+layout.GuestNode)
	t.Logf("KubeVirt: virt-api and virt-controller ready %s after install", time.Since(begin).Round(100*time.Millisecond))
	e.waitKubeVirtDeployed(ctx, t, dyn)
	t.Logf("KubeVirt: CR Deployed (virt-handler Ready on %s) %s after install", layout.GuestNode, time.Since(begin).Round(100*time.Millisecond))

	begin = time.Now()
	ns, name := e.applyExampleVM(ctx, t, kernelBootVM)
	vmi := e.waitVMI(ctx, t, dyn, ns, name)
	pod := e.waitVirtControllerPod(ctx, t, vmi)
	checkRenderedByVirtController(t, pod, vmi)
	e.waitGuestVMIPhase(ctx, t, dyn, ns, name, virtv1.Running)
	t.Logf("KubeVirt: VMI Running %s after kubectl apply", time.Since(begin).Round(100*time.Millisecond))
	mac := vmiMAC(vmi)
	if mac != exampleMAC {
		t.Errorf("VMI %s asks for MAC %q, want %s (manifests/examples/vm.yaml)", name, mac, exampleMAC)
	}
	// The VM's kernel under nested TCG: 10 min after the apply idle.
	line := e.waitGuestConsole(ctx, t, 25*time.Minute, func(l string) bool {
		return strings.Contains(l, layout.MarkInner+" vfs") && strings.Contains(l, "="+mac)
	})
	t.Logf("KubeVirt: the VM's kernel reads MAC %s on the VF %s after kubectl apply: %s", mac, time.Since(begin).Round(100*time.Millisecond), line)
	// What the guest's PFs hold: vfnet set the MAC and the example
	// claim's VLAN on one VF through its PF (the case reports the table
	// every 2 s when it changes).
	err = wait.PollUntilContextTimeout(ctx, 2*time.Second, time.Minute, true, func(ctx context.Context) (bool, error) {
		return strings.Contains(vfWith(e.guest.pfTable(), mac), "vlan 100"), nil
	})
	if err != nil {
		t.Errorf("the guest's PFs hold no VF with MAC %s and VLAN 100 (manifests/examples/resourceclaimtemplate.yaml):\n%s", mac, strings.Join(e.guest.pfTable(), "\n"))
	}
	pod, err = e.Kube.CoreV1().Pods(ns).Get(ctx, pod.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var claims []string
	for _, st := range pod.Status.ResourceClaimStatuses {
		if st.ResourceClaimName != nil {
			claims = append(claims, *st.ResourceClaimName)
		}
	}
	if len(claims) == 0 {
		t.Fatalf("launcher pod %s has no ResourceClaims: %+v", pod.Name, pod.Status.ResourceClaimStatuses)
	}

	begin = time.Now()
	if out, err := e.Kubectl(ctx, nil, "delete", "vm", name, "-n", ns, "--wait=false"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	err = wait.PollUntilContextTimeout(ctx, time.Second, 10*time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := dyn.Resource(vmiResource()).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	if err != nil {
		t.Fatalf("VMI %s/%s still there 10m after the VM's deletion: %v\n%s", ns, name, err, e.Events(context.Background(), ns, name))
	}
	if err := e.WaitPodGone(ctx, ns, pod.Name, 5*time.Minute); err != nil {
		t.Fatalf("launcher pod %s: %v", pod.Name, err)
	}
	t.Logf("KubeVirt: VM deleted until its VMI and launcher pod are gone: %s", time.Since(begin).Round(100*time.Millisecond))
	// The pod's claims go with it, and vfnet's unprepare gives the VF
	// back as it was: no MAC, no VLAN.
	for _, c := range claims {
		err := wait.PollUntilContextTimeout(ctx, time.Second, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
			_, err := e.Kube.ResourceV1().ResourceClaims(ns).Get(ctx, c, metav1.GetOptions{})
			return apierrors.IsNotFound(err), nil
		})
		if err != nil {
			t.Errorf("ResourceClaim %s/%s still there 2m after its pod: %v", ns, c, err)
		}
	}
	err = wait.PollUntilContextTimeout(ctx, 2*time.Second, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		table := e.guest.pfTable()
		return len(table) > 0 && vfWith(table, mac) == "" && vfWith(table, "vlan 100") == "", nil
	})
	if err != nil {
		t.Errorf("the guest's PFs still hold MAC %s or VLAN 100 2m after the VM's deletion:\n%s", mac, strings.Join(e.guest.pfTable(), "\n"))
	}
	t.Logf("KubeVirt: claims %v deleted and the VF released %s after the VM's deletion", claims, time.Since(begin).Round(100*time.Millisecond))
}

// pfTable is the guest's last report of what its PFs hold for their VFs
// (the kubevirt case prints it at each change): one line for each PF and
// each VF, as "ip link show" prints them.
func (g *guestVM) pfTable() []string {
	var table []string
	for _, l := range g.kubeVirtLines() {
		rest, ok := strings.CutPrefix(l, "pf: ")
		if !ok {
			continue
		}
		// A report starts with its first PF's line, the only one not
		// indented.
		if !strings.HasPrefix(rest, " ") {
			table = nil
		}
		table = append(table, strings.TrimSpace(rest))
	}
	return table
}

// vfWith is the first VF line of table that contains s, or "".
func vfWith(table []string, s string) string {
	for _, l := range table {
		if strings.HasPrefix(l, "vf ") && strings.Contains(l, s) {
			return l
		}
	}
	return ""
}

// kernelBootVM makes the test-sized example VM boot the real-kernel tier's
// VM kernel and initramfs (VMKernelImage) instead of its container disk,
// which the guest has no image of and which would take minutes to boot
// under nested TCG.
func kernelBootVM(vm map[string]any) error {
	spec, ok := dig(vm, "spec", "template", "spec")
	if !ok {
		return fmt.Errorf("no spec.template.spec")
	}
	domain, ok := dig(spec, "domain")
	if !ok {
		return fmt.Errorf("no spec.template.spec.domain")
	}
	domain["firmware"] = map[string]any{"kernelBoot": map[string]any{
		// The kernel's informational messages too (igbvf's about its
		// MAC): quiet stops at warnings.
		"kernelArgs": layout.VMKernelArgs + " loglevel=7",
		"container": map[string]any{
			"image": VMKernelImage, "imagePullPolicy": string(corev1.PullIfNotPresent),
			"kernelPath": VMKernelPath, "initrdPath": VMInitrdPath,
		},
	}}
	devices, ok := dig(domain, "devices")
	if !ok {
		return fmt.Errorf("no spec.template.spec.domain.devices")
	}
	delete(devices, "disks")
	delete(spec, "volumes")
	return nil
}

// waitKubeVirtDeployed waits for the KubeVirt CR's phase Deployed, which
// virt-operator sets once every component, virt-handler's DaemonSet on the
// guest's node included, is ready.
func (e *env) waitKubeVirtDeployed(ctx context.Context, t *testing.T, dyn dynamic.Interface) {
	t.Helper()
	gvr := schema.GroupVersionResource{Group: "kubevirt.io", Version: "v1", Resource: "kubevirts"}
	var phase string
	err := wait.PollUntilContextTimeout(ctx, 2*time.Second, 20*time.Minute, true, func(ctx context.Context) (bool, error) {
		if err, ended := e.guest.exited(); ended {
			return false, fmt.Errorf("the guest ended: %v", err)
		}
		u, err := dyn.Resource(gvr).Namespace(kubevirtNS).Get(ctx, "kubevirt", metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		phase, _, _ = unstructured.NestedString(u.Object, "status", "phase")
		return phase == string(virtv1.KubeVirtPhaseDeployed), nil
	})
	if err != nil {
		t.Fatalf("KubeVirt CR phase %q, want Deployed: %v\n%s\nthe guest's console:\n%s", phase, err, e.describeKubeVirt(), e.guest.tail(40))
	}
}

// waitGuestVMIPhase is waitVMIPhase with the real virt-handler's time under
// TCG, and the guest's console when it fails.
func (e *env) waitGuestVMIPhase(ctx context.Context, t *testing.T, dyn dynamic.Interface, ns, name string, want virtv1.VirtualMachineInstancePhase) {
	t.Helper()
	var phase, reason string
	err := wait.PollUntilContextTimeout(ctx, time.Second, 15*time.Minute, true, func(ctx context.Context) (bool, error) {
		if err, ended := e.guest.exited(); ended {
			return false, fmt.Errorf("the guest ended: %v", err)
		}
		u, err := dyn.Resource(vmiResource()).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		phase, _, _ = unstructured.NestedString(u.Object, "status", "phase")
		conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
		reason = fmt.Sprint(conds)
		return phase == string(want), nil
	})
	if err != nil {
		t.Fatalf("VMI %s/%s phase %q, want %s: %v\nconditions: %s\nevents:\n%s\nthe guest's console:\n%s", ns, name, phase, want, err, reason, e.Events(context.Background(), ns, name), e.guest.tail(60))
	}
}

// waitGuestConsole waits for a kubevirt case line that ok accepts.
func (e *env) waitGuestConsole(ctx context.Context, t *testing.T, timeout time.Duration, ok func(string) bool) string {
	t.Helper()
	var found string
	err := wait.PollUntilContextTimeout(ctx, time.Second, timeout, true, func(ctx context.Context) (bool, error) {
		for _, l := range e.guest.kubeVirtLines() {
			if ok(l) {
				found = l
				return true, nil
			}
		}
		if err, ended := e.guest.exited(); ended {
			return false, fmt.Errorf("the guest ended: %v", err)
		}
		return false, nil
	})
	if err != nil {
		var vm []string
		for _, l := range e.guest.kubeVirtLines() {
			if strings.HasPrefix(l, "vm") {
				vm = append(vm, l)
			}
		}
		t.Fatalf("no such line from the guest after %s: %v\nthe VM's console so far:\n%s\nthe guest's console:\n%s", timeout, err, strings.Join(vm, "\n"), e.guest.tail(40))
	}
	return found
}
