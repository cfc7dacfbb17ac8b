package scale

import (
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// The upstream shape is the device layout of Kubernetes' own DRA scheduler
// benchmark, the SchedulingWithResourceClaimTemplate workloads in
// kubernetes/kubernetes test/integration/scheduler_perf/dra/
// performance-config.yaml (v1.37.2), whose thresholds (56-64 pods/s at 500
// nodes) are the reference for what a claim costs the scheduler:
//   - templates/resourceslice-basic-devices.yaml: per node one pool of one
//     ResourceSlice (generation 1) with 10 devices named basic-device-<i>,
//     each with 13 attributes (11 strings, a version, a bool; three of them
//     qualified with another domain) and 2 capacities;
//   - templates/deviceclass.yaml: a DeviceClass whose only selector is on
//     the driver name;
//   - templates/resourceclaimtemplate.yaml with the default numRequests=1:
//     one request for exactly one device of that class, no selectors, no
//     configuration;
//   - templates/pod-with-claim-template.yaml: one pod-level claim from that
//     template, used by the pod's one container.
//
// Earlier revisions of resourceslice-basic-devices.yaml (before v1.37) had 4
// attributes (model, family, driverVersion, resource.k8s.io/pciRoot) and one
// capacity (memory); UpstreamShapeEarlier builds that.
//
// The objects are built here from that description (values are this
// package's own); the slices are written by the admin client, as
// scheduler_perf creates them, under their own driver name, with one pool
// per node named after the node as vfnet's pools are.
const (
	// UpstreamDriver is the upstream shape's driver name.
	UpstreamDriver = "upstream-shape.scale.vfnet.io"
	// UpstreamClass selects every device of UpstreamDriver.
	UpstreamClass = "scale-upstream-shape"
	// UpstreamTemplate asks for one device of UpstreamClass.
	UpstreamTemplate = "scale-upstream-shape"
	// UpstreamNamespace holds UpstreamTemplate and the upstream phase's pods.
	UpstreamNamespace = "scale-upstream"
	// UpstreamDevicesPerNode is the workload's numDevices.
	UpstreamDevicesPerNode = 10
)

// UpstreamShape picks the revision of the upstream device template.
type UpstreamShape string

const (
	// UpstreamShapeV137 is resourceslice-basic-devices.yaml as of v1.37.2:
	// 13 attributes, 2 capacities (the default).
	UpstreamShapeV137 UpstreamShape = "v1.37"
	// UpstreamShapeEarlier is its earlier revision: 4 attributes, 1 capacity.
	UpstreamShapeEarlier UpstreamShape = "earlier"
)

// UpstreamSlice is node's one ResourceSlice of the upstream shape.
func UpstreamSlice(node string, shape UpstreamShape) *resourceapi.ResourceSlice {
	devices := make([]resourceapi.Device, UpstreamDevicesPerNode)
	for i := range devices {
		devices[i] = upstreamDevice(i, shape)
	}
	return &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "upstream-shape-" + node},
		Spec: resourceapi.ResourceSliceSpec{
			Driver:   UpstreamDriver,
			Pool:     resourceapi.ResourcePool{Name: node, Generation: 1, ResourceSliceCount: 1},
			NodeName: ptr.To(node),
			Devices:  devices,
		},
	}
}

func upstreamDevice(i int, shape UpstreamShape) resourceapi.Device {
	str := func(s string) resourceapi.DeviceAttribute { return resourceapi.DeviceAttribute{StringValue: ptr.To(s)} }
	// The template's pciRoot attributes cycle through its numPCIRoots (2).
	root := i % 2
	if shape == UpstreamShapeEarlier {
		return resourceapi.Device{
			Name: fmt.Sprintf("basic-device-%d", i),
			Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
				"model":                   str("scale-model-1"),
				"family":                  str("scale-family"),
				"driverVersion":           {VersionValue: ptr.To("2.4.6")},
				"resource.k8s.io/pciRoot": str(fmt.Sprint(i)),
			},
			Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
				"memory": {Value: resource.MustParse("2Gi")},
			},
		}
	}
	addr := fmt.Sprintf("0000:%02x:00.0", 0x10+i)
	return resourceapi.Device{
		Name: fmt.Sprintf("basic-device-%d", i),
		Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
			"driver":                          str("scale-kmd"),
			"driverVersion":                   {VersionValue: ptr.To("2.4.6")},
			"resource.k8s.io/pciRoot":         str(fmt.Sprint(root)),
			"family":                          str("Scale Accelerator Series"),
			"health":                          str("Healthy"),
			"model":                           str("SA-100"),
			"pciAddress":                      str(addr),
			"pciId":                           str("0x1a2b"),
			"pciRoot":                         str(fmt.Sprintf("%02d", root)),
			"resource.kubernetes.io/pciBusID": str(addr),
			"resource.kubernetes.io/pciRoot":  str(fmt.Sprintf("pci0000:%02x", root)),
			"sriov":                           {BoolValue: ptr.To(true)},
			"type":                            str("accelerator"),
		},
		Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
			"memory":     {Value: resource.MustParse("16Gi")},
			"millicores": {Value: resource.MustParse("1000")},
		},
	}
}

// UpstreamDeviceClass selects on the driver name only.
func UpstreamDeviceClass() *resourceapi.DeviceClass {
	return &resourceapi.DeviceClass{
		ObjectMeta: metav1.ObjectMeta{Name: UpstreamClass},
		Spec: resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{
			CEL: &resourceapi.CELDeviceSelector{Expression: fmt.Sprintf("device.driver == %q", UpstreamDriver)},
		}}},
	}
}

// UpstreamClaimTemplate asks for exactly one device of UpstreamClass.
func UpstreamClaimTemplate() *resourceapi.ResourceClaimTemplate {
	return &resourceapi.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: UpstreamTemplate, Namespace: UpstreamNamespace},
		Spec: resourceapi.ResourceClaimTemplateSpec{Spec: resourceapi.ResourceClaimSpec{
			Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
				Name:    "req-0",
				Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: UpstreamClass},
			}}},
		}},
	}
}
