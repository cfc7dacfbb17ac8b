// Package checkpoint persists what vfnet-driver changed on the host, per
// claim and device, so that unprepare (possibly in a restarted process) can
// restore every VF exactly and a crash at any step converges.
//
// The file is versioned JSON, replaced atomically: write a temp file in the
// same directory, fsync it, rename it over the old one, fsync the directory.
// Entries are written BEFORE the host is touched.
package checkpoint

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/vfnet-io/vfnet/driver/kernel/vflink"
)

// Version is the only format this code reads and writes.
const Version = 1

// FileName is the checkpoint's name inside the plugin data directory.
const FileName = "checkpoint.json"

// Phase is where a claim is in its life cycle.
type Phase string

const (
	// PhasePreparing: prepare started; devices may be partly set up. A
	// repeated prepare continues it, unprepare undoes it.
	PhasePreparing Phase = "Preparing"
	// PhasePrepared: every device is set up and the CDI spec is written.
	PhasePrepared Phase = "Prepared"
	// PhaseUnpreparing: undo started; the host may be partly restored. A
	// repeated unprepare finishes it, a repeated prepare sets up again.
	PhaseUnpreparing Phase = "Unpreparing"
)

// Step is the last host change made for one device, in order:
// Recorded, BindingVFIO, Applying, Bound. The VF is bound to vfio-pci
// first and its settings are applied through the PF while no VF driver is
// bound (a VF driver would see the resets they cause).
//
// Configuring and Binding are the steps of the order used before (settings
// first, then the bind); they are still understood so that an entry
// written by an older driver is finished or undone correctly.
type Step string

const (
	// StepRecorded: originals are saved; the host is untouched.
	StepRecorded Step = "Recorded"
	// StepBindingVFIO: the VF is being moved to vfio-pci; its settings are
	// untouched.
	StepBindingVFIO Step = "BindingVFIO"
	// StepApplying: the VF is on vfio-pci and the claim's settings are
	// being applied through the PF.
	StepApplying Step = "Applying"
	// StepBound: the VF is bound to vfio-pci with its settings applied and
	// its group node exists.
	StepBound Step = "Bound"

	// StepConfiguring (older order): settings are being applied, the VF is
	// not being moved yet.
	StepConfiguring Step = "Configuring"
	// StepBinding (older order): settings are applied, the VF is being
	// moved to vfio-pci.
	StepBinding Step = "Binding"
)

// Valid reports whether s is a step this code knows.
func (s Step) Valid() bool {
	switch s {
	case StepRecorded, StepBindingVFIO, StepApplying, StepBound, StepConfiguring, StepBinding:
		return true
	}
	return false
}

// SettingsTouched reports whether the VF's link settings may differ from
// the originals (undo restores them).
func (s Step) SettingsTouched() bool {
	switch s {
	case StepApplying, StepBound, StepConfiguring, StepBinding:
		return true
	}
	return false
}

// DriverTouched reports whether the VF may have left its original driver
// (undo gives it back).
func (s Step) DriverTouched() bool {
	switch s {
	case StepBindingVFIO, StepApplying, StepBound, StepBinding:
		return true
	}
	return false
}

// Device is one prepared (or being prepared) VF.
type Device struct {
	// Request is the allocation result's request (maybe "req/subreq").
	Request string `json:"request"`
	Pool    string `json:"pool"`
	Device  string `json:"device"`

	BDF       string `json:"bdf"`
	PFAddress string `json:"pfAddress"`
	PFNetDev  string `json:"pfNetDev"`
	VFIndex   int    `json:"vfIndex"`

	Step Step `json:"step"`

	// OriginalDriver is the driver bound before prepare ("" = none).
	OriginalDriver string `json:"originalDriver"`
	// OriginalOverride is driver_override before prepare ("" = none).
	OriginalOverride string `json:"originalOverride"`
	// Original is the VF's link state before prepare: what an
	// administrator set through the PF. A MAC all zeros means none was
	// set, and undo leaves it so.
	Original vflink.VFState `json:"original"`
	// OriginalOwnMAC is the MAC the PF reported before prepare when it was
	// not an administrative one but the one the VF's own driver chose (its
	// netdev's addr_assign_type said so); kept for diagnostics, never
	// restored.
	OriginalOwnMAC string `json:"originalOwnMac,omitempty"`
	// MACSet is true when prepare sets the MAC (VFConfig.mac or the VM's
	// interface); otherwise the VF keeps its administrative MAC.
	MACSet bool `json:"macSet,omitempty"`
	// Applied is the VF link state prepare sets.
	Applied vflink.VFState `json:"applied"`

	// Failover marks a device of a request whose VFConfig asks for a
	// virtio-net failover pair; only its MAC is ever parked.
	Failover bool `json:"failover,omitempty"`
	// MACParked: the VF's MAC is held at zero instead of Applied.MAC,
	// because the VF is out of the guest (a migration target before its
	// attach, a source after its detach) and the NIC must steer the VM's
	// frames to the PF, where the standby path is. It is written before
	// the host is changed; a restarted driver makes the VF match it.
	MACParked bool `json:"macParked,omitempty"`

	// IOMMUGroup and DevNode ("vfio/42" or "vfio/noiommu-42", relative to
	// the dev root) are known once the VF is bound to vfio-pci.
	IOMMUGroup string `json:"iommuGroup,omitempty"`
	DevNode    string `json:"devNode,omitempty"`

	// Failover standby plumbing (VFConfig.failover): what the NRI plugin
	// (driver/standby) needs to connect the standby tap in the launcher
	// pod, recorded at prepare so that a restarted driver still knows it.
	// nil for a device without failover. Replaced whole, never changed in
	// place (Clone shares it).
	Standby *Standby `json:"standby,omitempty"`
}

