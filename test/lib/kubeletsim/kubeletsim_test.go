package kubeletsim

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	metadatav1beta1 "k8s.io/dynamic-resource-allocation/api/metadata/v1beta1"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/ptr"
)

const testDriver = "test.vfnet.io"

// recorder is a DRA plugin that hands out one device per claim with a CDI
// device whose spec it writes, and records the calls.
type recorder struct {
	cdiDir string
	mu     sync.Mutex
	prep   []string
	unprep []string
}

func (r *recorder) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[types.UID]kubeletplugin.PrepareResult{}
	for _, c := range claims {
		r.prep = append(r.prep, c.Name)
		spec := `{"cdiVersion":"0.6.0","kind":"` + testDriver + `/dev","devices":[{"name":"` + string(c.UID) + `","containerEdits":{"deviceNodes":[{"path":"/dev/test-` + c.Name + `"}],"env":["TEST=1"]}}]}`
		if err := os.WriteFile(filepath.Join(r.cdiDir, "test-"+string(c.UID)+".json"), []byte(spec), 0o644); err != nil {
			return nil, err
		}
		res := c.Status.Allocation.Devices.Results[0]
		out[c.UID] = kubeletplugin.PrepareResult{Devices: []kubeletplugin.Device{{
			Requests: []string{res.Request}, PoolName: res.Pool, DeviceName: res.Device,
			CDIDeviceIDs: []string{testDriver + "/dev=" + string(c.UID)},
			Metadata:     &kubeletplugin.DeviceMetadata{Attributes: map[string]resourceapi.DeviceAttribute{"resource.kubernetes.io/pciBusID": {StringValue: ptr.To("0000:3b:02.0")}}},
		}}}
	}
	return out, nil
}

func (r *recorder) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[types.UID]error{}
	for _, c := range claims {
		r.unprep = append(r.unprep, c.Name)
		out[c.UID] = nil
	}
	return out, nil
}

func (r *recorder) HandleError(ctx context.Context, err error, msg string) {}

func (r *recorder) WatchHealthStatus(ctx context.Context, reports chan<- kubeletplugin.DeviceHealthReport) error {
	return kubeletplugin.ErrHealthNotSupported
}

func (r *recorder) calls() ([]string, []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.prep), slices.Clone(r.unprep)
}

