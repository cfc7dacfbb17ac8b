package metadata

import (
	"bytes"
	"encoding/json"
	"reflect"
	"testing"

	drametadata "k8s.io/dynamic-resource-allocation/api/metadata"
	"k8s.io/dynamic-resource-allocation/devicemetadata"
)

// TestLayoutMatchesLibrary pins this package's copy of the KEP-5304 file
// layout to k8s.io/dynamic-resource-allocation's.
func TestLayoutMatchesLibrary(t *testing.T) {
	t.Parallel()
	for name, c := range map[string][2]string{
		"ContainerDir":                 {DefaultRoot, drametadata.ContainerDir},
		"ResourceClaimsSubDir":         {ResourceClaimsSubDir, drametadata.ResourceClaimsSubDir},
		"ResourceClaimTemplatesSubDir": {ResourceClaimTemplatesSubDir, drametadata.ResourceClaimTemplatesSubDir},
		"MetadataFileSuffix":           {FileSuffix, drametadata.MetadataFileSuffix},
		"GroupName":                    {apiGroup, drametadata.GroupName},
		"MetadataFileName":             {FileName, drametadata.MetadataFileName(DriverName)},
	} {
		if c[0] != c[1] {
			t.Errorf("%s: vfnet has %q, the library %q", name, c[0], c[1])
		}
	}
}

// comparable is what both decoders' results are reduced to.
type comparable struct {
	Namespace, Name, UID string
	PodClaimName         *string
	Requests             []requestV1
}

// normal makes empty and nil slices and maps equal (the library's
// conversion does not keep the difference).
func (c comparable) normal() comparable {
	if len(c.Requests) == 0 {
		c.Requests = nil
	}
	for i := range c.Requests {
		r := &c.Requests[i]
		if len(r.Devices) == 0 {
			r.Devices = nil
		}
		for j := range r.Devices {
			d := &r.Devices[j]
			if len(d.Attributes) == 0 {
				d.Attributes = nil
			}
			if d.NetworkData != nil && len(d.NetworkData.IPs) == 0 {
				d.NetworkData.IPs = nil
			}
		}
	}
	return c
}

func fromLibrary(dm *drametadata.DeviceMetadata) comparable {
	c := comparable{Namespace: dm.Namespace, Name: dm.Name, UID: string(dm.UID), PodClaimName: dm.PodClaimName}
	for _, r := range dm.Requests {
		rq := requestV1{Name: r.Name}
		for _, d := range r.Devices {
			dv := deviceV1{Driver: d.Driver, Pool: d.Pool, Name: d.Name}
			for k, a := range d.Attributes {
				if dv.Attributes == nil {
					dv.Attributes = map[string]Attribute{}
				}
				dv.Attributes[string(k)] = Attribute{IntValue: a.IntValue, BoolValue: a.BoolValue, StringValue: a.StringValue, VersionValue: a.VersionValue}
			}
			if nd := d.NetworkData; nd != nil {
				dv.NetworkData = &NetworkData{InterfaceName: nd.InterfaceName, IPs: nd.IPs, HardwareAddress: nd.HardwareAddress}
			}
			rq.Devices = append(rq.Devices, dv)
		}
		c.Requests = append(c.Requests, rq)
	}
	return c
}

func fromOurs(dm *deviceMetadataV1) comparable {
	return comparable{Namespace: dm.Metadata.Namespace, Name: dm.Metadata.Name, UID: dm.Metadata.UID, PodClaimName: dm.PodClaimName, Requests: dm.Requests}
}

// checkAgainstLibrary decodes data with both decoders: whenever the library
// decodes a stream, this package must decode the same content; whenever
// the library rejects one, so must this package.
func checkAgainstLibrary(t *testing.T, data []byte) {
	t.Helper()
	var lib drametadata.DeviceMetadata
	libErr := devicemetadata.DecodeMetadataFromStream(json.NewDecoder(bytes.NewReader(data)), &lib)
	ours, err := decodeStream(data)
	switch {
	case libErr == nil && err != nil:
		t.Fatalf("library decodes %q, vfnet fails: %v", data, err)
	case libErr != nil && err == nil:
		// vfnet skips fields it does not read (managedFields, labels,
		// generation...), so the library may reject a value there that
		// vfnet ignores. Anything else the library rejects, vfnet must too.
		pruned, ok := pruneUnread(data)
		if !ok || devicemetadata.DecodeMetadataFromStream(json.NewDecoder(bytes.NewReader(pruned)), &lib) != nil {
			t.Fatalf("library rejects %q (%v), vfnet decodes it", data, libErr)
		}
	case libErr == nil:
		if got, want := fromOurs(ours).normal(), fromLibrary(&lib).normal(); !reflect.DeepEqual(got, want) {
			t.Fatalf("%q:\nvfnet   %+v\nlibrary %+v", data, got, want)
		}
	}
}

