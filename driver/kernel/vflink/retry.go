package vflink

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"syscall"
	"time"

	"k8s.io/utils/clock"
)

// DefaultRetryTimeout bounds how long Retrying keeps trying one setting.
// Intel PF drivers reset a VF to apply a MAC, VLAN or trust change and
// refuse further changes until the reset is over ("VF %d still in reset.
// Try again.", EAGAIN on i40e; EBUSY on ice); a reset takes well under a
// second, so about 2 s rides out a few in a row without hiding a VF that
// never comes out of reset.
const DefaultRetryTimeout = 2 * time.Second

// defaultRetryInterval is the first wait; it doubles up to maxRetryInterval.
const (
	defaultRetryInterval = 10 * time.Millisecond
	maxRetryInterval     = 200 * time.Millisecond
)

// i40eMinRateMbps is the smallest rate limit i40e applies: it raises a
// smaller non-zero limit to one 50 Mbps credit (i40e_ndo_set_vf_bw).
const i40eMinRateMbps = 50

// ErrNotApplied marks a setting the PF accepted but does not report back.
var ErrNotApplied = errors.New("VF setting not applied")

// NotAppliedError is a set that succeeded without the PF then reporting
// the value: the PF driver dropped or changed it.
type NotAppliedError struct {
	PF      string
	VF      int
	Setting Setting
	Want    string
	Got     string
}

func (e *NotAppliedError) Error() string {
	return fmt.Sprintf("PF %s vf %d: %s was set to %s, but the PF reports %s: the PF driver did not apply it (its kernel log may say why)",
		e.PF, e.VF, e.Setting, e.Want, e.Got)
}

// Is makes errors.Is(err, ErrNotApplied) true.
func (e *NotAppliedError) Is(target error) bool { return target == ErrNotApplied }

// Transient reports whether err is a PF driver's "busy, try again": the VF
// is being reset (EBUSY, EAGAIN).
func Transient(err error) bool {
	return errors.Is(err, syscall.EBUSY) || errors.Is(err, syscall.EAGAIN)
}

// Retrying wraps Links so that every VF setting rides out VF resets, as
// sriov-cni does: a set failing with EBUSY/EAGAIN is repeated until it
// works or Timeout has passed, and a set is done only when reading the
// VF back through the PF shows the value (otherwise *NotAppliedError).
// Any other error (the driver refusing the setting) is returned at once.
type Retrying struct {
	Links Links
	// Clock measures the timeout and waits between attempts (nil: the
	// real clock). Tests pass a fake one so nothing sleeps.
	Clock clock.Clock
	// Timeout bounds the attempts of one set (0: DefaultRetryTimeout).
	Timeout time.Duration
}

var _ Links = Retrying{}

func (r Retrying) clock() clock.Clock {
	if r.Clock == nil {
		return clock.RealClock{}
	}
	return r.Clock
}

// do runs op until it succeeds, fails for good or the time is up. check
// (nil for reads) verifies a successful set by a fresh read; it returns a
// *NotAppliedError when the PF shows something else.
func (r Retrying) do(pf string, vf int, op func() error, check func(VFState) error) error {
	c := r.clock()
	timeout := r.Timeout
	if timeout <= 0 {
		timeout = DefaultRetryTimeout
	}
	deadline := c.Now().Add(timeout)
	wait := defaultRetryInterval
	for attempt := 1; ; attempt++ {
		err := op()
		if err == nil && check != nil {
			var st VFState
			if st, err = r.Links.VF(pf, vf); err == nil {
				err = check(st)
			}
		}
		if err == nil {
			return nil
		}
		// A read-back that differs may be a reset still in progress:
		// retried like EBUSY. Anything else is the driver's answer.
		if !Transient(err) && !errors.Is(err, ErrNotApplied) {
			return err
		}
		left := deadline.Sub(c.Now())
		if left <= 0 {
			return fmt.Errorf("%w (still so after %d attempts in %s; the VF did not come out of reset)", err, attempt, timeout)
		}
		c.Sleep(min(wait, left))
		wait = min(2*wait, maxRetryInterval)
	}
}

