package prepare

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"

	"github.com/vfnet-io/vfnet/driver/checkpoint"
	"github.com/vfnet-io/vfnet/driver/discovery"
	"github.com/vfnet-io/vfnet/driver/kernel/pcibind"
	"github.com/vfnet-io/vfnet/driver/kernel/sysfs"
	"github.com/vfnet-io/vfnet/driver/kernel/vflink"
	"github.com/vfnet-io/vfnet/pkg/contract/metadata"
)

// Hook step names (besides pcibind's): the crash tests stop after each.
const (
	StepCheckpointRecorded    = "checkpoint-recorded"
	StepCheckpointBinding     = "checkpoint-binding"
	StepCheckpointApplying    = "checkpoint-applying"
	StepCDITempWritten        = "cdi-temp-written" // inside the CDI spec write, before its rename
	StepCDIWritten            = "cdi-written"
	StepStatusUpdated         = "status-updated"
	StepCheckpointPrepared    = "checkpoint-prepared"
	StepCheckpointUnpreparing = "checkpoint-unpreparing"
	StepCDIRemoved            = "cdi-removed"
	StepCheckpointDropped     = "checkpoint-dropped"
)

func (s *State) prepareClaim(ctx context.Context, claim *resourceapi.ResourceClaim) ([]kubeletplugin.Device, error) {
	logger := klog.FromContext(ctx)
	results, err := s.ourResults(claim)
	if err != nil {
		return nil, at(ErrStepPlan, err)
	}
	if len(results) == 0 {
		return []kubeletplugin.Device{}, nil
	}
	failover, err := s.failoverRequests(claim, results)
	if err != nil {
		return nil, at(ErrStepPlan, err)
	}
	entry := s.entry(claim.UID)
	if entry != nil && entry.Phase == checkpoint.PhasePrepared {
		// Repeated call. The checkpoint says prepared, but the host may
		// have changed since (reboot, sriov_numvfs, an admin): report
		// the devices only if they still are as prepared, else repair.
		drift, err := s.verify(ctx, claim.UID, entry)
		if err != nil {
			if errors.Is(err, errVFGone) {
				return nil, fmt.Errorf("claim %s/%s: %w; the claim cannot be used on this node any more: delete the pod so the kubelet unprepares the claim and the scheduler allocates another VF", claim.Namespace, claim.Name, err)
			}
			return nil, fmt.Errorf("claim %s/%s: verify the prepared devices: %w", claim.Namespace, claim.Name, err)
		}
		if len(drift) == 0 {
			return s.deviceResults(claim.UID, entry, failover), nil
		}
		logger.Info("Prepared claim no longer matches the host, preparing it again", "drift", drift)
		entry.Phase = checkpoint.PhasePreparing
		if err := s.update(claim.UID, entry); err != nil {
			return nil, fmt.Errorf("claim %s/%s: %w", claim.Namespace, claim.Name, err)
		}
	} else if entry == nil {
		if entry, err = s.record(ctx, claim, results); err != nil {
			return nil, err
		}
		s.hook(StepCheckpointRecorded)
	} else {
		// An earlier prepare or unprepare was interrupted (crash, error
		// during rollback). The originals were recorded before the host
		// was touched, so going forward again is safe.
		logger.Info("Continuing interrupted work on claim", "phase", entry.Phase)
		entry.Phase = checkpoint.PhasePreparing
		if err := s.update(claim.UID, entry); err != nil {
			return nil, at(ErrStepCheckpoint, fmt.Errorf("claim %s/%s: %w", claim.Namespace, claim.Name, err))
		}
	}
	if err := s.forward(ctx, claim, entry); err != nil {
		// Roll back even if the kubelet gave up on the call.
		rctx := context.WithoutCancel(ctx)
		if rerr := s.undo(rctx, claim.UID, entry); rerr != nil {
			return nil, fmt.Errorf("prepare claim %s/%s: %w; rolling back failed too, the claim stays in the checkpoint and unprepare retries: %v", claim.Namespace, claim.Name, err, rerr)
		}
		if derr := s.update(claim.UID, nil); derr != nil {
			return nil, fmt.Errorf("prepare claim %s/%s: %w; host restored but dropping the checkpoint entry failed: %v", claim.Namespace, claim.Name, err, derr)
		}
		return nil, fmt.Errorf("prepare claim %s/%s: %w (everything done for the claim was undone)", claim.Namespace, claim.Name, err)
	}
	return s.deviceResults(claim.UID, entry, failover), nil
}

