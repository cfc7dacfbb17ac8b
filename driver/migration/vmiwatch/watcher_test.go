package vmiwatch_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"
	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/vfnet-io/vfnet/driver/migration/attach"
	"github.com/vfnet-io/vfnet/driver/migration/vmiwatch"
	"github.com/vfnet-io/vfnet/pkg/contract/vmiview"
)

// view is vmi as the watcher's informer keeps it: the API server's JSON
// decoded into vmiview types.
func view(t testing.TB, vmi *kubevirtv1.VirtualMachineInstance) *vmiview.VMI {
	t.Helper()
	b, err := json.Marshal(vmi)
	if err != nil {
		t.Fatal(err)
	}
	v, err := vmiview.Decode(b)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func ifacesOf(t *testing.T, vmi *vmiview.VMI) []vmiview.ClaimInterface {
	t.Helper()
	ci, err := vmi.BindingInterfaces("vfnet")
	if err != nil {
		t.Fatal(err)
	}
	return ci
}

func TestPlan(t *testing.T) {
	t.Parallel()
	base := newVMI("vm1", "uid-1", "node-a", ifaceOpt{name: "net1", mac: "02:00:00:00:00:01"}, ifaceOpt{name: "net2", mac: "02:00:00:00:00:02", direct: true})
	mig := migrating("node-a", "virt-launcher-vm1-aaaaa", "node-b", "virt-launcher-vm1-bbbbb")
	aborted := mig.DeepCopy()
	aborted.AbortRequested, aborted.AbortStatus = true, kubevirtv1.MigrationAbortSucceeded
	decentral := &kubevirtv1.VirtualMachineInstanceMigrationState{Completed: true,
		SourceState: &kubevirtv1.VirtualMachineInstanceMigrationSourceState{VirtualMachineInstanceCommonMigrationState: kubevirtv1.VirtualMachineInstanceCommonMigrationState{Node: "node-a", Pod: "src", MigrationUID: "m2"}},
		TargetState: &kubevirtv1.VirtualMachineInstanceMigrationTargetState{VirtualMachineInstanceCommonMigrationState: kubevirtv1.VirtualMachineInstanceCommonMigrationState{Node: "node-b", Pod: "dst", MigrationUID: "m2"}}}
	tests := []struct {
		name string
		ms   *kubevirtv1.VirtualMachineInstanceMigrationState
		node string
		want string // side:pod:ifaces, ";"-joined
	}{
		{"no migration", nil, "node-a", ""},
		{"running, target", mig, "node-b", ""},
		{"running, source watches its detach", mig, "node-a", "source-detach:virt-launcher-vm1-aaaaa:net1,net2"},
		{"completed, target attaches template ifaces only", completed(mig), "node-b", "target:virt-launcher-vm1-bbbbb:net1"},
		{"completed, source does nothing", completed(mig), "node-a", ""},
		{"completed, other node", completed(mig), "node-c", ""},
		{"failed, source re-attaches all", failed(mig), "node-a", "source:virt-launcher-vm1-aaaaa:net1,net2"},
		{"failed, target does nothing", failed(mig), "node-b", ""},
		{"aborted, source re-attaches", aborted, "node-a", "source:virt-launcher-vm1-aaaaa:net1,net2"},
		{"decentralized fields", decentral, "node-b", "target:dst:net1"},
	}
	for _, tc := range tests {
		vmi := base.DeepCopy()
		vmi.Status.MigrationState = tc.ms
		var got []string
		v := view(t, vmi)
		for _, a := range vmiwatch.Plan(v, ifacesOf(t, v), tc.node) {
			var names []string
			for _, ci := range a.Interfaces {
				names = append(names, ci.Interface.Name)
			}
			if a.Domain != "default_vm1" {
				t.Errorf("%s: domain %q", tc.name, a.Domain)
			}
			got = append(got, string(a.Side)+":"+a.PodName+":"+strings.Join(names, ","))
		}
		if g := strings.Join(got, ";"); g != tc.want {
			t.Errorf("%s: plan %q, want %q", tc.name, g, tc.want)
		}
	}
	other := newVMI("vm2", "uid-2", "node-a", ifaceOpt{name: "net1", binding: "passt"})
	other.Status.MigrationState = completed(mig)
	if got := vmiwatch.Plan(view(t, other), ifacesOf(t, view(t, other)), "node-b"); len(got) != 0 {
		t.Errorf("VMI without vfnet interfaces planned %v", got)
	}
}

type env struct {
	kube    *fake.Clientset
	dyn     *dynamicfake.FakeDynamicClient
	events  *record.FakeRecorder
	attach  *fakeAttacher
	watcher *vmiwatch.Watcher
}

func newEnv(t *testing.T, node string, objs ...runtime.Object) *env {
	t.Helper()
	e := &env{
		kube:   fake.NewClientset(objs...),
		dyn:    dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{vmiwatch.VMIResource: "VirtualMachineInstanceList"}),
		events: record.NewFakeRecorder(100),
		attach: newFakeAttacher(),
	}
	w, err := vmiwatch.New(vmiwatch.Config{NodeName: node, Kube: e.kube, Dynamic: e.dyn, Attacher: e.attach, Recorder: e.events})
	if err != nil {
		t.Fatal(err)
	}
	e.watcher = w
	return e
}

