package vflink

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"syscall"
)

// Setting names one VF setting, spelled as the VFConfig field that asks
// for it, so an error names what the user wrote.
type Setting string

// The VF settings a PF driver may refuse.
const (
	SettingMAC          Setting = "mac"
	SettingVLAN         Setting = "vlan"
	SettingQoS          Setting = "qos"
	SettingVLANProtocol Setting = "vlanProtocol" // the capability is 802.1ad; 802.1Q always works
	SettingSpoofChk     Setting = "spoofChk"
	SettingTrust        Setting = "trust"
	SettingLinkState    Setting = "linkState"
	SettingMinTxRate    Setting = "minTxRateMbps"
	SettingMaxTxRate    Setting = "maxTxRateMbps"
)

// Support says whether a PF driver applies a setting.
type Support int

const (
	// SupportUnknown: vfnet does not know the driver; it tries and reports
	// what the kernel answers.
	SupportUnknown Support = iota
	// Supported: the driver implements the setting.
	Supported
	// SupportDepends: the driver implements it, but refuses it in some
	// states or on some firmware (Capability.Note says which).
	SupportDepends
	// Unsupported: the driver refuses it, always, with Capability.Errno.
	Unsupported
)

func (s Support) String() string {
	switch s {
	case Supported:
		return "supported"
	case SupportDepends:
		return "depends"
	case Unsupported:
		return "unsupported"
	}
	return "unknown"
}

// Capability is what a PF driver does with one setting, read from the
// driver's ndo_set_vf_* implementation in the Linux sources.
type Capability struct {
	Support Support
	// Errno is what the kernel answers when the driver refuses (0: none known).
	Errno syscall.Errno
	// Note says why it is refused, or when (SupportDepends).
	Note string
}

// Caps are the capabilities of one PF driver (for igb, of one MAC type:
// the 82576 and the I350 differ).
type Caps struct {
	// Driver is the PF's kernel driver ("igb").
	Driver string
	// Model names the hardware variant when it matters ("82576"), else "".
	Model string
	// Known is false for a driver vfnet has no table for.
	Known    bool
	settings map[Setting]Capability
}

// Of returns the capability for one setting (SupportUnknown for an unknown
// driver).
func (c Caps) Of(s Setting) Capability {
	if cp, ok := c.settings[s]; ok {
		return cp
	}
	if c.Known {
		return Capability{Support: Supported}
	}
	return Capability{}
}

// Name is the driver with its model, as messages print it: "igb (82576)".
func (c Caps) Name() string {
	if c.Model != "" {
		return c.Driver + " (" + c.Model + ")"
	}
	return c.Driver
}

// Errnos the kernel uses for refusals. ENOTSUPP (524) is kernel-internal
// but some drivers (bnxt_en) return it to user space as is.
const errnoENOTSUPP = syscall.Errno(524)

// igb82576 are the PCI device IDs of the 82576 (e1000_82576 MAC type);
// igb's rate limiting exists only there (igb_ndo_set_vf_bw).
var igb82576 = []string{"10c9", "10e6", "10e7", "10e8", "150a", "150d", "1518", "1526"}

// igbCommon is what every igb MAC type shares (igb_main.c):
// igb_ndo_set_vf_vlan refuses any protocol but 802.1Q, and igb has no
// ndo_set_vf_link_state, so rtnetlink answers EOPNOTSUPP.
func igbCommon() map[Setting]Capability {
	return map[Setting]Capability{
		SettingVLANProtocol: {Unsupported, syscall.EPROTONOSUPPORT, "igb_ndo_set_vf_vlan accepts only 802.1Q"},
		SettingLinkState:    {Unsupported, syscall.EOPNOTSUPP, "igb has no ndo_set_vf_link_state: the VF always follows the PF's link"},
	}
}

