package watch

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/vfnet-io/vfnet/driver/discovery"
	"github.com/vfnet-io/vfnet/driver/migration/attach"
	"github.com/vfnet-io/vfnet/pkg/kubevirtvmi"
)

// VMIResource is KubeVirt's VirtualMachineInstance resource.
var VMIResource = schema.GroupVersionResource{Group: "kubevirt.io", Version: "v1", Resource: "virtualmachineinstances"}

// Event reasons recorded on VMIs.
const (
	// ReasonAttached (Normal): a VF was hot-plugged after a migration.
	ReasonAttached = "VFNetAttached"
	// ReasonAttachFailed (Warning): the driver gave up attaching a VF.
	ReasonAttachFailed = "VFNetAttachFailed"
	// ReasonNotMigratable (Warning): a migration started for a VMI with a
	// resourceClaimName-backed vfnet interface.
	ReasonNotMigratable = "VFNetNotMigratable"
)

// The MAC warning (VFNetMACNotMigratable) is recorded by prepare, which
// already reads the VMI interface behind each claim with get only; the
// watcher reads pods by name only (RBAC: pods get).

// Attacher is the part of attach.Attacher the watcher uses.
type Attacher interface {
	Attach(ctx context.Context, req attach.Request) (attach.Result, error)
}

// Config wires a Watcher.
type Config struct {
	// NodeName is this driver's node.
	NodeName string
	// DriverName is the DRA driver whose allocations are VFs
	// (discovery.DriverName if empty).
	DriverName string
	// BindingName is the binding name in the KubeVirt CR
	// (kubevirtvmi.DefaultBindingName if empty).
	BindingName string
	Kube        kubernetes.Interface
	Dynamic     dynamic.Interface
	Attacher    Attacher
	// Recorder records events on VMIs (with TypeMeta set).
	Recorder record.EventRecorder
	// ResolveTimeout bounds waiting for the pod and its allocated claims;
	// zero means 2 minutes. The attach has its own bound (attach.Attacher).
	ResolveTimeout time.Duration
	// Resync re-lists VMIs periodically; zero means 10 minutes.
	Resync time.Duration
}

// Watcher is the migration controller of one node.
type Watcher struct {
	cfg   Config
	queue workqueue.TypedRateLimitingInterface[string]

	mu   sync.Mutex
	vmis map[types.UID]*vmiState
	wg   sync.WaitGroup
}

type vmiState struct {
	started map[string]bool // "<migration key>/<side>"
	warned  map[string]bool // not-migratable warnings per migration key
}

// New returns a Watcher; Run starts it.
func New(cfg Config) (*Watcher, error) {
	if cfg.NodeName == "" || cfg.Kube == nil || cfg.Dynamic == nil || cfg.Attacher == nil || cfg.Recorder == nil {
		return nil, errors.New("migration watcher: NodeName, Kube, Dynamic, Attacher and Recorder are required")
	}
	if cfg.DriverName == "" {
		cfg.DriverName = discovery.DriverName
	}
	if cfg.BindingName == "" {
		cfg.BindingName = kubevirtvmi.DefaultBindingName
	}
	if cfg.ResolveTimeout <= 0 {
		cfg.ResolveTimeout = 2 * time.Minute
	}
	if cfg.Resync <= 0 {
		cfg.Resync = 10 * time.Minute
	}
	return &Watcher{
		cfg: cfg,
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[string](100*time.Millisecond, 30*time.Second),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "vfnet-migration"}),
		vmis: map[types.UID]*vmiState{},
	}, nil
}

// Run watches VMIs until ctx ends, then waits for attaches in flight.
func (w *Watcher) Run(ctx context.Context) error {
	logger := klog.FromContext(ctx).WithName("migration")
	ctx = klog.NewContext(ctx, logger)
	factory := dynamicinformer.NewDynamicSharedInformerFactory(w.cfg.Dynamic, w.cfg.Resync)
	inf := factory.ForResource(VMIResource).Informer()
	// Every node caches every VMI: drop what the watcher never reads.
	if err := inf.SetTransform(func(obj any) (any, error) {
		if m, ok := obj.(metav1.Object); ok {
			m.SetManagedFields(nil)
			m.SetAnnotations(nil)
		}
		return obj, nil
	}); err != nil {
		return fmt.Errorf("watch VirtualMachineInstances: %w", err)
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    w.enqueue,
		UpdateFunc: func(_, obj any) { w.enqueue(obj) },
		DeleteFunc: w.forget,
	}); err != nil {
		return fmt.Errorf("watch VirtualMachineInstances: %w", err)
	}
	factory.Start(ctx.Done())
	defer factory.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return fmt.Errorf("watch VirtualMachineInstances: cache did not sync (RBAC: list/watch virtualmachineinstances.kubevirt.io): %w", ctx.Err())
	}
	logger.Info("Watching VirtualMachineInstances for live migration", "node", w.cfg.NodeName)
	go func() {
		<-ctx.Done()
		w.queue.ShutDown()
	}()
	for w.processNext(ctx, inf.GetIndexer()) {
	}
	w.wg.Wait()
	return nil
}