// record plans the claim, captures the original state of every VF and
// writes it to the checkpoint before anything on the host changes.
func (s *State) record(ctx context.Context, claim *resourceapi.ResourceClaim, results []resourceapi.DeviceRequestAllocationResult) (*checkpoint.Claim, error) {
	plans, err := s.makePlans(ctx, claim, results)
	if err != nil {
		return nil, at(ErrStepPlan, err)
	}
	if err := s.binder.CheckVFIOLoaded(); err != nil {
		return nil, at(ErrStepCheck, fmt.Errorf("claim %s/%s: %w", claim.Namespace, claim.Name, err))
	}
	entry := &checkpoint.Claim{Namespace: claim.Namespace, Name: claim.Name, Phase: checkpoint.PhasePreparing}
	for _, p := range plans {
		d := checkpoint.Device{
			Request: p.result.Request, Pool: p.result.Pool, Device: p.result.Device,
			BDF: p.ref.Address, PFAddress: p.ref.PFAddress, PFNetDev: p.ref.PFName, VFIndex: p.ref.VFIndex,
			Step:           checkpoint.StepRecorded,
			OriginalDriver: p.ref.Driver,
			MACSet:         p.mac != nil,
		}
		if d.OriginalOverride, err = s.binder.Override(d.BDF); err != nil {
			return nil, at(ErrStepRecord, stepError(d, "read original state", err))
		}
		if d.Original, err = s.opts.Links.VF(d.PFNetDev, d.VFIndex); err != nil {
			return nil, at(ErrStepRecord, stepError(d, "read original VF link settings", err))
		}
		if s.vfDriverOwnMAC(d.BDF, d.Original.MAC) {
			// Not an administrative MAC: leave none behind on unprepare.
			klog.FromContext(ctx).V(2).Info("The VF's MAC before prepare is its driver's own, not set through the PF; unprepare sets none",
				"device", d.Device, "bdf", d.BDF, "driverMAC", d.Original.MAC)
			d.OriginalOwnMAC = d.Original.MAC.String()
			d.Original.MAC = make(net.HardwareAddr, len(d.Original.MAC))
		}
		d.Applied = p.config.Apply(d.Original, p.mac)
		d.Failover = p.config.WantsFailover()
		d.MACParked = p.parkMAC
		d.Standby = p.standby
		entry.Devices = append(entry.Devices, d)
	}
	// The holder check and the write happen under one lock: two claims can
	// never both reserve a VF.
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, d := range entry.Devices {
		if uid, other, ok := s.holderLocked(d.BDF); ok && uid != claim.UID {
			return nil, at(ErrStepRecord, fmt.Errorf("claim %s/%s: %s is already prepared for claim %s/%s (uid %s); a VF is never given to two claims, unprepare that claim first",
				claim.Namespace, claim.Name, describe(d), other.Namespace, other.Name, uid))
		}
	}
	next := s.cp.Clone()
	next.Claims[claim.UID] = entry
	if err := s.store.Save(next); err != nil {
		return nil, at(ErrStepCheckpoint, fmt.Errorf("claim %s/%s: record original VF state: %w", claim.Namespace, claim.Name, err))
	}
	s.cp = next.Clone()
	return entry, nil
}

