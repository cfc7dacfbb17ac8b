package node

// The KubeVirt step's deviations from released KubeVirt v1.9.0 (each
// stand-in, why, and what would remove it) are listed in README.md.

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
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
	"sigs.k8s.io/yaml"
)

const (
	kubevirtNS = "kubevirt"
	// Generous: virt-api and virt-operator spend seconds of CPU in package
	// init, readiness probes start after 15 s, and two cores are shared.
	// Alone the install takes 72-103 s; with two make test runs side by
	// side (rehearsal 61) virt-api was not ready after 6 min.
	kubevirtTimeout = 12 * time.Minute
)

// testKubeVirt: KubeVirt v1.9.0's real virt-operator installs virt-api and
// virt-controller; `kubectl apply` of the example VM (test-sized): virt-api
// admits it, virt-controller creates its VMI and launcher pod, the
// scheduler allocates a VF, the kubelet prepares it through vfnet (the
// chart's driver), the sidecar-claims policy gives hook-sidecar-0 the claim,
// and the domain vfnet-binding returns holds the VF's hostdev; the VF
// carries the MAC the VMI asks for. Deleting the VM unprepares the VF.
func (e *env) testKubeVirt(t *testing.T) {
	// The install alone may take kubevirtTimeout; the VM's part needs
	// minutes more (rehearsal 69 ran out of the ten of e.ctx).
	ctx := e.ctxFor(t, kubevirtTimeout+8*time.Minute)
	dyn, err := dynamic.NewForConfig(e.Plane.AdminRESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	begin := time.Now()
	e.installKubeVirt(ctx, t, dyn)
	t.Logf("KubeVirt: virt-api, virt-controller and the subresources APIService ready %s after install", time.Since(begin).Round(100*time.Millisecond))

	handler := &VirtHandlerStandIn{Node: e.Node}
	if err := handler.Start(ctx, kubevirtNS); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(handler.Stop)

	begin = time.Now()
	ns, name, vmi, pod, sidecar := e.startExampleVM(ctx, t, dyn)
	domain := e.waitDomain(ctx, t, pod, sidecar)
	t.Logf("KubeVirt: domain through %s %s after kubectl apply", sidecar, time.Since(begin).Round(100*time.Millisecond))

	podClaim := pod.Spec.ResourceClaims[0].Name
	v := e.claimVF(ctx, t, pod, podClaim)
	if mac := vmiMAC(vmi); mac != exampleMAC {
		t.Errorf("VMI %s asks for MAC %q, want %s (manifests/examples/vm.yaml)", name, mac, exampleMAC)
	}
	group := e.checkPrepared(t, v, exampleMAC)
	for _, c := range []string{"compute", sidecar} {
		e.checkContainerSees(ctx, t, pod, c, podClaim, v, group)
	}
	checkHostdev(t, domain, v)

	// virt-controller hands the VMI over (Scheduled); virt-handler would
	// report the running domain, which the VM's status then shows.
	e.waitVMIPhase(ctx, t, dyn, ns, name, virtv1.Scheduled)
	if err := handler.SetPhase(ctx, ns, name, virtv1.Running); err != nil {
		t.Fatal(err)
	}
	e.waitVMStatus(ctx, t, dyn, ns, name, virtv1.VirtualMachineStatusRunning)
	t.Logf("KubeVirt: VM Running %s after kubectl apply", time.Since(begin).Round(100*time.Millisecond))

	begin = time.Now()
	e.deleteVM(ctx, t, dyn, handler, ns, name, pod)
	e.checkRestored(ctx, t, v)
	t.Logf("KubeVirt: VM deleted until its VF is unprepared: %s", time.Since(begin).Round(100*time.Millisecond))
}

// installKubeVirt installs KubeVirt as its release manifest does (genoperator
// renders it from KubeVirt's own generators), creates the KubeVirt CR,
// registers the vfnet binding with manifests/kubevirt/binding-patch.yaml
// (the tier's image) and waits for virt-api, virt-controller and the
// subresources APIService. genoperator gets the extra flags too.
func (e *env) installKubeVirt(ctx context.Context, t *testing.T, dyn dynamic.Interface, genoperator ...string) {
	t.Helper()
	dir := filepath.Join(e.Dir, "kubevirt-install")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	e.removeHandMadeCRDs(ctx, t)
	operator, cr := filepath.Join(dir, "kubevirt-operator.yaml"), filepath.Join(dir, "kubevirt-cr.yaml")
	// -liveness-delay: see genoperator; the tier runs beside the others.
	cmd := exec.CommandContext(ctx, e.art.GenOperator, append([]string{"-node", NodeName, "-liveness-delay", "120", "-o", operator, "-cr", cr}, genoperator...)...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("genoperator (test/kubevirt/cmd/genoperator): %v\n%s", err, out)
	}
	// Server-side: the KubeVirt CRD is too large for client-side apply's
	// annotation.
	if out, err := e.Kubectl(ctx, nil, "apply", "--server-side", "-f", operator); err != nil {
		t.Fatalf("install virt-operator: %v\n%s", err, out)
	}
	e.waitDeployment(ctx, t, "virt-operator")
	if out, err := e.Kubectl(ctx, nil, "create", "-f", cr); err != nil {
		t.Fatalf("create the KubeVirt CR: %v\n%s", err, out)
	}
	// virt-operator's webhook for the CR comes up with its first sync:
	// retry until it admits the patch.
	var out []byte
	err := wait.PollUntilContextTimeout(ctx, time.Second, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		var err error
		out, err = e.Kubectl(ctx, nil, "patch", "kubevirt", "kubevirt", "-n", kubevirtNS, "--type", "merge", "--patch-file", e.art.KubeVirtCR)
		return err == nil, nil
	})
	if err != nil {
		t.Fatalf("register the binding (manifests/kubevirt/binding-patch.yaml): %v\n%s", err, out)
	}
	e.waitDeployment(ctx, t, "virt-api")
	e.waitDeployment(ctx, t, "virt-controller")
	e.waitAPIServiceAvailable(ctx, t, dyn, "v1.subresources.kubevirt.io")
	e.checkVersion(ctx, t)
}

