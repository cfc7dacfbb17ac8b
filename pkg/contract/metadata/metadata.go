// Package metadata locates and decodes the KEP-5304 DRA device metadata that
// vfnet-driver writes for each prepared claim request and the kubelet mounts
// into every container that names the claim. The binding sidecar reads it to
// learn which VF backs a VM interface; the driver and the migration code use
// the same paths and decoding rules.
//
// Layout under the metadata root (see k8s.io/dynamic-resource-allocation/api/metadata):
//
//	resourceclaims/<ResourceClaim name>/<request>/sriov.vfnet.io-metadata.json          (pod names a ResourceClaim)
//	resourceclaimtemplates/<pod claim name>/<request>/sriov.vfnet.io-metadata.json      (pod claim from a template)
//
// For a directly named claim the directory is keyed by the ResourceClaim
// object's name (vmi.spec.resourceClaims[].resourceClaimName), not by the
// pod-local claim name: the kubelet plugin helper only knows the
// ResourceClaim when it writes the file (kubeletplugin metadata.go,
// containerFilePath). For a template claim the generated ResourceClaim name
// is unpredictable, so the pod-local name (vmi.spec.resourceClaims[].name)
// is used; it is the same on a migration source and target.
package metadata

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/vfnet-io/vfnet/pkg/contract/pciaddr"
	"github.com/vfnet-io/vfnet/pkg/contract/vmiview"
)

const (
	// DriverName is the DRA driver name of vfnet-driver.
	DriverName = "sriov.vfnet.io"
	// FileName is the metadata file vfnet-driver writes in each request directory.
	FileName = DriverName + FileSuffix
	// PCIBusIDAttribute is the standard attribute holding the VF's PCI address
	// (lower-case BDF, e.g. 0000:3b:02.1).
	PCIBusIDAttribute = "resource.kubernetes.io/pciBusID"
	// FailoverAttribute is the boolean attribute vfnet-driver adds, set to
	// true, to the metadata of a device whose VFConfig asks for failover
	// (and to no other): the binding sidecar then adds the standby virtio
	// interface (pkg/contract/standby).
	FailoverAttribute = "vfnet.io/failover"
	// maxFileSize bounds what a reader loads; a real file is a few KiB.
	maxFileSize = 1 << 20
)

// ClaimPath is the metadata file of request in the ResourceClaim named
// claimName when the pod names that ResourceClaim directly.
func ClaimPath(root, claimName, request string) string {
	return filepath.Join(root, ResourceClaimsSubDir, claimName, request, FileName)
}

// TemplateClaimPath is the metadata file of request in the pod claim
// podClaimName when the pod claim is generated from a ResourceClaimTemplate.
func TemplateClaimPath(root, podClaimName, request string) string {
	return filepath.Join(root, ResourceClaimTemplatesSubDir, podClaimName, request, FileName)
}

// PathFor returns the metadata file that backs a VMI binding interface.
func PathFor(root string, ci vmiview.ClaimInterface) string {
	if ci.ResourceClaimName != nil {
		return ClaimPath(root, *ci.ResourceClaimName, ci.RequestName)
	}
	return TemplateClaimPath(root, ci.PodClaimName, ci.RequestName)
}

// Device is the one vfnet VF a claim request got, as its metadata describes it.
type Device struct {
	// ClaimNamespace, ClaimName and ClaimUID identify the ResourceClaim object.
	ClaimNamespace string
	ClaimName      string
	ClaimUID       string
	// PodClaimName is set for template claims.
	PodClaimName string
	Request      string
	Pool         string
	// Name is the device name in the ResourceSlice (vf-0000-3b-02-1).
	Name string
	// PCIBusID is the VF's PCI address, 0000:3b:02.1.
	PCIBusID   string
	Attributes map[string]Attribute
	// NetworkData is nil when the driver published none.
	NetworkData *NetworkData
	// Failover is the FailoverAttribute: the claim asks for a virtio-net
	// failover pair.
	Failover bool
}

// HardwareAddress is the VF MAC the driver reported, or "".
func (d *Device) HardwareAddress() string {
	if d.NetworkData == nil {
		return ""
	}
	return d.NetworkData.HardwareAddress
}

