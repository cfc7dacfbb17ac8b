package vfcount

import (
	"context"
	"errors"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// DefaultListTimeout bounds one APIAllocated call (every page). Apply
// lists under the node lock, so a prepare may wait this long: it stays
// well under the kubelet's 45 s timeout for NodePrepareResources.
const DefaultListTimeout = 10 * time.Second

// APIAllocated lists the devices of driver's pool poolName (the node) that
// ResourceClaims' allocations name, device name -> "namespace/name". It
// lists every claim: it runs only while a VF count change is due (Plan)
// and just before one is made (Apply), so no claim informer is kept for a
// rare event. RBAC: resourceclaims list. A list that takes longer than
// timeout (<= 0: DefaultListTimeout) fails: the driver's client has no
// timeout of its own, and an API server that accepts the connection but
// never answers would otherwise stop the rescan loop, and the node lock
// with it, for good.
func APIAllocated(kube kubernetes.Interface, driver, poolName string, timeout time.Duration) func(ctx context.Context) (map[string]string, error) {
	if timeout <= 0 {
		timeout = DefaultListTimeout
	}
	return func(parent context.Context) (map[string]string, error) {
		ctx, cancel := context.WithTimeout(parent, timeout)
		defer cancel()
		out := map[string]string{}
		opts := metav1.ListOptions{Limit: 500}
		for {
			list, err := kube.ResourceV1().ResourceClaims("").List(ctx, opts)
			if err != nil {
				return nil, listError(parent, err, timeout)
			}
			for i := range list.Items {
				c := &list.Items[i]
				if c.Status.Allocation == nil {
					continue
				}
				for _, r := range c.Status.Allocation.Devices.Results {
					if r.Driver == driver && r.Pool == poolName {
						out[r.Device] = c.Namespace + "/" + c.Name
					}
				}
			}
			if list.Continue == "" {
				return out, nil
			}
			opts.Continue = list.Continue
		}
	}
}

// listError wraps a failed list with what to do about it: the message is
// the reason a VF count change waits (log, Node Event).
func listError(parent context.Context, err error, timeout time.Duration) error {
	switch {
	case parent.Err() != nil:
		return fmt.Errorf("list ResourceClaims: %w", err) // the driver is stopping
	case apierrors.IsForbidden(err):
		return fmt.Errorf("list ResourceClaims: %w: the driver's ServiceAccount needs the verb list on resourceclaims (API group resource.k8s.io): restore it in the vfnet-driver ClusterRole (manifests/base/rbac.yaml)", err)
	case errors.Is(err, context.DeadlineExceeded), apierrors.IsTimeout(err), apierrors.IsServerTimeout(err):
		return fmt.Errorf("list ResourceClaims: no answer within %s (--claims-list-timeout): %w: check the API server's load and this node's connection to it", timeout, err)
	default:
		return fmt.Errorf("list ResourceClaims: %w: check that the API server is up and reachable from this node; retried every --vf-count-retry-interval", err)
	}
}
