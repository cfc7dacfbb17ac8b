package prepare_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/vfnet-io/vfnet/driver/checkpoint"
	"github.com/vfnet-io/vfnet/driver/prepare"
	"github.com/vfnet-io/vfnet/test/lib/preparetest"
	"github.com/vfnet-io/vfnet/test/lib/simhost"
)

// A failover device records what the NRI plugin needs (launcher pod, VMI
// interface, MAC, the PF's node bridge), whether the MAC comes from the VMI
// or from VFConfig.mac; StandbysOf finds it by pod. A claim no VMI uses,
// and a PF whose standby is not usable (StandbyBridge's error: no bridge
// configured, bridge missing, NRI not connected), are refused at plan time
// naming the cause, with nothing changed.
func TestFailoverStandbyRecorded(t *testing.T) {
	t.Parallel()
	e := preparetest.NewEnv(t, "", simhost.E810Host())
	opts := e.Options(nil)
	var asked []string
	bridgeErr := map[string]error{}
	opts.StandbyBridge = func(_ context.Context, pfAddress, pfNetDev string) (string, error) {
		asked = append(asked, pfAddress+"/"+pfNetDev)
		if err := bridgeErr[pfAddress]; err != nil {
			return "", err
		}
		return "br-phys", nil
	}
	s, err := prepare.New(opts)
	if err != nil {
		t.Fatal(err)
	}

	vm := e.AddVM(t, "ns", "vm-a", "vf-claim", "02:00:00:00:00:05")
	fromVMI := preparetest.ReserveFor(preparetest.Claim("ns", "a", "uid-a", []string{vf1},
		preparetest.Config(fromClaim, `{`+hdr+`,"failover":true}`)), vm, "vf-claim")
	vmB := e.AddVM(t, "ns", "vm-b", "vf-claim", "")
	fromCfg := preparetest.ReserveFor(preparetest.Claim("ns", "b", "uid-b", []string{"vf-0000-3b-02-2"},
		preparetest.Config(fromClaim, `{`+hdr+`,"failover":true,"mac":"02:aa:00:00:00:03"}`)), vmB, "vf-claim")
	for _, c := range []struct {
		claimUID types.UID
		pod      types.UID
		mac      string
	}{{"uid-a", vm.UID, "02:00:00:00:00:05"}, {"uid-b", vmB.UID, "02:aa:00:00:00:03"}} {
		claim := fromVMI
		if c.claimUID == "uid-b" {
			claim = fromCfg
		}
		e.AddClaim(t, claim)
		if r := prepareOne(t, s, claim); r.Err != nil {
			t.Fatalf("prepare %s: %v", claim.Name, r.Err)
		}
		got := s.Snapshot().Claims[c.claimUID].Devices[0].Standby
		want := checkpoint.Standby{PodUIDs: []types.UID{c.pod}, Interface: "dra-net", MAC: c.mac, Bridge: "br-phys"}
		if got == nil || !slices.Equal(got.PodUIDs, want.PodUIDs) || got.Interface != want.Interface || got.MAC != want.MAC || got.Bridge != want.Bridge {
			t.Errorf("%s: recorded standby %+v, want %+v", claim.Name, got, want)
		}
		byPod := prepare.StandbysOf(s.Snapshot(), c.pod)
		if len(byPod) != 1 || byPod[0].Claim != "ns/"+claim.Name || byPod[0].Interface != "dra-net" {
			t.Errorf("StandbysOf(%s) = %+v", c.pod, byPod)
		}
	}
	for _, a := range asked {
		if pf, netdev, _ := strings.Cut(a, "/"); len(asked) != 2 || !strings.HasPrefix(pf, "0000:3b:") || netdev == "" {
			t.Errorf("StandbyBridge asked for %v, want each device's PF address and netdev", asked)
		}
	}
	if got := prepare.StandbysOf(s.Snapshot(), "some-other-pod"); len(got) != 0 {
		t.Errorf("StandbysOf(another pod) = %+v", got)
	}
	// Unprepare: the record goes with the claim.
	for _, c := range []*resourceapi.ResourceClaim{fromVMI, fromCfg} {
		if err := unprepareOne(t, s, c); err != nil {
			t.Fatal(err)
		}
	}
	if got := prepare.StandbysOf(s.Snapshot(), vm.UID); len(got) != 0 {
		t.Errorf("after unprepare StandbysOf = %+v", got)
	}

	// No VMI uses the claim: the tap could not be named.
	orphan := preparetest.Claim("ns", "orphan", "uid-orphan", []string{"vf-0000-3b-02-3"},
		preparetest.Config(fromClaim, `{`+hdr+`,"failover":true,"mac":"02:aa:00:00:00:09"}`))
	e.AddClaim(t, orphan)
	before := e.Snapshot(t)
	r := prepareOne(t, s, orphan)
	if r.Err == nil || !strings.Contains(r.Err.Error(), "no VirtualMachineInstance uses the claim") || !strings.Contains(r.Err.Error(), "VFConfig.failover") {
		t.Fatalf("orphan failover claim: %v", r.Err)
	}
	assertUntouched(t, e, s, before)

	// The PF's standby is not usable: StandbyBridge's reason is the error.
	bridgeErr[strings.SplitN(asked[0], "/", 2)[0]] = errors.New("PF 0000:3b:00.0 (ens1f0) has no standby bridge: set pfs[0].standby.bridge in node-config.yaml")
	vmC := e.AddVM(t, "ns", "vm-c", "vf-claim", "02:00:00:00:00:07")
	noBridge := preparetest.ReserveFor(preparetest.Claim("ns", "c", "uid-c", []string{vf1},
		preparetest.Config(fromClaim, `{`+hdr+`,"failover":true}`)), vmC, "vf-claim")
	e.AddClaim(t, noBridge)
	before = e.Snapshot(t)
	r = prepareOne(t, s, noBridge)
	if r.Err == nil {
		t.Fatal("prepared a failover claim on a PF without a standby bridge")
	}
	for _, want := range []string{"pfs[0].standby.bridge", "ns/c", vf1, "VFConfig.failover"} {
		if !strings.Contains(r.Err.Error(), want) {
			t.Errorf("error %q lacks %q", r.Err, want)
		}
	}
	if got := prepare.StepOf(r.Err); got != prepare.ErrStepPlan {
		t.Errorf("step %q, want %q", got, prepare.ErrStepPlan)
	}
	assertUntouched(t, e, s, before)
}