// forward makes the claim's devices prepared, from whatever step they are
// at. Every host operation is idempotent.
//
// The VF goes to vfio-pci first and its settings are applied through the
// PF afterwards, while no VF driver is bound (as dra-driver-sriov does):
// MAC, VLAN and trust changes reset the VF on Intel PFs, which a bound VF
// driver would have to live through.
func (s *State) forward(ctx context.Context, claim *resourceapi.ResourceClaim, entry *checkpoint.Claim) error {
	// Before anything is bound: the host may have changed since the slice
	// was published (group shared, noiommu, a process took the VF). A
	// device an interrupted call already bound was checked then.
	for _, d := range entry.Devices {
		if d.Step.DriverTouched() {
			continue
		}
		if err := s.opts.CheckVF(d.BDF); err != nil {
			return at(ErrStepCheck, stepError(d, "check the VF can be passed through", err))
		}
	}
	for i := range entry.Devices {
		switch d := &entry.Devices[i]; d.Step {
		case checkpoint.StepRecorded:
			d.Step = checkpoint.StepBindingVFIO
		case checkpoint.StepConfiguring:
			// An older driver's entry: settings may be applied already.
			d.Step = checkpoint.StepBinding
		}
	}
	if err := s.update(claim.UID, entry); err != nil {
		return at(ErrStepCheckpoint, err)
	}
	s.hook(StepCheckpointBinding)
	cdiDevs := make([]cdiDevice, 0, len(entry.Devices))
	for i := range entry.Devices {
		d := &entry.Devices[i]
		bd, err := s.binder.BindVFIO(ctx, d.BDF, s.opts.VFIOTimeout)
		if err != nil {
			return at(ErrStepBind, stepError(*d, "bind to vfio-pci", err))
		}
		d.IOMMUGroup, d.DevNode = bd.IOMMUGroup, bd.DevNode
		cdiDevs = append(cdiDevs, cdiDevice{Name: d.Device, DevNode: d.DevNode})
	}
	for i := range entry.Devices {
		// The original MAC was classified when recorded (vfDriverOwnMAC):
		// with the VF driver gone the PF still reports the MAC it chose.
		entry.Devices[i].Step = checkpoint.StepApplying
	}
	if err := s.update(claim.UID, entry); err != nil {
		return at(ErrStepCheckpoint, err)
	}
	s.hook(StepCheckpointApplying)
	for _, d := range entry.Devices {
		if err := s.setLink(s.pfInfo(ctx, d), d.VFIndex, d.Wanted()); err != nil {
			return at(ErrStepLink, stepError(d, "apply VF link settings through the PF", err))
		}
	}
	// A kill inside an earlier write of this claim's files left its
	// temporary files; the claim is ready again without them.
	s.removeClaimTemps(ctx, claim.UID, claim.Namespace, claim.Name)
	if _, err := s.cdi.write(claim.UID, cdiDevs); err != nil {
		return at(ErrStepCDI, fmt.Errorf("write CDI spec: %w", err))
	}
	s.hook(StepCDIWritten)
	if err := s.setStatus(ctx, claim, entry.Devices); err != nil {
		return at(ErrStepStatus, fmt.Errorf("update claim status.devices: %w", err))
	}
	s.hook(StepStatusUpdated)
	for i := range entry.Devices {
		entry.Devices[i].Step = checkpoint.StepBound
	}
	entry.Phase = checkpoint.PhasePrepared
	if err := s.update(claim.UID, entry); err != nil {
		return at(ErrStepCheckpoint, err)
	}
	s.hook(StepCheckpointPrepared)
	return nil
}

// vfDriverOwnMAC reports whether mac, as the PF reports it for the VF at
// bdf, is one the VF's driver chose for itself rather than one set through
// the PF. igb keeps reporting such a MAC after the VF driver lets go (only
// a function-level reset clears it), so the PF cannot tell; the VF's netdev
// can: an address the driver made up reads addr_assign_type 1 (random,
// igbvf and iavf when the PF gives none) or 3 (set from the VF side),
// while one the PF gave reads 0 (permanent). Seen on Linux 6.1 with igb.
func (s *State) vfDriverOwnMAC(bdf string, mac net.HardwareAddr) bool {
	if len(mac) == 0 || bytes.Equal(mac, make(net.HardwareAddr, len(mac))) {
		return false
	}
	fn, err := s.opts.Sysfs.Function(bdf)
	if err != nil {
		return false
	}
	for _, nd := range fn.NetDevs {
		dir := "bus/pci/devices/" + bdf + "/net/" + nd + "/"
		addr, err := os.ReadFile(s.opts.Sysfs.Path(dir + "address"))
		if err != nil {
			continue
		}
		if a, err := net.ParseMAC(strings.TrimSpace(string(addr))); err != nil || !bytes.Equal(a, mac) {
			continue
		}
		typ, err := os.ReadFile(s.opts.Sysfs.Path(dir + "addr_assign_type"))
		if err != nil {
			return false
		}
		switch strings.TrimSpace(string(typ)) {
		case "1", "3": // NET_ADDR_RANDOM, NET_ADDR_SET
			return true
		}
	}
	return false
}

