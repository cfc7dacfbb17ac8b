// Package v1alpha1 holds the opaque device configuration that users attach to
// a vfnet ResourceClaim or DeviceClass:
//
//	apiVersion: vfnet.io/v1alpha1
//	kind: VFConfig
//
// Every field is a pointer so that "unset" differs from a zero value: when
// class and claim configs are merged, only fields that are set override.
package v1alpha1

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net"
	"strings"

	"github.com/vfnet-io/vfnet/driver/kernel/vflink"
	"github.com/vfnet-io/vfnet/pkg/api/internal/clip"
)

// Group, Version and Kind identify the opaque config.
const (
	Group      = "vfnet.io"
	Version    = "v1alpha1"
	APIVersion = Group + "/" + Version
	Kind       = "VFConfig"
)

// Limits of the VF settings.
const (
	MaxVLAN = 4094
	MaxQoS  = 7
	// MaxTxRateMbps is the largest rate the kernel can hold: min_tx_rate
	// and max_tx_rate are 32-bit fields of IFLA_VF_RATE. Netlink would
	// silently cut a larger value to its low 32 bits (4294967396 Mbps
	// becomes 100 Mbps), so larger values are refused here.
	MaxTxRateMbps = math.MaxUint32
)

// maxEcho bounds how much of a user's value an error repeats.
const maxEcho = clip.Max

// maxDecodeError bounds a decode error's text, which may quote an unknown
// field's name or a number's literal.
const maxDecodeError = 256

