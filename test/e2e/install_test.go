package e2e

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/vfnet-io/vfnet/test/lib/controlplane"
	"github.com/vfnet-io/vfnet/test/lib/flow"
)

// TestInstall applies every manifest to a real API server the way the docs
// say (kustomize install, KubeVirt CR patch, examples) and exercises the
// driver's RBAC and admission policy with a pod-bound ServiceAccount token,
// as the driver of node-a holds it.
func TestInstall(t *testing.T) {
	t.Parallel()
	ctx, env := newEnv(t)

	if err := env.ApplyManifests(ctx); err != nil {
		t.Fatal(err)
	}
	if err := env.InstallKubeVirtCRDs(ctx); err != nil {
		t.Fatal(err)
	}
	// The KubeVirt CR patch is a whole KubeVirt object: applying it checks it
	// against the CRD schema KubeVirt's operator generates, strictly
	// (kubectl's default field validation rejects unknown fields).
	if _, err := env.Plane.Kubectl(ctx, nil, "create", "namespace", "kubevirt"); err != nil {
		t.Fatal(err)
	}
	if _, err := env.ApplyFile(ctx, filepath.Join(env.Repo, "manifests", "kubevirt", "binding-patch.yaml")); err != nil {
		t.Fatalf("KubeVirt CR patch does not apply: %v", err)
	}
	kv, err := env.Dynamic.Resource(schema.GroupVersionResource{Group: "kubevirt.io", Version: "v1", Resource: "kubevirts"}).
		Namespace("kubevirt").Get(ctx, "kubevirt", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	binding, _, _ := unstructuredMap(kv.Object, "spec", "configuration", "network", "binding", "vfnet")
	if binding["sidecarImage"] == nil {
		t.Errorf("binding vfnet after apply = %v, want sidecarImage kept by the CRD schema", binding)
	}
	if out, err := env.Plane.Kubectl(ctx, nil, "apply", "--server-side", "-k", filepath.Join(env.Repo, "manifests", "examples")); err != nil {
		t.Fatalf("examples do not apply: %v", err)
	} else {
		t.Logf("examples:\n%s", out)
	}
	vm, err := env.Dynamic.Resource(schema.GroupVersionResource{Group: "kubevirt.io", Version: "v1", Resource: "virtualmachines"}).
		Namespace("default").Get(ctx, "vm-physnet-a", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	memLock, _, _ := unstructuredString(vm.Object, "spec", "template", "spec", "domain", "memory", "reservedOverhead", "memLock")
	if memLock != "Required" {
		t.Errorf("VM example memLock after apply = %q, want Required (pruned by the CRD schema?)", memLock)
	}

	// Every DeviceClass of manifests/deviceclasses is installed.
	files, _ := filepath.Glob(filepath.Join(env.Repo, "manifests", "deviceclasses", "*.yaml"))
	if len(files) == 0 {
		t.Fatal("no DeviceClass manifests")
	}
	for _, f := range files {
		name := "vfnet-" + strings.TrimSuffix(filepath.Base(f), ".yaml")
		if _, err := env.Client.ResourceV1().DeviceClasses().Get(ctx, name, metav1.GetOptions{}); err != nil {
			t.Errorf("DeviceClass %s from %s: %v", name, f, err)
		}
	}

	// The driver pods of two nodes, made from the DaemonSet template.
	for _, n := range []string{"node-a", "node-b"} {
		if _, err := env.Client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	podA := driverPod(ctx, t, env, "node-a")
	token, err := controlplane.PodBoundToken(ctx, env.Client, podA, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	driver, err := kubernetes.NewForConfig(env.Plane.RESTConfigForToken(token))
	if err != nil {
		t.Fatal(err)
	}
	driverDyn, err := dynamic.NewForConfig(env.Plane.RESTConfigForToken(token))
	if err != nil {
		t.Fatal(err)
	}
	checkDriverPermissions(ctx, t, env, driver, driverDyn)
}

func checkDriverPermissions(ctx context.Context, t *testing.T, env *flow.Env, driver kubernetes.Interface, driverDyn dynamic.Interface) {
	slices := driver.ResourceV1().ResourceSlices()
	slice := func(name, node string) *resourceapi.ResourceSlice {
		return &resourceapi.ResourceSlice{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: resourceapi.ResourceSliceSpec{
				Driver: flow.DriverName, NodeName: ptr.To(node),
				Pool:    resourceapi.ResourcePool{Name: node, ResourceSliceCount: 1},
				Devices: []resourceapi.Device{{Name: "vf-0000-3b-02-0"}},
			},
		}
	}
	// Allowed: its own node's slices, the whole life cycle.
	own, err := slices.Create(ctx, slice("own", "node-a"), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("driver on node-a creating a node-a ResourceSlice: %v", err)
	}
	own.Spec.Devices = append(own.Spec.Devices, resourceapi.Device{Name: "vf-0000-3b-02-1"})
	if own, err = slices.Update(ctx, own, metav1.UpdateOptions{}); err != nil {
		t.Errorf("update own slice: %v", err)
	}
	if _, err := slices.List(ctx, metav1.ListOptions{}); err != nil {
		t.Errorf("list slices: %v", err)
	}
	// Refused: another node's slices, by the admission policy.
	_, err = slices.Create(ctx, slice("other", "node-b"), metav1.CreateOptions{})
	if !apierrors.IsForbidden(err) && !apierrors.IsInvalid(err) || err == nil || !strings.Contains(err.Error(), "own node") {
		t.Errorf("driver on node-a creating a node-b slice: err = %v, want the admission policy's refusal", err)
	}
	adminSlices := env.Client.ResourceV1().ResourceSlices()
	otherSlice, err := adminSlices.Create(ctx, slice("other-by-admin", "node-b"), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	otherSlice.Spec.Devices = nil
	otherSlice.Spec.Devices = []resourceapi.Device{{Name: "stolen"}}
	if _, err := slices.Update(ctx, otherSlice, metav1.UpdateOptions{}); err == nil || !strings.Contains(err.Error(), "own node") {
		t.Errorf("driver on node-a updating a node-b slice: err = %v, want refusal", err)
	}
	if err := slices.Delete(ctx, otherSlice.Name, metav1.DeleteOptions{}); err == nil || !strings.Contains(err.Error(), "own node") {
		t.Errorf("driver on node-a deleting a node-b slice: err = %v, want refusal", err)
	}
	// Moving its own slice to another node is refused too.
	own.Spec.NodeName = ptr.To("node-b")
	own.Spec.Pool.Name = "node-b"
	if _, err := slices.Update(ctx, own, metav1.UpdateOptions{}); err == nil {
		t.Errorf("driver on node-a moved its slice to node-b")
	}
	if err := slices.Delete(ctx, "own", metav1.DeleteOptions{}); err != nil {
		t.Errorf("delete own slice: %v", err)
	}

	// Claims: get, and status.devices of claims allocated on its node only.
	claimOn := func(name, node string) *resourceapi.ResourceClaim {
		c, err := env.Client.ResourceV1().ResourceClaims("default").Create(ctx, &resourceapi.ResourceClaim{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
				Name: "vf", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "vfnet-physnet-a"},
			}}}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		c.Status.Allocation = &resourceapi.AllocationResult{
			Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{{
				Request: "vf", Driver: flow.DriverName, Pool: node, Device: "vf-0000-3b-02-0",
			}}},
			NodeSelector: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{node}}},
			}}},
		}
		c, err = env.Client.ResourceV1().ResourceClaims("default").UpdateStatus(ctx, c, metav1.UpdateOptions{})
		if err != nil {
			t.Fatalf("allocate claim %s as the scheduler would: %v", name, err)
		}
		return c
	}
	withNetworkData := func(c *resourceapi.ResourceClaim) *resourceapi.ResourceClaim {
		c = c.DeepCopy()
		c.Status.Devices = []resourceapi.AllocatedDeviceStatus{{
			Driver: flow.DriverName, Pool: c.Status.Allocation.Devices.Results[0].Pool, Device: "vf-0000-3b-02-0",
			NetworkData: &resourceapi.NetworkDeviceData{HardwareAddress: "02:00:00:00:00:01"},
		}}
		return c
	}
	local := claimOn("on-node-a", "node-a")
	remote := claimOn("on-node-b", "node-b")
	got, err := driver.ResourceV1().ResourceClaims("default").Get(ctx, local.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("driver get claim: %v", err)
	}
	if _, err := driver.ResourceV1().ResourceClaims("default").UpdateStatus(ctx, withNetworkData(got), metav1.UpdateOptions{}); err != nil {
		t.Errorf("driver on node-a writing status.devices of a claim allocated on node-a: %v", err)
	}
	// The API server reports this one as an invalid status.devices field
	// (422) whose cause is the missing arbitrary-node permission.
	if _, err := driver.ResourceV1().ResourceClaims("default").UpdateStatus(ctx, withNetworkData(remote), metav1.UpdateOptions{}); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "arbitrary-node:update") {
		t.Errorf("driver on node-a writing status.devices of a node-b claim: err = %v, want refusal for lack of arbitrary-node:update", err)
	}

	// Reads it needs.
	if _, err := driver.CoreV1().Nodes().Get(ctx, "node-a", metav1.GetOptions{}); err != nil {
		t.Errorf("get node: %v", err)
	}
	if _, err := driver.CoreV1().Pods(flow.Namespace).Get(ctx, "vfnet-driver-node-a", metav1.GetOptions{}); err != nil {
		t.Errorf("get pod: %v", err)
	}
	vmis := schema.GroupVersionResource{Group: "kubevirt.io", Version: "v1", Resource: "virtualmachineinstances"}
	if _, err := driverDyn.Resource(vmis).Namespace("default").List(ctx, metav1.ListOptions{}); err != nil {
		t.Errorf("list VMIs: %v", err)
	}
	// numVFs: before changing a PF's VF count, whether a claim is allocated one of its VFs.
	if _, err := driver.ResourceV1().ResourceClaims("").List(ctx, metav1.ListOptions{}); err != nil {
		t.Errorf("list claims: %v", err)
	}
	if _, err := driver.CoreV1().Events("default").Create(ctx, &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{Name: "vfnet-test"},
		InvolvedObject: corev1.ObjectReference{Kind: "VirtualMachineInstance", Namespace: "default", Name: "x"},
		Reason:         "Test", Message: "test",
	}, metav1.CreateOptions{}); err != nil {
		t.Errorf("create event: %v", err)
	}

	// Everything else is refused.
	refused := map[string]error{}
	_, refused["list secrets"] = driver.CoreV1().Secrets(flow.Namespace).List(ctx, metav1.ListOptions{})
	refused["delete pod"] = driver.CoreV1().Pods(flow.Namespace).Delete(ctx, "vfnet-driver-node-a", metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}})
	_, refused["list pods"] = driver.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
	_, refused["list nodes"] = driver.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	_, refused["patch node"] = driver.CoreV1().Nodes().Patch(ctx, "node-a", types.MergePatchType, []byte(`{"metadata":{"labels":{"x":"y"}}}`), metav1.PatchOptions{})
	_, refused["update claim spec"] = driver.ResourceV1().ResourceClaims("default").Update(ctx, got, metav1.UpdateOptions{})
	refused["delete claim"] = driver.ResourceV1().ResourceClaims("default").Delete(ctx, got.Name, metav1.DeleteOptions{})
	_, refused["create device class"] = driver.ResourceV1().DeviceClasses().Create(ctx, &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: "x"}}, metav1.CreateOptions{})
	_, refused["create configmap"] = driver.CoreV1().ConfigMaps(flow.Namespace).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "x"}}, metav1.CreateOptions{})
	refused["delete VMI"] = driverDyn.Resource(vmis).Namespace("default").Delete(ctx, "x", metav1.DeleteOptions{})
	_, refused["create serviceaccount token"] = driver.CoreV1().ServiceAccounts(flow.Namespace).CreateToken(ctx, flow.ServiceAccount, &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	for what, err := range refused {
		if !apierrors.IsForbidden(err) {
			t.Errorf("driver may %s: err = %v, want Forbidden", what, err)
		}
	}
}

