package kubevirtvmi

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/randfill"

	"github.com/vfnet-io/vfnet/pkg/contract/vmiview"
)

// TestViewMatchesKubeVirtAPI pins vmiview's JSON names to kubevirt.io/api:
// a VMI marshalled by kubevirt.io/api's types and decoded by vmiview (what
// vfnet-binding does with virt-launcher's JSON and vfnet-driver with the API
// server's) must equal View's field-by-field copy, for random values of
// every field vfnet reads.
func TestViewMatchesKubeVirtAPI(t *testing.T) {
	t.Parallel()
	f := randfill.NewWithSeed(1).NilChance(0.3).NumElements(0, 4)
	for i := range 500 {
		vmi := &kubevirtv1.VirtualMachineInstance{}
		f.Fill(&vmi.Name)
		f.Fill(&vmi.Namespace)
		f.Fill(&vmi.UID)
		f.Fill(&vmi.ResourceVersion)
		f.Fill(&vmi.Spec.Domain.Devices.Interfaces)
		f.Fill(&vmi.Spec.Networks)
		f.Fill(&vmi.Spec.ResourceClaims)
		f.Fill(&vmi.Status.MigrationState)
		if ms := vmi.Status.MigrationState; ms != nil {
			// Random times and quantities do not survive a JSON round
			// trip (metav1.Time keeps seconds); the start time is read.
			ms.EndTimestamp, ms.TargetNodeDomainReadyTimestamp, ms.TargetMemoryOverhead = nil, nil, nil
			if i%3 != 0 {
				st := metav1.NewTime(time.Unix(1_800_000_000+int64(i)*7919, 0))
				ms.StartTimestamp = &st
			} else {
				ms.StartTimestamp = nil
			}
			if ms.TargetState != nil {
				ms.TargetState.DomainReadyTimestamp = nil
			}
		}
		for j := range vmi.Spec.Domain.Devices.Interfaces {
			// Not read by vfnet; random values of its custom types do not
			// marshal.
			vmi.Spec.Domain.Devices.Interfaces[j].DHCPOptions = nil
		}
		b, err := json.Marshal(vmi)
		if err != nil {
			t.Fatalf("case %d: marshal: %v", i, err)
		}
		got, err := vmiview.Decode(b)
		if err != nil {
			t.Fatalf("case %d: decode: %v", i, err)
		}
		if want := View(vmi); !reflect.DeepEqual(normalize(got), normalize(want)) {
			t.Fatalf("case %d: decoded view\n%+v\nwant\n%+v\nfrom %s", i, got, want, b)
		}
	}
}

// normalize makes nil and empty slices equal: omitempty drops empty ones.
func normalize(v *vmiview.VMI) *vmiview.VMI {
	c := *v
	if len(c.Spec.Domain.Devices.Interfaces) == 0 {
		c.Spec.Domain.Devices.Interfaces = nil
	}
	if len(c.Spec.Networks) == 0 {
		c.Spec.Networks = nil
	}
	if len(c.Spec.ResourceClaims) == 0 {
		c.Spec.ResourceClaims = nil
	}
	return &c
}
