package prepare_test

import (
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/vfnet-io/vfnet/driver/kernel/sysfs"
	"github.com/vfnet-io/vfnet/driver/kernel/vflink"
	"github.com/vfnet-io/vfnet/driver/prepare"
	"github.com/vfnet-io/vfnet/test/lib/preparetest"
	"github.com/vfnet-io/vfnet/test/lib/simhost"
)

// A VF nobody set a MAC for reads 00:..:00 through the PF; once its VF
// driver has been rebound (after a first prepare and unprepare), the PF
// reports the MAC the driver chose for itself. A second prepare must not
// take that for an administrative MAC: unprepare leaves the MAC unset, so
// the VF driver may change it again, as before.
func TestRestoreKeepsZeroMACZero(t *testing.T) {
	t.Parallel()
	e := preparetest.NewEnv(t, "", simhost.E810Host())
	admin := func() net.HardwareAddr {
		t.Helper()
		st, err := e.Host.VFState(pf0, 1)
		if err != nil {
			t.Fatal(err)
		}
		return st.MAC
	}
	reported := func() net.HardwareAddr {
		t.Helper()
		st, err := e.Host.Links().VF(pf0, 1)
		if err != nil {
			t.Fatal(err)
		}
		return st.MAC
	}
	zero := net.HardwareAddr{0, 0, 0, 0, 0, 0}
	before := e.Snapshot(t)
	s := e.NewState(t, nil)
	withMAC := preparetest.Claim("ns", "a", "uid-a", []string{vf1}, preparetest.Config(fromClaim, `{`+hdr+`,"mac":"02:00:00:00:00:31","vlan":7}`))
	noMAC := preparetest.Claim("ns", "b", "uid-b", []string{vf1}, preparetest.Config(fromClaim, `{`+hdr+`,"vlan":8}`))
	for _, c := range []*resourceapi.ResourceClaim{withMAC, noMAC} {
		e.AddClaim(t, c)
	}
	for round, c := range []*resourceapi.ResourceClaim{withMAC, withMAC, noMAC} {
		own := reported()
		if round > 0 && own.String() == zero.String() {
			t.Fatalf("round %d: the rebound VF driver reported no MAC of its own; the simulation lost it", round)
		}
		r := prepareOne(t, s, c)
		if r.Err != nil {
			t.Fatalf("round %d: %v", round, r.Err)
		}
		d := s.Snapshot().Claims[c.UID].Devices[0]
		if d.Original.MAC.String() != zero.String() {
			t.Fatalf("round %d: recorded original MAC %s, want none (all zeros)", round, d.Original.MAC)
		}
		if round > 0 && d.OriginalOwnMAC != own.String() {
			t.Fatalf("round %d: originalOwnMac %q, want the VF driver's %s", round, d.OriginalOwnMAC, own)
		}
		if c == noMAC {
			// No MAC asked for: none is set, and the VM learns none.
			if m := admin(); m.String() != zero.String() {
				t.Fatalf("claim without a MAC set MAC %s on the VF", m)
			}
			if nd := r.Devices[0].Metadata.NetworkData; nd != nil && nd.HardwareAddress != "" {
				t.Fatalf("claim without a MAC reports hardware address %q", nd.HardwareAddress)
			}
		}
		if err := unprepareOne(t, s, c); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		if m := admin(); m.String() != zero.String() {
			t.Fatalf("round %d: unprepare left the administrative MAC %s, want none (00:00:00:00:00:00)", round, m)
		}
		if got := e.Snapshot(t); got.String() != before.String() {
			t.Fatalf("round %d: host after unprepare:\n%s\nwant\n%s", round, got, before)
		}
	}
	// A MAC an administrator set stays set.
	adminMAC, _ := net.ParseMAC("02:00:00:00:00:99")
	if err := e.Host.Links().SetMAC(pf0, 1, adminMAC); err != nil {
		t.Fatal(err)
	}
	if r := prepareOne(t, s, withMAC); r.Err != nil {
		t.Fatal(r.Err)
	}
	if d := s.Snapshot().Claims[withMAC.UID].Devices[0]; d.Original.MAC.String() != adminMAC.String() || d.OriginalOwnMAC != "" {
		t.Fatalf("administrative MAC recorded as %s (own %q)", d.Original.MAC, d.OriginalOwnMAC)
	}
	if err := unprepareOne(t, s, withMAC); err != nil {
		t.Fatal(err)
	}
	if m := admin(); m.String() != adminMAC.String() {
		t.Fatalf("administrative MAC after the round trip: %s, want %s", m, adminMAC)
	}
}

// linkLog records, for every PF-side set, the driver the VF was bound to.
type linkLog struct {
	vflink.Links
	sysfs *sysfs.Host
	vfs   map[int]string // VF index of pf0 -> address
	mu    sync.Mutex
	sets  []string
}

