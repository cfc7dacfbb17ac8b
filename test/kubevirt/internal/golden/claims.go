package golden

import (
	"fmt"

	"github.com/vfnet-io/vfnet/test/kubevirt/internal/drameta"
)

// Claims returns the metadata the driver would have written for the case's
// vfnet interfaces: one claim request per VF, at the template or direct path
// the VMI's resourceClaims entry implies.
func (c Case) Claims() ([]drameta.Claim, error) {
	var out []drameta.Claim
	for _, vf := range c.VFs {
		var claimName, request string
		for _, n := range c.VMI.Spec.Networks {
			if n.Name == vf.Interface && n.ResourceClaim != nil {
				claimName, request = n.ResourceClaim.ClaimName, n.ResourceClaim.RequestName
			}
		}
		if claimName == "" {
			return nil, fmt.Errorf("case %s: interface %s has no resourceClaim network", c.Name, vf.Interface)
		}
		claim := drameta.Claim{
			Namespace: c.VMI.Namespace,
			UID:       "c1a1e000-0000-4000-8000-" + uidSuffix(c.Name+vf.Interface),
			Request:   request,
			Devices:   []drameta.Device{{Pool: "node-1", Name: "vf-" + vf.PCIBusID, PCIBusID: vf.PCIBusID, MAC: vf.MAC}},
		}
		found := false
		for _, rc := range c.VMI.Spec.ResourceClaims {
			if rc.Name != claimName {
				continue
			}
			found = true
			if rc.ResourceClaimName != nil {
				claim.Name = *rc.ResourceClaimName
			} else {
				// The generated ResourceClaim's name is random; the file is
				// keyed by the pod claim name.
				claim.Name = c.VMI.Name + "-" + claimName + "-x7k2p"
				claim.PodClaimName = claimName
			}
		}
		if !found {
			return nil, fmt.Errorf("case %s: claim %s not in spec.resourceClaims", c.Name, claimName)
		}
		out = append(out, claim)
	}
	return out, nil
}
