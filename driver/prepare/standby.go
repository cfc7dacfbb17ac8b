package prepare

import (
	"context"
	"fmt"
	"net"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/vfnet-io/vfnet/driver/checkpoint"
	"github.com/vfnet-io/vfnet/driver/maclookup"
)

// planStandby is what the NRI plugin (driver/standby) needs to plumb the
// standby of failover request r: the launcher pods, the VMI interface (the
// tap is named after it), the MAC and the PF's node bridge. Prepare refuses
// the claim when any is missing, before the host is touched: without its
// tap the VM could not start. looked is the VMI interface makePlans found
// (nil: not looked up, e.g. VFConfig.mac is set; it is looked up here).
func (s *State) planStandby(ctx context.Context, claim *resourceapi.ResourceClaim, r resourceapi.DeviceRequestAllocationResult, ref vfRef,
	mac net.HardwareAddr, looked *maclookup.Result) (*checkpoint.Standby, error) {
	refuse := func(format string, args ...any) error {
		return fmt.Errorf("device %s: claim %s/%s request %q: VFConfig.failover: %s", r.Device, claim.Namespace, claim.Name, r.Request, fmt.Sprintf(format, args...))
	}
	if s.opts.StandbyBridge == nil {
		// vfnet's plumbing is off (--standby-nri=false, or a simulated
		// driver without --standby-netns): the admin makes the tap.
		klog.FromContext(ctx).Info("Failover standby plumbing is off in this driver: the launcher pod's standby tap must be made by other means",
			"device", r.Device, "tap", "vfsb… (pkg/contract/standby.TargetDev of the VMI interface)")
		return nil, nil
	}
	if looked == nil {
		if s.opts.MACs == nil {
			return nil, refuse("the driver has no VMI lookup, and the standby's tap is named after the VMI interface: remove failover: true")
		}
		res, found, err := s.opts.MACs.Find(ctx, claim, r.Request)
		if err != nil {
			return nil, refuse("find the VMI interface the claim backs: %v", err)
		}
		if found {
			looked = &res
		}
	}
	if looked == nil || looked.Interface == "" {
		return nil, refuse("no VirtualMachineInstance uses the claim through the vfnet binding (status.reservedFor -> virt-launcher pod -> VMI interface whose network names this claim and request), and the standby's tap is named after that interface; use failover only in a VM's claims")
	}
	var pods []types.UID
	for _, rf := range claim.Status.ReservedFor {
		if rf.APIGroup == "" && rf.Resource == "pods" {
			pods = append(pods, rf.UID)
		}
	}
	if len(pods) == 0 {
		return nil, refuse("the claim is reserved for no pod, so there is no launcher pod to plumb the standby into")
	}
	bridge, err := s.opts.StandbyBridge(ctx, ref.PFAddress, ref.PFName)
	if err != nil {
		return nil, refuse("%v", err)
	}
	return &checkpoint.Standby{PodUIDs: pods, Interface: looked.Interface, MAC: mac.String(), Bridge: bridge}, nil
}

// Standby is one prepared failover standby, for the NRI plugin.
type Standby struct {
	checkpoint.Standby
	// Claim is namespace/name.
	Claim string
}

// StandbysOf returns the standbys prepared for pod podUID, from the
// checkpoint on disk (another driver instance may have prepared the claim
// during a rolling update). Claims being unprepared are left out.
func StandbysOf(f *checkpoint.File, podUID types.UID) []Standby {
	var out []Standby
	for _, c := range f.Claims {
		if c.Phase == checkpoint.PhaseUnpreparing {
			continue
		}
		for _, d := range c.Devices {
			if d.Standby == nil {
				continue
			}
			for _, uid := range d.Standby.PodUIDs {
				if uid == podUID {
					out = append(out, Standby{Standby: *d.Standby, Claim: c.Namespace + "/" + c.Name})
					break
				}
			}
		}
	}
	return out
}

// StandbyOfVF returns the standby recorded for the failover VF at bdf;
// false when the VF is not prepared with one.
func StandbyOfVF(f *checkpoint.File, bdf string) (checkpoint.Standby, bool) {
	for _, c := range f.Claims {
		for _, d := range c.Devices {
			if d.BDF == bdf && d.Standby != nil {
				return *d.Standby, true
			}
		}
	}
	return checkpoint.Standby{}, false
}