// Lookup returns the capability table of a PF driver. deviceID is the PF's
// PCI device ID (four lower-case hex digits); it tells igb's 82576 from the
// I350. An unknown driver gets Known false: every setting is tried.
func Lookup(driver, deviceID string) Caps {
	c := Caps{Driver: driver, Known: true}
	switch driver {
	case "igb":
		c.settings = igbCommon()
		if slices.Contains(igb82576, strings.ToLower(deviceID)) {
			c.Model = "82576"
			c.settings[SettingMinTxRate] = Capability{Unsupported, syscall.EINVAL, "igb_ndo_set_vf_bw refuses any minimum rate"}
			c.settings[SettingMaxTxRate] = Capability{SupportDepends, syscall.EINVAL,
				"igb applies a VF rate limit only while the PF has link (carrier), and at most the link speed"}
		} else {
			c.Model = "I350"
			if deviceID != "" && !slices.Contains([]string{"1521", "1522", "1523", "1524"}, strings.ToLower(deviceID)) {
				c.Model = "device " + deviceID
			}
			why := "igb_ndo_set_vf_bw rate-limits VFs only on the 82576"
			c.settings[SettingMinTxRate] = Capability{Unsupported, syscall.EOPNOTSUPP, why}
			c.settings[SettingMaxTxRate] = Capability{Unsupported, syscall.EOPNOTSUPP, why}
		}
	case "i40e":
		c.settings = map[Setting]Capability{
			SettingVLANProtocol: {Unsupported, syscall.EPROTONOSUPPORT, "i40e_ndo_set_vf_port_vlan accepts only 802.1Q"},
			SettingMinTxRate:    {Unsupported, syscall.EINVAL, "i40e_ndo_set_vf_bw refuses any minimum rate"},
			SettingMaxTxRate: {SupportDepends, syscall.EINVAL,
				"i40e accepts a rate limit up to the PF's current link speed (none while the link is down) and rounds values under 50 Mbps up to 50"},
		}
	case "ice":
		c.settings = map[Setting]Capability{
			SettingVLANProtocol: {SupportDepends, syscall.EPROTONOSUPPORT,
				"ice accepts 802.1ad only in double VLAN mode (DVM), which needs a DDP package and NVM that support it"},
			SettingMinTxRate: {SupportDepends, syscall.EINVAL,
				"ice refuses a minimum rate while DCB is enabled on the PF (EOPNOTSUPP), and when the minimums of all its VFs would exceed the link speed (EINVAL)"},
		}
	case "mlx5_core":
		c.settings = map[Setting]Capability{
			SettingVLANProtocol: {Unsupported, syscall.EPROTONOSUPPORT,
				"upstream mlx5e_set_vf_vlan accepts only 802.1Q (NVIDIA's out-of-tree MLNX_OFED driver accepts 802.1ad)"},
			SettingMinTxRate: {SupportDepends, syscall.EOPNOTSUPP, "mlx5 needs firmware with e-switch bandwidth share (QoS esw_bw_share) for a minimum rate"},
			SettingMaxTxRate: {SupportDepends, syscall.EOPNOTSUPP, "mlx5 needs firmware with e-switch rate limiting (QoS esw_rate_limit)"},
		}
	case "bnxt_en":
		c.settings = map[Setting]Capability{
			SettingVLANProtocol: {SupportDepends, syscall.EPROTONOSUPPORT,
				"bnxt_en accepts 802.1ad only on recent kernels with firmware that can set the default VLAN TPID"},
			SettingQoS: {SupportDepends, syscall.EINVAL, "older bnxt_en kernels refuse a VLAN priority (qos) on a VF"},
			SettingSpoofChk: {SupportDepends, errnoENOTSUPP,
				"bnxt_en needs firmware with HWRM interface 1.7.1 or later for spoof checking"},
			SettingMinTxRate: {SupportDepends, syscall.EINVAL, "bnxt_en accepts rates up to the PF's link speed"},
			SettingMaxTxRate: {SupportDepends, syscall.EINVAL, "bnxt_en accepts rates up to the PF's link speed"},
		}
	default:
		c.Known = false
	}
	return c
}

// PF describes the PF a setting went through, for messages.
type PF struct {
	// Name is the PF netdev, Address its PCI address.
	Name    string
	Address string
	// Driver and DeviceID select the capability table (Lookup).
	Driver   string
	DeviceID string
	// OperState is the PF netdev's operstate ("" unknown): a rate refused
	// while it is not "up" is explained by the missing carrier.
	OperState string
}

// RefusalError is a VF setting the PF driver refused. It unwraps to the
// kernel's error, so errors.Is(err, syscall.EOPNOTSUPP) still works.
type RefusalError struct {
	Setting Setting
	// Value is the requested value as the user wrote it ("802.1ad").
	Value string
	PF    PF
	// Errno is the kernel's answer, 0 if the error carried none.
	Errno syscall.Errno
	Err   error
	msg   string
}

func (e *RefusalError) Error() string { return e.msg }
func (e *RefusalError) Unwrap() error { return e.Err }

// Attribute names (in the vfnet.io domain) a DeviceClass can select on;
// discovery publishes them per device from Caps.
const (
	AttrSupportsVlan8021ad = "supportsVlan8021ad"
	AttrSupportsLinkState  = "supportsLinkState"
	AttrSupportsMinTxRate  = "supportsMinTxRate"
	AttrSupportsMaxTxRate  = "supportsMaxTxRate"
)

// PublishedSettings maps the settings whose support is published as a
// device attribute to the attribute's name.
var PublishedSettings = map[Setting]string{
	SettingVLANProtocol: AttrSupportsVlan8021ad,
	SettingLinkState:    AttrSupportsLinkState,
	SettingMinTxRate:    AttrSupportsMinTxRate,
	SettingMaxTxRate:    AttrSupportsMaxTxRate,
}

// Publishes reports the value of the supports* attribute for s: true when
// the driver implements the setting (possibly under the conditions in the
// Note), false when it refuses it or the driver is unknown to vfnet.
func (c Caps) Publishes(s Setting) bool {
	switch c.Of(s).Support {
	case Supported, SupportDepends:
		return true
	}
	return false
}

