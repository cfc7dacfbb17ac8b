package vmiwatch_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"

	"github.com/vfnet-io/vfnet/driver/migration/attach"
	"github.com/vfnet-io/vfnet/driver/migration/vmiwatch"
	"github.com/vfnet-io/vfnet/test/lib/libvirtfake"
)

// BenchmarkCompletedToAttached measures, in one process, the time from the
// VMI status update that marks a migration completed to the hot-plug
// arriving at the target launcher's libvirt: informer, pod and claim
// lookups, O_PATH dial, live XML, attach.
func BenchmarkCompletedToAttached(b *testing.B) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	kube := fake.NewClientset()
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{vmiwatch.VMIResource: "VirtualMachineInstanceList"})
	pods := filepath.Join(b.TempDir(), "pods")
	const targetUID = "pod-b"
	rd := attach.RuntimeDir(pods, targetUID)
	if err := os.MkdirAll(rd, 0o755); err != nil {
		b.Fatal(err)
	}
	srv, err := libvirtfake.Listen(rd)
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = srv.Close() }()
	w, err := vmiwatch.New(vmiwatch.Config{NodeName: "node-b", Kube: kube, Dynamic: dyn, Recorder: record.NewFakeRecorder(1 << 20),
		Attacher: &attach.Attacher{Dialer: attach.SessionDialer{}, Memlock: attach.NoMemlock{}, PodsDir: pods}})
	if err != nil {
		b.Fatal(err)
	}
	go func() { _ = w.Run(ctx) }()
	res := dyn.Resource(vmiwatch.VMIResource).Namespace(ns)
	var total time.Duration
	n := 0
	for i := 0; b.Loop(); i++ {
		b.StopTimer()
		name := "vm" + strconv.Itoa(i)
		vmi := migratingTo(newVMI(name, types.UID("uid-"+name), "node-a", ifaceOpt{name: "net1", mac: "02:00:00:00:00:01"}), "node-b")
		podName := "virt-launcher-" + name + "-b"
		claim := name + "-claim-dst"
		pod := launcherPod(podName, targetUID, vmi, "node-b", map[string]string{"net1-claim": claim})
		if _, err := kube.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
		if _, err := kube.ResourceV1().ResourceClaims(ns).Create(ctx, allocatedClaim(claim, "vf-0000-5e-00-4", ""), metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
		if err := srv.DefineRunning("<domain type='kvm'><name>" + vmiwatch.DomainName(ns, name) + "</name><memory>1048576</memory><os><type>hvm</type></os></domain>"); err != nil {
			b.Fatal(err)
		}
		vmi.Status.MigrationState = completed(migrating("node-a", "src", "node-b", podName))
		vmi.Status.MigrationState.MigrationUID = types.UID("mig-" + name)
		u := toUnstructured(b, vmi)
		b.StartTimer()
		t0 := time.Now()
		if _, err := res.Create(ctx, u, metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
		select {
		case a := <-srv.Notify():
			total += a.At.Sub(t0)
			n++
		case <-time.After(30 * time.Second):
			b.Fatal("no attach within 30s")
		}
	}
	b.ReportMetric(float64(total.Microseconds())/float64(n), "µs/attach")
}
