// VFConfig precedence: the VFConfig that applies to one allocated device
// follows the precedence Kubernetes documents for opaque device config:
// configs from the DeviceClass come first, then the claim's own, and later
// entries override earlier ones field by field.

package prepare

import (
	"encoding/json"
	"fmt"
	"strings"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/vfnet-io/vfnet/pkg/api/v1alpha1"
)

// vfConfigForRequest returns the merged config for the allocation result whose
// request is request (maybe "request/subrequest"). Opaque configs of other
// drivers are ignored; one of ours that does not decode is an error naming
// its position and source.
func vfConfigForRequest(claim *resourceapi.ResourceClaim, driverName, request string) (v1alpha1.VFConfig, error) {
	merged := v1alpha1.VFConfig{APIVersion: v1alpha1.APIVersion, Kind: v1alpha1.Kind}
	if claim.Status.Allocation == nil {
		return merged, fmt.Errorf("claim %s/%s is not allocated", claim.Namespace, claim.Name)
	}
	configs := claim.Status.Allocation.Devices.Config
	// Stable two-pass walk: class configs keep their order, then claim
	// configs keep theirs.
	for _, source := range []resourceapi.AllocationConfigSource{resourceapi.AllocationConfigSourceClass, resourceapi.AllocationConfigSourceClaim} {
		for i, cfg := range configs {
			if cfg.Source != source || cfg.Opaque == nil || cfg.Opaque.Driver != driverName {
				continue
			}
			if !appliesTo(cfg.Requests, request) {
				continue
			}
			raw := cfg.Opaque.Parameters.Raw
			if raw == nil && cfg.Opaque.Parameters.Object != nil {
				var err error
				if raw, err = json.Marshal(cfg.Opaque.Parameters.Object); err != nil {
					return merged, fmt.Errorf("claim %s/%s: status.allocation.devices.config[%d] (%s): encode parameters: %w", claim.Namespace, claim.Name, i, source, err)
				}
			}
			c, err := v1alpha1.Decode(raw)
			if err != nil {
				return merged, fmt.Errorf("claim %s/%s: status.allocation.devices.config[%d] (%s) for driver %s: %w", claim.Namespace, claim.Name, i, source, driverName, err)
			}
			merged = merged.Merge(c)
		}
	}
	if err := merged.ValidateMerged(); err != nil {
		return merged, fmt.Errorf("claim %s/%s request %q: %w", claim.Namespace, claim.Name, request, err)
	}
	return merged, nil
}

// appliesTo reports whether a config listing requests applies to the
// allocation result of request: an empty list applies to all; "main" applies
// to "main" and every "main/sub"; "main/sub" applies only to itself.
func appliesTo(requests []string, request string) bool {
	if len(requests) == 0 {
		return true
	}
	base, _, _ := strings.Cut(request, "/")
	for _, r := range requests {
		if r == request || r == base {
			return true
		}
	}
	return false
}
