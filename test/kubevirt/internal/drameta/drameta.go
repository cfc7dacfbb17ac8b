// Package drameta writes KEP-5304 device metadata files at the paths the
// kubelet mounts them into a container, in the layout the kubeletplugin
// helper produces: one JSON stream holding a metadata.resource.k8s.io/v1beta1
// object followed by the same object as v1alpha1 (the version KubeVirt's
// reader decodes). This module pins k8s.io/* to KubeVirt's v0.34.2, where the
// dynamic-resource-allocation metadata types do not exist, so it encodes
// KubeVirt's own mirror of those types (pkg/dra/metadata), whose v1alpha1
// shape is identical to v1beta1's.
package drameta

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	kvmetadata "kubevirt.io/kubevirt/pkg/dra/metadata"
)

const (
	// DriverName is vfnet-driver's DRA driver name.
	DriverName = "sriov.vfnet.io"
	// APIVersionV1Beta1 is the version the helper writes first.
	APIVersionV1Beta1 = "metadata.resource.k8s.io/v1beta1"
)

// Claim is one claim request's allocation as the helper records it.
type Claim struct {
	Namespace string
	// Name is the ResourceClaim object's name.
	Name string
	UID  string
	// PodClaimName is set for claims generated from a template; the file
	// then lives under resourceclaimtemplates/<PodClaimName>.
	PodClaimName string
	Request      string
	Devices      []Device
}

// Device is one allocated device.
type Device struct {
	Driver   string // defaults to DriverName
	Pool     string
	Name     string
	PCIBusID string // resource.kubernetes.io/pciBusID; omitted when ""
	MAC      string // networkData.hardwareAddress; omitted when ""
	// Failover adds vfnet.io/failover, true: the device of a claim whose
	// VFConfig asks for a failover pair (vfnet-driver's prepare writes it).
	Failover bool
}

// FailoverAttribute is the metadata attribute vfnet-driver writes for a
// failover device (pkg/contract/metadata.FailoverAttribute).
const FailoverAttribute = "vfnet.io/failover"

// Path is where the claim's metadata file appears in the container, below root.
func (c Claim) Path(root string) string {
	driver := DriverName
	if len(c.Devices) > 0 && c.Devices[0].Driver != "" {
		driver = c.Devices[0].Driver
	}
	if c.PodClaimName != "" {
		return filepath.Join(root, "resourceclaimtemplates", c.PodClaimName, c.Request, driver+"-metadata.json")
	}
	return filepath.Join(root, "resourceclaims", c.Name, c.Request, driver+"-metadata.json")
}

// Stream encodes the claim as the helper's JSON stream (v1beta1, v1alpha1).
func (c Claim) Stream() ([]byte, error) {
	devices := make([]kvmetadata.Device, 0, len(c.Devices))
	for _, d := range c.Devices {
		dev := kvmetadata.Device{Driver: d.Driver, Pool: d.Pool, Name: d.Name}
		if dev.Driver == "" {
			dev.Driver = DriverName
		}
		if d.PCIBusID != "" || d.Failover {
			dev.Attributes = map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{}
		}
		if d.PCIBusID != "" {
			bdf := d.PCIBusID
			dev.Attributes[kvmetadata.PCIBusIDAttribute] = resourcev1.DeviceAttribute{StringValue: &bdf}
		}
		if d.Failover {
			on := true
			dev.Attributes[FailoverAttribute] = resourcev1.DeviceAttribute{BoolValue: &on}
		}
		if d.MAC != "" {
			dev.NetworkData = &resourcev1.NetworkDeviceData{HardwareAddress: d.MAC}
		}
		devices = append(devices, dev)
	}
	var podClaimName *string
	if c.PodClaimName != "" {
		p := c.PodClaimName
		podClaimName = &p
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	for _, version := range []string{APIVersionV1Beta1, kvmetadata.APIVersionV1Alpha1} {
		obj := kvmetadata.DeviceMetadata{
			TypeMeta: metav1.TypeMeta{Kind: "DeviceMetadata", APIVersion: version},
			ObjectMeta: metav1.ObjectMeta{
				Namespace: c.Namespace, Name: c.Name, UID: types.UID(c.UID), Generation: 1,
			},
			PodClaimName: podClaimName,
			Requests:     []kvmetadata.DeviceMetadataRequest{{Name: c.Request, Devices: devices}},
		}
		if err := enc.Encode(obj); err != nil {
			return nil, fmt.Errorf("encode %s metadata of claim %s/%s: %w", version, c.Namespace, c.Name, err)
		}
	}
	return buf.Bytes(), nil
}

// Write writes the claim's metadata file below root and returns its path.
func (c Claim) Write(root string) (string, error) {
	data, err := c.Stream()
	if err != nil {
		return "", err
	}
	p := c.Path(root)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return "", fmt.Errorf("create metadata dir for claim %s request %s: %w", c.Name, c.Request, err)
	}
	if err := os.WriteFile(p, data, 0o644); err != nil {
		return "", fmt.Errorf("write metadata file %s: %w", p, err)
	}
	return p, nil
}
