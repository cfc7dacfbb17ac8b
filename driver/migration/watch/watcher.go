package watch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
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
	apiwatch "k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	"github.com/vfnet-io/vfnet/driver/discovery"
	"github.com/vfnet-io/vfnet/driver/migration/attach"
	"github.com/vfnet-io/vfnet/pkg/contract/vmiview"
)

// VMIResource is KubeVirt's VirtualMachineInstance resource.
var VMIResource = schema.GroupVersionResource{Group: "kubevirt.io", Version: "v1", Resource: "virtualmachineinstances"}

// KubeVirt's VMI labels (kubevirt.io/api/core/v1 NodeNameLabel and
// MigrationTargetNodeNameLabel; the driver reads VMIs as pkg/contract/vmiview types
// and does not link kubevirt.io/api).
const (
	NodeNameLabel                = "kubevirt.io/nodeName"
	MigrationTargetNodeNameLabel = "kubevirt.io/migrationTargetNodeName"
)

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
	// (vmiview.DefaultBindingName if empty).
	BindingName string
	Kube        kubernetes.Interface
	Dynamic     dynamic.Interface
	Attacher    Attacher
	// Recorder records events on VMIs (given as *corev1.ObjectReference).
	Recorder record.EventRecorder
	// ResolveTimeout bounds waiting for the pod and its allocated claims;
	// zero means 2 minutes. The attach has its own bound (attach.Attacher).
	ResolveTimeout time.Duration
	// Resync re-lists VMIs periodically; zero means 10 minutes.
	Resync time.Duration
	// OnAttach, if set, sees every finished attach action: its side, the
	// time from seeing the finished migration to the VFs being in place
	// (or to giving up), and the error (driver/metrics).
	OnAttach func(side string, d time.Duration, err error)
	// Sleep waits d between checks for the VMI API, or returns ctx's error;
	// nil means a timer. Tests record the backoff with it.
	Sleep func(ctx context.Context, d time.Duration) error
}

// Watcher is the migration controller of one node.
type Watcher struct {
	cfg   Config
	queue workqueue.TypedRateLimitingInterface[string]

	mu     sync.Mutex
	vmis   map[types.UID]*vmiState
	stores []cache.Store // one per Selectors entry, set by Run
	wg     sync.WaitGroup
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
		cfg.BindingName = vmiview.DefaultBindingName
	}
	if cfg.ResolveTimeout <= 0 {
		cfg.ResolveTimeout = 2 * time.Minute
	}
	if cfg.Resync <= 0 {
		cfg.Resync = 10 * time.Minute
	}
	if cfg.Sleep == nil {
		cfg.Sleep = sleepCtx
	}
	return &Watcher{
		cfg: cfg,
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[string](100*time.Millisecond, 30*time.Second),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "vfnet-migration"}),
		vmis: map[types.UID]*vmiState{},
	}, nil
}

// Selectors are the label selectors of the watcher's two VMI informers,
// the ones KubeVirt v1.9.0's virt-handler uses (pkg/controller/virtinformers.go
// VMISourceHost and VMITargetHost): VMIs running on node (virt-controller sets
// kubevirt.io/nodeName when the launcher is scheduled, the target's
// virt-handler moves it on a completed migration) and VMIs migrating to node
// (virt-controller sets kubevirt.io/migrationTargetNodeName when the target
// pod is scheduled; the target's virt-handler removes it when done). Between
// them they cover every VMI this node acts on: the source after a failed or
// aborted migration, the target after a completed one.
func Selectors(node string) []string {
	return []string{
		NodeNameLabel + "=" + node,
		MigrationTargetNodeNameLabel + "=" + node,
	}
}

// Retry bounds of the wait for the VMI API (KubeVirt not installed yet, or
// RBAC missing): one log line, then checks at growing intervals.
const (
	APIRetryMin = 5 * time.Second
	APIRetryMax = 5 * time.Minute
)

