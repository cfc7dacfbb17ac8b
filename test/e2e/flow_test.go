package e2e

import (
	"testing"
	"time"
)

// TestFlow is issue 6's end-to-end flow on the real control plane with the
// real driver (vfnet-driver-sim --simulate) and vfnet-binding binaries; see
// flow.Env.RunScenario for the steps and what each checks.
func TestFlow(t *testing.T) {
	t.Parallel()
	ctx, env := newEnv(t)
	res, err := env.RunScenario(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for vm, d := range res.PodToPrepared {
		t.Logf("measured: %s pod creation -> VF prepared: %v", vm, d.Round(time.Millisecond))
	}
	t.Logf("measured: control plane start %v", env.Plane.StartDuration.Round(time.Millisecond))
}
