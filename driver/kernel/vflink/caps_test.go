package vflink

import (
	"errors"
	"fmt"
	"strings"
	"syscall"
	"testing"
)

func TestLookupModels(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		driver, device string
		model          string
		setting        Setting
		support        Support
		errno          syscall.Errno
	}{
		{"igb", "10c9", "82576", SettingMaxTxRate, SupportDepends, syscall.EINVAL},
		{"igb", "10c9", "82576", SettingMinTxRate, Unsupported, syscall.EINVAL},
		{"igb", "1521", "I350", SettingMaxTxRate, Unsupported, syscall.EOPNOTSUPP},
		{"igb", "1521", "I350", SettingMinTxRate, Unsupported, syscall.EOPNOTSUPP},
		{"igb", "1521", "I350", SettingLinkState, Unsupported, syscall.EOPNOTSUPP},
		{"igb", "10C9", "82576", SettingVLANProtocol, Unsupported, syscall.EPROTONOSUPPORT},
		{"igb", "1521", "I350", SettingTrust, Supported, 0},
		{"i40e", "1572", "", SettingMinTxRate, Unsupported, syscall.EINVAL},
		{"i40e", "1572", "", SettingLinkState, Supported, 0},
		{"ice", "1593", "", SettingVLANProtocol, SupportDepends, syscall.EPROTONOSUPPORT},
		{"ice", "1593", "", SettingMaxTxRate, Supported, 0},
		{"mlx5_core", "101d", "", SettingVLANProtocol, Unsupported, syscall.EPROTONOSUPPORT},
		{"mlx5_core", "101d", "", SettingLinkState, Supported, 0},
		{"bnxt_en", "16d7", "", SettingQoS, SupportDepends, syscall.EINVAL},
		{"bnxt_en", "16d7", "", SettingLinkState, Supported, 0},
		{"sfc", "0903", "", SettingLinkState, SupportUnknown, 0},
	} {
		c := Lookup(tc.driver, tc.device)
		cp := c.Of(tc.setting)
		if c.Model != tc.model || cp.Support != tc.support || cp.Errno != tc.errno {
			t.Errorf("Lookup(%s, %s).Of(%s) = model %q %v %v, want model %q %v %v", tc.driver, tc.device, tc.setting,
				c.Model, cp.Support, cp.Errno, tc.model, tc.support, tc.errno)
		}
		if cp.Support == Unsupported || cp.Support == SupportDepends {
			if cp.Note == "" {
				t.Errorf("%s %s: no note", tc.driver, tc.setting)
			}
		}
	}
	if Lookup("sfc", "").Known || !Lookup("igb", "").Known {
		t.Error("Known is wrong")
	}
	if Lookup("igb", "1521").Publishes(SettingLinkState) || !Lookup("igb", "10c9").Publishes(SettingMaxTxRate) ||
		!Lookup("ice", "1593").Publishes(SettingVLANProtocol) || Lookup("sfc", "").Publishes(SettingLinkState) {
		t.Error("Publishes is wrong")
	}
}

// wrapped is how vflink.Netlink hands a kernel errno over.
func wrapped(errno syscall.Errno) error {
	return fmt.Errorf("set enp1s0f0 vf 0 ...: %w", errno)
}

func TestExplain(t *testing.T) {
	t.Parallel()
	i350 := PF{Name: "enp1s0f0", Address: "0000:01:00.0", Driver: "igb", DeviceID: "1521", OperState: "up"}
	i82576 := PF{Name: "ens3", Driver: "igb", DeviceID: "10c9", OperState: "down"}
	for _, tc := range []struct {
		name    string
		setting Setting
		value   string
		pf      PF
		errno   syscall.Errno
		want    []string
	}{
		{"igb 802.1ad", SettingVLANProtocol, "802.1ad", i350, syscall.EPROTONOSUPPORT, []string{
			"vlanProtocol 802.1ad: PF driver igb (I350, PF enp1s0f0) does not support it (EPROTONOSUPPORT)",
			"use vlanProtocol 802.1Q", `device.attributes["vfnet.io"].supportsVlan8021ad`}},
		{"igb link state", SettingLinkState, "disable", i350, syscall.EOPNOTSUPP, []string{
			"linkState disable: PF driver igb", "(EOPNOTSUPP)", "no ndo_set_vf_link_state", "leave linkState unset", "supportsLinkState"}},
		{"i350 rate", SettingMaxTxRate, "100", i350, syscall.EOPNOTSUPP, []string{
			"maxTxRateMbps 100: PF driver igb (I350", "does not support it (EOPNOTSUPP)", "only on the 82576", "leave maxTxRateMbps unset or 0", "supportsMaxTxRate"}},
		{"82576 min rate", SettingMinTxRate, "10", i82576, syscall.EINVAL, []string{
			"minTxRateMbps 10: PF driver igb (82576, PF ens3) does not support it (EINVAL)", "supportsMinTxRate"}},
		{"82576 max rate without carrier", SettingMaxTxRate, "100", i82576, syscall.EINVAL, []string{
			"maxTxRateMbps 100: PF driver igb (82576, PF ens3) refused it (EINVAL)", "only while the PF has link (carrier)",
			"PF ens3 is down now", "bring the PF's link up"}},
		{"bnxt qos", SettingQoS, "3", PF{Name: "ens1f0np0", Driver: "bnxt_en", DeviceID: "16d7"}, syscall.EINVAL, []string{
			"qos 3: PF driver bnxt_en (PF ens1f0np0) refused it (EINVAL)", "older bnxt_en", "use qos 0"}},
		{"unknown driver", SettingLinkState, "enable", PF{Name: "eth7", Driver: "sfc"}, syscall.EOPNOTSUPP, []string{
			"linkState enable: PF driver sfc (PF eth7) does not support it (EOPNOTSUPP)", "leave linkState unset"}},
		{"unknown driver, odd errno", SettingVLAN, "100", PF{Name: "eth7", Driver: "sfc"}, syscall.ERANGE, []string{
			"vlan 100: PF driver sfc (PF eth7) refused it (ERANGE", "kernel log"}},
		{"driver not known at all", SettingTrust, "true", PF{Name: "eth7"}, syscall.EOPNOTSUPP, []string{
			"trust true: the PF driver (PF eth7) does not support it"}},
		{"busy", SettingMAC, "02:00:00:00:00:01", i350, syscall.EBUSY, []string{"busy (EBUSY)", "reset"}},
	} {
		err := Explain(tc.setting, tc.value, tc.pf, wrapped(tc.errno))
		var re *RefusalError
		if !errors.As(err, &re) || re.Setting != tc.setting || re.Errno != tc.errno {
			t.Errorf("%s: %v is not a RefusalError for %s/%v", tc.name, err, tc.setting, tc.errno)
			continue
		}
		if !errors.Is(err, tc.errno) {
			t.Errorf("%s: %v does not unwrap to %v", tc.name, err, tc.errno)
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %q\n  lacks %q", tc.name, err, w)
			}
		}
	}
	if Explain(SettingMAC, "x", i350, nil) != nil {
		t.Error("Explain(nil) is not nil")
	}
	plain := errors.New("PF reports no VF 3")
	if err := Explain(SettingVLAN, "5", i350, plain); !errors.Is(err, plain) || !strings.HasPrefix(err.Error(), "vlan 5: ") {
		t.Errorf("Explain without errno: %v", err)
	}
}
