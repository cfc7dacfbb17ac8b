package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/vfnet-io/vfnet/driver/migration/attach"
	"github.com/vfnet-io/vfnet/driver/migration/vmiwatch"
	"github.com/vfnet-io/vfnet/test/lib/flow"
)

// noAttach fails the test if the watcher ever attaches: no VMI here migrates.
type noAttach struct{ t *testing.T }

func (a noAttach) Attach(context.Context, attach.Request) (attach.Result, error) {
	a.t.Error("unexpected attach")
	return attach.Result{}, fmt.Errorf("unexpected")
}

func (a noAttach) WaitRemoved(context.Context, attach.Removal) error {
	a.t.Error("unexpected removal watch")
	return fmt.Errorf("unexpected")
}

// wireRecorder keeps every VMI list and watch response body the client
// receives: what reaches the driver over the wire.
type wireRecorder struct {
	next http.RoundTripper
	mu   sync.Mutex
	buf  bytes.Buffer
}

func (w *wireRecorder) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := w.next.RoundTrip(req)
	if err != nil || !strings.Contains(req.URL.Path, "/virtualmachineinstances") {
		return resp, err
	}
	resp.Body = struct {
		io.Reader
		io.Closer
	}{io.TeeReader(resp.Body, w), resp.Body}
	return resp, nil
}

func (w *wireRecorder) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.Write(p)
}

func (w *wireRecorder) saw(name string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return bytes.Contains(w.buf.Bytes(), []byte(`"name":"`+name+`"`))
}

// labelledVMI is a vfnet VMI with the node labels KubeVirt sets (empty
// values are left out).
func labelledVMI(name, node, target string) *unstructured.Unstructured {
	vmi := &kubevirtv1.VirtualMachineInstance{
		TypeMeta:   metav1.TypeMeta{APIVersion: "kubevirt.io/v1", Kind: "VirtualMachineInstance"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", Labels: map[string]string{}},
		Spec: kubevirtv1.VirtualMachineInstanceSpec{
			Domain: kubevirtv1.DomainSpec{Devices: kubevirtv1.Devices{Interfaces: []kubevirtv1.Interface{{
				Name: "net1", Binding: &kubevirtv1.PluginBinding{Name: "vfnet"},
			}}}},
			Networks: []kubevirtv1.Network{{Name: "net1", NetworkSource: kubevirtv1.NetworkSource{
				ResourceClaim: &kubevirtv1.ClaimRequest{ClaimName: "vf", RequestName: "vf"},
			}}},
			ResourceClaims: []kubevirtv1.VirtualMachineInstanceResourceClaim{{Name: "vf", ResourceClaimTemplateName: new("vf-template")}},
		},
	}
	if node != "" {
		vmi.Labels[kubevirtv1.NodeNameLabel] = node
	}
	if target != "" {
		vmi.Labels[kubevirtv1.MigrationTargetNodeNameLabel] = target
	}
	obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(vmi)
	if err != nil {
		panic(err)
	}
	return &unstructured.Unstructured{Object: obj}
}

func startWatcher(ctx context.Context, t *testing.T, env *flow.Env, node string, dyn dynamic.Interface, sleep func(context.Context, time.Duration) error) (*vmiwatch.Watcher, chan error) {
	t.Helper()
	kube, err := kubernetes.NewForConfig(env.Plane.AdminRESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	w, err := vmiwatch.New(vmiwatch.Config{NodeName: node, Kube: kube, Dynamic: dyn, Attacher: noAttach{t},
		Recorder: record.NewFakeRecorder(100), Sleep: sleep})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	return w, done
}

func waitCached(ctx context.Context, t *testing.T, w *vmiwatch.Watcher, want ...string) {
	t.Helper()
	slices.Sort(want)
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		return slices.Equal(w.Cached(), want), nil
	})
	if err != nil {
		t.Fatalf("watcher cache %q, want %q", w.Cached(), want)
	}
}