// Wait blocks until the attaches started so far have finished.
func (w *Watcher) Wait() { w.wg.Wait() }

func (w *Watcher) enqueue(obj any) {
	if key, err := cache.MetaNamespaceKeyFunc(obj); err == nil {
		w.queue.Add(key)
	}
}

func (w *Watcher) forget(obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	if m, err := meta(obj); err == nil {
		w.mu.Lock()
		delete(w.vmis, m.GetUID())
		w.mu.Unlock()
	}
}

func meta(obj any) (metav1.Object, error) {
	m, ok := obj.(metav1.Object)
	if !ok {
		return nil, fmt.Errorf("unexpected object %T", obj)
	}
	return m, nil
}

func (w *Watcher) processNext(ctx context.Context, store cache.Store) bool {
	key, shutdown := w.queue.Get()
	if shutdown {
		return false
	}
	defer w.queue.Done(key)
	obj, exists, err := store.GetByKey(key)
	if err != nil || !exists {
		w.queue.Forget(key)
		return true
	}
	vmi, err := toVMI(obj)
	if err != nil {
		klog.FromContext(ctx).Error(err, "Skipping VirtualMachineInstance", "key", key)
		w.queue.Forget(key)
		return true
	}
	if err := w.Sync(ctx, vmi); err != nil {
		klog.FromContext(ctx).V(3).Info("Will retry VirtualMachineInstance", "key", key, "err", err)
		w.queue.AddRateLimited(key)
		return true
	}
	w.queue.Forget(key)
	return true
}

func toVMI(obj any) (*kubevirtv1.VirtualMachineInstance, error) {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return nil, fmt.Errorf("unexpected object %T in VMI informer", obj)
	}
	vmi := &kubevirtv1.VirtualMachineInstance{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, vmi); err != nil {
		return nil, fmt.Errorf("decode VirtualMachineInstance %s/%s: %w", u.GetNamespace(), u.GetName(), err)
	}
	return vmi, nil
}

func (w *Watcher) state(uid types.UID) *vmiState {
	s := w.vmis[uid]
	if s == nil {
		s = &vmiState{started: map[string]bool{}, warned: map[string]bool{}}
		w.vmis[uid] = s
	}
	return s
}

// Sync looks at one VMI once: it records the not-migratable warning and
// starts the attaches Plan asks for (each at most once per
// migration and side). An error means "look again later".
func (w *Watcher) Sync(ctx context.Context, vmi *kubevirtv1.VirtualMachineInstance) error {
	ifaces, err := kubevirtvmi.BindingInterfaces(vmi, w.cfg.BindingName)
	if err != nil {
		// The binding sidecar reports this to the user; nothing to attach.
		klog.FromContext(ctx).V(3).Info("VMI has unusable vfnet interfaces", "vmi", klog.KObj(vmi), "err", err)
		return nil
	}
	if len(ifaces) == 0 {
		return nil
	}
	vmi = vmi.DeepCopy()
	vmi.SetGroupVersionKind(kubevirtv1.VirtualMachineInstanceGroupVersionKind)
	w.warnNotMigratable(vmi, ifaces)
	for _, act := range Plan(vmi, ifaces, w.cfg.NodeName) {
		k := act.MigrationKey + "/" + string(act.Side)
		w.mu.Lock()
		st := w.state(vmi.UID)
		dup := st.started[k]
		st.started[k] = true
		w.mu.Unlock()
		if dup {
			continue
		}
		w.wg.Add(1)
		go func() {
			defer w.wg.Done()
			w.run(ctx, vmi, act)
		}()
	}
	return nil
}