// Run watches this node's VMIs until ctx ends, then waits for attaches in
// flight. Without the VMI API (KubeVirt's CRDs absent) it logs once and
// checks again with backoff (APIRetryMin to APIRetryMax) until the API
// appears.
func (w *Watcher) Run(ctx context.Context) error {
	logger := klog.FromContext(ctx).WithName("migration")
	ctx = klog.NewContext(ctx, logger)
	if err := w.waitForAPI(ctx); err != nil {
		return nil // ctx ended
	}
	sels := Selectors(w.cfg.NodeName)
	stores := make([]cache.Store, 0, len(sels))
	synced := make([]cache.InformerSynced, 0, len(sels))
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	for _, sel := range sels {
		inf := w.informer(sel)
		// Keep only what the watcher reads (a few hundred bytes a VMI,
		// instead of the whole object as unstructured maps).
		if err := inf.SetTransform(toCached); err != nil {
			return fmt.Errorf("watch VirtualMachineInstances (%s): %w", sel, err)
		}
		if err := inf.SetWatchErrorHandlerWithContext(newWatchErrorLogger(sel).handle); err != nil {
			return fmt.Errorf("watch VirtualMachineInstances (%s): %w", sel, err)
		}
		if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    w.enqueue,
			UpdateFunc: func(_, obj any) { w.enqueue(obj) },
			DeleteFunc: w.forget,
		}); err != nil {
			return fmt.Errorf("watch VirtualMachineInstances (%s): %w", sel, err)
		}
		stores = append(stores, inf.GetStore())
		synced = append(synced, inf.HasSynced)
		wg.Go(func() { inf.RunWithContext(ctx) })
	}
	w.mu.Lock()
	w.stores = stores
	w.mu.Unlock()
	if !cache.WaitForCacheSync(ctx.Done(), synced...) {
		return nil // ctx ended
	}
	logger.Info("Watching this node's VirtualMachineInstances for live migration", "node", w.cfg.NodeName, "selectors", sels)
	go func() {
		<-ctx.Done()
		w.queue.ShutDown()
	}()
	for w.processNext(ctx) {
	}
	w.wg.Wait()
	return nil
}

// informer lists and watches the VMIs matching the label selector sel.
func (w *Watcher) informer(sel string) cache.SharedIndexInformer {
	res := w.cfg.Dynamic.Resource(VMIResource)
	// With the client: a client that cannot stream the initial list
	// (fakes) is then listed instead.
	lw := cache.ToListWatcherWithWatchListSemantics(&cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.LabelSelector = sel
			return res.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (apiwatch.Interface, error) {
			o.LabelSelector = sel
			return res.Watch(ctx, o)
		},
	}, w.cfg.Dynamic)
	return cache.NewSharedIndexInformerWithOptions(lw, &unstructured.Unstructured{}, cache.SharedIndexInformerOptions{
		ResyncPeriod: w.cfg.Resync, ObjectDescription: "VirtualMachineInstance " + sel,
	})
}

// cachedVMI is what the informers keep of a VMI: the identity the cache
// keys on and the vmiview fields vfnet reads.
type cachedVMI struct {
	metav1.ObjectMeta
	view *vmiview.VMI
}

func (c *cachedVMI) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }

func (c *cachedVMI) DeepCopyObject() runtime.Object {
	// The view is never modified once cached.
	return &cachedVMI{ObjectMeta: *c.ObjectMeta.DeepCopy(), view: c.view}
}

// toCached is the informers' transform: the API server's VMI (as
// unstructured) becomes a cachedVMI. A VMI that does not decode is kept
// with an empty view and reported when processed.
func toCached(obj any) (any, error) {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return obj, nil // already transformed
	}
	c := &cachedVMI{ObjectMeta: metav1.ObjectMeta{Name: u.GetName(), Namespace: u.GetNamespace(), UID: u.GetUID(), ResourceVersion: u.GetResourceVersion()}}
	b, err := u.MarshalJSON()
	if err == nil {
		c.view, err = vmiview.Decode(b)
	}
	if err != nil {
		c.view = nil
	}
	return c, nil
}