func (e *env) sync(t *testing.T, vmi *kubevirtv1.VirtualMachineInstance) error {
	t.Helper()
	err := e.watcher.Sync(context.Background(), view(t, vmi))
	e.watcher.Wait()
	return err
}

// twoNodes: vm1 on node-a with source pod and claim, target pod on node-b
// with its own template claim and VF.
func twoNodes(t *testing.T, node string, mac string, opts ...ifaceOpt) (*env, *kubevirtv1.VirtualMachineInstance) {
	t.Helper()
	if len(opts) == 0 {
		opts = []ifaceOpt{{name: "net1", mac: "02:00:00:00:00:01", pci: "0000:81:01.0", boot: uptr(2)}}
	}
	vmi := newVMI("vm1", "uid-1", "node-a", opts...)
	src := launcherPod("virt-launcher-vm1-aaaaa", "pod-a", vmi, "node-a", map[string]string{"net1-claim": "vm1-net1-claim-src"})
	dst := launcherPod("virt-launcher-vm1-bbbbb", "pod-b", vmi, "node-b", map[string]string{"net1-claim": "vm1-net1-claim-dst"})
	e := newEnv(t, node, src, dst,
		allocatedClaim("vm1-net1-claim-src", "vf-0000-3b-02-1", mac),
		allocatedClaim("vm1-net1-claim-dst", "vf-0000-5e-00-4", mac))
	return e, vmi
}

func TestTargetAttachesTargetPodVFOnce(t *testing.T) {
	t.Parallel()
	e, vmi := twoNodes(t, "node-b", "")
	mig := migrating("node-a", "virt-launcher-vm1-aaaaa", "node-b", "virt-launcher-vm1-bbbbb")
	vmi.Status.MigrationState = mig
	if err := e.sync(t, vmi); err != nil {
		t.Fatal(err)
	}
	if n := len(e.attach.requests()); n != 0 {
		t.Fatalf("%d attaches while migrating", n)
	}
	vmi.Status.MigrationState = completed(mig)
	vmi.Status.NodeName = "node-b"
	for range 3 { // informer updates and resyncs replay the same state
		if err := e.sync(t, vmi); err != nil {
			t.Fatal(err)
		}
	}
	reqs := e.attach.requests()
	if len(reqs) != 1 {
		t.Fatalf("%d attach requests, want 1", len(reqs))
	}
	r := reqs[0]
	if r.PodUID != "pod-b" || r.Domain != "default_vm1" || len(r.Hostdevs) != 1 {
		t.Fatalf("request %+v", r)
	}
	h := r.Hostdevs[0]
	if h.Interface != "net1" || h.Source.String() != "0000:5e:00.4" || h.Guest == nil || h.Guest.String() != "0000:81:01.0" || h.BootOrder == nil || *h.BootOrder != 2 {
		t.Fatalf("hostdev %+v", h)
	}
	evs := drain(e.events.Events)
	if len(evs) != 1 || !strings.HasPrefix(evs[0], "Normal "+vmiwatch.ReasonAttached) || !strings.Contains(evs[0], "0000:5e:00.4") {
		t.Fatalf("events %q", evs)
	}
	onlyGets(t, e)
}