func (w *Watcher) warnNotMigratable(vmi *kubevirtv1.VirtualMachineInstance, ifaces []kubevirtvmi.ClaimInterface) {
	direct := DirectClaimInterfaces(ifaces)
	if len(direct) == 0 {
		return
	}
	key, ok := MigrationStartedFrom(vmi, w.cfg.NodeName)
	if !ok {
		return
	}
	w.mu.Lock()
	st := w.state(vmi.UID)
	dup := st.warned[key]
	st.warned[key] = true
	w.mu.Unlock()
	if dup {
		return
	}
	w.cfg.Recorder.Eventf(vmi, corev1.EventTypeWarning, ReasonNotMigratable,
		"vfnet interface(s) %s use a named ResourceClaim (spec.resourceClaims[].resourceClaimName), which stays allocated on node %s: the VF cannot follow a live migration; use resourceClaimTemplateName to make the VM migratable",
		strings.Join(direct, ", "), w.cfg.NodeName)
}

// run resolves the launcher pod and its VFs, then attaches them.
func (w *Watcher) run(ctx context.Context, vmi *kubevirtv1.VirtualMachineInstance, act Action) {
	logger := klog.FromContext(ctx).WithValues("vmi", klog.KObj(vmi), "side", act.Side, "migration", act.MigrationKey)
	ctx = klog.NewContext(ctx, logger)
	if act.PodName == "" {
		w.sourcePodUnknown(ctx, vmi, act)
		return
	}
	req, err := w.resolveWithRetry(ctx, vmi, act)
	if err == nil {
		var res attach.Result
		res, err = w.cfg.Attacher.Attach(ctx, req)
		if err == nil {
			if len(res.Attached) > 0 {
				w.cfg.Recorder.Eventf(vmi, corev1.EventTypeNormal, ReasonAttached,
					"Attached %s to domain %s in pod %s on node %s after %s migration",
					describe(req.Hostdevs), req.Domain, act.PodName, w.cfg.NodeName, outcome(act.Side))
			}
			logger.Info("Migration VFs in place", "attached", res.Attached, "present", res.Present, "attempts", res.Attempts)
			return
		}
	}
	if ctx.Err() != nil {
		return // shutting down; a restarted driver replays the VMI
	}
	logger.Error(err, "Giving up attaching VFs after migration")
	w.cfg.Recorder.Eventf(vmi, corev1.EventTypeWarning, ReasonAttachFailed,
		"Could not attach vfnet VFs to the %s launcher on node %s after %s migration: %v", act.Side, w.cfg.NodeName, outcome(act.Side), err)
}

// sourcePodUnknown reports a failed migration whose status names no source
// pod. status.activePods maps pod UIDs to nodes, but pods can only be read by
// name with the driver's RBAC (pods: get), so the launcher, its claims and
// thus the VFs to re-attach are unknown. KubeVirt's migration controller
// records the VMI's current pod as sourcePod while the migration is pending
// and copies it into the VMI status at the hand-off to the target, so this
// only happens if it did not find that pod (or something else wrote the
// status). Plan gives the action once per migration: one Event.
func (w *Watcher) sourcePodUnknown(ctx context.Context, vmi *kubevirtv1.VirtualMachineInstance, act Action) {
	names := make([]string, len(act.Interfaces))
	for i, ci := range act.Interfaces {
		names[i] = ci.Interface.Name
	}
	klog.FromContext(ctx).Error(nil, "Cannot re-attach VFs after a failed migration: status.migrationState.sourcePod is empty", "interfaces", names)
	w.cfg.Recorder.Eventf(vmi, corev1.EventTypeWarning, ReasonAttachFailed,
		"Could not re-attach the VF(s) of vfnet interface(s) %s on node %s after the failed migration %s: status.migrationState.sourcePod is empty, so the source launcher pod is unknown (the driver reads pods by name only; status.activePods holds pod UIDs); the VM keeps running without them until it is restarted or migrated again",
		strings.Join(names, ", "), w.cfg.NodeName, act.MigrationKey)
}

func outcome(s Side) string {
	if s == Target {
		return "completed"
	}
	return "failed"
}

func describe(hs []attach.Hostdev) string {
	parts := make([]string, len(hs))
	for i, h := range hs {
		parts[i] = fmt.Sprintf("VF %s as %s", h.Source, attach.Alias(h.Interface))
	}
	return strings.Join(parts, ", ")
}

// retryable marks resolve errors that waiting can fix.
type retryable struct{ error }

func (r retryable) Unwrap() error { return r.error }

func (w *Watcher) resolveWithRetry(ctx context.Context, vmi *kubevirtv1.VirtualMachineInstance, act Action) (attach.Request, error) {
	ctx, cancel := context.WithTimeout(ctx, w.cfg.ResolveTimeout)
	defer cancel()
	delay := 20 * time.Millisecond
	for {
		req, err := w.resolve(ctx, vmi, act)
		var r retryable
		if err == nil || !errors.As(err, &r) {
			return req, err
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return req, fmt.Errorf("gave up waiting: %w", err)
		case <-t.C:
		}
		delay = min(2*delay, 2*time.Second)
	}
}