// TestVMIWatchIsNodeScoped runs the migration watcher of node-a against the
// real API server with KubeVirt's CRDs: only VMIs labelled
// kubevirt.io/nodeName=node-a or kubevirt.io/migrationTargetNodeName=node-a
// reach its cache, or even its connection; a VMI leaves the cache when its
// labels move it to another node.
func TestVMIWatchIsNodeScoped(t *testing.T) {
	t.Parallel()
	ctx, env := newEnv(t)
	if err := env.InstallKubeVirtCRDs(ctx); err != nil {
		t.Fatal(err)
	}
	res := env.Dynamic.Resource(vmiwatch.VMIResource).Namespace("default")
	create := func(name, node, target string) {
		t.Helper()
		if _, err := res.Create(ctx, labelledVMI(name, node, target), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	relabel := func(name, node, target string) {
		t.Helper()
		u, err := res.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		u.SetLabels(labelledVMI(name, node, target).GetLabels())
		if _, err := res.Update(ctx, u, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	create("on-a", "node-a", "")
	create("to-a", "node-b", "node-a")
	create("from-a", "node-a", "node-b")
	create("on-b", "node-b", "")
	create("b-to-c", "node-b", "node-c")
	create("unscheduled", "", "")

	cfg := env.Plane.AdminRESTConfig()
	wire := &wireRecorder{}
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { wire.next = rt; return wire })
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	w, done := startWatcher(wctx, t, env, "node-a", dyn, nil)
	waitCached(ctx, t, w, "default/on-a", "default/to-a", "default/from-a")

	// While it runs: other nodes' VMIs appear and change, to-a's migration
	// completes (virt-handler moves nodeName to node-a, then drops the
	// target label), from-a migrates away to node-b and on-a is relabelled
	// to node-c.
	create("late-b", "node-b", "")
	relabel("on-b", "node-b", "node-c")
	relabel("to-a", "node-a", "node-a")
	relabel("to-a", "node-a", "")
	relabel("from-a", "node-b", "")
	relabel("on-a", "node-c", "")
	create("late-a", "node-a", "")
	waitCached(ctx, t, w, "default/to-a", "default/late-a")

	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"on-a", "to-a", "from-a", "late-a"} {
		if !wire.saw(name) {
			t.Errorf("VMI %s never arrived over the watcher's connection", name)
		}
	}
	for _, name := range []string{"on-b", "b-to-c", "unscheduled", "late-b"} {
		if wire.saw(name) {
			t.Errorf("VMI %s of another node reached node-a's watcher", name)
		}
	}
}

// TestVMIWatchWaitsForKubeVirt starts the watcher on a cluster without
// KubeVirt: it logs one line at the default verbosity, checks again after
// 5 s, 10 s, ... up to 5 min (the waits are recorded, not slept), and
// starts watching once the CRDs are installed.
func TestVMIWatchWaitsForKubeVirt(t *testing.T) {
	t.Parallel()
	ctx, env := newEnv(t)
	var mu sync.Mutex
	var lines []string
	logger := funcr.New(func(prefix, args string) {
		mu.Lock()
		lines = append(lines, prefix+" "+args)
		mu.Unlock()
	}, funcr.Options{Verbosity: 0})
	ctx = klog.NewContext(ctx, logr.Logger(logger))

	const absentChecks = 9
	var waits []time.Duration
	sleep := func(ctx context.Context, d time.Duration) error {
		waits = append(waits, d)
		if len(waits) == absentChecks {
			if err := env.InstallKubeVirtCRDs(ctx); err != nil {
				t.Error(err)
				return err
			}
		}
		return ctx.Err()
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w, done := startWatcher(wctx, t, env, "node-a", env.Dynamic, sleep)
	res := env.Dynamic.Resource(vmiwatch.VMIResource).Namespace("default")
	// Generous: the CRDs are generated by building KubeVirt's operator code
	// (minutes when its build cache is cold).
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 10*time.Minute, true, func(ctx context.Context) (bool, error) {
		select {
		case err := <-done:
			return false, fmt.Errorf("watcher stopped: %v", err)
		default:
		}
		mu.Lock()
		defer mu.Unlock()
		return slices.ContainsFunc(lines, func(l string) bool { return strings.Contains(l, "Watching this node's VirtualMachineInstances") }), nil
	})
	if err != nil {
		t.Fatalf("watcher did not start after the CRDs appeared: %v; log %q", err, lines)
	}
	if _, err := res.Create(ctx, labelledVMI("on-a", "node-a", ""), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitCached(ctx, t, w, "default/on-a")
	cancel()
	<-done

	s := time.Second
	want := []time.Duration{5 * s, 10 * s, 20 * s, 40 * s, 80 * s, 160 * s, 300 * s, 300 * s, 300 * s}
	if !slices.Equal(waits, want) {
		t.Errorf("waits between checks %v, want %v", waits, want)
	}
	mu.Lock()
	defer mu.Unlock()
	var absent []string
	for _, l := range lines {
		if strings.Contains(l, "KubeVirt is not installed") {
			absent = append(absent, l)
		}
	}
	if len(absent) != 1 || !strings.Contains(absent[0], "virtualmachineinstances.kubevirt.io") {
		t.Errorf("want one line naming the missing CRD at the default verbosity over %d checks, got %q", absentChecks, absent)
	}
	t.Logf("log at the default verbosity: %q", lines)
}