// TestPrepareLayoutUnprepare registers a real kubeletplugin helper over its
// registration socket, prepares a pod's claim, checks what the containers
// would see (CDI device nodes and the KEP-5304 metadata mount), survives a
// plugin restart, and unprepares when the pod is deleted.
func TestPrepareLayoutUnprepare(t *testing.T) {
	t.Parallel()
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	dir, err := os.MkdirTemp("", "ks")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	reg, plug, cdi, pods := filepath.Join(dir, "reg"), filepath.Join(dir, "plug"), filepath.Join(dir, "cdi"), filepath.Join(dir, "pods")
	for _, d := range []string{reg, plug, cdi} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	cs := fake.NewClientset()
	claim := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "c1", Namespace: "default", UID: "claim-uid-1"},
		Status: resourceapi.ResourceClaimStatus{
			Allocation: &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{{
				Request: "r", Driver: testDriver, Pool: "n1", Device: "d0",
			}}}},
			ReservedFor: []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: "p1", UID: "pod-uid-1"}},
		},
	}
	if _, err := cs.ResourceV1().ResourceClaims("default").Create(ctx, claim, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	k, err := New(Options{NodeName: "n1", Client: cs, RegistrarDir: reg, CDIDirs: []string{cdi}, PodsDir: pods})
	if err != nil {
		t.Fatal(err)
	}
	runDone := make(chan error, 1)
	go func() { runDone <- k.Run(ctx) }()

	rec := &recorder{cdiDir: cdi}
	start := func() *kubeletplugin.Helper {
		h, err := kubeletplugin.Start(ctx, rec, kubeletplugin.DriverName(testDriver), kubeletplugin.NodeName("n1"),
			kubeletplugin.KubeClient(cs), kubeletplugin.RegistrarDirectoryPath(reg), kubeletplugin.PluginDataDirectoryPath(plug),
			kubeletplugin.CDIDirectory(cdi), kubeletplugin.EnableDeviceMetadata(true, []schema.GroupVersion{metadatav1beta1.SchemeGroupVersion}))
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	h := start()
	wctx, wcancel := context.WithTimeout(ctx, 20*time.Second)
	defer wcancel()
	if err := k.WaitRegistered(wctx, testDriver, 1); err != nil {
		t.Fatal(err)
	}
	// The helper learns the kubelet accepted it.
	if st := h.RegistrationStatus(); st == nil || !st.PluginRegistered {
		t.Errorf("plugin registration status %+v, want registered", st)
	}
	node, err := cs.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{})
	if err != nil || len(node.Status.Conditions) == 0 || node.Status.Conditions[0].Type != corev1.NodeReady {
		t.Errorf("node n1 = %+v, %v; want a Ready node", node, err)
	}

	// A plugin restart re-creates the socket; the kubelet registers it again.
	h.Stop()
	h = start()
	defer h.Stop()
	if err := k.WaitRegistered(wctx, testDriver, 2); err != nil {
		t.Fatal(err)
	}

	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p1", Namespace: "default", UID: "pod-uid-1"},
		Spec: corev1.PodSpec{
			NodeName:       "n1",
			ResourceClaims: []corev1.PodResourceClaim{{Name: "net", ResourceClaimName: ptr.To("c1")}},
			Containers: []corev1.Container{
				{Name: "with", Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "net", Request: "r"}}}},
				{Name: "other-request", Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "net", Request: "x"}}}},
				{Name: "without"},
			},
		},
	}
	if _, err := cs.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	st, err := k.WaitPrepared(wctx, pod.UID)
	if err != nil {
		t.Fatal(err)
	}
	if pc := st.Claims["net"]; pc == nil || pc.ClaimName != "c1" || len(pc.Devices) != 1 || pc.Devices[0].DeviceName != "d0" {
		t.Errorf("prepared claims = %+v, want c1 with device d0", st.Claims)
	}
	edits, err := k.ContainerEditsOf(pod.UID, "with")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(edits.DeviceNodes, "/dev/test-c1") || !slices.Contains(edits.Env, "TEST=1") {
		t.Errorf("container edits %+v, want the driver's CDI device node and env", edits)
	}
	// The helper's metadata CDI device mounts the metadata file.
	meta := filepath.Join(k.ContainerRoot(pod.UID, "with"), "var/run/kubernetes.io/dra-device-attributes/resourceclaims/c1/r", testDriver+"-metadata.json")
	data, err := os.ReadFile(meta)
	if err != nil {
		t.Fatalf("metadata not visible where the container would see it: %v (edits %+v)", err, edits)
	}
	if !containsBytes(data, "0000:3b:02.0") {
		t.Errorf("metadata %s does not carry the device attribute: %s", meta, data)
	}
	for _, c := range []string{"other-request", "without"} {
		if _, err := k.ContainerEditsOf(pod.UID, c); !os.IsNotExist(err) {
			t.Errorf("container %s got CDI edits (err %v), want none", c, err)
		}
	}

	if err := cs.CoreV1().Pods("default").Delete(ctx, "p1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := k.WaitUnprepared(wctx, pod.UID); err != nil {
		t.Fatal(err)
	}
	prep, unprep := rec.calls()
	if !slices.Equal(prep, []string{"c1"}) || !slices.Equal(unprep, []string{"c1"}) {
		t.Errorf("plugin calls prepare %v unprepare %v, want [c1] each", prep, unprep)
	}
	if _, err := os.Stat(filepath.Join(pods, string(pod.UID))); !os.IsNotExist(err) {
		t.Errorf("pod directory left after unprepare: %v", err)
	}
	cancel()
	if err := <-runDone; err != nil {
		t.Errorf("Run: %v", err)
	}
}

// TestPrepareWaitsForAllocation: a pod whose claim is not reserved for it
// is not prepared (the kubelet refuses such pods too).
func TestPrepareWaitsForAllocation(t *testing.T) {
	t.Parallel()
	_, ctx := ktesting.NewTestContext(t)
	cs := fake.NewClientset(&resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "c1", Namespace: "default"}})
	k, err := New(Options{NodeName: "n1", Client: cs, RegistrarDir: t.TempDir(), PodsDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p1", Namespace: "default", UID: "u1"},
		Spec: corev1.PodSpec{NodeName: "n1", ResourceClaims: []corev1.PodResourceClaim{{Name: "net", ResourceClaimName: ptr.To("c1")}}}}
	done, err := k.syncPod(ctx, pod)
	if done || err == nil {
		t.Fatalf("syncPod with an unallocated claim: done=%v err=%v, want not done with an error", done, err)
	}
}

func containsBytes(b []byte, s string) bool { return strings.Contains(string(b), s) }