func (l *linkLog) note(op string, vf int) {
	drv := "?"
	if fn, err := l.sysfs.Function(l.vfs[vf]); err == nil {
		drv = fn.Driver
	}
	l.mu.Lock()
	l.sets = append(l.sets, fmt.Sprintf("%s vf %d on %q", op, vf, drv))
	l.mu.Unlock()
}

func (l *linkLog) SetMAC(pf string, vf int, mac net.HardwareAddr) error {
	l.note("mac", vf)
	return l.Links.SetMAC(pf, vf, mac)
}

func (l *linkLog) SetVLAN(pf string, vf, vlan, qos int, proto string) error {
	l.note("vlan", vf)
	return l.Links.SetVLAN(pf, vf, vlan, qos, proto)
}

func (l *linkLog) SetSpoofChk(pf string, vf int, on bool) error {
	l.note("spoofchk", vf)
	return l.Links.SetSpoofChk(pf, vf, on)
}

func (l *linkLog) SetTrust(pf string, vf int, on bool) error {
	l.note("trust", vf)
	return l.Links.SetTrust(pf, vf, on)
}

func (l *linkLog) SetLinkState(pf string, vf int, state string) error {
	l.note("state", vf)
	return l.Links.SetLinkState(pf, vf, state)
}

func (l *linkLog) SetRate(pf string, vf, minMbps, maxMbps int) error {
	l.note("rate", vf)
	return l.Links.SetRate(pf, vf, minMbps, maxMbps)
}

// Prepare binds the VF to vfio-pci first and applies its settings through
// the PF while no VF driver is bound; unprepare restores them before the
// original driver is bound again. Every set happens with the VF on
// vfio-pci, in both directions.
func TestSettingsAppliedWhileOnVFIO(t *testing.T) {
	t.Parallel()
	e := preparetest.NewEnv(t, "", simhost.E810Host())
	log := &linkLog{Links: e.Host.Links(), sysfs: e.Host.Sysfs(), vfs: map[int]string{1: vf1BDF, 2: "0000:3b:02.2"}}
	opts := e.Options(nil)
	opts.Links = log
	s, err := prepare.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	c := preparetest.Claim("ns", "c", "uid-c", []string{vf1, "vf-0000-3b-02-2"},
		preparetest.Config(fromClass, `{`+hdr+`,"mac":"02:00:00:00:00:41","vlan":9,"qos":2,"spoofChk":false,"trust":true,"linkState":"enable","maxTxRateMbps":500}`))
	e.AddClaim(t, c)
	before := e.Snapshot(t)
	if r := prepareOne(t, s, c); r.Err != nil {
		t.Fatal(r.Err)
	}
	prepared := len(log.sets)
	if err := unprepareOne(t, s, c); err != nil {
		t.Fatal(err)
	}
	if prepared < 12 || len(log.sets) < 2*prepared {
		t.Fatalf("%d sets in prepare, %d in all: %v", prepared, len(log.sets), log.sets)
	}
	for i, s := range log.sets {
		if !strings.HasSuffix(s, `on "vfio-pci"`) {
			phase := "prepare"
			if i >= prepared {
				phase = "unprepare"
			}
			t.Errorf("%s: %s, want every set while the VF is on vfio-pci", phase, s)
		}
	}
	if got := e.Snapshot(t); got.String() != before.String() {
		t.Fatalf("host after unprepare:\n%s\nwant\n%s", got, before)
	}
}