// checkVersion asks virt-api for its version through the aggregator (the
// API server's front-proxy client certificate, which virt-api verifies
// against the request-header CA) and checks it is the release the images
// stand for: the build stamped it as KubeVirt's release build does.
func (e *env) checkVersion(ctx context.Context, t *testing.T) {
	t.Helper()
	out, err := e.Kubectl(ctx, nil, "get", "--raw", "/apis/subresources.kubevirt.io/v1/version")
	if err != nil {
		t.Fatalf("virt-api's version through the aggregator: %v\n%s", err, out)
	}
	var v struct{ GitVersion, GitCommit string }
	if err := json.Unmarshal(out, &v); err != nil {
		t.Fatalf("virt-api's version: %v\n%s", err, out)
	}
	if v.GitVersion != kubeVirtRelease.Tag || v.GitCommit != kubeVirtRelease.Commit {
		t.Errorf("virt-api reports %s (%s), want %s (%s): see gobuild.KubeVirtRelease", v.GitVersion, v.GitCommit, kubeVirtRelease.Tag, kubeVirtRelease.Commit)
	}
}

// removeHandMadeCRDs deletes the KubeVirt CRDs LauncherPod applied for its
// hand-made VMI (flow.ApplyKubeVirtCRDs), so KubeVirt installs on a cluster
// without them, as a user's: virt-operator creates the CRDs it manages and
// fails on ones that exist without its labels.
func (e *env) removeHandMadeCRDs(ctx context.Context, t *testing.T) {
	t.Helper()
	dir := filepath.Join(e.Dir, "kubevirt-crds")
	if _, err := os.Stat(dir); os.IsNotExist(err) {
		return // LauncherPod did not run
	}
	if out, err := e.Kubectl(ctx, nil, "delete", "--ignore-not-found", "--wait", "-f", dir); err != nil {
		t.Fatalf("remove the KubeVirt CRDs LauncherPod applied: %v\n%s", err, out)
	}
}

