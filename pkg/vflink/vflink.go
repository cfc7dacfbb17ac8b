// Package vflink sets and reads a VF's link settings through its PF, the way
// `ip link set <pf> vf <n> ...` does. Links is the narrow interface the driver
// uses; Netlink is the real implementation and the simulated host provides a
// fake that models the kernel's behaviour.
package vflink

import "net"

// VLAN protocols accepted by SetVLAN.
const (
	VLANProto8021Q  = "802.1Q"
	VLANProto8021AD = "802.1ad"
)

// Link states accepted by SetLinkState.
const (
	LinkStateAuto    = "auto"
	LinkStateEnable  = "enable"
	LinkStateDisable = "disable"
)

// VFState is everything the PF reports and lets us set for one VF.
type VFState struct {
	MAC           net.HardwareAddr `json:"mac"`
	VLAN          int              `json:"vlan"`
	QoS           int              `json:"qos"`
	VLANProto     string           `json:"vlanProto"` // VLANProto8021Q or VLANProto8021AD
	SpoofChk      bool             `json:"spoofChk"`
	Trust         bool             `json:"trust"`
	LinkState     string           `json:"linkState"` // LinkState*
	MinTxRateMbps int              `json:"minTxRateMbps"`
	MaxTxRateMbps int              `json:"maxTxRateMbps"`
}

// Links reads and changes VF settings through the PF netdev pfName.
// Every method names the PF by netdev name and the VF by its index.
type Links interface {
	VF(pfName string, vf int) (VFState, error)
	SetMAC(pfName string, vf int, mac net.HardwareAddr) error
	SetVLAN(pfName string, vf int, vlan, qos int, proto string) error
	SetSpoofChk(pfName string, vf int, on bool) error
	SetTrust(pfName string, vf int, on bool) error
	SetLinkState(pfName string, vf int, state string) error
	SetRate(pfName string, vf int, minMbps, maxMbps int) error
}
