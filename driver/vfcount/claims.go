package vfcount

import (
	"context"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// APIAllocated lists the devices of driver's pool poolName (the node) that
// ResourceClaims' allocations name, device name -> "namespace/name". It
// lists every claim: it runs only while a VF count change is due (Plan)
// and just before one is made (Apply), so no claim informer is kept for a
// rare event. RBAC: resourceclaims list.
func APIAllocated(kube kubernetes.Interface, driver, poolName string) func(ctx context.Context) (map[string]string, error) {
	return func(ctx context.Context) (map[string]string, error) {
		out := map[string]string{}
		opts := metav1.ListOptions{Limit: 500}
		for {
			list, err := kube.ResourceV1().ResourceClaims("").List(ctx, opts)
			if err != nil {
				return nil, fmt.Errorf("list ResourceClaims: %w", err)
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
