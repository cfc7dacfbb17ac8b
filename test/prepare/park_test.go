package prepare

import (
	"context"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/vfnet-io/vfnet/driver/prepare"
	"github.com/vfnet-io/vfnet/test/lib/preparetest"
	"github.com/vfnet-io/vfnet/test/lib/simhost"
)

const (
	parkBDF = "0000:3b:02.1"
	parkMAC = "02:aa:00:00:00:37"
	zeroMAC = "00:00:00:00:00:00"
)

// parkClaim is a failover claim with a fixed MAC on VF parkBDF.
func parkClaim() *resourceapi.ResourceClaim {
	return preparetest.Claim("ns", "park", "uid-park", []string{"vf-0000-3b-02-1"},
		preparetest.Config(resourceapi.AllocationConfigSourceClaim, `{"apiVersion":"vfnet.io/v1alpha1","kind":"VFConfig","failover":true,"mac":"`+parkMAC+`"}`))
}

// TestParkCrashAtEveryStep kills the driver (a child process) at every step
// of parking and of restoring a failover VF's MAC and checks that the
// restarted driver converges: Converge (run at start-up) makes the VF's MAC
// what the checkpoint wants, a repeated prepare then finds nothing to
// repair, and unprepare restores the VF's original MAC whatever the park
// state.
func TestParkCrashAtEveryStep(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"park", "unpark"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			want := map[string]string{"park": zeroMAC, "unpark": parkMAC}[mode]
			before := map[string]string{"park": parkMAC, "unpark": zeroMAC}[mode]
			var steps []string
			for n := 1; ; n++ {
				e := preparetest.NewEnv(t, preparetest.FastDir(), simhost.E810Host())
				original := vfMAC(t, e)
				claim := parkClaim()
				e.AddClaim(t, claim)
				s := e.NewState(t, nil)
				prepareClaim(t, s, claim)
				if mode == "unpark" {
					if _, err := s.SetMACParked(ctx, parkBDF, true); err != nil {
						t.Fatal(err)
					}
				}
				if got := vfMAC(t, e); got != before {
					t.Fatalf("before %s: VF MAC %s, want %s", mode, got, before)
				}
				step := runHelper(t, e, "TestCrashChildProcess", mode, n)
				if step == "" {
					break
				}
				steps = append(steps, step)
				s = e.NewState(t, nil)
				if err := s.Converge(ctx); err != nil {
					t.Fatalf("crash after %s: converge: %v", step, err)
				}
				if got := vfMAC(t, e); got != want {
					t.Errorf("crash after %s: VF MAC %s after the restart, want %s", step, got, want)
				}
				prepareClaim(t, s, claim)
				if got := vfMAC(t, e); got != want {
					t.Errorf("crash after %s: repeated prepare changed the VF MAC to %s, want %s", step, got, want)
				}
				unprepareClaim(t, s, claim)
				if got := vfMAC(t, e); got != original {
					t.Errorf("crash after %s: VF MAC %s after unprepare, want the original %s", step, got, original)
				}
			}
			wantSteps := map[string][]string{
				"park":   {prepare.StepParkRecorded, prepare.StepParkApplied},
				"unpark": {prepare.StepUnparkRecorded, prepare.StepUnparkApplied},
			}[mode]
			if len(steps) != len(wantSteps) || steps[0] != wantSteps[0] || steps[1] != wantSteps[1] {
				t.Errorf("crash points %v, want %v", steps, wantSteps)
			}
		})
	}
}

// TestParkRefusesNonFailoverVF: a VF prepared without failover keeps its
// MAC whatever the watcher asks, and one not prepared here is named.
func TestParkRefusesNonFailoverVF(t *testing.T) {
	t.Parallel()
	e := preparetest.NewEnv(t, preparetest.FastDir(), simhost.E810Host())
	claim := preparetest.Claim("ns", "plain", "uid-plain", []string{"vf-0000-3b-02-1"},
		preparetest.Config(resourceapi.AllocationConfigSourceClaim, `{"apiVersion":"vfnet.io/v1alpha1","kind":"VFConfig","mac":"`+parkMAC+`"}`))
	e.AddClaim(t, claim)
	s := e.NewState(t, nil)
	if _, err := s.SetMACParked(t.Context(), parkBDF, true); err == nil || err.Error() != "VF "+parkBDF+" is not prepared on this node" {
		t.Errorf("park of an unprepared VF: %v", err)
	}
	prepareClaim(t, s, claim)
	if s.IsFailover(parkBDF) {
		t.Error("IsFailover true for a claim without failover")
	}
	_, err := s.SetMACParked(t.Context(), parkBDF, true)
	if err == nil || !strings.Contains(err.Error(), "not a failover device") {
		t.Errorf("park of a non-failover VF: %v", err)
	}
	if got := vfMAC(t, e); got != parkMAC {
		t.Errorf("VF MAC %s, want %s", got, parkMAC)
	}
}

// vfMAC reads parkBDF's MAC through its PF, as the kernel reports it.
func vfMAC(t *testing.T, e *preparetest.Env) string {
	t.Helper()
	st, err := e.Host.VFStateOf(parkBDF)
	if err != nil {
		t.Fatal(err)
	}
	return st.MAC.String()
}