// VFConfig is the per-VF configuration a claim or class may carry.
type VFConfig struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`

	// MAC is the unicast MAC address to give the VF, e.g. "02:00:00:00:00:01".
	MAC *string `json:"mac,omitempty"`
	// VLAN is the port VLAN (0-4094, 0 = none).
	VLAN *int `json:"vlan,omitempty"`
	// QoS is the 802.1p priority of the port VLAN (0-7).
	QoS *int `json:"qos,omitempty"`
	// VLANProtocol is "802.1Q" (default) or "802.1ad".
	VLANProtocol *string `json:"vlanProtocol,omitempty"`
	SpoofChk     *bool   `json:"spoofChk,omitempty"`
	Trust        *bool   `json:"trust,omitempty"`
	// LinkState is "auto", "enable" or "disable".
	LinkState     *string `json:"linkState,omitempty"`
	MinTxRateMbps *int    `json:"minTxRateMbps,omitempty"`
	MaxTxRateMbps *int    `json:"maxTxRateMbps,omitempty"`
	// Failover, when true, asks for a virtio-net failover pair: the binding
	// sidecar adds a standby virtio interface with the VF's MAC and
	// <teaming type='persistent'/> next to the VF. It needs a fixed MAC
	// (mac here or the VM interface's macAddress); prepare refuses the
	// claim without one. Opt-in and incomplete: see docs/migration.md,
	// "Failover (opt-in)".
	Failover *bool `json:"failover,omitempty"`
}

// Decode parses one opaque config strictly: unknown fields, a wrong
// apiVersion/kind and trailing data are errors. It validates the result.
func Decode(raw []byte) (*VFConfig, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	var c VFConfig
	if err := dec.Decode(&c); err != nil {
		var ute *json.UnmarshalTypeError
		if errors.As(err, &ute) && (ute.Field == "minTxRateMbps" || ute.Field == "maxTxRateMbps") {
			// A number beyond int64 (or a fraction) lands here before Validate sees it.
			return nil, fmt.Errorf("invalid %s: %s: %s is not a whole number of Mbps; allowed 0 (no limit) to %d", Kind, ute.Field, clip.String(ute.Value, maxEcho), uint64(MaxTxRateMbps))
		}
		return nil, fmt.Errorf("decode %s %s: %s (allowed fields: mac, vlan, qos, vlanProtocol, spoofChk, trust, linkState, minTxRateMbps, maxTxRateMbps, failover)", APIVersion, Kind, clip.String(err.Error(), maxDecodeError))
	}
	if dec.More() {
		return nil, fmt.Errorf("decode %s %s: trailing data after the object", APIVersion, Kind)
	}
	if c.APIVersion != APIVersion || c.Kind != Kind {
		return nil, fmt.Errorf("opaque config has apiVersion %s kind %s; want apiVersion %q kind %q", clip.Quote(c.APIVersion, maxEcho), clip.Quote(c.Kind, maxEcho), APIVersion, Kind)
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return &c, nil
}

// Validate checks every set field and names the field and its allowed values.
func (c *VFConfig) Validate() error {
	var errs []string
	if c.MAC != nil {
		if _, err := ParseMAC(*c.MAC); err != nil {
			errs = append(errs, err.Error())
		}
	}
	if c.VLAN != nil && (*c.VLAN < 0 || *c.VLAN > MaxVLAN) {
		errs = append(errs, fmt.Sprintf("vlan: %d is out of range; allowed 0-%d", *c.VLAN, MaxVLAN))
	}
	if c.QoS != nil && (*c.QoS < 0 || *c.QoS > MaxQoS) {
		errs = append(errs, fmt.Sprintf("qos: %d is out of range; allowed 0-%d", *c.QoS, MaxQoS))
	}
	if c.VLANProtocol != nil && *c.VLANProtocol != vflink.VLANProto8021Q && *c.VLANProtocol != vflink.VLANProto8021AD {
		errs = append(errs, fmt.Sprintf("vlanProtocol: %s is not allowed; allowed %q or %q", clip.Quote(*c.VLANProtocol, maxEcho), vflink.VLANProto8021Q, vflink.VLANProto8021AD))
	}
	if c.LinkState != nil {
		switch *c.LinkState {
		case vflink.LinkStateAuto, vflink.LinkStateEnable, vflink.LinkStateDisable:
		default:
			errs = append(errs, fmt.Sprintf("linkState: %s is not allowed; allowed %q, %q or %q", clip.Quote(*c.LinkState, maxEcho), vflink.LinkStateAuto, vflink.LinkStateEnable, vflink.LinkStateDisable))
		}
	}
	for _, r := range []struct {
		field string
		v     *int
	}{{"minTxRateMbps", c.MinTxRateMbps}, {"maxTxRateMbps", c.MaxTxRateMbps}} {
		switch {
		case r.v == nil:
		case *r.v < 0:
			errs = append(errs, fmt.Sprintf("%s: %d is negative; allowed 0 (no limit) to %d", r.field, *r.v, uint64(MaxTxRateMbps)))
		case int64(*r.v) > MaxTxRateMbps:
			errs = append(errs, fmt.Sprintf("%s: %d is above %d, the largest rate the kernel's 32-bit field holds; allowed 0 (no limit) to %d", r.field, *r.v, uint64(MaxTxRateMbps), uint64(MaxTxRateMbps)))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("invalid %s: %s", Kind, strings.Join(errs, "; "))
	}
	return nil
}

// ValidateMerged checks the merged config of one request: every field, and
// the rules that span fields that may come from different configs.
func (c *VFConfig) ValidateMerged() error {
	if err := c.Validate(); err != nil {
		return err
	}
	var errs []string
	if c.MinTxRateMbps != nil && c.MaxTxRateMbps != nil && *c.MaxTxRateMbps != 0 && *c.MinTxRateMbps > *c.MaxTxRateMbps {
		errs = append(errs, fmt.Sprintf("minTxRateMbps: %d exceeds maxTxRateMbps %d; allowed min <= max (or max 0 = no limit)", *c.MinTxRateMbps, *c.MaxTxRateMbps))
	}
	if c.QoS != nil && *c.QoS != 0 && (c.VLAN == nil || *c.VLAN == 0) {
		errs = append(errs, "qos: needs a non-zero vlan; the priority travels in the VLAN tag")
	}
	if len(errs) > 0 {
		return fmt.Errorf("invalid merged %s: %s", Kind, strings.Join(errs, "; "))
	}
	return nil
}

// WantsFailover reports whether the config asks for a failover pair.
func (c VFConfig) WantsFailover() bool { return c.Failover != nil && *c.Failover }

// ParseMAC parses a unicast 48-bit MAC address as the mac field accepts it.
func ParseMAC(s string) (net.HardwareAddr, error) {
	hw, err := net.ParseMAC(s)
	if err != nil || len(hw) != 6 {
		return nil, fmt.Errorf("mac: %s is not a 48-bit MAC address; allowed form 02:00:00:00:00:01", clip.Quote(s, maxEcho))
	}
	if hw[0]&1 == 1 {
		return nil, fmt.Errorf("mac: %q is a multicast address; allowed: unicast addresses (first octet even)", hw.String())
	}
	if bytes.Equal(hw, make(net.HardwareAddr, 6)) {
		return nil, fmt.Errorf("mac: %q is all zeros; allowed: a non-zero unicast address", hw.String())
	}
	return hw, nil
}

// Merge returns c with every field that over sets replaced by over's value:
// later configs win field by field.
func (c VFConfig) Merge(over *VFConfig) VFConfig {
	if over == nil {
		return c
	}
	if over.MAC != nil {
		c.MAC = over.MAC
	}
	if over.VLAN != nil {
		c.VLAN = over.VLAN
	}
	if over.QoS != nil {
		c.QoS = over.QoS
	}
	if over.VLANProtocol != nil {
		c.VLANProtocol = over.VLANProtocol
	}
	if over.SpoofChk != nil {
		c.SpoofChk = over.SpoofChk
	}
	if over.Trust != nil {
		c.Trust = over.Trust
	}
	if over.LinkState != nil {
		c.LinkState = over.LinkState
	}
	if over.MinTxRateMbps != nil {
		c.MinTxRateMbps = over.MinTxRateMbps
	}
	if over.MaxTxRateMbps != nil {
		c.MaxTxRateMbps = over.MaxTxRateMbps
	}
	if over.Failover != nil {
		c.Failover = over.Failover
	}
	c.APIVersion, c.Kind = APIVersion, Kind
	return c
}

// Apply returns the VF state that results from applying c's set fields on
// top of base. mac, when non-nil, is the MAC chosen for the VF (it may come
// from c.MAC or from the VM's interface).
func (c VFConfig) Apply(base vflink.VFState, mac net.HardwareAddr) vflink.VFState {
	out := base
	out.MAC = append(net.HardwareAddr(nil), base.MAC...)
	if mac != nil {
		out.MAC = append(net.HardwareAddr(nil), mac...)
	}
	if c.VLAN != nil {
		out.VLAN = *c.VLAN
		if c.QoS == nil {
			out.QoS = 0
		}
		if c.VLANProtocol == nil {
			out.VLANProto = vflink.VLANProto8021Q
		}
	}
	if c.QoS != nil {
		out.QoS = *c.QoS
	}
	if c.VLANProtocol != nil {
		out.VLANProto = *c.VLANProtocol
	}
	if out.VLANProto == "" {
		out.VLANProto = vflink.VLANProto8021Q
	}
	if c.SpoofChk != nil {
		out.SpoofChk = *c.SpoofChk
	}
	if c.Trust != nil {
		out.Trust = *c.Trust
	}
	if c.LinkState != nil {
		out.LinkState = *c.LinkState
	}
	if c.MinTxRateMbps != nil {
		out.MinTxRateMbps = *c.MinTxRateMbps
	}
	if c.MaxTxRateMbps != nil {
		out.MaxTxRateMbps = *c.MaxTxRateMbps
	}
	return out
}
