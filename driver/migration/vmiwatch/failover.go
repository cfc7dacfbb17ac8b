// The MAC choreography of failover VFs around a live migration: park a
// source VF's MAC once its launcher has detached it, restore it before any
// attach. docs/migration.md "Failover (opt-in)" says why.

package vmiwatch

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/vfnet-io/vfnet/driver/migration/attach"
	"github.com/vfnet-io/vfnet/pkg/contract/vmiview"
)

// Event reasons of the MAC choreography.
const (
	// ReasonMACParked (Normal): a failover VF left the guest on the
	// migration source and its MAC was cleared.
	ReasonMACParked = "VFNetFailoverParked"
	// ReasonParkFailed (Warning): the driver could not park a MAC; the
	// VM's inbound frames may go into the detached VF until it is attached
	// again.
	ReasonParkFailed = "VFNetFailoverParkFailed"
)

// failoverHostdevs are the hostdevs of req whose VF is prepared here for a
// failover request.
func (w *Watcher) failoverHostdevs(req attach.Request) []attach.Hostdev {
	if w.cfg.Failover == nil {
		return nil
	}
	var out []attach.Hostdev
	for _, h := range req.Hostdevs {
		if w.cfg.Failover.IsFailover(h.Source.String()) {
			out = append(out, h)
		}
	}
	return out
}

// unpark restores the MAC of every failover VF of req before it is
// attached (a migration target's VF was prepared parked; a failed
// migration's source VF was parked at its detach).
func (w *Watcher) unpark(ctx context.Context, vmi *vmiview.VMI, req attach.Request) error {
	for _, h := range w.failoverHostdevs(req) {
		if _, err := w.cfg.Failover.SetMACParked(ctx, h.Source.String(), false); err != nil {
			return fmt.Errorf("restore the MAC of failover VF %s (interface %s) before attaching it: %w", h.Source, h.Interface, err)
		}
	}
	return nil
}

// detach runs a SourceDetach action: it waits for the source launcher to
// detach each failover VF and parks its MAC at once, until the migration
// ends (ctx is cancelled then).
func (w *Watcher) detach(ctx context.Context, vmi *vmiview.VMI, act Action) {
	if w.cfg.Failover == nil {
		return
	}
	logger := klog.FromContext(ctx).WithValues("vmi", kref(vmi), "side", act.Side, "migration", act.MigrationKey)
	ctx = klog.NewContext(ctx, logger)
	req, err := w.resolveWithRetry(ctx, vmi, act)
	if err != nil {
		if ctx.Err() == nil {
			logger.Error(err, "Cannot find the source launcher's failover VFs to park their MACs")
		}
		return
	}
	fo := w.failoverHostdevs(req)
	if len(fo) == 0 {
		return
	}
	byAlias := map[string]attach.Hostdev{}
	aliases := make([]string, 0, len(fo))
	for _, h := range fo {
		byAlias[attach.Alias(h.Interface)] = h
		aliases = append(aliases, attach.Alias(h.Interface))
	}
	start := time.Now()
	err = w.cfg.Attacher.WaitRemoved(ctx, attach.Removal{PodUID: req.PodUID, Domain: req.Domain, Aliases: aliases,
		Gone: func(ctx context.Context, alias string) error {
			h := byAlias[alias]
			changed, err := w.cfg.Failover.SetMACParked(ctx, h.Source.String(), true)
			if err != nil {
				w.cfg.Recorder.Eventf(eventRef(vmi), corev1.EventTypeWarning, ReasonParkFailed,
					"Could not clear the MAC of failover VF %s (interface %s) on node %s after the source launcher detached it: %v; inbound frames may go into the detached VF instead of the virtio standby until the migration ends",
					h.Source, h.Interface, w.cfg.NodeName, err)
				return err
			}
			logger.Info("Failover VF detached by the source launcher, MAC parked", "vf", h.Source.String(), "interface", h.Interface, "changed", changed, "sinceWatchStart", time.Since(start))
			if changed {
				w.cfg.Recorder.Eventf(eventRef(vmi), corev1.EventTypeNormal, ReasonMACParked,
					"Cleared the MAC of failover VF %s (interface %s) on node %s after the source launcher detached it: the VM's traffic uses its virtio standby until the VF is back",
					h.Source, h.Interface, w.cfg.NodeName)
			}
			return nil
		}})
	if err != nil && ctx.Err() == nil {
		logger.Error(err, "Parking failover VF MACs on the migration source failed")
	}
}
