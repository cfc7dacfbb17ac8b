package prepare

import (
	"context"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	"github.com/vfnet-io/vfnet/driver/metrics"
	"github.com/vfnet-io/vfnet/driver/prepare"
	"github.com/vfnet-io/vfnet/test/lib/preparetest"
	"github.com/vfnet-io/vfnet/test/lib/scrape"
	"github.com/vfnet-io/vfnet/test/lib/simhost"
)

// claimGauges is one reading of the claim gauges, taken at a prepare step.
type claimGauges struct {
	step              string
	prepared, pending float64
}

// TestClaimGaugesFollowCheckpoint reads the driver's claim gauges, wired
// as vfnet-driver wires them, after every step of a prepare that the PF
// refuses (rolled back), of one that succeeds and of its unprepare. A VF
// counts as prepared only once its claim's prepare finished, and as
// pending while a prepare or unprepare is under way: the e2e TestMetrics
// once read prepared_devices 1 while the kubelet retried a refused prepare.
func TestClaimGaugesFollowCheckpoint(t *testing.T) {
	t.Parallel()
	e := preparetest.NewEnv(t, "", simhost.E810Host())
	var s *prepare.State
	m := metrics.New(metrics.State{Claimed: func() []metrics.ClaimDevice { return metrics.ClaimDevices(s.Snapshot()) }})
	read := func(step string) claimGauges {
		fams, err := m.Registry().Gather()
		if err != nil {
			t.Fatal(err)
		}
		f := scrape.Families{}
		for _, fam := range fams {
			f[fam.GetName()] = fam
		}
		return claimGauges{step, f.Sum("vfnet_driver_prepared_devices", nil), f.Sum("vfnet_driver_pending_devices", nil)}
	}
	var trace []claimGauges
	s = e.NewState(t, func(step string) { trace = append(trace, read(step)) })
	ctx := context.Background()

	// ice refuses a minimum rate above the E810 port's 25 Gb/s.
	bad := preparetest.Claim("ns", "too-fast", "uid-bad", []string{"vf-0000-3b-02-1"},
		preparetest.Config("FromClaim", `{"apiVersion":"vfnet.io/v1alpha1","kind":"VFConfig","minTxRateMbps":30000}`))
	e.AddClaim(t, bad)
	for attempt := range 2 { // the kubelet retries
		trace = nil
		res, err := s.Prepare(ctx, []*resourceapi.ResourceClaim{bad})
		if err != nil || res[bad.UID].Err == nil {
			t.Fatalf("attempt %d: prepare of a rate the PF refuses: %v, %+v; want a claim error", attempt, err, res)
		}
		sawPending := false
		for _, g := range trace {
			if g.prepared != 0 {
				t.Errorf("attempt %d, step %s: prepared_devices %v during a prepare that fails", attempt, g.step, g.prepared)
			}
			sawPending = sawPending || g.pending == 1
		}
		if !sawPending {
			t.Errorf("attempt %d: pending_devices never 1 during the prepare: %+v", attempt, trace)
		}
		if g := read("rolled back"); g.prepared != 0 || g.pending != 0 {
			t.Errorf("attempt %d: after the rollback prepared %v, pending %v; want 0, 0", attempt, g.prepared, g.pending)
		}
	}

	good := preparetest.Claim("ns", "ok", "uid-good", []string{"vf-0000-3b-02-2"},
		preparetest.Config("FromClaim", `{"apiVersion":"vfnet.io/v1alpha1","kind":"VFConfig","vlan":100}`))
	e.AddClaim(t, good)
	trace = nil
	if res, err := s.Prepare(ctx, []*resourceapi.ResourceClaim{good}); err != nil || res[good.UID].Err != nil {
		t.Fatalf("prepare: %v, %+v", err, res)
	}
	for _, g := range trace {
		// The last step is the checkpoint's Prepared write itself.
		want := claimGauges{g.step, 0, 1}
		if g.step == prepare.StepCheckpointPrepared {
			want = claimGauges{g.step, 1, 0}
		}
		if g != want {
			t.Errorf("prepare step %s: prepared %v, pending %v; want %v, %v", g.step, g.prepared, g.pending, want.prepared, want.pending)
		}
	}
	if g := read("prepared"); g.prepared != 1 || g.pending != 0 {
		t.Errorf("after prepare: prepared %v, pending %v; want 1, 0", g.prepared, g.pending)
	}

	trace = nil
	ref := kubeletplugin.NamespacedObject{UID: good.UID, NamespacedName: types.NamespacedName{Namespace: good.Namespace, Name: good.Name}}
	if res, err := s.Unprepare(ctx, []kubeletplugin.NamespacedObject{ref}); err != nil || res[good.UID] != nil {
		t.Fatalf("unprepare: %v, %+v", err, res)
	}
	for _, g := range trace {
		want := claimGauges{g.step, 0, 1} // unpreparing
		if g.step == prepare.StepCheckpointDropped {
			want = claimGauges{g.step, 0, 0}
		}
		if g != want {
			t.Errorf("unprepare step %s: prepared %v, pending %v; want %v, %v", g.step, g.prepared, g.pending, want.prepared, want.pending)
		}
	}
	if len(trace) == 0 {
		t.Error("unprepare called no step hook")
	}
}
