// The watcher's view of the API: the two VMI informers, the wait for the
// VMI API, and how watch errors are logged.

package vmiwatch

import (
	"context"
	"errors"
	"io"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	apiwatch "k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/vfnet-io/vfnet/pkg/contract/vmiview"
)

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