// Explain turns a kernel refusal of setting s (value as requested) on pf
// into an error that names the setting, the PF driver and the fix. err is
// the error of the set call; nil gives nil. An error without an errno, or
// one no PF driver returns for a refusal, is wrapped with the setting only.
func Explain(s Setting, value string, pf PF, err error) error {
	if err == nil {
		return nil
	}
	var errno syscall.Errno
	if !errors.As(err, &errno) {
		return fmt.Errorf("%s %s: %w", s, value, err)
	}
	caps := Lookup(pf.Driver, pf.DeviceID)
	cp := caps.Of(s)
	e := &RefusalError{Setting: s, Value: value, PF: pf, Errno: errno, Err: err}
	where := "the PF driver"
	if pf.Driver != "" {
		where = "PF driver " + pf.Driver
	}
	var details []string
	if caps.Model != "" {
		details = append(details, caps.Model)
	}
	if pf.Name != "" {
		details = append(details, "PF "+pf.Name)
	}
	if len(details) > 0 {
		where += " (" + strings.Join(details, ", ") + ")"
	}
	name := errnoName(errno)
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s: ", s, value)
	switch {
	case errno == syscall.EBUSY || errno == syscall.EAGAIN:
		// Retrying already waited: the reset outlasted its bound.
		fmt.Fprintf(&b, "%s is busy (%s): the VF is being reset and did not come out of reset while vfnet retried; check the PF's kernel log, then retry the prepare", where, name)
	case cp.Support == Unsupported && (cp.Errno == 0 || cp.Errno == errno):
		fmt.Fprintf(&b, "%s does not support it (%s): %s; %s", where, name, cp.Note, fix(s, value, caps))
	case cp.Support == SupportDepends:
		fmt.Fprintf(&b, "%s refused it (%s): %s", where, name, cp.Note)
		if state := pf.OperState; (s == SettingMaxTxRate || s == SettingMinTxRate) && state != "" && state != "up" {
			fmt.Fprintf(&b, "; PF %s is %s now", pf.Name, state)
		}
		fmt.Fprintf(&b, "; %s", fix(s, value, caps))
	case errno == syscall.EOPNOTSUPP || errno == syscall.EPROTONOSUPPORT || errno == errnoENOTSUPP:
		fmt.Fprintf(&b, "%s does not support it (%s); %s", where, name, fix(s, value, caps))
	default:
		fmt.Fprintf(&b, "%s refused it (%s; the kernel log names the driver's reason); %s", where, name, fix(s, value, caps))
	}
	e.msg = b.String()
	return e
}

// fix says what the user can change: the setting itself, or a DeviceClass
// that selects PFs whose driver applies it.
func fix(s Setting, value string, caps Caps) string {
	attr := ""
	// A DeviceClass helps only where the attribute tells this PF apart.
	if a, ok := PublishedSettings[s]; ok && !caps.Publishes(s) {
		attr = fmt.Sprintf(", or allocate from a DeviceClass whose selector requires device.attributes[\"vfnet.io\"].%s", a)
	}
	switch s {
	case SettingVLANProtocol:
		return "use vlanProtocol 802.1Q" + attr
	case SettingLinkState:
		return "leave linkState unset (the VF then follows the PF's link)" + attr
	case SettingMinTxRate:
		return "leave minTxRateMbps unset or 0" + attr
	case SettingMaxTxRate:
		if caps.Of(s).Support == SupportDepends {
			return "bring the PF's link up and keep maxTxRateMbps within its speed, or leave maxTxRateMbps unset" + attr
		}
		return "leave maxTxRateMbps unset or 0" + attr
	case SettingQoS:
		return "use qos 0"
	case SettingSpoofChk:
		return "leave spoofChk unset"
	case SettingTrust:
		return "leave trust unset"
	case SettingVLAN:
		return "use another vlan or leave it unset"
	case SettingMAC:
		return "use another unicast mac or leave it unset"
	}
	return "leave " + string(s) + " unset"
}

// errnoName is the errno's symbolic name ("EOPNOTSUPP"), as the kernel
// sources spell the refusals.
func errnoName(e syscall.Errno) string {
	switch e {
	case syscall.EINVAL:
		return "EINVAL"
	case syscall.EOPNOTSUPP:
		return "EOPNOTSUPP"
	case syscall.EPROTONOSUPPORT:
		return "EPROTONOSUPPORT"
	case syscall.EBUSY:
		return "EBUSY"
	case syscall.EAGAIN:
		return "EAGAIN"
	case syscall.EPERM:
		return "EPERM"
	case syscall.ENETDOWN:
		return "ENETDOWN"
	case syscall.ENODEV:
		return "ENODEV"
	case syscall.ERANGE:
		return "ERANGE"
	case errnoENOTSUPP:
		return "ENOTSUPP"
	}
	return fmt.Sprintf("errno %d: %s", int(e), e.Error())
}