// Read decodes the metadata file at path and returns its single vfnet device.
// A missing file yields an error wrapping fs.ErrNotExist.
func Read(path string) (*Device, error) {
	d, _, err := readIdentified(path)
	return d, err
}

// readIdentified is Read that also returns the identity of the file it read
// (id.ok is false when the file changed while it was being read, so the
// result must not be cached under either identity).
func readIdentified(path string) (*Device, fileID, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fileID{}, fmt.Errorf("read device metadata %s: %w", path, err)
	}
	defer f.Close()
	before := fdIdentity(f)
	data, err := io.ReadAll(io.LimitReader(f, maxFileSize+1))
	if err != nil {
		return nil, fileID{}, fmt.Errorf("read device metadata %s: %w", path, err)
	}
	if len(data) > maxFileSize {
		return nil, fileID{}, fmt.Errorf("device metadata %s: larger than %d bytes; not a file vfnet-driver wrote", path, maxFileSize)
	}
	if after := fdIdentity(f); after != before {
		before = fileID{}
	}
	d, err := Decode(data)
	if err != nil {
		return nil, fileID{}, fmt.Errorf("device metadata %s: %w", path, err)
	}
	return d, before, nil
}

// Decode decodes a metadata stream (one JSON object per API version, see
// decodeStream) and applies vfnet's rule: exactly one device, from driver
// sriov.vfnet.io, with a string pciBusID.
func Decode(data []byte) (*Device, error) {
	dm, err := decodeStream(data)
	if err != nil {
		return nil, fmt.Errorf("decode: %w", err)
	}
	var (
		found   *deviceV1
		request string
		n       int
	)
	for i := range dm.Requests {
		for j := range dm.Requests[i].Devices {
			n++
			if found == nil {
				found, request = &dm.Requests[i].Devices[j], dm.Requests[i].Name
			}
		}
	}
	switch {
	case n == 0:
		return nil, errors.New("lists no device; the claim request has no allocated device yet or the driver wrote an empty file")
	case n > 1:
		return nil, fmt.Errorf("lists %d devices, want exactly one; a vfnet request must allocate count 1 (set exactly: {count: 1} in the claim)", n)
	case found.Driver != DriverName:
		return nil, fmt.Errorf("device %q is from driver %q, want %s; the claim request must select a vfnet DeviceClass", found.Name, found.Driver, DriverName)
	}
	d := &Device{
		ClaimNamespace: dm.Metadata.Namespace,
		ClaimName:      dm.Metadata.Name,
		ClaimUID:       dm.Metadata.UID,
		Request:        request,
		Pool:           found.Pool,
		Name:           found.Name,
		Attributes:     found.Attributes,
		NetworkData:    found.NetworkData,
	}
	if dm.PodClaimName != nil {
		d.PodClaimName = *dm.PodClaimName
	}
	attr, ok := found.Attributes[PCIBusIDAttribute]
	if !ok || attr.StringValue == nil || *attr.StringValue == "" {
		return nil, fmt.Errorf("device %q has no string attribute %s; vfnet-driver always publishes it, so the file is damaged or from another writer", found.Name, PCIBusIDAttribute)
	}
	if _, err := pciaddr.Parse(*attr.StringValue); err != nil {
		return nil, fmt.Errorf("device %q: attribute %s %q: %w; vfnet-driver never publishes such an address, so the file is damaged or from another writer", found.Name, PCIBusIDAttribute, *attr.StringValue, err)
	}
	d.PCIBusID = *attr.StringValue
	if fo, ok := found.Attributes[FailoverAttribute]; ok {
		if fo.BoolValue == nil {
			return nil, fmt.Errorf("device %q: attribute %s is not a boolean; vfnet-driver writes it as {\"bool\": true}, so the file is damaged or from another writer", found.Name, FailoverAttribute)
		}
		d.Failover = *fo.BoolValue
	}
	return d, nil
}

// IsNotExist reports whether err says a metadata file or directory is missing.
func IsNotExist(err error) bool { return errors.Is(err, fs.ErrNotExist) }
