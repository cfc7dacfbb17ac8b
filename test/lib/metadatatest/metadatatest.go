// Package metadatatest writes device metadata files the way the kubelet
// plugin helper does (a v1beta1 object followed by a v1alpha1 object, both
// from the real API types), for tests of code that reads them.
package metadatatest

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	metadatav1alpha1 "k8s.io/dynamic-resource-allocation/api/metadata/v1alpha1"
	metadatav1beta1 "k8s.io/dynamic-resource-allocation/api/metadata/v1beta1"

	"github.com/vfnet-io/vfnet/pkg/contract/metadata"
)

// Device describes one device entry of a request.
type Device struct {
	Driver   string // defaults to sriov.vfnet.io
	Pool     string
	Name     string
	PCIBusID string // omitted when ""
	MAC      string // networkData.hardwareAddress, omitted when ""
	// Failover adds the vfnet.io/failover attribute, true, as
	// vfnet-driver writes it for a VFConfig with failover.
	Failover bool
	// Extra are more attributes, written as given (they win over the
	// ones above).
	Extra map[resourceapi.QualifiedName]resourceapi.DeviceAttribute
}

// VF is a vfnet device with the given PCI address and MAC.
func VF(bdf, mac string) Device {
	return Device{Pool: "node-1", Name: "vf-" + bdf, PCIBusID: bdf, MAC: mac}
}

// Claim identifies the claim the metadata describes.
type Claim struct {
	Namespace, Name, UID string
	PodClaimName         string // "" for a directly named claim
	Request              string
}

// Stream returns the metadata stream for one request.
func Stream(c Claim, devs ...Device) []byte {
	var devices []metadatav1beta1.Device
	for _, d := range devs {
		drv := d.Driver
		if drv == "" {
			drv = metadata.DriverName
		}
		dev := metadatav1beta1.Device{Driver: drv, Pool: d.Pool, Name: d.Name}
		attrs := map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{}
		if d.PCIBusID != "" {
			bdf := d.PCIBusID
			attrs[metadata.PCIBusIDAttribute] = resourceapi.DeviceAttribute{StringValue: &bdf}
		}
		if d.Failover {
			attrs[metadata.FailoverAttribute] = resourceapi.DeviceAttribute{BoolValue: &d.Failover}
		}
		for k, v := range d.Extra {
			attrs[k] = v
		}
		if len(attrs) > 0 {
			dev.Attributes = attrs
		}
		if d.MAC != "" {
			dev.NetworkData = &resourceapi.NetworkDeviceData{InterfaceName: "", HardwareAddress: d.MAC}
		}
		devices = append(devices, dev)
	}
	meta := metav1.ObjectMeta{Namespace: c.Namespace, Name: c.Name, UID: types.UID(c.UID), Generation: 1}
	var pcn *string
	if c.PodClaimName != "" {
		pcn = &c.PodClaimName
	}
	beta := metadatav1beta1.DeviceMetadata{
		TypeMeta:     metav1.TypeMeta{Kind: "DeviceMetadata", APIVersion: metadatav1beta1.SchemeGroupVersion.String()},
		ObjectMeta:   meta,
		PodClaimName: pcn,
		Requests:     []metadatav1beta1.DeviceMetadataRequest{{Name: c.Request, Devices: devices}},
	}
	// v1alpha1 has the same shape; KubeVirt's reader only decodes it.
	alphaDevices := make([]metadatav1alpha1.Device, len(devices))
	for i, d := range devices {
		alphaDevices[i] = metadatav1alpha1.Device(d)
	}
	alpha := metadatav1alpha1.DeviceMetadata{
		TypeMeta:     metav1.TypeMeta{Kind: "DeviceMetadata", APIVersion: metadatav1alpha1.SchemeGroupVersion.String()},
		ObjectMeta:   meta,
		PodClaimName: pcn,
		Requests:     []metadatav1alpha1.DeviceMetadataRequest{{Name: c.Request, Devices: alphaDevices}},
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	for _, o := range []any{beta, alpha} {
		if err := enc.Encode(o); err != nil {
			panic(err) // only plain data: cannot fail
		}
	}
	return buf.Bytes()
}

// Write writes data to path, creating its directories.
func Write(path string, data []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, data, 0o644)
}
