// The MAC of a failover VF is parked (held at zero) while the VF is out of
// the guest during a live migration, so that the NIC's embedded switch
// steers the VM's frames to the PF, where the standby virtio path is,
// instead of into a VF nobody reads (Linux's net_failover design; see
// docs/migration.md "Failover (opt-in)"). Prepare parks it for a migration
// target; the migration watcher parks the source's once its launcher has
// detached the VF and unparks before each attach.

package prepare

import (
	"bytes"
	"context"
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/klog/v2"

	"github.com/vfnet-io/vfnet/driver/checkpoint"
	"github.com/vfnet-io/vfnet/driver/kernel/vflink"
	"github.com/vfnet-io/vfnet/driver/maclookup"
)

// Hook steps of the MAC choreography: after the checkpoint records the
// wanted state, and after the host has it.
const (
	StepParkRecorded   = "park-recorded"
	StepParkApplied    = "park-applied"
	StepUnparkRecorded = "unpark-recorded"
	StepUnparkApplied  = "unpark-applied"
)

// forMigrationTarget reports whether the failover request r is prepared
// for the target pod of a live migration: its VF then starts parked.
// looked is the VMI interface already read for the MAC, if any.
func (s *State) forMigrationTarget(ctx context.Context, claim *resourceapi.ResourceClaim, r resourceapi.DeviceRequestAllocationResult, looked *maclookup.Result) (bool, error) {
	if looked != nil {
		return looked.MigrationTarget, nil
	}
	if s.opts.MACs == nil {
		return false, nil
	}
	res, found, err := s.opts.MACs.Find(ctx, claim, r.Request)
	if err != nil {
		return false, fmt.Errorf("find whether the VM's launcher pod is a migration target: %w", err)
	}
	return found && res.MigrationTarget, nil
}

// IsFailover reports whether the VF at bdf is prepared on this node for a
// failover request, as the checkpoint file says now.
func (s *State) IsFailover(bdf string) bool {
	for _, c := range s.Snapshot().Claims {
		for _, d := range c.Devices {
			if d.BDF == bdf {
				return d.Failover
			}
		}
	}
	return false
}

// SetMACParked parks (zero) or unparks (the claim's MAC) the MAC of the
// failover VF at bdf, under the node lock: first the checkpoint records the
// wanted state, then the PF sets it, so a crash in between is finished by
// the next call or by Converge. It reports whether the VF's MAC changed.
func (s *State) SetMACParked(ctx context.Context, bdf string, parked bool) (bool, error) {
	release, err := s.begin(ctx)
	if err != nil {
		return false, err
	}
	defer release()
	s.mu.Lock()
	uid, c, ok := s.holderLocked(bdf)
	s.mu.Unlock()
	if !ok {
		return false, fmt.Errorf("VF %s is not prepared on this node", bdf)
	}
	entry := s.entry(uid)
	i := deviceIndex(entry, bdf)
	d := &entry.Devices[i]
	if !d.Failover {
		return false, fmt.Errorf("%s of claim %s/%s: not a failover device (VFConfig.failover is not true), its MAC is never parked", describe(*d), c.Namespace, c.Name)
	}
	if entry.Phase != checkpoint.PhasePrepared {
		return false, fmt.Errorf("%s of claim %s/%s: claim is %s, not prepared", describe(*d), c.Namespace, c.Name, entry.Phase)
	}
	recorded, applied := StepUnparkRecorded, StepUnparkApplied
	if parked {
		recorded, applied = StepParkRecorded, StepParkApplied
	}
	if d.MACParked != parked {
		d.MACParked = parked
		if err := s.update(uid, entry); err != nil {
			return false, fmt.Errorf("%s: record MAC parked=%v: %w", describe(*d), parked, err)
		}
	}
	s.hook(recorded)
	changed, err := s.applyMAC(ctx, *d)
	if err != nil {
		return false, err
	}
	s.hook(applied)
	if changed {
		msg := "Failover VF MAC restored"
		if parked {
			msg = "Failover VF MAC parked"
		}
		klog.FromContext(ctx).Info(msg, "device", d.Device, "bdf", d.BDF, "claim", klog.KRef(c.Namespace, c.Name), "mac", d.Applied.MAC)
	}
	return changed, nil
}

// applyMAC sets the device's wanted MAC through the PF if it differs.
func (s *State) applyMAC(ctx context.Context, d checkpoint.Device) (bool, error) {
	want := d.Wanted().MAC
	pfi := s.pfInfo(ctx, d)
	cur, err := s.opts.Links.VF(pfi.Name, d.VFIndex)
	if err != nil {
		return false, stepError(d, "read the VF's MAC", err)
	}
	if bytes.Equal(cur.MAC, want) {
		return false, nil
	}
	if err := s.opts.Links.SetMAC(pfi.Name, d.VFIndex, want); err != nil {
		return false, stepError(d, "set the VF's MAC", vflink.Explain(vflink.SettingMAC, want.String(), pfi, err))
	}
	return true, nil
}

// Converge makes the MAC of every prepared failover VF match what the
// checkpoint wants (parked or not): a driver killed between recording and
// setting finishes the change at start-up.
func (s *State) Converge(ctx context.Context) error {
	return s.Exclusive(ctx, func(cp *checkpoint.File) error {
		var errs []error
		for _, c := range cp.Claims {
			if c.Phase != checkpoint.PhasePrepared {
				continue // the next prepare or unprepare finishes it
			}
			for _, d := range c.Devices {
				if !d.Failover {
					continue
				}
				changed, err := s.applyMAC(ctx, d)
				if err != nil {
					errs = append(errs, err)
					continue
				}
				if changed {
					klog.FromContext(ctx).Info("Finished an interrupted failover MAC change", "device", d.Device, "bdf", d.BDF,
						"claim", klog.KRef(c.Namespace, c.Name), "parked", d.MACParked)
				}
			}
		}
		if len(errs) > 0 {
			return fmt.Errorf("converge failover VF MACs: %s", joinErrs(errs))
		}
		return nil
	})
}

func deviceIndex(c *checkpoint.Claim, bdf string) int {
	for i, d := range c.Devices {
		if d.BDF == bdf {
			return i
		}
	}
	return -1
}
