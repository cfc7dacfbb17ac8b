package v1alpha1

import (
	"net"
	"strings"
	"testing"

	"github.com/vfnet-io/vfnet/driver/kernel/vflink"
)

func TestDecodeValid(t *testing.T) {
	t.Parallel()
	c, err := Decode([]byte(`{"apiVersion":"vfnet.io/v1alpha1","kind":"VFConfig","mac":"02:00:00:00:00:01","vlan":100,"qos":3,"vlanProtocol":"802.1ad","spoofChk":false,"trust":true,"linkState":"enable","minTxRateMbps":10,"maxTxRateMbps":1000}`))
	if err != nil {
		t.Fatal(err)
	}
	if *c.MAC != "02:00:00:00:00:01" || *c.VLAN != 100 || *c.QoS != 3 || *c.VLANProtocol != "802.1ad" || *c.SpoofChk || !*c.Trust || *c.LinkState != "enable" || *c.MinTxRateMbps != 10 || *c.MaxTxRateMbps != 1000 {
		t.Fatalf("decoded %+v", c)
	}
	// Zero values stay distinguishable from unset.
	c, err = Decode([]byte(`{"apiVersion":"vfnet.io/v1alpha1","kind":"VFConfig","vlan":0}`))
	if err != nil {
		t.Fatal(err)
	}
	if c.VLAN == nil || *c.VLAN != 0 || c.Trust != nil {
		t.Fatalf("vlan=0 must be set, trust unset: %+v", c)
	}
}

func TestDecodeErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, in, want string }{
		{"unknown field", `{"apiVersion":"vfnet.io/v1alpha1","kind":"VFConfig","vlna":3}`, `unknown field "vlna"`},
		{"wrong kind", `{"apiVersion":"vfnet.io/v1alpha1","kind":"Other"}`, `want apiVersion "vfnet.io/v1alpha1" kind "VFConfig"`},
		{"wrong version", `{"apiVersion":"vfnet.io/v1","kind":"VFConfig"}`, `apiVersion "vfnet.io/v1"`},
		{"vlan range", `{"apiVersion":"vfnet.io/v1alpha1","kind":"VFConfig","vlan":4095}`, "vlan: 4095 is out of range; allowed 0-4094"},
		{"negative vlan", `{"apiVersion":"vfnet.io/v1alpha1","kind":"VFConfig","vlan":-1}`, "vlan: -1 is out of range"},
		{"qos range", `{"apiVersion":"vfnet.io/v1alpha1","kind":"VFConfig","vlan":5,"qos":8}`, "qos: 8 is out of range; allowed 0-7"},
		{"bad mac", `{"apiVersion":"vfnet.io/v1alpha1","kind":"VFConfig","mac":"02:00:00:00:00"}`, `mac: "02:00:00:00:00" is not a 48-bit MAC`},
		{"multicast mac", `{"apiVersion":"vfnet.io/v1alpha1","kind":"VFConfig","mac":"01:00:5e:00:00:01"}`, "multicast"},
		{"zero mac", `{"apiVersion":"vfnet.io/v1alpha1","kind":"VFConfig","mac":"00:00:00:00:00:00"}`, "all zeros"},
		{"proto", `{"apiVersion":"vfnet.io/v1alpha1","kind":"VFConfig","vlanProtocol":"802.1x"}`, `vlanProtocol: "802.1x" is not allowed; allowed "802.1Q" or "802.1ad"`},
		{"link state", `{"apiVersion":"vfnet.io/v1alpha1","kind":"VFConfig","linkState":"up"}`, `linkState: "up" is not allowed; allowed "auto", "enable" or "disable"`},
		{"rate", `{"apiVersion":"vfnet.io/v1alpha1","kind":"VFConfig","maxTxRateMbps":-5}`, "maxTxRateMbps: -5 is negative"},
		{"type", `{"apiVersion":"vfnet.io/v1alpha1","kind":"VFConfig","vlan":"100"}`, "vlan"},
		{"malformed", `{"apiVersion":`, "decode vfnet.io/v1alpha1 VFConfig"},
		{"trailing", `{"apiVersion":"vfnet.io/v1alpha1","kind":"VFConfig"} {}`, "trailing data"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := Decode([]byte(tc.in))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Decode(%s) = %v, want error containing %q", tc.in, err, tc.want)
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }

func TestMergeAndValidateMerged(t *testing.T) {
	t.Parallel()
	class := &VFConfig{VLAN: ptr(100), Trust: ptr(true), MinTxRateMbps: ptr(50)}
	claim := &VFConfig{QoS: ptr(2), Trust: ptr(false), MaxTxRateMbps: ptr(10)}
	m := VFConfig{}.Merge(class).Merge(claim)
	if *m.VLAN != 100 || *m.QoS != 2 || *m.Trust || *m.MinTxRateMbps != 50 || *m.MaxTxRateMbps != 10 || m.MAC != nil {
		t.Fatalf("merged %+v", m)
	}
	// A claim config with only qos is valid on its own; the merge decides.
	if err := claim.Validate(); err != nil {
		t.Fatal(err)
	}
	err := m.ValidateMerged()
	if err == nil || !strings.Contains(err.Error(), "minTxRateMbps: 50 exceeds maxTxRateMbps 10") {
		t.Fatalf("ValidateMerged = %v", err)
	}
	noVLAN := VFConfig{}.Merge(&VFConfig{QoS: ptr(3)})
	if err := noVLAN.ValidateMerged(); err == nil || !strings.Contains(err.Error(), "qos: needs a non-zero vlan") {
		t.Fatalf("qos without vlan: %v", err)
	}
}

func TestApply(t *testing.T) {
	t.Parallel()
	orig := net.HardwareAddr{2, 0, 0, 0, 0, 9}
	base := vflink.VFState{MAC: orig, VLAN: 7, QoS: 1, VLANProto: "802.1ad", SpoofChk: true, LinkState: "auto", MaxTxRateMbps: 5}
	mac := net.HardwareAddr{2, 0, 0, 0, 0, 1}
	got := VFConfig{VLAN: ptr(100), Trust: ptr(true)}.Apply(base, mac)
	want := vflink.VFState{MAC: mac, VLAN: 100, QoS: 0, VLANProto: "802.1Q", SpoofChk: true, Trust: true, LinkState: "auto", MaxTxRateMbps: 5}
	if got.MAC.String() != want.MAC.String() || got.VLAN != want.VLAN || got.QoS != want.QoS || got.VLANProto != want.VLANProto || got.SpoofChk != want.SpoofChk || got.Trust != want.Trust || got.LinkState != want.LinkState || got.MaxTxRateMbps != want.MaxTxRateMbps {
		t.Fatalf("Apply = %+v, want %+v", got, want)
	}
	// Without a chosen MAC the VF keeps its own; the base is not aliased.
	got = VFConfig{}.Apply(base, nil)
	got.MAC[5] = 0xff
	if base.MAC[5] != 9 {
		t.Fatal("Apply aliases the base MAC")
	}
	if got.VLAN != 7 || got.QoS != 1 || got.VLANProto != "802.1ad" {
		t.Fatalf("empty config changed VLAN: %+v", got)
	}
}

// min_tx_rate and max_tx_rate are 32-bit in the kernel (IFLA_VF_RATE):
// netlink would cut 4294967396 Mbps to 100 Mbps. Such values are refused
// with the bound and the field's name; the bound itself is accepted.
func TestRateBounds(t *testing.T) {
	t.Parallel()
	cfg := func(field, v string) []byte {
		return []byte(`{"apiVersion":"vfnet.io/v1alpha1","kind":"VFConfig","` + field + `":` + v + `}`)
	}
	for _, field := range []string{"minTxRateMbps", "maxTxRateMbps"} {
		if c, err := Decode(cfg(field, "4294967295")); err != nil {
			t.Errorf("%s at the bound: %v", field, err)
		} else if v := c.MinTxRateMbps; field == "minTxRateMbps" && (v == nil || *v != 4294967295) {
			t.Errorf("%s decoded as %v", field, v)
		}
		for _, v := range []string{"4294967296", "4294967396", "9223372036854775807"} {
			_, err := Decode(cfg(field, v))
			if err == nil || !strings.Contains(err.Error(), field+": "+v+" is above 4294967295") {
				t.Errorf("%s=%s: %v", field, v, err)
			}
		}
		// Beyond int64 and fractions fail in decoding; the error still
		// names the field and the range.
		for _, v := range []string{"1e400", "184467440737095516160", "1.5"} {
			_, err := Decode(cfg(field, v))
			if err == nil || !strings.Contains(err.Error(), field+": ") || !strings.Contains(err.Error(), "allowed 0 (no limit) to 4294967295") {
				t.Errorf("%s=%s: %v", field, v, err)
			}
		}
	}
}

// A claim can hold megabytes; errors repeat at most a bounded prefix of
// what the user wrote.
func TestErrorsClipEchoedValues(t *testing.T) {
	t.Parallel()
	huge := strings.Repeat("z", 1<<20)
	hugeNum := strings.Repeat("9", 1<<16)
	for _, tc := range []struct{ name, in, want string }{
		{"mac", `{"apiVersion":"vfnet.io/v1alpha1","kind":"VFConfig","mac":"` + huge + `"}`, "mac: "},
		{"vlanProtocol", `{"apiVersion":"vfnet.io/v1alpha1","kind":"VFConfig","vlanProtocol":"` + huge + `"}`, "vlanProtocol: "},
		{"linkState", `{"apiVersion":"vfnet.io/v1alpha1","kind":"VFConfig","linkState":"` + huge + `"}`, "linkState: "},
		{"kind", `{"apiVersion":"vfnet.io/v1alpha1","kind":"` + huge + `"}`, "want apiVersion"},
		{"apiVersion", `{"apiVersion":"` + huge + `","kind":"VFConfig"}`, "want apiVersion"},
		{"unknown field", `{"apiVersion":"vfnet.io/v1alpha1","kind":"VFConfig","` + huge + `":1}`, "unknown field"},
		{"rate literal", `{"apiVersion":"vfnet.io/v1alpha1","kind":"VFConfig","maxTxRateMbps":` + hugeNum + `}`, "maxTxRateMbps: "},
		{"vlan literal", `{"apiVersion":"vfnet.io/v1alpha1","kind":"VFConfig","vlan":` + hugeNum + `}`, "vlan"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := Decode([]byte(tc.in))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("want an error containing %q, got %.300v", tc.want, err)
			}
			if n := len(err.Error()); n > 600 {
				t.Fatalf("error is %d bytes: %.300s...", n, err.Error())
			}
		})
	}
}

