package prepare

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"k8s.io/apimachinery/pkg/types"

	"github.com/vfnet-io/vfnet/driver/checkpoint"
	"github.com/vfnet-io/vfnet/driver/kernel/pcibind"
	"github.com/vfnet-io/vfnet/driver/kernel/sysfs"
	"github.com/vfnet-io/vfnet/driver/kernel/vflink"
)

// errVFGone marks a prepared VF that no longer exists: nothing can repair
// that, the claim has to be unprepared and allocated anew.
var errVFGone = errors.New("VF gone")

// verify checks a claim the checkpoint marks prepared against the host: a
// node reboot (fresh kernel state, empty tmpfs CDI directory, surviving
// checkpoint), a lowered sriov_numvfs or an admin may have changed it since.
// It returns what differs from the prepared state, marking every device
// that is no longer on vfio-pci to go through binding again, or an error
// wrapping errVFGone when a VF is gone.
func (s *State) verify(ctx context.Context, uid types.UID, entry *checkpoint.Claim) ([]string, error) {
	var drift []string
	cdiDevs := make([]cdiDevice, 0, len(entry.Devices))
	for i := range entry.Devices {
		d := &entry.Devices[i]
		fn, err := s.opts.Sysfs.Function(d.BDF)
		if pcibind.IsNotExist(err) {
			return nil, fmt.Errorf("%w: %s was prepared for this claim but no longer exists on this node (sriov_numvfs lowered, PF removed?): %v", errVFGone, describe(*d), err)
		}
		if err != nil {
			return nil, stepError(*d, "read the VF to verify it", err)
		}
		physfn, err := os.Readlink(s.opts.Sysfs.Path(sysfs.PCIDevicesDir + "/" + d.BDF + "/physfn"))
		if err != nil || filepath.Base(physfn) != d.PFAddress {
			return nil, fmt.Errorf("%w: %s was prepared for this claim as a VF of PF %s, but %s is no longer that PF's VF", errVFGone, describe(*d), d.PFAddress, d.BDF)
		}
		ov, err := s.binder.Override(d.BDF)
		if err != nil {
			return nil, stepError(*d, "read driver_override to verify it", err)
		}
		bound := fn.Driver == pcibind.VFIOPCI
		switch {
		case !bound:
			drift = append(drift, fmt.Sprintf("%s is bound to %q, not vfio-pci", d.BDF, fn.Driver))
			// Back through the pass-through check and binding.
			// Configuring, not Recorded: the settings may still be
			// applied (an admin rebound the VF), so an undo restores
			// them; the originals recorded at the first prepare stay
			// (they are not read again from a VF a reboot reset).
			d.Step = checkpoint.StepConfiguring
		case ov != pcibind.VFIOPCI:
			drift = append(drift, fmt.Sprintf("%s has driver_override %q, not vfio-pci", d.BDF, ov))
		case fn.IOMMUGroup != d.IOMMUGroup:
			drift = append(drift, fmt.Sprintf("%s is in IOMMU group %q, recorded %q", d.BDF, fn.IOMMUGroup, d.IOMMUGroup))
		}
		if bound && d.DevNode != "" {
			if _, err := os.Stat(filepath.Join(s.opts.DevRoot, filepath.FromSlash(d.DevNode))); err != nil {
				drift = append(drift, fmt.Sprintf("%s: /dev/%s is missing", d.BDF, d.DevNode))
			}
		}
		cur, err := s.opts.Links.VF(s.pfNetDev(ctx, *d), d.VFIndex)
		if err != nil {
			return nil, stepError(*d, "read VF link settings to verify them", err)
		}
		for _, f := range linkDrift(cur, d.Wanted()) {
			drift = append(drift, fmt.Sprintf("%s: %s", d.BDF, f))
		}
		cdiDevs = append(cdiDevs, cdiDevice{Name: d.Device, DevNode: d.DevNode})
	}
	if len(drift) == 0 {
		ok, err := s.cdi.installed(uid, cdiDevs)
		if err != nil {
			return nil, err
		}
		if !ok {
			drift = append(drift, "CDI spec "+s.cdi.SpecPath(uid)+" is missing or differs")
		}
	}
	return drift, nil
}

// linkDrift lists the settings of cur that differ from what prepare set
// (want), as setLink compares them.
func linkDrift(cur, want vflink.VFState) []string {
	var out []string
	if len(want.MAC) > 0 && !bytes.Equal(cur.MAC, want.MAC) {
		out = append(out, fmt.Sprintf("MAC %s, want %s", cur.MAC, want.MAC))
	}
	proto := func(p string) string {
		if p == "" {
			return vflink.VLANProto8021Q
		}
		return p
	}
	if cur.VLAN != want.VLAN || cur.QoS != want.QoS || proto(cur.VLANProto) != proto(want.VLANProto) {
		out = append(out, fmt.Sprintf("VLAN %d qos %d %s, want %d qos %d %s", cur.VLAN, cur.QoS, proto(cur.VLANProto), want.VLAN, want.QoS, proto(want.VLANProto)))
	}
	if cur.SpoofChk != want.SpoofChk {
		out = append(out, fmt.Sprintf("spoof check %v, want %v", cur.SpoofChk, want.SpoofChk))
	}
	if cur.Trust != want.Trust {
		out = append(out, fmt.Sprintf("trust %v, want %v", cur.Trust, want.Trust))
	}
	if want.LinkState != "" && cur.LinkState != want.LinkState {
		out = append(out, fmt.Sprintf("link state %s, want %s", cur.LinkState, want.LinkState))
	}
	if cur.MinTxRateMbps != want.MinTxRateMbps || !vflink.RateApplied(want.MaxTxRateMbps, cur.MaxTxRateMbps) {
		out = append(out, fmt.Sprintf("tx rate %d-%d Mbps, want %d-%d", cur.MinTxRateMbps, cur.MaxTxRateMbps, want.MinTxRateMbps, want.MaxTxRateMbps))
	}
	return out
}