// undo restores every device of the entry to its original state. It marks
// the claim Unpreparing first so that a crash in the middle is finished by
// the next call instead of being mistaken for a prepared claim.
func (s *State) undo(ctx context.Context, uid types.UID, entry *checkpoint.Claim) error {
	logger := klog.FromContext(ctx)
	entry.Phase = checkpoint.PhaseUnpreparing
	if err := s.update(uid, entry); err != nil {
		return at(ErrStepCheckpoint, err)
	}
	s.hook(StepCheckpointUnpreparing)
	var errs []error
	if err := s.cdi.remove(uid); err != nil {
		errs = append(errs, at(ErrStepCDI, err))
	}
	// Without this, a kill inside one of the claim's writes leaves a file
	// that outlives the claim until a driver start finds it stale.
	s.removeClaimTemps(ctx, uid, entry.Namespace, entry.Name)
	s.hook(StepCDIRemoved)
	for i := len(entry.Devices) - 1; i >= 0; i-- {
		d := entry.Devices[i]
		if _, err := s.opts.Sysfs.Function(d.BDF); pcibind.IsNotExist(err) {
			// The VF (or its PF) is gone: nothing is left to restore.
			logger.Info("VF disappeared, nothing to restore", "device", d.Device, "bdf", d.BDF)
			continue
		}
		// Settings first, while the VF is still on vfio-pci: the resets
		// they cause hit no VF driver, and the original driver then probes
		// the VF with its original settings (and picks its own MAC again
		// when none is set).
		if d.Step.SettingsTouched() {
			if err := s.setLink(s.pfInfo(ctx, d), d.VFIndex, d.Original); err != nil {
				errs = append(errs, at(ErrStepRestoreLink, stepError(d, "restore VF link settings", err)))
			}
		}
		if d.Step.DriverTouched() {
			if err := s.binder.Restore(ctx, d.BDF, d.OriginalDriver, d.OriginalOverride); err != nil {
				errs = append(errs, at(ErrStepRestoreDriver, stepError(d, fmt.Sprintf("restore driver %q", d.OriginalDriver), err)))
			}
		}
	}
	if len(errs) > 0 {
		// The first failure names the step.
		return at(StepOf(errs[0]), errors.New(joinErrs(errs)))
	}
	return nil
}

func (s *State) unprepareClaim(ctx context.Context, c kubeletplugin.NamespacedObject) error {
	entry := s.entry(c.UID)
	if entry == nil {
		return nil // never prepared here, or already unprepared
	}
	if err := s.undo(ctx, c.UID, entry); err != nil {
		return fmt.Errorf("unprepare claim %s: %w (the claim stays in the checkpoint; the next unprepare retries)", c.NamespacedName, err)
	}
	s.clearStatus(ctx, c)
	if err := s.update(c.UID, nil); err != nil {
		return at(ErrStepCheckpoint, fmt.Errorf("unprepare claim %s: host restored, but %w", c.NamespacedName, err))
	}
	s.hook(StepCheckpointDropped)
	return nil
}

// pfInfo describes the device's PF as it is now (name, driver, model,
// link), so a refused setting can be explained.
func (s *State) pfInfo(ctx context.Context, d checkpoint.Device) vflink.PF {
	pf := vflink.PF{Name: s.pfNetDev(ctx, d), Address: d.PFAddress}
	if fn, err := s.opts.Sysfs.Function(d.PFAddress); err == nil {
		pf.Driver, pf.DeviceID = fn.Driver, fn.DeviceID
	}
	if b, err := os.ReadFile(s.opts.Sysfs.Path(sysfs.ClassNetDir + "/" + pf.Name + "/operstate")); err == nil {
		pf.OperState = strings.TrimSpace(string(b))
	}
	return pf
}