// failover is opt-in: unset and false do not ask for it, a claim's false
// overrides a class's true, and a config without it leaves the class's.
func TestFailoverDecodeAndMerge(t *testing.T) {
	t.Parallel()
	c, err := Decode([]byte(`{"apiVersion":"vfnet.io/v1alpha1","kind":"VFConfig","failover":true}`))
	if err != nil {
		t.Fatal(err)
	}
	if c.Failover == nil || !*c.Failover || !c.WantsFailover() {
		t.Fatalf("failover:true decoded as %v", c.Failover)
	}
	if (VFConfig{}).WantsFailover() || (VFConfig{Failover: ptr(false)}).WantsFailover() {
		t.Fatal("unset or false failover must not ask for failover")
	}
	if _, err := Decode([]byte(`{"apiVersion":"vfnet.io/v1alpha1","kind":"VFConfig","failover":"yes"}`)); err == nil || !strings.Contains(err.Error(), "failover") {
		t.Fatalf("failover:\"yes\": %v", err)
	}
	class := &VFConfig{Failover: ptr(true)}
	if m := (VFConfig{}).Merge(class).Merge(&VFConfig{VLAN: ptr(5)}); !m.WantsFailover() {
		t.Fatal("a claim config without failover dropped the class's")
	}
	if m := (VFConfig{}).Merge(class).Merge(&VFConfig{Failover: ptr(false)}); m.WantsFailover() {
		t.Fatal("the claim's failover:false did not override the class's true")
	}
	_, err = Decode([]byte(`{"apiVersion":"vfnet.io/v1alpha1","kind":"VFConfig","failovr":true}`))
	if err == nil || !strings.Contains(err.Error(), "failover)") {
		t.Fatalf("the allowed fields do not list failover: %v", err)
	}
}