// pruneUnread re-encodes a stream keeping only what decodeStream reads.
func pruneUnread(data []byte) ([]byte, bool) {
	keep := func(m map[string]any, keys ...string) map[string]any {
		out := map[string]any{}
		for _, k := range keys {
			if v, ok := m[k]; ok {
				out[k] = v
			}
		}
		return out
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	for dec.More() {
		var raw json.RawMessage
		if dec.Decode(&raw) != nil {
			return nil, false
		}
		var obj map[string]any
		if json.Unmarshal(raw, &obj) != nil {
			buf.Write(raw) // not an object: both decoders see it as it is
			buf.WriteByte('\n')
			continue
		}
		out := map[string]any{}
		for k, v := range obj {
			switch {
			case k == "metadata":
				m, ok := v.(map[string]any)
				if !ok {
					return nil, false
				}
				out[k] = keep(m, "name", "namespace", "uid")
			case k == "requests", k == "podClaimName":
				out[k] = v
			case bytes.EqualFold([]byte(k), []byte("apiVersion")), bytes.EqualFold([]byte(k), []byte("kind")):
				out[k] = v
			}
		}
		if enc.Encode(out) != nil {
			return nil, false
		}
	}
	return buf.Bytes(), true
}

var decodeSeeds = []string{
	// What the kubelet plugin helper writes: v1beta1, then v1alpha1.
	`{"kind":"DeviceMetadata","apiVersion":"metadata.resource.k8s.io/v1beta1","metadata":{"name":"c","namespace":"ns","uid":"u","generation":1},"podClaimName":"net","requests":[{"name":"vf","devices":[{"driver":"sriov.vfnet.io","pool":"n","name":"vf-0000-3b-02-1","attributes":{"resource.kubernetes.io/pciBusID":{"string":"0000:3b:02.1"},"vfnet.io/vfIndex":{"int":1},"b":{"bool":true},"v":{"version":"1.0.0"}},"networkData":{"interfaceName":"","ips":["10.0.0.1/24"],"hardwareAddress":"02:00:00:00:00:01"}}]}]}
{"kind":"DeviceMetadata","apiVersion":"metadata.resource.k8s.io/v1alpha1","metadata":{"name":"c","namespace":"ns"}}`,
	// A newer version first is skipped.
	`{"kind":"DeviceMetadata","apiVersion":"metadata.resource.k8s.io/v9","requests":[{"name":"x"}]}
{"kind":"DeviceMetadata","apiVersion":"metadata.resource.k8s.io/v1alpha1","requests":[{"name":"vf"}]}`,
	`{"kind":"DeviceMetadata","apiVersion":"metadata.resource.k8s.io/v9"}`,
	`{"kind":"DeviceMetadata","apiVersion":"other.example.com/v1"}`,
	`{"kind":"DeviceMetadata"}`,
	`{"apiVersion":"metadata.resource.k8s.io/v1beta1"}`,
	`{"kind":"Other","apiVersion":"metadata.resource.k8s.io/v1beta1"}`,
	`{"kind":"DeviceMetadata","apiVersion":"a/b/c"}`,
	`{"KIND":"DeviceMetadata","APIVERSION":"metadata.resource.k8s.io/v1beta1","Requests":[{"name":"vf"}]}`,
	`{"kind":"DeviceMetadata","apiVersion":"metadata.resource.k8s.io/v1beta1","requests":{}}`,
	`{"kind":"DeviceMetadata","apiVersion":"metadata.resource.k8s.io/v1beta1","requests":[{"name":"vf","devices":[{"attributes":{"a":{"int":1.5}}}]}]}`,
	`{"kind":"DeviceMetadata","apiVersion":"metadata.resource.k8s.io/v1beta1"} garbage`,
	``, `[]`, `{`, `null`, `{"kind":"DeviceMetadata","apiVersion":"metadata.resource.k8s.io/v1beta1","unknown":1}`,
}

func TestDecodeMatchesDeviceMetadata(t *testing.T) {
	t.Parallel()
	for _, s := range decodeSeeds {
		checkAgainstLibrary(t, []byte(s))
	}
}

func FuzzDecodeMatchesDeviceMetadata(f *testing.F) {
	for _, s := range decodeSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) { checkAgainstLibrary(t, data) })
}