// setLink makes the VF's settings equal want, changing only what differs.
// A refusal names the setting, the PF driver and the fix (vflink.Explain).
func (s *State) setLink(pfi vflink.PF, vf int, want vflink.VFState) error {
	l := s.opts.Links
	pf := pfi.Name
	cur, err := l.VF(pf, vf)
	if err != nil {
		return err
	}
	if want.MAC != nil && !bytes.Equal(cur.MAC, want.MAC) {
		if err := l.SetMAC(pf, vf, want.MAC); err != nil {
			return vflink.Explain(vflink.SettingMAC, want.MAC.String(), pfi, err)
		}
		s.hook("link-mac")
	}
	proto := func(p string) string {
		if p == "" {
			return vflink.VLANProto8021Q
		}
		return p
	}
	if cur.VLAN != want.VLAN || cur.QoS != want.QoS || proto(cur.VLANProto) != proto(want.VLANProto) {
		if err := l.SetVLAN(pf, vf, want.VLAN, want.QoS, proto(want.VLANProto)); err != nil {
			return explainVLAN(pfi, want, proto(want.VLANProto), err)
		}
		s.hook("link-vlan")
	}
	if cur.SpoofChk != want.SpoofChk {
		if err := l.SetSpoofChk(pf, vf, want.SpoofChk); err != nil {
			return vflink.Explain(vflink.SettingSpoofChk, strconv.FormatBool(want.SpoofChk), pfi, err)
		}
		s.hook("link-spoofchk")
	}
	if cur.Trust != want.Trust {
		if err := l.SetTrust(pf, vf, want.Trust); err != nil {
			return vflink.Explain(vflink.SettingTrust, strconv.FormatBool(want.Trust), pfi, err)
		}
		s.hook("link-trust")
	}
	if want.LinkState != "" && cur.LinkState != want.LinkState {
		if err := l.SetLinkState(pf, vf, want.LinkState); err != nil {
			return vflink.Explain(vflink.SettingLinkState, want.LinkState, pfi, err)
		}
		s.hook("link-state")
	}
	// i40e raises a limit under 50 Mbps to 50: that one is applied.
	if cur.MinTxRateMbps != want.MinTxRateMbps || !vflink.RateApplied(want.MaxTxRateMbps, cur.MaxTxRateMbps) {
		if err := l.SetRate(pf, vf, want.MinTxRateMbps, want.MaxTxRateMbps); err != nil {
			return explainRate(pfi, cur, want, err)
		}
		s.hook("link-rate")
	}
	return nil
}

// explainVLAN blames the part of a refused VLAN change the driver objects
// to: the protocol (EPROTONOSUPPORT), a priority the driver may refuse, or
// the VLAN.
func explainVLAN(pfi vflink.PF, want vflink.VFState, proto string, err error) error {
	caps := vflink.Lookup(pfi.Driver, pfi.DeviceID)
	switch {
	case errors.Is(err, syscall.EPROTONOSUPPORT):
		return vflink.Explain(vflink.SettingVLANProtocol, proto, pfi, err)
	case want.QoS != 0 && caps.Of(vflink.SettingQoS).Support != vflink.Supported:
		return vflink.Explain(vflink.SettingQoS, strconv.Itoa(want.QoS), pfi, err)
	}
	return vflink.Explain(vflink.SettingVLAN, strconv.Itoa(want.VLAN), pfi, err)
}

// explainRate blames the minimum when a non-zero minimum is being set and
// the driver may refuse minimums (drivers check it first), else the maximum.
func explainRate(pfi vflink.PF, cur, want vflink.VFState, err error) error {
	caps := vflink.Lookup(pfi.Driver, pfi.DeviceID)
	if want.MinTxRateMbps != 0 && want.MinTxRateMbps != cur.MinTxRateMbps && caps.Of(vflink.SettingMinTxRate).Support != vflink.Supported {
		return vflink.Explain(vflink.SettingMinTxRate, strconv.Itoa(want.MinTxRateMbps), pfi, err)
	}
	return vflink.Explain(vflink.SettingMaxTxRate, strconv.Itoa(want.MaxTxRateMbps), pfi, err)
}

