package prepare_test

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/types"

	"github.com/vfnet-io/vfnet/driver/checkpoint"
	"github.com/vfnet-io/vfnet/test/lib/preparetest"
	"github.com/vfnet-io/vfnet/test/lib/simhost"
)

// A setting the PF driver refuses fails prepare with an error that names
// the setting, the PF driver and what to change, and leaves the host,
// the CDI directory and the checkpoint as they were.
func TestRefusalNamesSettingDriverAndFix(t *testing.T) {
	t.Parallel()
	e := preparetest.NewEnv(t, "", simhost.I350Host())
	const dev = "vf-0000-01-10-4" // VF 1 of the I350 enp1s0f0 (igb)
	c := preparetest.Claim("ns", "qinq", "uid-qinq", []string{dev},
		preparetest.Config(fromClaim, `{`+hdr+`,"mac":"02:00:00:00:00:07","vlan":100,"vlanProtocol":"802.1ad"}`))
	e.AddClaim(t, c)
	before := e.Snapshot(t)
	s := e.NewState(t, nil)
	r := prepareOne(t, s, c)
	if r.Err == nil {
		t.Fatal("prepare of 802.1ad on igb succeeded")
	}
	for _, want := range []string{
		"vlanProtocol 802.1ad",
		"PF driver igb (I350, PF enp1s0f0) does not support it (EPROTONOSUPPORT)",
		"use vlanProtocol 802.1Q",
		`device.attributes["vfnet.io"].supportsVlan8021ad`,
		"everything done for the claim was undone",
	} {
		if !strings.Contains(r.Err.Error(), want) {
			t.Errorf("error %q\n  lacks %q", r.Err, want)
		}
	}
	assertUntouched(t, e, s, before)
}

// Every modelled PF driver's refusal fails prepare with its own reason and
// rolls back; what the driver accepts prepares.
func TestPFDriverRefusals(t *testing.T) {
	t.Parallel()
	e := preparetest.NewEnv(t, "", simhost.PFDriverHost())
	const (
		i82576 = "vf-0000-01-10-0"
		i350   = "vf-0000-02-10-0"
		ice    = "vf-0000-3b-02-0"
		i40e   = "vf-0000-5e-02-0"
		bnxt   = "vf-0000-af-01-0"
		mlx5   = "vf-0000-d8-00-2"
	)
	for i, tc := range []struct {
		name   string
		dev    string
		config string
		down   string // PF netdev to take down first
		want   []string
	}{
		{"82576 link state", i82576, `"linkState":"disable"`, "", []string{
			"linkState disable: PF driver igb (82576, PF ens3) does not support it (EOPNOTSUPP)", "leave linkState unset", "supportsLinkState"}},
		{"82576 minimum rate", i82576, `"minTxRateMbps":10,"maxTxRateMbps":100`, "", []string{
			"minTxRateMbps 10: PF driver igb (82576, PF ens3) does not support it (EINVAL)", "supportsMinTxRate"}},
		{"82576 rate without carrier", i82576, `"vlan":5,"maxTxRateMbps":100`, "ens3", []string{
			"maxTxRateMbps 100: PF driver igb (82576, PF ens3) refused it (EINVAL)", "PF ens3 is down now", "bring the PF's link up"}},
		{"I350 rate", i350, `"maxTxRateMbps":100`, "", []string{
			"maxTxRateMbps 100: PF driver igb (I350, PF enp2s0f0) does not support it (EOPNOTSUPP)", "only on the 82576", "supportsMaxTxRate"}},
		{"i40e 802.1ad", i40e, `"vlan":5,"vlanProtocol":"802.1ad"`, "", []string{
			"vlanProtocol 802.1ad: PF driver i40e (PF enp94s0f0) does not support it (EPROTONOSUPPORT)"}},
		{"i40e minimum rate", i40e, `"minTxRateMbps":100`, "", []string{
			"minTxRateMbps 100: PF driver i40e (PF enp94s0f0) does not support it (EINVAL)"}},
		{"mlx5 802.1ad", mlx5, `"vlan":5,"vlanProtocol":"802.1ad"`, "", []string{
			"vlanProtocol 802.1ad: PF driver mlx5_core (PF ens8f0np0) does not support it (EPROTONOSUPPORT)", "MLNX_OFED"}},
		{"bnxt 802.1ad", bnxt, `"vlan":5,"vlanProtocol":"802.1ad"`, "", []string{
			"vlanProtocol 802.1ad: PF driver bnxt_en (PF ens1f0np0) refused it (EPROTONOSUPPORT)", "TPID", "use vlanProtocol 802.1Q"}},
		{"bnxt rate above link speed", bnxt, `"maxTxRateMbps":40000`, "", []string{
			"maxTxRateMbps 40000: PF driver bnxt_en (PF ens1f0np0) refused it (EINVAL)", "link speed"}},
		{"ice 802.1ad and rates", ice, `"vlan":5,"vlanProtocol":"802.1ad","minTxRateMbps":100,"maxTxRateMbps":1000,"linkState":"enable"`, "", nil},
		{"82576 rate with carrier", i82576, `"vlan":5,"qos":2,"maxTxRateMbps":100,"trust":true`, "", nil},
	} {
		uid := "uid-" + strings.ReplaceAll(tc.name, " ", "-")
		c := preparetest.Claim("ns", "c"+string(rune('a'+i)), types.UID(uid), []string{tc.dev},
			preparetest.Config(fromClaim, `{`+hdr+`,`+tc.config+`}`))
		e.AddClaim(t, c)
		if tc.down != "" {
			if err := e.Host.SetOperState(tc.down, "down"); err != nil {
				t.Fatal(err)
			}
		}
		before := e.Snapshot(t)
		s := e.NewState(t, nil)
		r := prepareOne(t, s, c)
		if tc.want == nil {
			if r.Err != nil {
				t.Errorf("%s: %v", tc.name, r.Err)
			} else if err := unprepareOne(t, s, c); err != nil {
				t.Errorf("%s: unprepare: %v", tc.name, err)
			}
		} else {
			if r.Err == nil {
				t.Errorf("%s: prepare succeeded", tc.name)
				continue
			}
			for _, w := range tc.want {
				if !strings.Contains(r.Err.Error(), w) {
					t.Errorf("%s: error %q\n  lacks %q", tc.name, r.Err, w)
				}
			}
		}
		assertUntouched(t, e, s, before)
		if tc.down != "" {
			if err := e.Host.SetOperState(tc.down, "up"); err != nil {
				t.Fatal(err)
			}
		}
	}
}