// Resolve implements Links (a lookup has no reset to wait for).
func (r Retrying) Resolve(name string) (Netdev, error) { return r.Links.Resolve(name) }

// VF implements Links.
func (r Retrying) VF(pf string, vf int) (VFState, error) {
	var st VFState
	err := r.do(pf, vf, func() error {
		var err error
		st, err = r.Links.VF(pf, vf)
		return err
	}, nil)
	return st, err
}

func notApplied(pf string, vf int, s Setting, want, got string) error {
	return &NotAppliedError{PF: pf, VF: vf, Setting: s, Want: want, Got: got}
}

// SetMAC implements Links.
func (r Retrying) SetMAC(pf string, vf int, mac net.HardwareAddr) error {
	return r.do(pf, vf, func() error { return r.Links.SetMAC(pf, vf, mac) }, func(st VFState) error {
		if !bytes.Equal(st.MAC, mac) {
			return notApplied(pf, vf, SettingMAC, mac.String(), st.MAC.String())
		}
		return nil
	})
}

func protoOrDefault(p string) string {
	if p == "" {
		return VLANProto8021Q
	}
	return p
}

// SetVLAN implements Links.
func (r Retrying) SetVLAN(pf string, vf int, vlan, qos int, proto string) error {
	return r.do(pf, vf, func() error { return r.Links.SetVLAN(pf, vf, vlan, qos, proto) }, func(st VFState) error {
		if st.VLAN != vlan || st.QoS != qos || protoOrDefault(st.VLANProto) != protoOrDefault(proto) {
			return notApplied(pf, vf, SettingVLAN,
				fmt.Sprintf("vlan %d qos %d proto %s", vlan, qos, protoOrDefault(proto)),
				fmt.Sprintf("vlan %d qos %d proto %s", st.VLAN, st.QoS, protoOrDefault(st.VLANProto)))
		}
		return nil
	})
}

// SetSpoofChk implements Links.
func (r Retrying) SetSpoofChk(pf string, vf int, on bool) error {
	return r.do(pf, vf, func() error { return r.Links.SetSpoofChk(pf, vf, on) }, func(st VFState) error {
		if st.SpoofChk != on {
			return notApplied(pf, vf, SettingSpoofChk, fmt.Sprint(on), fmt.Sprint(st.SpoofChk))
		}
		return nil
	})
}

// SetTrust implements Links.
func (r Retrying) SetTrust(pf string, vf int, on bool) error {
	return r.do(pf, vf, func() error { return r.Links.SetTrust(pf, vf, on) }, func(st VFState) error {
		if st.Trust != on {
			return notApplied(pf, vf, SettingTrust, fmt.Sprint(on), fmt.Sprint(st.Trust))
		}
		return nil
	})
}

// SetLinkState implements Links.
func (r Retrying) SetLinkState(pf string, vf int, state string) error {
	return r.do(pf, vf, func() error { return r.Links.SetLinkState(pf, vf, state) }, func(st VFState) error {
		if st.LinkState != state {
			return notApplied(pf, vf, SettingLinkState, state, st.LinkState)
		}
		return nil
	})
}

// RateApplied reports whether a PF showing maximum rate got applied a
// requested maximum of want: exactly, or raised to i40e's smallest limit.
func RateApplied(want, got int) bool {
	return got == want || (want > 0 && want < got && got <= i40eMinRateMbps)
}

// SetRate implements Links.
func (r Retrying) SetRate(pf string, vf int, minMbps, maxMbps int) error {
	return r.do(pf, vf, func() error { return r.Links.SetRate(pf, vf, minMbps, maxMbps) }, func(st VFState) error {
		if st.MinTxRateMbps != minMbps {
			return notApplied(pf, vf, SettingMinTxRate, fmt.Sprint(minMbps), fmt.Sprint(st.MinTxRateMbps))
		}
		if !RateApplied(maxMbps, st.MaxTxRateMbps) {
			return notApplied(pf, vf, SettingMaxTxRate, fmt.Sprint(maxMbps), fmt.Sprint(st.MaxTxRateMbps))
		}
		return nil
	})
}
