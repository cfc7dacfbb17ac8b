package driver

import (
	"context"
	"fmt"
	"net"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/vfnet-io/vfnet/driver/checkpoint"
	"github.com/vfnet-io/vfnet/driver/kernel/sysfs"
	"github.com/vfnet-io/vfnet/driver/prepare"
	"github.com/vfnet-io/vfnet/driver/standby"
)

// StandbyConfig is the failover standby plumbing: the NRI plugin that
// makes each failover VF's standby tap in its launcher pod
// (driver/standby, docs/migration.md).
type StandbyConfig struct {
	// NRI runs the plugin (--standby-nri).
	NRI bool
	// NRISocket is the container runtime's NRI socket (--nri-socket).
	NRISocket string
	// HostNetns is the node's network namespace file, where the admin's
	// bridges are (--standby-netns). Empty: vfnet plumbs no standby (a
	// simulated driver without one); failover claims are then prepared
	// without it.
	HostNetns string
}

// on reports whether vfnet plumbs standbys.
func (c StandbyConfig) on() bool { return c.NRI && c.HostNetns != "" }

// newStandby builds the NRI plugin when the plumbing is on.
func (d *Driver) newStandby() {
	sc := d.cfg.Standby
	if !sc.on() {
		return
	}
	d.plumber = standby.Netlink{HostNetns: sc.HostNetns}
	socket := sc.NRISocket
	if socket == "" {
		socket = standby.DefaultSocket
	}
	d.nri = &standby.NRI{Socket: socket, Handler: &standby.Handler{
		Plumber: d.plumber, Wanted: d.standbysOf, ProcRoot: d.cfg.ProcRoot,
	}}
}

// standbysOf is the NRI plugin's question: the standbys prepared for a pod.
func (d *Driver) standbysOf(podUID string) []standby.Want {
	var out []standby.Want
	for _, s := range prepare.StandbysOf(d.state.Snapshot(), types.UID(podUID)) {
		out = append(out, standby.Want{Interface: s.Interface, Bridge: s.Bridge, Claim: s.Claim})
	}
	return out
}

// standbyBridge is prepare's StandbyBridge: the PF's configured node
// bridge, if it exists as a bridge and the runtime's NRI is connected.
// Each refusal names the PF, the bridge, the config field and the fix.
func (d *Driver) standbyBridge(ctx context.Context, pfAddress, pfNetDev string) (string, error) {
	cfg, err := LoadNodeConfig(d.cfg.ConfigPath)
	if err != nil {
		return "", err
	}
	pf, ok, err := d.cfg.Host.Sysfs.DiscoverPF(ctx, pfAddress)
	if err != nil || !ok {
		return "", fmt.Errorf("PF %s (%s): cannot read it to find its standby bridge: %v", pfAddress, pfNetDev, err)
	}
	sel, err := cfg.Select([]sysfs.PF{pf})
	if err != nil {
		return "", err
	}
	if len(sel) == 0 {
		return "", fmt.Errorf("PF %s (%s) is not in the node config %s, so it has no standby bridge", pfAddress, pfNetDev, d.cfg.ConfigPath)
	}
	s := sel[0]
	if s.Standby == nil {
		return "", fmt.Errorf("PF %s (%s) has no standby bridge: set pfs[%d].standby.bridge in the node config %s to a node bridge on its physical network %q, or remove VFConfig.failover",
			pfAddress, pfNetDev, s.Selector, cfg.Source, s.Network)
	}
	if _, err := d.plumber.Bridge(s.Standby.Bridge); err != nil {
		return "", fmt.Errorf("PF %s (%s): standby bridge %s (pfs[%d].standby.bridge in %s) is not usable: %w; create it on the node, on the PF's physical network %q, or correct the name",
			pfAddress, pfNetDev, s.Standby.Bridge, s.Selector, cfg.Source, err, s.Network)
	}
	if !d.nri.Connected() {
		return "", d.nri.ErrNotConnected()
	}
	return s.Standby.Bridge, nil
}

// runStandby runs the NRI plugin until ctx ends; the returned function
// waits for it (after ctx is canceled).
func (d *Driver) runStandby(ctx context.Context) (wait func()) {
	if d.nri == nil {
		return func() {}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		d.nri.Run(ctx)
	}()
	return func() { <-done }
}

// failoverMACs is the migration watcher's FailoverMACs: prepare.State's
// park and restore, with the node bridge steered to the VF's standby on
// each park (standby.Netlink.Steer), so the VM's inbound frames reach it
// at once even where the bridge had learned the MAC on its uplink, and
// handed back to learning on each restore (Unsteer).
type failoverMACs struct {
	state parkState
	// steer and unsteer are nil when vfnet plumbs no standbys.
	steer, unsteer func(ctx context.Context, podUID, iface, bridge string, mac net.HardwareAddr) error
}

// parkState is the part of prepare.State failoverMACs uses.
type parkState interface {
	IsFailover(bdf string) bool
	SetMACParked(ctx context.Context, bdf string, parked bool) (bool, error)
	Snapshot() *checkpoint.File
}

func (f failoverMACs) IsFailover(bdf string) bool { return f.state.IsFailover(bdf) }

func (f failoverMACs) SetMACParked(ctx context.Context, bdf string, parked bool) (bool, error) {
	changed, err := f.state.SetMACParked(ctx, bdf, parked)
	if err != nil || f.steer == nil {
		return changed, err
	}
	sb, ok := prepare.StandbyOfVF(f.state.Snapshot(), bdf)
	if !ok {
		return changed, nil
	}
	mac, err := net.ParseMAC(sb.MAC)
	if err != nil {
		return changed, fmt.Errorf("failover VF %s: checkpoint standby MAC %q: %w", bdf, sb.MAC, err)
	}
	for _, uid := range sb.PodUIDs {
		// The park stands without it: the bridge relearns the MAC from
		// the guest's next frame through the standby.
		if !parked {
			if err := f.unsteer(ctx, string(uid), sb.Interface, sb.Bridge, mac); err != nil {
				klog.FromContext(ctx).Error(err, "Could not hand the failover MAC back to the node bridge's learning; the bridge sends the VM's frames through the standby until the entry ages", "vf", bdf)
			}
			continue
		}
		if err := f.steer(ctx, string(uid), sb.Interface, sb.Bridge, mac); err != nil {
			klog.FromContext(ctx).Error(err, "Could not steer the node bridge to the failover standby; inbound frames may be lost until the guest sends through it", "vf", bdf)
		}
	}
	return changed, nil
}

// failover is what the migration watcher parks with.
func (d *Driver) failover() failoverMACs {
	f := failoverMACs{state: d.state}
	if d.cfg.Standby.on() {
		f.steer, f.unsteer = d.plumber.Steer, d.plumber.Unsteer
	}
	return f
}
