package simhost

import (
	"errors"
	"reflect"
	"syscall"
	"testing"

	"github.com/vfnet-io/vfnet/driver/kernel/vflink"
)

// Each simulated PF driver refuses what its Linux driver refuses, with the
// same errno, and accepts the rest; a refusal changes nothing.
func TestPFDriverModels(t *testing.T) {
	t.Parallel()
	h := build(t, PFDriverHost())
	l := h.Links()
	const (
		i82576 = "ens3"
		i350   = "enp2s0f0"
		ice    = "enp59s0f0"
		i40e   = "enp94s0f0"
		bnxt   = "ens1f0np0"
		mlx5   = "ens8f0np0"
	)
	ad := vflink.VLANProto8021AD
	for _, c := range []struct {
		name  string
		err   error
		errno syscall.Errno // 0: accepted
	}{
		// igb, both MAC types (igb_main.c).
		{"82576 802.1ad", l.SetVLAN(i82576, 0, 10, 0, ad), syscall.EPROTONOSUPPORT},
		{"I350 802.1ad", l.SetVLAN(i350, 0, 10, 0, ad), syscall.EPROTONOSUPPORT},
		{"82576 link state", l.SetLinkState(i82576, 0, vflink.LinkStateDisable), syscall.EOPNOTSUPP},
		{"I350 link state auto", l.SetLinkState(i350, 0, vflink.LinkStateAuto), syscall.EOPNOTSUPP},
		{"82576 min rate", l.SetRate(i82576, 0, 10, 100), syscall.EINVAL},
		{"82576 max above 1G", l.SetRate(i82576, 0, 0, 1001), syscall.EINVAL},
		{"I350 max rate", l.SetRate(i350, 0, 0, 100), syscall.EOPNOTSUPP},
		{"I350 no limit", l.SetRate(i350, 0, 0, 0), syscall.EOPNOTSUPP},
		{"I350 min rate", l.SetRate(i350, 0, 10, 0), syscall.EOPNOTSUPP},
		{"82576 max rate with link", l.SetRate(i82576, 1, 0, 100), 0},
		{"82576 802.1Q qos", l.SetVLAN(i82576, 1, 10, 3, vflink.VLANProto8021Q), 0},
		{"I350 trust", l.SetTrust(i350, 1, true), 0},
		{"I350 spoofchk", l.SetSpoofChk(i350, 1, false), 0},
		// i40e (i40e_virtchnl_pf.c).
		{"i40e 802.1ad", l.SetVLAN(i40e, 0, 10, 0, ad), syscall.EPROTONOSUPPORT},
		{"i40e min rate", l.SetRate(i40e, 0, 10, 0), syscall.EINVAL},
		{"i40e max above 10G", l.SetRate(i40e, 0, 0, 10001), syscall.EINVAL},
		{"i40e link state", l.SetLinkState(i40e, 1, vflink.LinkStateDisable), 0},
		{"i40e max 20 (raised to 50)", l.SetRate(i40e, 1, 0, 20), 0},
		// ice (ice_sriov.c), in double VLAN mode, without DCB.
		{"ice 802.1ad", l.SetVLAN(ice, 1, 10, 0, ad), 0},
		{"ice min rate", l.SetRate(ice, 1, 20000, 0), 0},
		{"ice min oversubscribed", l.SetRate(ice, 2, 5001, 0), syscall.EINVAL},
		{"ice min within speed", l.SetRate(ice, 2, 5000, 0), 0},
		// mlx5_core (en_main.c).
		{"mlx5 802.1ad", l.SetVLAN(mlx5, 0, 10, 0, ad), syscall.EPROTONOSUPPORT},
		{"mlx5 rates and state", errors.Join(l.SetRate(mlx5, 1, 10, 100), l.SetLinkState(mlx5, 1, vflink.LinkStateEnable)), 0},
		// bnxt_en (bnxt_sriov.c), firmware without the TPID capability.
		{"bnxt 802.1ad", l.SetVLAN(bnxt, 0, 10, 0, ad), syscall.EPROTONOSUPPORT},
		{"bnxt max above 25G", l.SetRate(bnxt, 0, 0, 25001), syscall.EINVAL},
		{"bnxt min rate", l.SetRate(bnxt, 1, 100, 1000), 0},
	} {
		switch {
		case c.errno == 0 && c.err != nil:
			t.Errorf("%s: %v, want accepted", c.name, c.err)
		case c.errno != 0 && !errors.Is(c.err, c.errno):
			t.Errorf("%s: err = %v, want %v", c.name, c.err, c.errno)
		}
	}
	for _, pf := range []string{i82576, i350, i40e, mlx5, bnxt} {
		if st, _ := l.VF(pf, 0); !reflect.DeepEqual(st, DefaultVFState()) {
			t.Errorf("refused calls changed %s VF 0: %+v", pf, st)
		}
	}
	if st, _ := l.VF(i40e, 1); st.MaxTxRateMbps != 50 {
		t.Errorf("i40e stores a 20 Mbps limit as 50: %+v", st)
	}
}

// igb rate-limits an 82576 VF only while the PF has carrier; i40e's limit
// is bounded by the current speed, which is 0 while the link is down.
func TestPFDriverRateNeedsCarrier(t *testing.T) {
	t.Parallel()
	h := build(t, PFDriverHost())
	l := h.Links()
	for _, pf := range []string{"ens3", "enp94s0f0"} {
		if err := l.SetRate(pf, 0, 0, 100); err != nil {
			t.Fatalf("%s with link: %v", pf, err)
		}
		if err := h.SetOperState(pf, "down"); err != nil {
			t.Fatal(err)
		}
		if err := l.SetRate(pf, 0, 0, 200); !errors.Is(err, syscall.EINVAL) {
			t.Errorf("%s without carrier: %v, want EINVAL", pf, err)
		}
		if err := l.SetRate(pf, 0, 0, 0); pf == "ens3" && !errors.Is(err, syscall.EINVAL) {
			// igb checks the link before the value: even clearing fails.
			t.Errorf("%s clearing without carrier: %v, want EINVAL", pf, err)
		}
		if err := h.SetOperState(pf, "up"); err != nil {
			t.Fatal(err)
		}
		if err := l.SetRate(pf, 0, 0, 0); err != nil {
			t.Errorf("%s clearing with link: %v", pf, err)
		}
	}
}

// The ice knobs: without double VLAN mode 802.1ad is refused, with DCB
// any minimum rate.
func TestIceSingleVLANModeAndDCB(t *testing.T) {
	t.Parallel()
	spec := E810Host()
	spec.PFs[0].SingleVLANMode, spec.PFs[0].DCB = true, true
	h := build(t, spec)
	l := h.Links()
	if err := l.SetVLAN("enp59s0f0", 0, 10, 0, vflink.VLANProto8021AD); !errors.Is(err, syscall.EPROTONOSUPPORT) {
		t.Errorf("802.1ad in single VLAN mode: %v", err)
	}
	if err := l.SetRate("enp59s0f0", 0, 10, 0); !errors.Is(err, syscall.EOPNOTSUPP) {
		t.Errorf("min rate with DCB: %v", err)
	}
	if err := l.SetRate("enp59s0f0", 0, 0, 100); err != nil {
		t.Errorf("max rate with DCB: %v", err)
	}
	if err := l.SetVLAN("enp59s0f1", 0, 10, 0, vflink.VLANProto8021AD); err != nil {
		t.Errorf("the other port has DVM: %v", err)
	}
}
