package simhost

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path"
	"path/filepath"
	"syscall"
	"time"

	"k8s.io/utils/clock"
)

// vfRuntime is what a PF driver knows about one VF besides the settings an
// administrator made through it: the MAC the VF's own driver chose and
// reported (igbvf, iavf and bnxt VFs pick a random one when the PF gave
// none), and until when the VF is being reset. It is kept per VF address
// in .simhost/vfruntime.json, beside the settings in vflinks.json.
type vfRuntime struct {
	// OwnMAC is the MAC the VF driver reported for itself; the PF shows it
	// while no MAC is administratively set (igb's vf_mac_addresses, ice and
	// bnxt report the VF's address). Nil: none.
	OwnMAC net.HardwareAddr `json:"ownMac,omitempty"`
	// ResetUntil is when the VF's current reset ends (Unix nanoseconds on
	// the host's clock; 0: not in reset).
	ResetUntil int64 `json:"resetUntil,omitempty"`
}

// VFResets makes the simulated PF drivers reset a VF the way Intel's do,
// and refuse settings while the reset runs: every change of the
// administrative MAC, VLAN or trust, and every VF function reset (a VF
// driver bound or unbound), puts the VF in reset for Window; a VF setting
// made meanwhile fails with EAGAIN on i40e ("VF %d still in reset. Try
// again.") and EBUSY on the other drivers (ice_check_vf_ready_for_cfg).
// Reading the VF's settings works throughout. The zero value is off.
type VFResets struct {
	Window time.Duration
	// Errno, if set, replaces the per-driver errno.
	Errno syscall.Errno
}

// SetVFResets turns reset windows on (or off with the zero value) for
// calls made through this Host (like FailWrite, it is not stored in the
// tree: another process opening the host sets its own).
func (h *Host) SetVFResets(r VFResets) {
	unlock := h.lock()
	defer unlock()
	h.resets = r
}

// WithClock makes the host read time from c (reset windows; the VFIO node
// delay keeps using real timers). Tests pass a fake clock they also give
// the code under test, so waiting for a reset needs no sleeping.
func WithClock(c clock.PassiveClock) Option { return func(o *options) { o.clock = c } }

func (h *Host) runtimePath() string { return filepath.Join(h.t.root, stateDir, "vfruntime.json") }

// loadRuntime reads the per-VF runtime state (caller holds the lock).
func (h *Host) loadRuntime() (map[string]vfRuntime, error) {
	m := map[string]vfRuntime{}
	b, err := os.ReadFile(h.runtimePath())
	if errors.Is(err, fs.ErrNotExist) {
		return m, nil
	}
	if err != nil {
		return nil, err
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("simulated VF runtime state %s is corrupt: %w", h.runtimePath(), err)
	}
	return m, nil
}

// changeRuntime applies fn to the runtime state of the VF at bdf and
// stores it (caller holds the lock). An entry left empty is dropped.
func (h *Host) changeRuntime(bdf string, fn func(r *vfRuntime)) error {
	if bdf == "" {
		return nil
	}
	m, err := h.loadRuntime()
	if err != nil {
		return err
	}
	r := m[bdf]
	before, _ := json.Marshal(r)
	fn(&r)
	after, _ := json.Marshal(r)
	if string(before) == string(after) {
		return nil
	}
	if r.OwnMAC == nil && r.ResetUntil == 0 {
		delete(m, bdf)
	} else {
		m[bdf] = r
	}
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	return writeAtomic(h.runtimePath(), b)
}

func (h *Host) runtimeOf(bdf string) vfRuntime {
	if bdf == "" {
		return vfRuntime{}
	}
	m, err := h.loadRuntime()
	if err != nil {
		return vfRuntime{}
	}
	return m[bdf]
}

// startReset puts the VF at bdf in reset for the configured window.
func (h *Host) startReset(bdf string) error {
	if h.resets.Window <= 0 {
		return nil
	}
	until := h.clock.Now().Add(h.resets.Window).UnixNano()
	return h.changeRuntime(bdf, func(r *vfRuntime) { r.ResetUntil = until })
}

// inReset is the errno a setting of the VF at bdf (PF driver pfDriver)
// fails with now, or nil.
func (h *Host) inReset(bdf, pfDriver string) error {
	if h.resets.Window <= 0 {
		return nil
	}
	r := h.runtimeOf(bdf)
	if r.ResetUntil == 0 || h.clock.Now().UnixNano() >= r.ResetUntil {
		return nil
	}
	if h.resets.Errno != 0 {
		return h.resets.Errno
	}
	if pfDriver == DriverI40E {
		return syscall.EAGAIN
	}
	return syscall.EBUSY
}

// vfDriverProbed is the PF's side of a VF driver probing the VF at bdf
// (dir): the function reset, and a network VF driver that got no MAC from
// the PF reporting the one it chose for itself (the VF netdev's address).
// A VF created by SR-IOV enable is probed without this: a VF nobody rebound
// reads MAC 00:00:00:00:00:00 through the PF (seen with igb/igbvf on 6.1).
func (h *Host) vfDriverProbed(drv, bdf, dir string) error {
	pf, i := h.vfOf(bdf)
	if pf == nil {
		return nil
	}
	if err := h.startReset(bdf); err != nil {
		return err
	}
	if !isNetDriver(drv) {
		return nil
	}
	if st, ok := h.links.peek(pf.NetDev, i); ok && !isZeroMAC(st.MAC) {
		return nil // the VF driver takes the administrator's MAC
	}
	ents, _ := os.ReadDir(h.t.abs(dir + "/net"))
	for _, e := range ents {
		addr, err := h.t.read(dir + "/net/" + e.Name() + "/address")
		if err != nil {
			continue
		}
		mac, err := net.ParseMAC(addr)
		if err != nil {
			continue
		}
		return h.changeRuntime(bdf, func(r *vfRuntime) { r.OwnMAC = mac })
	}
	return nil
}

// vfDriverReleased is the PF's side of a VF driver letting go of the VF.
// The PF keeps showing the MAC the driver chose: igb forgets it only on a
// function-level reset (igb_vf_reset_event), which neither an unbind nor a
// bind to vfio-pci causes (seen on the real kernel: test/kernel/scenario).
func (h *Host) vfDriverReleased(bdf string) error {
	if pf, _ := h.vfOf(bdf); pf == nil {
		return nil
	}
	return h.startReset(bdf)
}

// forgetRuntime drops what the PF knew about a VF that is removed.
func (h *Host) forgetRuntime(bdf string) error {
	return h.changeRuntime(bdf, func(r *vfRuntime) { *r = vfRuntime{} })
}

// vfAddr is the address of VF vf of the PF at pfDir ("" if none).
func (h *Host) vfAddr(pfDir string, vf int) string {
	d, err := h.t.readlink(pfDir + "/virtfn" + fmt.Sprint(vf))
	if err != nil {
		return ""
	}
	return path.Base(d)
}
