// Package vflink sets and reads a VF's link settings through its PF, the way
// `ip link set <pf> vf <n> ...` does. Links is the narrow interface the driver
// uses; Netlink (Open) is the real implementation, bound to one network
// namespace, and the simulated host provides a fake that models the
// kernel's behaviour, namespaces included.
package vflink

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"syscall"
)

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

// DefaultHostNetns is the host's network namespace as a pod with hostPID
// sees it: the namespace of the host's init process.
const DefaultHostNetns = "/proc/1/ns/net"

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

// Netdev is a network device as the link layer's namespace shows it.
type Netdev struct {
	Name  string
	Index int
}

// Links reads and changes VF settings through the PF netdev pfName.
// Every method names the PF by netdev name and the VF by its index, and
// looks the netdev up in one network namespace, fixed when the Links is
// made: a netdev that is not there fails with a *LinkNotFoundError.
type Links interface {
	// Resolve looks up a netdev by name without reading its VFs.
	Resolve(name string) (Netdev, error)
	VF(pfName string, vf int) (VFState, error)
	SetMAC(pfName string, vf int, mac net.HardwareAddr) error
	SetVLAN(pfName string, vf int, vlan, qos int, proto string) error
	SetSpoofChk(pfName string, vf int, on bool) error
	SetTrust(pfName string, vf int, on bool) error
	SetLinkState(pfName string, vf int, state string) error
	SetRate(pfName string, vf int, minMbps, maxMbps int) error
}

// LinkNotFoundError is a netdev the kernel does not know in the namespace
// the link layer works in (ENODEV from RTM_GETLINK). On a real node it
// usually means the driver looks in the wrong namespace.
type LinkNotFoundError struct {
	Name string
	// Netns is the namespace file the link layer was opened on.
	Netns string
}

func (e *LinkNotFoundError) Error() string {
	return fmt.Sprintf("netdev %s not found in network namespace %s", e.Name, e.Netns)
}

// Unwrap makes errors.Is(err, syscall.ENODEV) hold, as for the kernel's
// own answer.
func (e *LinkNotFoundError) Unwrap() error { return syscall.ENODEV }

// IsLinkNotFound reports whether err is (or wraps) a *LinkNotFoundError.
func IsLinkNotFound(err error) bool {
	var nf *LinkNotFoundError
	return errors.As(err, &nf)
}

// NamespaceError is a network namespace file the link layer cannot enter.
type NamespaceError struct {
	Path string
	Err  error
}

func (e *NamespaceError) Error() string {
	var fix string
	switch {
	case errors.Is(e.Err, fs.ErrNotExist):
		fix = "the file does not exist; the driver reaches the host's netdevs through the host's network namespace, " +
			"so run its pod with hostPID: true (then " + DefaultHostNetns + " is the host's) or point --host-netns at the host's namespace file"
	case errors.Is(e.Err, syscall.EPERM), errors.Is(e.Err, fs.ErrPermission):
		fix = "entering a network namespace needs CAP_SYS_ADMIN: run the driver privileged"
	case errors.Is(e.Err, syscall.EINVAL):
		fix = "it is not a network namespace file (use /proc/<pid>/ns/net of a process in the host's namespace)"
	default:
		fix = "point --host-netns at the host's network namespace file (default " + DefaultHostNetns + ", which needs hostPID: true)"
	}
	return fmt.Sprintf("network namespace %s: %v: %s", e.Path, e.Err, fix)
}

func (e *NamespaceError) Unwrap() error { return e.Err }