// failoverRequests are the requests among results whose merged VFConfig
// asks for failover. It is read from the claim on every call rather than
// kept in the checkpoint: the allocation's configs cannot change, and an
// older driver sharing the checkpoint in a rolling update refuses fields it
// does not know.
func (s *State) failoverRequests(claim *resourceapi.ResourceClaim, results []resourceapi.DeviceRequestAllocationResult) (map[string]bool, error) {
	var out map[string]bool
	for _, r := range results {
		cfg, err := vfConfigForRequest(claim, s.opts.DriverName, r.Request)
		if err != nil {
			return nil, fmt.Errorf("device %s: %w", r.Device, err)
		}
		if cfg.WantsFailover() {
			if out == nil {
				out = map[string]bool{}
			}
			out[r.Request] = true
		}
	}
	return out, nil
}

// deviceResults is what the kubelet (and the metadata files) get. A device
// of a request in failover carries metadata.FailoverAttribute, true, which
// tells the binding sidecar to add the standby interface.
func (s *State) deviceResults(uid types.UID, entry *checkpoint.Claim, failover map[string]bool) []kubeletplugin.Device {
	var published []discovery.Device
	if s.opts.Published != nil {
		published = s.opts.Published()
	}
	out := make([]kubeletplugin.Device, 0, len(entry.Devices))
	for _, d := range entry.Devices {
		md := &kubeletplugin.DeviceMetadata{Attributes: s.attributes(d, published)}
		if failover[d.Request] {
			md.Attributes[metadata.FailoverAttribute] = resourceapi.DeviceAttribute{BoolValue: new(true)}
		}
		if hw := macString(d.Applied.MAC); hw != "" {
			md.NetworkData = &resourceapi.NetworkDeviceData{HardwareAddress: hw}
		}
		out = append(out, kubeletplugin.Device{
			Requests:     []string{d.Request},
			PoolName:     d.Pool,
			DeviceName:   d.Device,
			CDIDeviceIDs: []string{cdiDeviceID(uid, d.Device)},
			Metadata:     md,
		})
	}
	return out
}

// macString is "" for an unset (all-zero) MAC: the VF then has no
// administratively set address to report.
func macString(mac net.HardwareAddr) string {
	if len(mac) == 0 || bytes.Equal(mac, make(net.HardwareAddr, len(mac))) {
		return ""
	}
	return mac.String()
}

// attributes are the device's published attributes (pciBusID among them).
// If the device is not in the published set (configuration changed since
// allocation), they are derived from sysfs, without the network name.
func (s *State) attributes(d checkpoint.Device, published []discovery.Device) map[string]resourceapi.DeviceAttribute {
	i := slices.IndexFunc(published, func(p discovery.Device) bool { return p.Name == d.Device })
	var dev discovery.Device
	if i >= 0 {
		dev = published[i]
	} else {
		dev = discovery.Device{Name: d.Device, Address: d.BDF, VFIndex: d.VFIndex, PFAddress: d.PFAddress, PFName: d.PFNetDev, NUMANode: -1}
		if fn, err := s.opts.Sysfs.Function(d.BDF); err == nil {
			dev.VendorID, dev.DeviceID, dev.NUMANode, dev.PCIeRoot = fn.VendorID, fn.DeviceID, fn.NUMANode, fn.PCIeRoot
		}
		if pf, err := s.opts.Sysfs.Function(d.PFAddress); err == nil {
			dev.PFDriver, dev.PFSupports = pf.Driver, discovery.SupportsOf(pf.Driver, pf.DeviceID)
		}
	}
	attrs := dev.Attributes()
	out := make(map[string]resourceapi.DeviceAttribute, len(attrs))
	for k, v := range attrs {
		if v.StringValue != nil && *v.StringValue == "" {
			continue
		}
		out[string(k)] = v
	}
	return out
}