func TestSourceReattachesOriginalVFOnFailure(t *testing.T) {
	t.Parallel()
	e, vmi := twoNodes(t, "node-a", "")
	vmi.Status.MigrationState = failed(migrating("node-a", "virt-launcher-vm1-aaaaa", "node-b", "virt-launcher-vm1-bbbbb"))
	if err := e.sync(t, vmi); err != nil {
		t.Fatal(err)
	}
	reqs := e.attach.requests()
	if len(reqs) != 1 || reqs[0].PodUID != "pod-a" || reqs[0].Hostdevs[0].Source.String() != "0000:3b:02.1" {
		t.Fatalf("requests %+v, want the source pod's VF", reqs)
	}
	onlyGets(t, e)
}

// onlyGets fails unless every API call was a get: the driver's RBAC allows
// pods get only (issue 5), and claims get.
func onlyGets(t *testing.T, e *env) {
	t.Helper()
	for _, a := range e.kube.Actions() {
		if a.GetVerb() != "get" {
			t.Errorf("API call %s %s: the watcher may only get", a.GetVerb(), a.GetResource().Resource)
		}
	}
}

func TestSourceWithoutSourcePodRecordsWarning(t *testing.T) {
	t.Parallel()
	e, vmi := twoNodes(t, "node-a", "")
	vmi.Status.MigrationState = failed(migrating("node-a", "", "node-b", "virt-launcher-vm1-bbbbb"))
	vmi.Status.ActivePods = map[types.UID]string{"pod-a": "node-a"}
	for range 3 { // replays record nothing new
		if err := e.sync(t, vmi); err != nil {
			t.Fatal(err)
		}
	}
	if reqs := e.attach.requests(); len(reqs) != 0 {
		t.Fatalf("requests %+v without a source pod name", reqs)
	}
	evs := drain(e.events.Events)
	if len(evs) != 1 || !strings.HasPrefix(evs[0], "Warning "+vmiwatch.ReasonAttachFailed) ||
		!strings.Contains(evs[0], "sourcePod is empty") || !strings.Contains(evs[0], "net1") || !strings.Contains(evs[0], "node-a") {
		t.Fatalf("events %q, want one warning naming the missing sourcePod", evs)
	}
	if n := len(e.kube.Actions()); n != 0 {
		t.Fatalf("%d API calls, want none", n)
	}
}

