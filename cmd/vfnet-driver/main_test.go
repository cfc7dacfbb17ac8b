package main

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// TestShipsNoSimulator: the shipped driver links neither test/lib/simhost nor
// the --simulate adapter nor test code, with or without the images' build
// tag (go list -deps is what the linker gets). vfnet-driver-sim is listed
// too, so a renamed package cannot make the check pass vacuously.
func TestShipsNoSimulator(t *testing.T) {
	t.Parallel()
	const mod = "github.com/vfnet-io/vfnet/"
	forbidden := []string{mod + "test/lib/simhost", mod + "test/lib/simulate", mod + "test"}
	deps := func(pkg string, tags ...string) []string {
		t.Helper()
		args := append([]string{"list", "-deps"}, tags...)
		out, err := exec.Command("go", append(args, pkg)...).Output()
		if err != nil {
			t.Fatalf("go list -deps %s: %v", pkg, err)
		}
		return strings.Fields(string(out))
	}
	for _, tags := range [][]string{nil, {"-tags", "grpcnotrace"}} {
		for _, d := range deps(mod+"cmd/vfnet-driver", tags...) {
			for _, f := range forbidden {
				if d == f || strings.HasPrefix(d, f+"/") {
					t.Errorf("vfnet-driver (tags %v) links %s: the shipped build must not carry the simulator; only test/cmd/vfnet-driver-sim passes one to app.Main", tags, d)
				}
			}
		}
	}
	sim := deps(mod + "test/cmd/vfnet-driver-sim")
	for _, f := range forbidden[:2] {
		if !slices.Contains(sim, f) {
			t.Errorf("vfnet-driver-sim does not link %s: the check above looks for a name that no longer exists", f)
		}
	}
}
