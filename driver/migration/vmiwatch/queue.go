// The work queue: VMI keys in, one VMI synced at a time.

package vmiwatch

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
)

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
	w.stopDetaching(m.GetUID(), nil)
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
		s = &vmiState{started: map[string]bool{}, warned: map[string]bool{}, detaching: map[string]*detachRun{}}
		w.vmis[uid] = s
	}
	return s
}