func (w *Watcher) resolve(ctx context.Context, vmi *kubevirtv1.VirtualMachineInstance, act Action) (attach.Request, error) {
	pod, err := w.launcherPod(ctx, vmi, act.PodName)
	if err != nil {
		return attach.Request{}, err
	}
	req := attach.Request{PodUID: string(pod.UID), Domain: act.Domain}
	for _, ci := range act.Interfaces {
		claim, err := w.podClaim(ctx, pod, ci)
		if err != nil {
			return req, err
		}
		h, err := w.hostdev(claim, ci)
		if err != nil {
			return req, err
		}
		req.Hostdevs = append(req.Hostdevs, h)
	}
	return req, nil
}

// launcherPod returns the named launcher pod, which must run on this node.
func (w *Watcher) launcherPod(ctx context.Context, vmi *kubevirtv1.VirtualMachineInstance, name string) (*corev1.Pod, error) {
	pod, err := w.cfg.Kube.CoreV1().Pods(vmi.Namespace).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, retryable{fmt.Errorf("launcher pod %s/%s not found", vmi.Namespace, name)}
	}
	if err != nil {
		return nil, retryable{fmt.Errorf("get launcher pod %s/%s: %w", vmi.Namespace, name, err)}
	}
	if pod.Spec.NodeName != w.cfg.NodeName {
		return nil, fmt.Errorf("launcher pod %s/%s runs on node %q, not on this node %q", vmi.Namespace, name, pod.Spec.NodeName, w.cfg.NodeName)
	}
	return pod, nil
}

// podClaim returns the allocated ResourceClaim behind one interface in pod.
func (w *Watcher) podClaim(ctx context.Context, pod *corev1.Pod, ci kubevirtvmi.ClaimInterface) (*resourceapi.ResourceClaim, error) {
	var name string
	if ci.ResourceClaimName != nil {
		name = *ci.ResourceClaimName
	} else {
		for _, s := range pod.Status.ResourceClaimStatuses {
			if s.Name == ci.PodClaimName && s.ResourceClaimName != nil {
				name = *s.ResourceClaimName
			}
		}
		if name == "" {
			return nil, retryable{fmt.Errorf("pod %s/%s: status.resourceClaimStatuses has no claim for %q yet", pod.Namespace, pod.Name, ci.PodClaimName)}
		}
	}
	claim, err := w.cfg.Kube.ResourceV1().ResourceClaims(pod.Namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, retryable{fmt.Errorf("get ResourceClaim %s/%s of pod %s: %w", pod.Namespace, name, pod.Name, err)}
	}
	if claim.Status.Allocation == nil {
		return nil, retryable{fmt.Errorf("ResourceClaim %s/%s is not allocated yet", claim.Namespace, claim.Name)}
	}
	return claim, nil
}

// hostdev finds the VF allocated by this driver for the interface's request.
func (w *Watcher) hostdev(claim *resourceapi.ResourceClaim, ci kubevirtvmi.ClaimInterface) (attach.Hostdev, error) {
	h := attach.Hostdev{Interface: ci.Interface.Name, BootOrder: ci.Interface.BootOrder}
	var devs []string
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver == w.cfg.DriverName && (r.Request == ci.RequestName || strings.HasPrefix(r.Request, ci.RequestName+"/")) {
			devs = append(devs, r.Device)
		}
	}
	if len(devs) != 1 {
		return h, fmt.Errorf("ResourceClaim %s/%s request %q: want exactly one %s device for interface %q, allocation has %d (%v)",
			claim.Namespace, claim.Name, ci.RequestName, w.cfg.DriverName, ci.Interface.Name, len(devs), devs)
	}
	bdf, err := discovery.ParseDeviceName(devs[0])
	if err != nil {
		return h, fmt.Errorf("ResourceClaim %s/%s: %w", claim.Namespace, claim.Name, err)
	}
	if h.Source, err = attach.ParsePCIAddress(bdf); err != nil {
		return h, err
	}
	if pa := ci.Interface.PciAddress; pa != "" {
		g, err := attach.ParsePCIAddress(pa)
		if err != nil {
			return h, fmt.Errorf("VMI interface %q pciAddress: %w", ci.Interface.Name, err)
		}
		h.Guest = &g
	}
	return h, nil
}