// Standby is what a failover device's standby plumbing needs.
type Standby struct {
	// PodUIDs are the pods reserving the claim at prepare (the launcher).
	PodUIDs []types.UID `json:"podUIDs"`
	// Interface is the VMI interface name; the tap is
	// pkg/contract/standby.TargetDev(Interface).
	Interface string `json:"interface"`
	// MAC is the VF's fixed MAC, which the standby shares.
	MAC string `json:"mac"`
	// Bridge is the node bridge (nodeconfig standby.bridge) the standby's
	// veth joins.
	Bridge string `json:"bridge"`
}

// Wanted is the VF link state the device should have now: Applied, with
// the MAC zeroed while it is parked.
func (d Device) Wanted() vflink.VFState {
	w := d.Applied
	if d.MACParked && len(w.MAC) > 0 {
		w.MAC = make(net.HardwareAddr, len(w.MAC))
	}
	return w
}

// Claim is one claim's entry.
type Claim struct {
	Namespace string   `json:"namespace"`
	Name      string   `json:"name"`
	Phase     Phase    `json:"phase"`
	Devices   []Device `json:"devices"`
}

// File is the whole checkpoint.
type File struct {
	Version int                  `json:"version"`
	Claims  map[types.UID]*Claim `json:"claims"`
}

// Clone returns a deep copy, so callers can hand out snapshots.
func (f *File) Clone() *File {
	out := &File{Version: f.Version, Claims: make(map[types.UID]*Claim, len(f.Claims))}
	for uid, c := range f.Claims {
		cc := *c
		cc.Devices = append([]Device(nil), c.Devices...)
		out.Claims[uid] = &cc
	}
	return out
}

// Store reads and writes the checkpoint file at Path.
type Store struct{ Path string }

// ErrCorrupt marks a checkpoint that cannot be trusted.
var ErrCorrupt = errors.New("checkpoint unusable")

// Load reads the checkpoint. A missing file is an empty checkpoint. A file
// that does not parse or has another version is an error wrapping
// ErrCorrupt: guessing would risk leaving VFs on vfio-pci or handing them
// to two claims.
func (s Store) Load() (*File, error) {
	// Temp files of an interrupted write are not removed here: another
	// driver instance (rolling update) may be writing one right now. The
	// driver removes old ones at start-up (RemoveStaleTemps).
	data, err := os.ReadFile(s.Path)
	if errors.Is(err, fs.ErrNotExist) {
		return &File{Version: Version, Claims: map[types.UID]*Claim{}}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read checkpoint %s: %w", s.Path, err)
	}
	const fix = "the driver cannot tell which VFs it changed; check the VFs listed in it (driver, driver_override, `ip link show <pf>`), restore them by hand if needed, then move the file away and restart vfnet-driver"
	var probe struct {
		Version *int `json:"version"`
	}
	if err := json.Unmarshal(data, &probe); err != nil || probe.Version == nil {
		if err == nil {
			err = errors.New("no version field")
		}
		return nil, fmt.Errorf("%w: checkpoint %s is corrupt (%v): %s", ErrCorrupt, s.Path, err, fix)
	}
	if *probe.Version != Version {
		return nil, fmt.Errorf("%w: checkpoint %s has version %d, this vfnet-driver reads version %d: run the driver version that wrote it to unprepare its claims, or %s", ErrCorrupt, s.Path, *probe.Version, Version, fix)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var f File
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("%w: checkpoint %s is corrupt (%v): %s", ErrCorrupt, s.Path, err, fix)
	}
	if f.Claims == nil {
		f.Claims = map[types.UID]*Claim{}
	}
	for uid, c := range f.Claims {
		if c == nil || (c.Phase != PhasePreparing && c.Phase != PhasePrepared && c.Phase != PhaseUnpreparing) {
			return nil, fmt.Errorf("%w: checkpoint %s is corrupt (claim %s has no valid phase): %s", ErrCorrupt, s.Path, uid, fix)
		}
		for _, d := range c.Devices {
			if d.BDF == "" || !d.Step.Valid() {
				return nil, fmt.Errorf("%w: checkpoint %s is corrupt (claim %s device %q has no BDF or step): %s", ErrCorrupt, s.Path, uid, d.Device, fix)
			}
		}
	}
	return &f, nil
}