// waitDeployment waits until a Deployment of KubeVirt's namespace has all
// its replicas available.
func (e *env) waitDeployment(ctx context.Context, t *testing.T, name string) {
	t.Helper()
	var last string
	err := wait.PollUntilContextTimeout(ctx, time.Second, kubevirtTimeout, true, func(ctx context.Context) (bool, error) {
		d, err := e.Kube.AppsV1().Deployments(kubevirtNS).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			last = err.Error()
			return false, nil
		}
		want := int32(1)
		if d.Spec.Replicas != nil {
			want = *d.Spec.Replicas
		}
		last = fmt.Sprintf("%d/%d available", d.Status.AvailableReplicas, want)
		return d.Status.AvailableReplicas == want && d.Status.ObservedGeneration == d.Generation, nil
	})
	if err != nil {
		t.Fatalf("Deployment %s/%s not available (last: %s): %v\n%s", kubevirtNS, name, last, err, e.describeKubeVirt())
	}
}

// waitAPIServiceAvailable waits for an APIService's Available condition:
// the aggregator reaches virt-api's pod (aggregator routing, request-header
// authentication: test/lib/controlplane.Options.KubeVirt).
func (e *env) waitAPIServiceAvailable(ctx context.Context, t *testing.T, dyn dynamic.Interface, name string) {
	t.Helper()
	gvr := schema.GroupVersionResource{Group: "apiregistration.k8s.io", Version: "v1", Resource: "apiservices"}
	var last string
	err := wait.PollUntilContextTimeout(ctx, time.Second, kubevirtTimeout, true, func(ctx context.Context) (bool, error) {
		u, err := dyn.Resource(gvr).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			last = err.Error()
			return false, nil
		}
		conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
		for _, c := range conds {
			m, _ := c.(map[string]any)
			if m["type"] == "Available" {
				last = fmt.Sprintf("%v: %v", m["reason"], m["message"])
				return m["status"] == "True", nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("APIService %s not Available (last: %s): %v\n%s", name, last, err, e.describeKubeVirt())
	}
}

// describeKubeVirt summarises KubeVirt's pods and the CR, with the tail of
// each pod's log, for a failure message.
func (e *env) describeKubeVirt() string {
	// Its own time: it is called when a wait ran out, often with its
	// context, which would leave only that context's error to show.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var b strings.Builder
	if out, err := e.Kubectl(ctx, nil, "get", "kubevirt", "-n", kubevirtNS, "-o", "jsonpath={.items[*].status}"); err == nil {
		fmt.Fprintf(&b, "KubeVirt CR status: %s\n", out)
	}
	pods, err := e.Kube.CoreV1().Pods(kubevirtNS).List(ctx, metav1.ListOptions{})
	if err != nil {
		return b.String() + err.Error()
	}
	for i := range pods.Items {
		p := &pods.Items[i]
		fmt.Fprintf(&b, "pod %s: %s\n%s", p.Name, DescribePod(p), e.Events(ctx, kubevirtNS, p.Name))
		for _, c := range p.Spec.Containers {
			fmt.Fprintf(&b, "--- log of %s/%s (tail) ---\n%s\n", p.Name, c.Name, tailLines(PodLog(p, c.Name), 15))
		}
	}
	return b.String()
}

func tailLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// testSizedVM is manifests/examples/vm.yaml made to fit the tier: less
// guest memory (no guest boots), and its container disk taken from the
// node (virt-api defaults a :latest image to pull Always; no registry here).
func testSizedVM(vm map[string]any) error {
	spec, ok := dig(vm, "spec", "template", "spec")
	if !ok {
		return fmt.Errorf("no spec.template.spec")
	}
	mem, ok := dig(spec, "domain", "memory")
	if !ok {
		return fmt.Errorf("no spec.template.spec.domain.memory")
	}
	mem["guest"] = "256Mi"
	vols, _ := spec["volumes"].([]any)
	for _, v := range vols {
		if cd, ok := dig(v.(map[string]any), "containerDisk"); ok {
			cd["imagePullPolicy"] = string(corev1.PullIfNotPresent)
		}
	}
	return nil
}

// startExampleVM applies the example VM and waits for the launcher pod the
// real virt-controller renders to run. It returns the VMI's namespace and
// name, the VMI, the running pod and the binding sidecar's container.
func (e *env) startExampleVM(ctx context.Context, t *testing.T, dyn dynamic.Interface) (string, string, *unstructured.Unstructured, *corev1.Pod, string) {
	t.Helper()
	ns, name := e.applyExampleVM(ctx, t, nil)
	vmi := e.waitVMI(ctx, t, dyn, ns, name)
	pod := e.waitVirtControllerPod(ctx, t, vmi)
	sidecar := checkRenderedByVirtController(t, pod, vmi)
	return ns, name, vmi, e.waitLauncherRunning(ctx, t, pod), sidecar
}

// applyExampleVM writes a test-sized copy of manifests/examples (the VM and
// its ResourceClaimTemplate), changed further by change when set, and
// applies it with kubectl; it returns the VM's namespace and name.
func (e *env) applyExampleVM(ctx context.Context, t *testing.T, change func(vm map[string]any) error) (string, string) {
	t.Helper()
	src := filepath.Join(e.repo, "manifests", "examples")
	dir := filepath.Join(e.Dir, "kubevirt-example")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(src, "vm.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	vm := map[string]any{}
	if err := yaml.Unmarshal(b, &vm); err != nil {
		t.Fatal(err)
	}
	if err := testSizedVM(vm); err != nil {
		t.Fatalf("manifests/examples/vm.yaml: %v", err)
	}
	if change != nil {
		if err := change(vm); err != nil {
			t.Fatalf("manifests/examples/vm.yaml: %v", err)
		}
	}
	if b, err = yaml.Marshal(vm); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "vm.yaml"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	rct, err := os.ReadFile(filepath.Join(src, "resourceclaimtemplate.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "resourceclaimtemplate.yaml"), rct, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := e.Kubectl(ctx, nil, "apply", "-f", dir); err != nil {
		t.Fatalf("kubectl apply of the example VM (virt-api admits it): %v\n%s", err, out)
	}
	meta, _ := dig(vm, "metadata")
	return fmt.Sprint(meta["namespace"]), fmt.Sprint(meta["name"])
}

// waitVMI waits for the VMI virt-controller creates for the VM.
func (e *env) waitVMI(ctx context.Context, t *testing.T, dyn dynamic.Interface, ns, name string) *unstructured.Unstructured {
	t.Helper()
	var vmi *unstructured.Unstructured
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, podTimeout, true, func(ctx context.Context) (bool, error) {
		u, err := dyn.Resource(vmiResource()).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		vmi = u
		return true, nil
	})
	if err != nil {
		t.Fatalf("virt-controller created no VMI %s/%s: %v\nVM events:\n%s\n%s", ns, name, err, e.Events(ctx, ns, name), e.describeKubeVirt())
	}
	return vmi
}

// waitVirtControllerPod waits for the launcher pod virt-controller creates
// for the VMI (labelled with the VMI's UID, controlled by the VMI).
func (e *env) waitVirtControllerPod(ctx context.Context, t *testing.T, vmi *unstructured.Unstructured) *corev1.Pod {
	t.Helper()
	var pod *corev1.Pod
	sel := virtv1.CreatedByLabel + "=" + string(vmi.GetUID())
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, podTimeout, true, func(ctx context.Context) (bool, error) {
		pods, err := e.Kube.CoreV1().Pods(vmi.GetNamespace()).List(ctx, metav1.ListOptions{LabelSelector: sel})
		if err != nil || len(pods.Items) != 1 {
			return false, nil
		}
		pod = &pods.Items[0]
		return true, nil
	})
	if err != nil {
		t.Fatalf("virt-controller created no launcher pod (%s): %v\nVMI events:\n%s\n%s", sel, err, e.Events(ctx, vmi.GetNamespace(), vmi.GetName()), e.describeKubeVirt())
	}
	return pod
}

// checkRenderedByVirtController: the pod is the VMI's, its compute container
// runs the launcher image and hook-sidecar-0 the binding image with
// compute's claims (the policy's doing: v1.9.0 renders it without). It
// returns the sidecar's name.
func checkRenderedByVirtController(t *testing.T, pod *corev1.Pod, vmi *unstructured.Unstructured) string {
	t.Helper()
	if ref := metav1.GetControllerOf(pod); ref == nil || ref.UID != vmi.GetUID() || ref.Kind != "VirtualMachineInstance" {
		t.Errorf("launcher pod %s is not controlled by VMI %s: %+v", pod.Name, vmi.GetName(), pod.OwnerReferences)
	}
	compute := container(pod, "compute")
	if compute.Image != LauncherImage || len(compute.Resources.Claims) == 0 {
		t.Fatalf("compute container: image %s claims %v, want %s with the VM's claim", compute.Image, compute.Resources.Claims, LauncherImage)
	}
	const sidecar = "hook-sidecar-0"
	sc := container(pod, sidecar)
	if sc.Image != BindingImage {
		t.Fatalf("%s runs %q, want the registered binding image %s", sidecar, sc.Image, BindingImage)
	}
	if !reflect.DeepEqual(sc.Resources.Claims, compute.Resources.Claims) {
		t.Errorf("%s has claims %v, want compute's %v (the KubeVirt v1.9 sidecar-claims policy)", sidecar, sc.Resources.Claims, compute.Resources.Claims)
	}
	if len(pod.Spec.ResourceClaims) != 1 {
		t.Fatalf("launcher pod claims %+v, want the VM's one", pod.Spec.ResourceClaims)
	}
	return sidecar
}

// vmiMAC is the MAC the VMI's first interface asks for.
func vmiMAC(vmi *unstructured.Unstructured) string {
	ifaces, _, _ := unstructured.NestedSlice(vmi.Object, "spec", "domain", "devices", "interfaces")
	if len(ifaces) == 0 {
		return ""
	}
	mac, _, _ := unstructured.NestedString(ifaces[0].(map[string]any), "macAddress")
	return mac
}

// waitVMIPhase waits for a VMI's status.phase.
func (e *env) waitVMIPhase(ctx context.Context, t *testing.T, dyn dynamic.Interface, ns, name string, want virtv1.VirtualMachineInstancePhase) {
	t.Helper()
	var phase string
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, podTimeout, true, func(ctx context.Context) (bool, error) {
		u, err := dyn.Resource(vmiResource()).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		phase, _, _ = unstructured.NestedString(u.Object, "status", "phase")
		return phase == string(want), nil
	})
	if err != nil {
		t.Fatalf("VMI %s/%s phase %q, want %s: %v\nevents:\n%s", ns, name, phase, want, err, e.Events(ctx, ns, name))
	}
}

// waitVMStatus waits for the VM's printable status, which virt-controller
// derives from its VMI.
func (e *env) waitVMStatus(ctx context.Context, t *testing.T, dyn dynamic.Interface, ns, name string, want virtv1.VirtualMachinePrintableStatus) {
	t.Helper()
	gvr := schema.GroupVersionResource{Group: "kubevirt.io", Version: "v1", Resource: "virtualmachines"}
	var status string
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, podTimeout, true, func(ctx context.Context) (bool, error) {
		u, err := dyn.Resource(gvr).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		status, _, _ = unstructured.NestedString(u.Object, "status", "printableStatus")
		return status == string(want), nil
	})
	if err != nil {
		t.Errorf("VM %s/%s printableStatus %q, want %s: %v", ns, name, status, want, err)
	}
}

// deleteVM deletes the VM as a user does; virt-controller deletes the VMI's
// launcher pod, the virt-handler stand-in reports the domain gone
// (Succeeded), and virt-controller then lets the VMI and the VM go.
func (e *env) deleteVM(ctx context.Context, t *testing.T, dyn dynamic.Interface, handler *VirtHandlerStandIn, ns, name string, pod *corev1.Pod) {
	t.Helper()
	if out, err := e.Kubectl(ctx, nil, "delete", "vm", name, "-n", ns, "--wait=false"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if err := e.WaitPodGone(ctx, ns, pod.Name, podTimeout); err != nil {
		t.Fatalf("virt-controller did not delete launcher pod %s: %v\n%s", pod.Name, err, e.Events(ctx, ns, name))
	}
	if err := handler.SetPhase(ctx, ns, name, virtv1.Succeeded); err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, podTimeout, true, func(ctx context.Context) (bool, error) {
		_, err := dyn.Resource(vmiResource()).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	if err != nil {
		t.Errorf("VMI %s/%s not removed after its VM was deleted: %v", ns, name, err)
	}
}