func assertUntouched(t *testing.T, e *preparetest.Env, s interface{ Snapshot() *checkpoint.File }, before preparetest.Snapshot) {
	t.Helper()
	if got := e.Snapshot(t); got.String() != before.String() {
		t.Errorf("host after the refused prepare:\n%s\nwant\n%s", got, before)
	}
	if cp := s.Snapshot(); len(cp.Claims) != 0 {
		t.Errorf("checkpoint keeps %d claims", len(cp.Claims))
	}
}

// igb clears an 82576 VF's rate limit only while the PF has carrier:
// unprepare then fails saying so, keeps the claim, and a later unprepare
// (link back) restores everything.
func TestRestoreRefusedWithoutCarrier(t *testing.T) {
	t.Parallel()
	e := preparetest.NewEnv(t, "", simhost.I82576Host())
	const dev = "vf-0000-01-10-2" // VF 1 of ens3
	c := preparetest.Claim("ns", "capped", "uid-capped", []string{dev},
		preparetest.Config(fromClaim, `{`+hdr+`,"vlan":7,"maxTxRateMbps":300}`))
	e.AddClaim(t, c)
	before := e.Snapshot(t)
	s := e.NewState(t, nil)
	if r := prepareOne(t, s, c); r.Err != nil {
		t.Fatal(r.Err)
	}
	if err := e.Host.SetOperState("ens3", "down"); err != nil {
		t.Fatal(err)
	}
	err := unprepareOne(t, s, c)
	if err == nil {
		t.Fatal("unprepare restored the rate without carrier")
	}
	for _, want := range []string{"restore VF link settings", "maxTxRateMbps 0: PF driver igb (82576, PF ens3) refused it (EINVAL)",
		"PF ens3 is down now", "the next unprepare retries"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q\n  lacks %q", err, want)
		}
	}
	if cp := s.Snapshot(); len(cp.Claims) != 1 {
		t.Fatalf("checkpoint has %d claims, want the one still to undo", len(cp.Claims))
	}
	if err := e.Host.SetOperState("ens3", "up"); err != nil {
		t.Fatal(err)
	}
	if err := unprepareOne(t, s, c); err != nil {
		t.Fatal(err)
	}
	assertUntouched(t, e, s, before)
}