// Save replaces the checkpoint atomically and durably.
func (s Store) Save(f *File) error {
	f.Version = Version
	data, err := json.MarshalIndent(f, "", " ")
	if err != nil {
		return fmt.Errorf("encode checkpoint %s: %w", s.Path, err)
	}
	return WriteFileAtomic(s.Path, data, 0o600)
}

// TempGlob matches the temporaries WriteFileAtomic creates for a file
// named name (the kubeletplugin helper uses the same scheme for its
// metadata files and specs).
func TempGlob(name string) string { return "." + name + ".*.tmp" }

// RemoveStaleTemps removes the regular files matching any of globs whose
// last change is older than minAge: temporaries a crash inside a write
// left behind. Younger ones may be another driver instance's write in
// progress (rolling update) and are kept. It returns what it removed and
// the errors it met, joined.
func RemoveStaleTemps(globs []string, minAge time.Duration) ([]string, error) {
	cutoff := time.Now().Add(-minAge)
	var removed []string
	var errs []error
	for _, g := range globs {
		matches, err := filepath.Glob(g)
		if err != nil {
			errs = append(errs, fmt.Errorf("pattern %s: %w", g, err))
			continue
		}
		for _, m := range matches {
			st, err := os.Lstat(m)
			if err != nil || !st.Mode().IsRegular() || !st.ModTime().Before(cutoff) {
				continue
			}
			if err := os.Remove(m); err != nil && !errors.Is(err, fs.ErrNotExist) {
				errs = append(errs, fmt.Errorf("remove stale temporary file: %w", err))
				continue
			}
			removed = append(removed, m)
		}
	}
	return removed, errors.Join(errs...)
}

// GlobEscape quotes the glob metacharacters in a literal path, so a
// directory can be joined with a pattern.
func GlobEscape(path string) string {
	var b strings.Builder
	for _, r := range path {
		switch r {
		case '*', '?', '[', '\\':
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}

// WriteFileAtomic replaces path with data so that readers (and a reader
// after a crash or power loss) see either the old or the new content.
func WriteFileAtomic(path string, data []byte, perm os.FileMode) error {
	return WriteFileAtomicChecked(path, data, perm, nil)
}

// WriteFileAtomicChecked is WriteFileAtomic with check run on the complete,
// synced temporary file before the rename: what check accepts is exactly
// what is installed, and a check error (returned as it is) installs
// nothing and removes the temporary file.
func WriteFileAtomicChecked(path string, data []byte, perm os.FileMode, check func(tmp string) error) error {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, TempGlob(filepath.Base(path)))
	if err != nil {
		return fmt.Errorf("create temp file for %s: %w", path, err)
	}
	cleanup := func() { _ = os.Remove(tmp.Name()) }
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		cleanup()
		return fmt.Errorf("write %s: %w", tmp.Name(), err)
	}
	if err := tmp.Chmod(perm); err != nil {
		tmp.Close()
		cleanup()
		return fmt.Errorf("chmod %s: %w", tmp.Name(), err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		cleanup()
		return fmt.Errorf("fsync %s: %w", tmp.Name(), err)
	}
	if err := tmp.Close(); err != nil {
		cleanup()
		return fmt.Errorf("close %s: %w", tmp.Name(), err)
	}
	if check != nil {
		if err := check(tmp.Name()); err != nil {
			cleanup()
			return err
		}
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		cleanup()
		return fmt.Errorf("rename %s to %s: %w", tmp.Name(), path, err)
	}
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("open directory %s to fsync it: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("fsync directory %s: %w", dir, err)
	}
	return nil
}
