// Package slices builds the ResourceSlices vfnet-driver publishes and runs
// the rescan loop that republishes them when the offered VFs change.
//
// Decisions:
//   - One pool named after the node; devices in discovery order (PF PCI
//     address, then VF index), cut into slices of at most 128. Slice order
//     is allocation preference.
//   - Every rescan (--rescan-interval) re-reads sysfs and the node
//     configuration file, so a ConfigMap edit or a VF count change is
//     published within one interval. Only a change of a published field
//     (device set, any attribute) republishes; a VF moving to vfio-pci for a
//     claim does not.
//   - At start-up an invalid or ambiguous configuration is fatal. Later, an
//     invalid file is logged once and the last valid configuration stays in
//     effect, and a configuration that matches a PF twice keeps the
//     published slices: a typo in a ConfigMap must not take VFs away from
//     running VMs.
//   - Nothing to offer (no configuration, nothing selected) publishes one
//     empty slice, which tells the scheduler the driver runs and has no
//     devices, and logs one line saying why.
package slices

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/dynamic-resource-allocation/resourceslice"

	"github.com/vfnet-io/vfnet/driver/discovery"
)

// MaxDevicesPerSlice is the API server's limit for slices without taints or
// counters; the resourceslice controller never splits slices itself.
const MaxDevicesPerSlice = 128

// Pool splits devices, already in preference order, into slices of at most
// MaxDevicesPerSlice. Without devices it returns one empty slice: an empty
// pool tells the scheduler the driver runs and has nothing, which "no pool"
// does not.
func Pool(devices []discovery.Device) resourceslice.Pool {
	n := (len(devices) + MaxDevicesPerSlice - 1) / MaxDevicesPerSlice
	pool := resourceslice.Pool{Slices: make([]resourceslice.Slice, 0, max(n, 1))}
	for start := 0; start < len(devices); start += MaxDevicesPerSlice {
		end := min(start+MaxDevicesPerSlice, len(devices))
		out := make([]resourceapi.Device, 0, end-start)
		for _, d := range devices[start:end] {
			out = append(out, d.ResourceDevice())
		}
		pool.Slices = append(pool.Slices, resourceslice.Slice{Devices: out})
	}
	if len(pool.Slices) == 0 {
		pool.Slices = append(pool.Slices, resourceslice.Slice{})
	}
	return pool
}

// DriverResources returns the single pool, named after the node.
func DriverResources(nodeName string, devices []discovery.Device) resourceslice.DriverResources {
	return resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{nodeName: Pool(devices)}}
}

// Digest is a short hash of what resources publishes. Two driver instances
// serving one node during a rolling update log it with every publish: equal
// digests mean they publish identical slices (they share the pool, so
// different content would make their controllers overwrite each other).
func Digest(resources resourceslice.DriverResources) string {
	// encoding/json sorts map keys, so equal content encodes equally.
	b, err := json.Marshal(resources.Pools)
	if err != nil {
		return "unencodable: " + err.Error()
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:8])
}

// ResourceSlices renders resources the way the resourceslice controller
// creates them for a node-local driver (same generateName scheme, node name,
// pool), for `vfnet-driver inspect`. The controller adds the Node owner
// reference and pool generation, the API server the name suffix.
func ResourceSlices(driverName, nodeName string, resources resourceslice.DriverResources) []resourceapi.ResourceSlice {
	pool, ok := resources.Pools[nodeName]
	if !ok {
		return nil
	}
	width := len(fmt.Sprintf("%x", max(len(pool.Slices)-1, 0)))
	width = max(width, 5) // the controller's minimum index width
	out := make([]resourceapi.ResourceSlice, 0, len(pool.Slices))
	for i, s := range pool.Slices {
		node := nodeName
		out = append(out, resourceapi.ResourceSlice{
			TypeMeta: metav1.TypeMeta{APIVersion: resourceapi.SchemeGroupVersion.String(), Kind: "ResourceSlice"},
			ObjectMeta: metav1.ObjectMeta{
				GenerateName: fmt.Sprintf("%0*x-%s-%s-", width, i, driverName, nodeName),
			},
			Spec: resourceapi.ResourceSliceSpec{
				Driver:   driverName,
				Pool:     resourceapi.ResourcePool{Name: nodeName, ResourceSliceCount: int64(len(pool.Slices))},
				NodeName: &node,
				Devices:  s.Devices,
			},
		})
	}
	return out
}
