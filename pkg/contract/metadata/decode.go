package metadata

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	k8sjson "sigs.k8s.io/json"
)

// The file layout of KEP-5304 device metadata, as
// k8s.io/dynamic-resource-allocation/api/metadata defines it
// (TestLayoutMatchesLibrary pins these to the library's constants).
const (
	// DefaultRoot is where the kubelet mounts device metadata in a container.
	DefaultRoot = "/var/run/kubernetes.io/dra-device-attributes"
	// ResourceClaimsSubDir holds the metadata of directly named claims.
	ResourceClaimsSubDir = "resourceclaims"
	// ResourceClaimTemplatesSubDir holds the metadata of template claims.
	ResourceClaimTemplatesSubDir = "resourceclaimtemplates"
	// FileSuffix follows the driver name in a metadata file's name.
	FileSuffix = "-metadata.json"

	// apiGroup is the API group of the DeviceMetadata objects in a file.
	apiGroup = "metadata.resource.k8s.io"
	kind     = "DeviceMetadata"
)

// knownVersions are the DeviceMetadata versions this package decodes; they
// have the same shape. "__internal" is accepted because the library's scheme
// registers it too.
var knownVersions = [...]string{"v1beta1", "v1alpha1", "__internal"}

// Attribute is one device attribute (resource.k8s.io DeviceAttribute).
type Attribute struct {
	IntValue     *int64  `json:"int,omitempty"`
	BoolValue    *bool   `json:"bool,omitempty"`
	StringValue  *string `json:"string,omitempty"`
	VersionValue *string `json:"version,omitempty"`
}

// NetworkData is a device's networkData (resource.k8s.io NetworkDeviceData).
type NetworkData struct {
	InterfaceName   string   `json:"interfaceName,omitempty"`
	IPs             []string `json:"ips,omitempty"`
	HardwareAddress string   `json:"hardwareAddress,omitempty"`
}

// deviceMetadataV1 is a DeviceMetadata object of any known version, with the
// fields vfnet reads.
type deviceMetadataV1 struct {
	Metadata struct {
		Name      string `json:"name,omitempty"`
		Namespace string `json:"namespace,omitempty"`
		UID       string `json:"uid,omitempty"`
	} `json:"metadata"`
	PodClaimName *string     `json:"podClaimName,omitempty"`
	Requests     []requestV1 `json:"requests,omitempty"`
}

type requestV1 struct {
	Name    string     `json:"name"`
	Devices []deviceV1 `json:"devices,omitempty"`
}

type deviceV1 struct {
	Driver      string               `json:"driver"`
	Pool        string               `json:"pool"`
	Name        string               `json:"name"`
	Attributes  map[string]Attribute `json:"attributes,omitempty"`
	NetworkData *NetworkData         `json:"networkData,omitempty"`
}

// decodeStream returns the first DeviceMetadata object of a known version in
// a metadata stream, following the rules of the library's
// devicemetadata.DecodeMetadataFromStream: objects of unknown versions of
// the group are skipped (a newer driver may write a newer version first);
// an object without apiVersion or kind, or a known version that does not
// decode, is an error. TestDecodeMatchesDeviceMetadata checks the two agree.
//
// Why not the library itself: it builds an apimachinery runtime.Scheme,
// which keeps every method of every Kubernetes API type in the binary (see
// pkg/contract/vmiview); vfnet-binding, one per VM pod, would carry twice the code.
func decodeStream(data []byte) (*deviceMetadataV1, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	var unknown []string
	for dec.More() {
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, fmt.Errorf("read metadata object from stream: %w", err)
		}
		var tm struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
		}
		// Case-insensitive like apimachinery's type sniffing.
		if err := json.Unmarshal(raw, &tm); err != nil {
			return nil, fmt.Errorf("decode metadata object: %w", err)
		}
		// The library's order: a bad apiVersion or a missing kind or
		// version is fatal, an unknown version is skipped, an unknown
		// kind of a known version is fatal.
		group, version, err := parseAPIVersion(tm.APIVersion)
		if err != nil {
			return nil, fmt.Errorf("decode metadata object: %w", err)
		}
		gv := tm.APIVersion
		if tm.Kind == "" {
			return nil, fmt.Errorf("decode metadata object: Object 'Kind' is missing (apiVersion %q)", clip(gv))
		}
		if version == "" {
			return nil, fmt.Errorf("decode metadata object: apiVersion %q names no version", clip(gv))
		}
		if group != apiGroup || !known(version) {
			unknown = append(unknown, gv)
			continue
		}
		if tm.Kind != kind {
			return nil, fmt.Errorf("decode %s: kind %q, want %s", gv, clip(tm.Kind), kind)
		}
		dm := &deviceMetadataV1{}
		// Case-sensitive like apimachinery's JSON serializer.
		if err := k8sjson.UnmarshalCaseSensitivePreserveInts(raw, dm); err != nil {
			return nil, fmt.Errorf("decode %s: %w", gv, err)
		}
		return dm, nil
	}
	if len(unknown) == 0 {
		return nil, errors.New("no metadata objects found in stream")
	}
	return nil, fmt.Errorf("no compatible metadata version found in stream (unknown versions: %s)", clip(strings.Join(unknown, ", ")))
}

// parseAPIVersion splits apiVersion as apimachinery's ParseGroupVersion does.
func parseAPIVersion(s string) (group, version string, err error) {
	if s == "" || s == "/" {
		return "", "", nil
	}
	switch strings.Count(s, "/") {
	case 0:
		return "", s, nil
	case 1:
		i := strings.Index(s, "/")
		return s[:i], s[i+1:], nil
	default:
		return "", "", fmt.Errorf("unexpected GroupVersion string: %s", clip(s))
	}
}

func known(version string) bool {
	for _, v := range knownVersions {
		if v == version {
			return true
		}
	}
	return false
}

// clip bounds a value echoed back in an error.
func clip(s string) string {
	const max = 64
	if len(s) <= max {
		return s
	}
	return s[:max] + "..."
}
