// Package publish builds the ResourceSlices vfnet-driver publishes and runs
// the rescan loop that republishes them when the offered VFs change.
//
// Decisions:
//   - One pool named after the node; devices in discovery order (PF PCI
//     address, then VF index), cut into slices of at most 128 (64 for a
//     slice holding a tainted device, the API server's limit). Slice order
//     is allocation preference.
//   - VFs of a PF whose link is down, or which disappeared, are published
//     with the NoSchedule taint vfnet.io/pf-unhealthy (value link-down or
//     gone): the scheduler allocates them only to claims that tolerate it.
//     A vanished PF's VFs stay published, tainted, until it comes back or
//     the driver restarts, so the reason is visible on the devices. The
//     health probe (--health-interval) triggers a rescan when a PF's state
//     changes, so a taint follows within that interval.
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
package publish

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/dynamic-resource-allocation/resourceslice"

	"github.com/vfnet-io/vfnet/driver/discovery"
	"github.com/vfnet-io/vfnet/driver/health"
	"github.com/vfnet-io/vfnet/driver/kernel/sysfs"
	"github.com/vfnet-io/vfnet/driver/vfcount"
)

// MaxDevicesPerSlice is the API server's limit for slices without taints or
// counters; the resourceslice controller never splits slices itself.
const MaxDevicesPerSlice = resourceapi.ResourceSliceMaxDevices

// MaxTaintedDevicesPerSlice is the limit for a slice in which any device
// has a taint.
const MaxTaintedDevicesPerSlice = resourceapi.ResourceSliceMaxDevicesWithAdvancedFeatures

// TaintKey marks the VFs of an unhealthy PF; its value is the PF's state
// (health.PFLinkDown or health.PFGone).
const TaintKey = "vfnet.io/pf-unhealthy"

// Taints maps device names to the reason (taint value) their PF is
// unhealthy; devices not in it are healthy.
type Taints map[string]string

// PFTaints returns the taints for devices whose PF in pfs has its link down.
func PFTaints(pfs []sysfs.PF, devices []discovery.Device) Taints {
	down := map[string]bool{}
	for i := range pfs {
		if health.PFState(&pfs[i]) == health.PFLinkDown {
			down[pfs[i].Address] = true
		}
	}
	taints := Taints{}
	for _, d := range devices {
		if down[d.PFAddress] {
			taints[d.Name] = health.PFLinkDown
		}
	}
	return taints
}

// Pool splits devices, already in preference order, into slices of at most
// MaxDevicesPerSlice, or MaxTaintedDevicesPerSlice once a slice holds a
// tainted device. Without devices it returns one empty slice: an empty pool
// tells the scheduler the driver runs and has nothing, which "no pool" does
// not.
func Pool(devices []discovery.Device, taints Taints) resourceslice.Pool {
	return PoolWith(devices, taints, nil)
}

// PoolWith is Pool where the devices in changing also carry the
// vfcount.TaintKey taint with their value: a VF count change will destroy
// them.
func PoolWith(devices []discovery.Device, taints, changing Taints) resourceslice.Pool {
	pool := resourceslice.Pool{}
	var cur []resourceapi.Device
	curTainted := false
	flush := func() {
		if len(cur) > 0 {
			pool.Slices = append(pool.Slices, resourceslice.Slice{Devices: cur})
		}
		cur, curTainted = nil, false
	}
	for _, d := range devices {
		reason, unhealthy := taints[d.Name]
		change, changes := changing[d.Name]
		tainted := unhealthy || changes
		if len(cur) == MaxDevicesPerSlice || len(cur) >= MaxTaintedDevicesPerSlice && (curTainted || tainted) {
			flush()
		}
		if cur == nil {
			cur = make([]resourceapi.Device, 0, min(len(devices), MaxDevicesPerSlice))
		}
		rd := d.ResourceDevice()
		if unhealthy {
			rd.Taints = append(rd.Taints, resourceapi.DeviceTaint{Key: TaintKey, Value: reason, Effect: resourceapi.DeviceTaintEffectNoSchedule})
		}
		if changes {
			rd.Taints = append(rd.Taints, resourceapi.DeviceTaint{Key: vfcount.TaintKey, Value: change, Effect: resourceapi.DeviceTaintEffectNoSchedule})
		}
		curTainted = curTainted || tainted
		cur = append(cur, rd)
	}
	flush()
	if len(pool.Slices) == 0 {
		pool.Slices = append(pool.Slices, resourceslice.Slice{})
	}
	return pool
}

// DriverResources returns the single pool, named after the node.
func DriverResources(nodeName string, devices []discovery.Device, taints Taints) resourceslice.DriverResources {
	return DriverResourcesWith(nodeName, devices, taints, nil)
}

// DriverResourcesWith is DriverResources with the VF count change taints
// (PoolWith).
func DriverResourcesWith(nodeName string, devices []discovery.Device, taints, changing Taints) resourceslice.DriverResources {
	return resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{nodeName: PoolWith(devices, taints, changing)}}
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