// waitForAPI returns nil once this node's VMIs can be listed, or ctx's
// error. A failure is logged once per distinct cause at the default
// verbosity; the checks in between are quiet (-v=4).
func (w *Watcher) waitForAPI(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	sel := Selectors(w.cfg.NodeName)[0]
	delay := APIRetryMin
	var last string
	for {
		_, err := w.cfg.Dynamic.Resource(VMIResource).List(ctx, metav1.ListOptions{LabelSelector: sel, Limit: 1})
		if err == nil {
			if last != "" {
				logger.Info("VirtualMachineInstance API is available, starting the live-migration watch")
			}
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		msg := apiProblem(err)
		if msg != last {
			logger.Info(msg, "err", err.Error(), "nextCheckIn", delay)
			last = msg
		} else {
			logger.V(4).Info("VirtualMachineInstance API still unavailable", "err", err.Error(), "nextCheckIn", delay)
		}
		if err := w.cfg.Sleep(ctx, delay); err != nil {
			return err
		}
		delay = min(2*delay, APIRetryMax)
	}
}

// apiProblem says what a failed VMI list means for the admin.
func apiProblem(err error) string {
	switch {
	case apierrors.IsNotFound(err):
		return "KubeVirt is not installed (no VirtualMachineInstance API: CRD virtualmachineinstances.kubevirt.io is missing); " +
			"live-migration re-attach waits for it, checking again with backoff up to " + APIRetryMax.String() + "; preparing VFs does not need it"
	case apierrors.IsForbidden(err):
		return "Not allowed to list VirtualMachineInstances (RBAC: the driver's ClusterRole needs list and watch on virtualmachineinstances.kubevirt.io); " +
			"live-migration re-attach waits for it, checking again with backoff up to " + APIRetryMax.String()
	default:
		return "Cannot list VirtualMachineInstances; live-migration re-attach waits, checking again with backoff up to " + APIRetryMax.String()
	}
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// watchErrorLogger replaces client-go's default reflector error handler,
// which logs every failed list or watch (about once a second at first)
// when, say, KubeVirt's CRDs are deleted under a running driver: one line
// per distinct error, repeats at -v=4.
type watchErrorLogger struct {
	selector string
	mu       sync.Mutex
	last     string
}

func newWatchErrorLogger(selector string) *watchErrorLogger {
	return &watchErrorLogger{selector: selector}
}

func (l *watchErrorLogger) handle(ctx context.Context, _ *cache.Reflector, err error) {
	logger := klog.FromContext(ctx)
	if errors.Is(err, io.EOF) || apierrors.IsResourceExpired(err) || apierrors.IsGone(err) {
		logger.V(4).Info("VirtualMachineInstance watch closed, restarting", "selector", l.selector, "err", err)
		return
	}
	msg := apiProblem(err)
	l.mu.Lock()
	repeat := msg == l.last
	l.last = msg
	l.mu.Unlock()
	if repeat {
		logger.V(4).Info("VirtualMachineInstance watch still failing", "selector", l.selector, "err", err)
		return
	}
	logger.Info(msg, "selector", l.selector, "err", err.Error())
}

// Wait blocks until the attaches started so far have finished.
func (w *Watcher) Wait() { w.wg.Wait() }

func (w *Watcher) enqueue(obj any) {
	if key, err := cache.MetaNamespaceKeyFunc(obj); err == nil {
		w.queue.Add(key)
	}
}

// forget drops a VMI's state once neither informer holds it: a VMI moves
// from the target selector to the node selector when its migration
// completes, and must not start its attaches again.
func (w *Watcher) forget(obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	m, err := meta(obj)
	if err != nil {
		return
	}
	key, err := cache.MetaNamespaceKeyFunc(obj)
	if err != nil {
		return
	}
	if _, held := w.lookup(key); held {
		return
	}
	w.mu.Lock()
	delete(w.vmis, m.GetUID())
	w.mu.Unlock()
}

// lookup returns the VMI under key from either informer; when both hold it
// (mid-move between selectors), the newer resourceVersion.
func (w *Watcher) lookup(key string) (any, bool) {
	w.mu.Lock()
	stores := w.stores
	w.mu.Unlock()
	var best any
	var bestRV uint64
	for _, s := range stores {
		obj, exists, err := s.GetByKey(key)
		if err != nil || !exists {
			continue
		}
		// resourceVersions are opaque, but the API server's are etcd
		// revisions: decimal and increasing. Unparsable: first one wins.
		var rv uint64
		if m, err := meta(obj); err == nil {
			rv, _ = strconv.ParseUint(m.GetResourceVersion(), 10, 64)
		}
		if best == nil || rv > bestRV {
			best, bestRV = obj, rv
		}
	}
	return best, best != nil
}

// Cached returns the namespace/name keys of the VMIs in the watcher's
// informer caches, sorted (diagnostics; tests check the node scoping).
func (w *Watcher) Cached() []string {
	w.mu.Lock()
	stores := w.stores
	w.mu.Unlock()
	set := map[string]bool{}
	for _, s := range stores {
		for _, k := range s.ListKeys() {
			set[k] = true
		}
	}
	return slices.Sorted(maps.Keys(set))
}

func meta(obj any) (metav1.Object, error) {
	m, ok := obj.(metav1.Object)
	if !ok {
		return nil, fmt.Errorf("unexpected object %T", obj)
	}
	return m, nil
}

func (w *Watcher) processNext(ctx context.Context) bool {
	key, shutdown := w.queue.Get()
	if shutdown {
		return false
	}
	defer w.queue.Done(key)
	obj, exists := w.lookup(key)
	if !exists {
		w.queue.Forget(key)
		return true
	}
	c, ok := obj.(*cachedVMI)
	if !ok || c.view == nil {
		klog.FromContext(ctx).Error(nil, "Skipping VirtualMachineInstance: it does not decode as a KubeVirt v1 VirtualMachineInstance", "key", key)
		w.queue.Forget(key)
		return true
	}
	vmi := c.view
	if err := w.Sync(ctx, vmi); err != nil {
		klog.FromContext(ctx).V(3).Info("Will retry VirtualMachineInstance", "key", key, "err", err)
		w.queue.AddRateLimited(key)
		return true
	}
	w.queue.Forget(key)
	return true
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
func (w *Watcher) Sync(ctx context.Context, vmi *vmiview.VMI) error {
	ifaces, err := vmi.BindingInterfaces(w.cfg.BindingName)
	if err != nil {
		// The binding sidecar reports this to the user; nothing to attach.
		klog.FromContext(ctx).V(3).Info("VMI has unusable vfnet interfaces", "vmi", kref(vmi), "err", err)
		return nil
	}
	if len(ifaces) == 0 {
		return nil
	}
	w.warnNotMigratable(vmi, ifaces)
	for _, act := range Plan(vmi, ifaces, w.cfg.NodeName) {
		k := act.MigrationKey + "/" + string(act.Side)
		w.mu.Lock()
		st := w.state(types.UID(vmi.Metadata.UID))
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

// kref names vmi in log lines.
func kref(vmi *vmiview.VMI) klog.ObjectRef {
	return klog.KRef(vmi.Metadata.Namespace, vmi.Metadata.Name)
}

// eventRef is the object Events about vmi are recorded on.
func eventRef(vmi *vmiview.VMI) *corev1.ObjectReference {
	return &corev1.ObjectReference{
		APIVersion: VMIResource.GroupVersion().String(), Kind: "VirtualMachineInstance",
		Namespace: vmi.Metadata.Namespace, Name: vmi.Metadata.Name,
		UID: types.UID(vmi.Metadata.UID), ResourceVersion: vmi.Metadata.ResourceVersion,
	}
}

func (w *Watcher) warnNotMigratable(vmi *vmiview.VMI, ifaces []vmiview.ClaimInterface) {
	direct := DirectClaimInterfaces(ifaces)
	if len(direct) == 0 {
		return
	}
	key, ok := MigrationStartedFrom(vmi, w.cfg.NodeName)
	if !ok {
		return
	}
	w.mu.Lock()
	st := w.state(types.UID(vmi.Metadata.UID))
	dup := st.warned[key]
	st.warned[key] = true
	w.mu.Unlock()
	if dup {
		return
	}
	w.cfg.Recorder.Eventf(eventRef(vmi), corev1.EventTypeWarning, ReasonNotMigratable,
		"vfnet interface(s) %s use a named ResourceClaim (spec.resourceClaims[].resourceClaimName), which stays allocated on node %s: the VF cannot follow a live migration; use resourceClaimTemplateName to make the VM migratable",
		strings.Join(direct, ", "), w.cfg.NodeName)
}

// run resolves the launcher pod and its VFs, then attaches them.
func (w *Watcher) run(ctx context.Context, vmi *vmiview.VMI, act Action) {
	logger := klog.FromContext(ctx).WithValues("vmi", kref(vmi), "side", act.Side, "migration", act.MigrationKey)
	ctx = klog.NewContext(ctx, logger)
	start := time.Now()
	done := func(err error) {
		if w.cfg.OnAttach != nil {
			w.cfg.OnAttach(string(act.Side), time.Since(start), err)
		}
	}
	if act.PodName == "" {
		w.sourcePodUnknown(ctx, vmi, act)
		done(errors.New("source pod unknown"))
		return
	}
	req, err := w.resolveWithRetry(ctx, vmi, act)
	if err == nil {
		var res attach.Result
		res, err = w.cfg.Attacher.Attach(ctx, req)
		if err == nil {
			if len(res.Attached) > 0 {
				w.cfg.Recorder.Eventf(eventRef(vmi), corev1.EventTypeNormal, ReasonAttached,
					"Attached %s to domain %s in pod %s on node %s after %s migration",
					describe(req.Hostdevs), req.Domain, act.PodName, w.cfg.NodeName, outcome(act.Side))
			}
			logger.Info("Migration VFs in place", "attached", res.Attached, "present", res.Present, "attempts", res.Attempts, "duration", time.Since(start))
			done(nil)
			return
		}
	}
	if ctx.Err() != nil {
		return // shutting down; a restarted driver replays the VMI
	}
	logger.Error(err, "Giving up attaching VFs after migration")
	done(err)
	w.cfg.Recorder.Eventf(eventRef(vmi), corev1.EventTypeWarning, ReasonAttachFailed,
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
func (w *Watcher) sourcePodUnknown(ctx context.Context, vmi *vmiview.VMI, act Action) {
	names := make([]string, len(act.Interfaces))
	for i, ci := range act.Interfaces {
		names[i] = ci.Interface.Name
	}
	klog.FromContext(ctx).Error(nil, "Cannot re-attach VFs after a failed migration: status.migrationState.sourcePod is empty", "interfaces", names)
	w.cfg.Recorder.Eventf(eventRef(vmi), corev1.EventTypeWarning, ReasonAttachFailed,
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

func (w *Watcher) resolveWithRetry(ctx context.Context, vmi *vmiview.VMI, act Action) (attach.Request, error) {
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

func (w *Watcher) resolve(ctx context.Context, vmi *vmiview.VMI, act Action) (attach.Request, error) {
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
func (w *Watcher) launcherPod(ctx context.Context, vmi *vmiview.VMI, name string) (*corev1.Pod, error) {
	ns := vmi.Metadata.Namespace
	pod, err := w.cfg.Kube.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, retryable{fmt.Errorf("launcher pod %s/%s not found", ns, name)}
	}
	if err != nil {
		return nil, retryable{fmt.Errorf("get launcher pod %s/%s: %w", ns, name, err)}
	}
	if pod.Spec.NodeName != w.cfg.NodeName {
		return nil, fmt.Errorf("launcher pod %s/%s runs on node %q, not on this node %q", ns, name, pod.Spec.NodeName, w.cfg.NodeName)
	}
	return pod, nil
}

// podClaim returns the allocated ResourceClaim behind one interface in pod.
func (w *Watcher) podClaim(ctx context.Context, pod *corev1.Pod, ci vmiview.ClaimInterface) (*resourceapi.ResourceClaim, error) {
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
func (w *Watcher) hostdev(claim *resourceapi.ResourceClaim, ci vmiview.ClaimInterface) (attach.Hostdev, error) {
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