func driverPod(ctx context.Context, t *testing.T, env *flow.Env, node string) *corev1.Pod {
	t.Helper()
	ds, err := env.Client.AppsV1().DaemonSets(flow.Namespace).Get(ctx, flow.DaemonSet, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "vfnet-driver-" + node, Namespace: flow.Namespace, Labels: ds.Spec.Template.Labels},
		Spec: *ds.Spec.Template.Spec.DeepCopy()}
	pod.Spec.NodeName = node
	created, err := env.Client.CoreV1().Pods(flow.Namespace).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create a driver pod from the DaemonSet template (admission: privileged, priority class): %v", err)
	}
	return created
}

func unstructuredMap(obj map[string]any, path ...string) (map[string]any, bool, error) {
	var cur any = obj
	for _, p := range path {
		m, ok := cur.(map[string]any)
		if !ok {
			return nil, false, nil
		}
		cur = m[p]
	}
	m, ok := cur.(map[string]any)
	return m, ok, nil
}

func unstructuredString(obj map[string]any, path ...string) (string, bool, error) {
	var cur any = obj
	for _, p := range path {
		m, ok := cur.(map[string]any)
		if !ok {
			return "", false, nil
		}
		cur = m[p]
	}
	s, ok := cur.(string)
	return s, ok, nil
}
