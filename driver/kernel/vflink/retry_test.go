package vflink_test

import (
	"errors"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/vfnet-io/vfnet/driver/kernel/vflink"
	"github.com/vfnet-io/vfnet/test/lib/simhost"
)

// counting counts the calls that reach the PF.
type counting struct {
	vflink.Links
	sets int
}

func (c *counting) SetTrust(pf string, vf int, on bool) error {
	c.sets++
	return c.Links.SetTrust(pf, vf, on)
}

func (c *counting) SetMAC(pf string, vf int, mac net.HardwareAddr) error {
	c.sets++
	return c.Links.SetMAC(pf, vf, mac)
}

func newHost(t *testing.T, spec simhost.Spec, clk *clocktesting.FakeClock) *simhost.Host {
	t.Helper()
	h, err := simhost.Build(simhost.TempDir(t), spec, simhost.WithClock(clk))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return h
}

// Every MAC, VLAN and trust change resets the VF on Intel PFs and the next
// change fails with EBUSY/EAGAIN until the reset is over; Retrying waits
// it out (on a fake clock: nothing sleeps) and the settings stick.
func TestRetryingRidesOutResets(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ name, pf string }{{"ice", "enp59s0f0"}, {"i40e", "enp94s0f0"}} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
			h := newHost(t, simhost.PFDriverHost(), clk)
			h.SetVFResets(simhost.VFResets{Window: 300 * time.Millisecond})
			cnt := &counting{Links: h.Links()}
			r := vflink.Retrying{Links: cnt, Clock: clk}
			start := clk.Now()
			mac, _ := net.ParseMAC("02:00:00:00:00:07")
			if err := r.SetMAC(c.pf, 1, mac); err != nil {
				t.Fatal(err)
			}
			// Straight after the MAC change the VF is in reset.
			if err := h.Links().SetTrust(c.pf, 1, true); !vflink.Transient(err) {
				t.Fatalf("unwrapped set during the reset: %v, want EBUSY/EAGAIN", err)
			}
			cnt.sets = 0
			if err := r.SetTrust(c.pf, 1, true); err != nil {
				t.Fatal(err)
			}
			if cnt.sets < 2 {
				t.Fatalf("trust went through in %d attempt(s); the reset window was not hit", cnt.sets)
			}
			if waited := clk.Since(start); waited < 300*time.Millisecond || waited > vflink.DefaultRetryTimeout {
				t.Fatalf("waited %s on the clock, want the 300ms reset and less than the timeout", waited)
			}
			st, err := h.VFState(c.pf, 1)
			if err != nil || st.MAC.String() != mac.String() || !st.Trust {
				t.Fatalf("VF state %+v %v", st, err)
			}
		})
	}
	// A few transient failures of any kind are ridden out too.
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	h := newHost(t, simhost.E810Host(), clk)
	h.Links().Fail(simhost.OpSetSpoofChk, syscall.EAGAIN, 3)
	if err := (vflink.Retrying{Links: h.Links(), Clock: clk}).SetSpoofChk("enp59s0f0", 2, false); err != nil {
		t.Fatal(err)
	}
}

// A VF that never comes out of reset is given up on after the timeout
// (about 2 s), with the kernel's error and how long it was tried.
func TestRetryingGivesUpInTime(t *testing.T) {
	t.Parallel()
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	h := newHost(t, simhost.E810Host(), clk)
	h.Links().Fail(simhost.OpSetTrust, syscall.EBUSY, -1)
	cnt := &counting{Links: h.Links()}
	start := clk.Now()
	err := vflink.Retrying{Links: cnt, Clock: clk}.SetTrust("enp59s0f0", 0, true)
	if !errors.Is(err, syscall.EBUSY) || !strings.Contains(err.Error(), "did not come out of reset") {
		t.Fatalf("got %v, want EBUSY after the timeout", err)
	}
	if waited := clk.Since(start); waited != vflink.DefaultRetryTimeout {
		t.Fatalf("gave up after %s on the clock, want %s", waited, vflink.DefaultRetryTimeout)
	}
	// 10ms doubling to 200ms: 10+20+40+80+160 = 310ms, then 200ms steps.
	if cnt.sets < 5 || cnt.sets > 20 {
		t.Fatalf("%d attempts in %s", cnt.sets, vflink.DefaultRetryTimeout)
	}
	// A shorter bound is honoured.
	start = clk.Now()
	_ = vflink.Retrying{Links: h.Links(), Clock: clk, Timeout: 300 * time.Millisecond}.SetTrust("enp59s0f0", 0, true)
	if waited := clk.Since(start); waited != 300*time.Millisecond {
		t.Fatalf("Timeout 300ms: gave up after %s", waited)
	}
}

// A driver's refusal is its answer: returned after one attempt, no waiting.
// A set that succeeds but does not read back is NotApplied, once the time
// is up.
func TestRetryingReturnsRefusalsAtOnce(t *testing.T) {
	t.Parallel()
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	h := newHost(t, simhost.PFDriverHost(), clk)
	r := vflink.Retrying{Links: h.Links(), Clock: clk}
	start := clk.Now()
	for name, err := range map[string]error{
		"igb link state": r.SetLinkState("ens3", 0, vflink.LinkStateEnable),
		"igb 802.1ad":    r.SetVLAN("ens3", 0, 10, 0, vflink.VLANProto8021AD),
		"bad VF index":   r.SetSpoofChk("enp59s0f0", 99, false),
		"unknown PF":     r.SetSpoofChk("nosuch", 0, false),
	} {
		if err == nil || vflink.Transient(err) {
			t.Errorf("%s: %v, want the refusal", name, err)
		}
	}
	if clk.Since(start) != 0 {
		t.Fatalf("refusals waited %s", clk.Since(start))
	}
	// A PF that accepts a value and reports another: NotApplied.
	lying := lyingLinks{Links: h.Links()}
	err := vflink.Retrying{Links: lying, Clock: clk}.SetTrust("enp59s0f0", 0, true)
	var na *vflink.NotAppliedError
	if !errors.As(err, &na) || !errors.Is(err, vflink.ErrNotApplied) || na.Setting != vflink.SettingTrust || na.Want != "true" || na.Got != "false" {
		t.Fatalf("got %v, want NotApplied for trust", err)
	}
	if !strings.Contains(err.Error(), "enp59s0f0 vf 0: trust was set to true, but the PF reports false") {
		t.Fatalf("message: %v", err)
	}
}

// lyingLinks accepts trust without applying it.
type lyingLinks struct{ vflink.Links }

func (lyingLinks) SetTrust(string, int, bool) error { return nil }

// i40e raises a rate limit under 50 Mbps to 50: that counts as applied;
// any other difference does not.
func TestRateApplied(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		want, got int
		ok        bool
	}{{100, 100, true}, {0, 0, true}, {10, 50, true}, {49, 50, true}, {10, 60, false}, {100, 50, false}, {0, 50, false}, {4294967396, 100, false}} {
		if vflink.RateApplied(c.want, c.got) != c.ok {
			t.Errorf("RateApplied(%d, %d) = %v", c.want, c.got, !c.ok)
		}
	}
}
