package vmiwatch

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
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
	WaitRemoved(ctx context.Context, req attach.Removal) error
}

// FailoverMACs parks and restores the MACs of failover VFs
// (prepare.State).
type FailoverMACs interface {
	// IsFailover reports whether the VF at bdf is prepared on this node
	// for a failover request.
	IsFailover(bdf string) bool
	// SetMACParked parks (zero) or restores the VF's MAC and reports
	// whether it changed.
	SetMACParked(ctx context.Context, bdf string, parked bool) (bool, error)
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
	// Failover parks failover VFs' MACs while they are out of the guest;
	// nil leaves every MAC alone.
	Failover FailoverMACs
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
	// detaching are the SourceDetach runs in flight, by migration key.
	detaching map[string]*detachRun
}

// detachRun is one SourceDetach action: it runs until the migration ends.
type detachRun struct {
	cancel context.CancelFunc
	done   chan struct{}
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

// Wait blocks until the attaches started so far have finished.
func (w *Watcher) Wait() { w.wg.Wait() }

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
	acts := Plan(vmi, ifaces, w.cfg.NodeName)
	// A detach watch whose migration is over stops before anything
	// attaches: it must not park a MAC the attach has just restored.
	stopped := w.stopDetaching(types.UID(vmi.Metadata.UID), acts)
	for _, act := range acts {
		k := act.MigrationKey + "/" + string(act.Side)
		w.mu.Lock()
		st := w.state(types.UID(vmi.Metadata.UID))
		dup := st.started[k]
		st.started[k] = true
		var run *detachRun
		actx := ctx
		if !dup && act.Side == SourceDetach {
			var cancel context.CancelFunc
			actx, cancel = context.WithCancel(ctx)
			run = &detachRun{cancel: cancel, done: make(chan struct{})}
			st.detaching[act.MigrationKey] = run
		}
		w.mu.Unlock()
		if dup {
			continue
		}
		w.wg.Add(1)
		go func() {
			defer w.wg.Done()
			if run != nil {
				defer close(run.done)
				defer run.cancel()
				w.detach(actx, vmi, act)
				return
			}
			for _, ch := range stopped {
				<-ch
			}
			w.run(actx, vmi, act)
		}()
	}
	return nil
}

// stopDetaching cancels the VMI's detach watches that acts no longer asks
// for (all of them when acts is nil) and returns their done channels.
func (w *Watcher) stopDetaching(uid types.UID, acts []Action) []chan struct{} {
	keep := map[string]bool{}
	for _, a := range acts {
		if a.Side == SourceDetach {
			keep[a.MigrationKey] = true
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	st := w.vmis[uid]
	if st == nil {
		return nil
	}
	var out []chan struct{}
	for k, r := range st.detaching {
		if keep[k] {
			continue
		}
		r.cancel()
		out = append(out, r.done)
		delete(st.detaching, k)
	}
	return out
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
