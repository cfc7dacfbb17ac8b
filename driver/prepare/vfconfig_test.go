package prepare

import (
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

const driver = "sriov.vfnet.io"

func cfg(source resourceapi.AllocationConfigSource, drv string, requests []string, params string) resourceapi.DeviceAllocationConfiguration {
	return resourceapi.DeviceAllocationConfiguration{
		Source:   source,
		Requests: requests,
		DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
			Driver: drv, Parameters: runtime.RawExtension{Raw: []byte(params)},
		}},
	}
}

func claimWith(configs ...resourceapi.DeviceAllocationConfiguration) *resourceapi.ResourceClaim {
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "c"},
		Status: resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{
			Devices: resourceapi.DeviceAllocationResult{Config: configs},
		}},
	}
}

const hdr = `"apiVersion":"vfnet.io/v1alpha1","kind":"VFConfig"`

func TestVFConfigPrecedence(t *testing.T) {
	t.Parallel()
	claim := claimWith(
		// Claim configs are listed first here but must still win over
		// class configs.
		cfg(resourceapi.AllocationConfigSourceClaim, driver, nil, `{`+hdr+`,"vlan":200,"trust":true}`),
		cfg(resourceapi.AllocationConfigSourceClass, driver, nil, `{`+hdr+`,"vlan":100,"spoofChk":false,"maxTxRateMbps":1000}`),
		cfg(resourceapi.AllocationConfigSourceClaim, driver, []string{"other"}, `{`+hdr+`,"vlan":999}`),
		cfg(resourceapi.AllocationConfigSourceClaim, driver, []string{"vf"}, `{`+hdr+`,"qos":4}`),
		cfg(resourceapi.AllocationConfigSourceClaim, driver, []string{"vf/fast"}, `{`+hdr+`,"maxTxRateMbps":5000}`),
		cfg(resourceapi.AllocationConfigSourceClaim, "gpu.example.com", nil, `{"anything":"goes"}`),
		cfg(resourceapi.AllocationConfigSourceClaim, driver, nil, `{`+hdr+`,"trust":false}`),
	)
	for _, tc := range []struct {
		request        string
		vlan, qos, max int
	}{
		{"vf", 200, 4, 1000},
		{"vf/fast", 200, 4, 5000},
		{"vf/slow", 200, 4, 1000},
		{"net2", 200, 0, 1000},
	} {
		c, err := vfConfigForRequest(claim, driver, tc.request)
		if err != nil {
			t.Fatalf("%s: %v", tc.request, err)
		}
		qos := 0
		if c.QoS != nil {
			qos = *c.QoS
		}
		if *c.VLAN != tc.vlan || qos != tc.qos || *c.MaxTxRateMbps != tc.max || *c.Trust || *c.SpoofChk {
			t.Errorf("%s: got vlan=%d qos=%d max=%d trust=%v spoof=%v", tc.request, *c.VLAN, qos, *c.MaxTxRateMbps, *c.Trust, *c.SpoofChk)
		}
	}
}

func TestNoVFConfig(t *testing.T) {
	t.Parallel()
	c, err := vfConfigForRequest(claimWith(), driver, "vf")
	if err != nil || c.VLAN != nil || c.MAC != nil {
		t.Fatalf("empty: %+v %v", c, err)
	}
}

func TestVFConfigErrors(t *testing.T) {
	t.Parallel()
	_, err := vfConfigForRequest(claimWith(cfg(resourceapi.AllocationConfigSourceClass, driver, nil, `{`+hdr+`,"vlan":5000}`)), driver, "vf")
	if err == nil || !strings.Contains(err.Error(), "config[0] (FromClass)") || !strings.Contains(err.Error(), "vlan: 5000 is out of range") {
		t.Fatalf("got %v", err)
	}
	_, err = vfConfigForRequest(claimWith(cfg(resourceapi.AllocationConfigSourceClaim, driver, nil, `{`+hdr+`,"mtu":9000}`)), driver, "vf")
	if err == nil || !strings.Contains(err.Error(), `unknown field "mtu"`) {
		t.Fatalf("got %v", err)
	}
	// Cross-field rules are checked on the merge.
	_, err = vfConfigForRequest(claimWith(
		cfg(resourceapi.AllocationConfigSourceClass, driver, nil, `{`+hdr+`,"minTxRateMbps":100}`),
		cfg(resourceapi.AllocationConfigSourceClaim, driver, nil, `{`+hdr+`,"maxTxRateMbps":10}`),
	), driver, "vf")
	if err == nil || !strings.Contains(err.Error(), `request "vf"`) || !strings.Contains(err.Error(), "exceeds maxTxRateMbps") {
		t.Fatalf("got %v", err)
	}
	_, err = vfConfigForRequest(&resourceapi.ResourceClaim{}, driver, "vf")
	if err == nil {
		t.Fatal("unallocated claim accepted")
	}
}