// Intel PF drivers reset the VF for every MAC, VLAN and trust change, and
// after every VF driver change, and refuse settings meanwhile (EBUSY on
// ice). Prepare and unprepare ride that out within the retry bound and end
// with every setting read back; a VF that never leaves reset fails prepare
// after the bound, naming the setting, and the claim is rolled back.
func TestPrepareRidesOutVFResets(t *testing.T) {
	t.Parallel()
	clk := clocktesting.NewFakeClock(time.Unix(5000, 0))
	e := preparetest.NewEnv(t, "", simhost.E810Host(), simhost.WithClock(clk))
	e.Host.SetVFResets(simhost.VFResets{Window: 400 * time.Millisecond})
	opts := e.Options(nil)
	opts.Clock = clk
	s, err := prepare.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	c := preparetest.Claim("ns", "r", "uid-r", []string{vf1, "vf-0000-3b-02-2"},
		preparetest.Config(fromClass, `{`+hdr+`,"mac":"02:00:00:00:00:51","vlan":11,"spoofChk":false,"trust":true,"maxTxRateMbps":300}`))
	e.AddClaim(t, c)
	before := e.Snapshot(t)
	start := clk.Now()
	if r := prepareOne(t, s, c); r.Err != nil {
		t.Fatal(r.Err)
	}
	if clk.Since(start) < 400*time.Millisecond {
		t.Fatalf("prepare waited %s on the clock: it never met a VF reset", clk.Since(start))
	}
	for _, vf := range []int{1, 2} {
		st, err := e.Host.VFState(pf0, vf)
		if err != nil || st.MAC.String() != "02:00:00:00:00:51" || st.VLAN != 11 || st.SpoofChk || !st.Trust || st.MaxTxRateMbps != 300 {
			t.Fatalf("vf %d after prepare: %+v %v", vf, st, err)
		}
	}
	clk.Step(time.Second)
	if err := unprepareOne(t, s, c); err != nil {
		t.Fatal(err)
	}
	if got := e.Snapshot(t); got.String() != before.String() {
		t.Fatalf("host after unprepare:\n%s\nwant\n%s", got, before)
	}

	// A VF stuck in reset: prepare gives up after the bound and undoes.
	e.Host.Links().Fail(simhost.OpSetVLAN, syscall.EBUSY, -1)
	clk.Step(time.Second)
	start = clk.Now()
	r := prepareOne(t, s, c)
	if r.Err == nil {
		t.Fatal("prepare succeeded with the VF stuck in reset")
	}
	waited := clk.Since(start)
	if !errors.Is(r.Err, syscall.EBUSY) && !strings.Contains(r.Err.Error(), "EBUSY") {
		t.Fatalf("error %v does not carry EBUSY", r.Err)
	}
	for _, w := range []string{"vlan 11", "the VF is being reset", "did not come out of reset", "undone"} {
		if !strings.Contains(r.Err.Error(), w) {
			t.Errorf("error %q lacks %q", r.Err, w)
		}
	}
	if waited < vflink.DefaultRetryTimeout || waited > 2*vflink.DefaultRetryTimeout+2*time.Second {
		t.Fatalf("gave up after %s on the clock, want about %s", waited, vflink.DefaultRetryTimeout)
	}
	if got := e.Snapshot(t); got.String() != before.String() {
		t.Fatalf("host after the failed prepare:\n%s\nwant\n%s", got, before)
	}
}

// i40e raises a rate limit under 50 Mbps to one 50 Mbps credit. That is
// the setting applied, not a failure: prepare succeeds, and a repeated
// prepare finds nothing to redo.
func TestI40ERoundedRateIsApplied(t *testing.T) {
	t.Parallel()
	e := preparetest.NewEnv(t, "", simhost.PFDriverHost())
	log := &linkLog{Links: e.Host.Links(), sysfs: e.Host.Sysfs(), vfs: map[int]string{0: "0000:5e:02.0"}}
	opts := e.Options(nil)
	opts.Links = log
	s, err := prepare.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	c := preparetest.Claim("ns", "i40e", "uid-i40e", []string{"vf-0000-5e-02-0"}, preparetest.Config(fromClaim, `{`+hdr+`,"maxTxRateMbps":10}`))
	e.AddClaim(t, c)
	if r := prepareOne(t, s, c); r.Err != nil {
		t.Fatal(r.Err)
	}
	if st, err := e.Host.VFState("enp94s0f0", 0); err != nil || st.MaxTxRateMbps != 50 {
		t.Fatalf("i40e VF rate %+v %v, want 50", st, err)
	}
	sets := len(log.sets)
	if r := prepareOne(t, s, c); r.Err != nil {
		t.Fatal(r.Err)
	}
	if n := len(log.sets) - sets; n != 0 {
		t.Fatalf("repeated prepare set the VF again: %v", log.sets[sets:])
	}
	if err := unprepareOne(t, s, c); err != nil {
		t.Fatal(err)
	}
}

// With the PF's sriov_drivers_autoprobe at 0 the kernel binds a VF only
// through driver_override (pci_device_can_probe); unprepare still gives the
// VF back to its driver and leaves no override (seen on 6.1 and 6.12).
func TestUnprepareOnPFWithoutAutoprobe(t *testing.T) {
	t.Parallel()
	e := preparetest.NewEnv(t, "", simhost.E810Host())
	if err := e.Host.Kernel().WriteFile("bus/pci/devices/0000:3b:00.0/sriov_drivers_autoprobe", []byte("0\n")); err != nil {
		t.Fatal(err)
	}
	s := e.NewState(t, nil)
	c := preparetest.Claim("ns", "ap", "uid-ap", []string{vf1}, preparetest.Config(fromClaim, `{`+hdr+`,"vlan":5}`))
	e.AddClaim(t, c)
	before := e.Snapshot(t)
	if r := prepareOne(t, s, c); r.Err != nil {
		t.Fatal(r.Err)
	}
	if err := unprepareOne(t, s, c); err != nil {
		t.Fatal(err)
	}
	if got := e.Snapshot(t); got.String() != before.String() {
		t.Fatalf("host after unprepare:\n%s\nwant\n%s", got, before)
	}
}