func TestTargetWaitsForClaimStatus(t *testing.T) {
	t.Parallel()
	e, vmi := twoNodes(t, "node-b", "")
	// The target pod's claim status is not written yet.
	pod, err := e.kube.CoreV1().Pods(ns).Get(context.Background(), "virt-launcher-vm1-bbbbb", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	full := pod.DeepCopy()
	pod.Status.ResourceClaimStatuses = nil
	if _, err := e.kube.CoreV1().Pods(ns).UpdateStatus(context.Background(), pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	vmi.Status.MigrationState = completed(migrating("node-a", "virt-launcher-vm1-aaaaa", "node-b", "virt-launcher-vm1-bbbbb"))
	done := make(chan error, 1)
	go func() { done <- e.sync(t, vmi) }()
	// Let the watcher find the status missing at least once, then fill it in.
	for len(e.kube.Actions()) < 4 {
		time.Sleep(time.Millisecond)
	}
	if _, err := e.kube.CoreV1().Pods(ns).UpdateStatus(context.Background(), full, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if reqs := e.attach.requests(); len(reqs) != 1 || reqs[0].Hostdevs[0].Source.String() != "0000:5e:00.4" {
		t.Fatalf("requests %+v", reqs)
	}
}

func TestAttachGiveUpRecordsWarning(t *testing.T) {
	t.Parallel()
	e, vmi := twoNodes(t, "node-b", "")
	e.attach.err = &attach.GaveUpError{Attempts: 9, Err: errors.New("dial unix virtqemud-sock: no such file or directory")}
	vmi.Status.MigrationState = completed(migrating("node-a", "virt-launcher-vm1-aaaaa", "node-b", "virt-launcher-vm1-bbbbb"))
	if err := e.sync(t, vmi); err != nil {
		t.Fatal(err)
	}
	evs := drain(e.events.Events)
	if len(evs) != 1 || !strings.HasPrefix(evs[0], "Warning "+vmiwatch.ReasonAttachFailed) || !strings.Contains(evs[0], "virtqemud-sock") {
		t.Fatalf("events %q", evs)
	}
}

func TestNonVFNetVMIIsNeverTouched(t *testing.T) {
	t.Parallel()
	e, vmi := twoNodes(t, "node-b", "", ifaceOpt{name: "net1", binding: "sriov-other"})
	vmi.Status.MigrationState = completed(migrating("node-a", "virt-launcher-vm1-aaaaa", "node-b", "virt-launcher-vm1-bbbbb"))
	if err := e.sync(t, vmi); err != nil {
		t.Fatal(err)
	}
	if n := len(e.attach.requests()); n != 0 {
		t.Fatalf("%d attaches for a VMI without vfnet interfaces", n)
	}
	if n := len(e.kube.Actions()); n != 0 {
		t.Fatalf("%d API calls for a VMI without vfnet interfaces", n)
	}
}

func TestDirectClaimWarnsOncePerMigration(t *testing.T) {
	t.Parallel()
	e, vmi := twoNodes(t, "node-a", "", ifaceOpt{name: "net1", mac: "02:00:00:00:00:01", direct: true})
	vmi.Status.MigrationState = migrating("node-a", "virt-launcher-vm1-aaaaa", "node-b", "virt-launcher-vm1-bbbbb")
	for range 3 {
		if err := e.sync(t, vmi); err != nil {
			t.Fatal(err)
		}
	}
	evs := drain(e.events.Events)
	if len(evs) != 1 || !strings.HasPrefix(evs[0], "Warning "+vmiwatch.ReasonNotMigratable) || !strings.Contains(evs[0], "net1") {
		t.Fatalf("events %q", evs)
	}
	// The target node says nothing: the source node already did.
	eb, vb := twoNodes(t, "node-b", "", ifaceOpt{name: "net1", mac: "02:00:00:00:00:01", direct: true})
	vb.Status.MigrationState = vmi.Status.MigrationState
	if err := eb.sync(t, vb); err != nil {
		t.Fatal(err)
	}
	if evs := drain(eb.events.Events); len(evs) != 0 {
		t.Fatalf("target node events %q", evs)
	}
}

// TestRunFollowsVMIUpdates drives the informer path: VMI status changes in
// the API (here a dynamic fake) reach the attacher of the right node only.
func TestRunFollowsVMIUpdates(t *testing.T) {
	t.Parallel()
	e, vmi := twoNodes(t, "node-b", "")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	res := e.dyn.Resource(vmiwatch.VMIResource).Namespace(ns)
	mig := migrating("node-a", "virt-launcher-vm1-aaaaa", "node-b", "virt-launcher-vm1-bbbbb")
	vmi.Status.MigrationState = mig
	migratingTo(vmi, "node-b")
	if _, err := res.Create(ctx, toUnstructured(t, vmi), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- e.watcher.Run(ctx) }()
	vmi.Status.MigrationState = completed(mig)
	if _, err := res.Update(ctx, toUnstructured(t, vmi), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	r := e.attach.next(t)
	if r.PodUID != "pod-b" || r.Hostdevs[0].Source.String() != "0000:5e:00.4" {
		t.Fatalf("request %+v", r)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func toUnstructured(t testing.TB, vmi *kubevirtv1.VirtualMachineInstance) *unstructured.Unstructured {
	t.Helper()
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(vmi)
	if err != nil {
		t.Fatal(err)
	}
	return &unstructured.Unstructured{Object: m}
}

// TestLabelsMatchKubeVirtAPI: the driver spells KubeVirt's VMI labels
// itself (it does not link kubevirt.io/api).
func TestLabelsMatchKubeVirtAPI(t *testing.T) {
	t.Parallel()
	if vmiwatch.NodeNameLabel != kubevirtv1.NodeNameLabel || vmiwatch.MigrationTargetNodeNameLabel != kubevirtv1.MigrationTargetNodeNameLabel {
		t.Fatalf("labels %q, %q; kubevirt.io/api has %q, %q", vmiwatch.NodeNameLabel, vmiwatch.MigrationTargetNodeNameLabel,
			kubevirtv1.NodeNameLabel, kubevirtv1.MigrationTargetNodeNameLabel)
	}
}
