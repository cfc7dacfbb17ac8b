// Command bindingbench runs vfnet-binding and KubeVirt v1.9.0's passt
// binding sidecar side by side and reports OnDefineDomain latency (8 vfnet
// interfaces) and each sidecar's RSS after the calls. Needs root (the passt
// sidecar runs in a private mount namespace for its fixed socket path).
//
//	cd test/kubevirt && go run ./cmd/bindingbench [-calls 1000] [-cgo 0] [-tags grpcnotrace]
//
// -cgo and -tags set CGO_ENABLED and GOFLAGS=-tags=... for both builds
// alike; by default both sidecars build as plain `go build` does here.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/vfnet-io/vfnet/test/kubevirt/internal/bench"
	"github.com/vfnet-io/vfnet/test/kubevirt/internal/mountns"
)

func main() {
	if _, child, err := mountns.Child(); child {
		// Only returns on failure: a successful child execs the sidecar.
		fmt.Fprintln(os.Stderr, "bindingbench child:", err)
		os.Exit(1)
	}
	calls := flag.Int("calls", 1000, "measured OnDefineDomain calls per sidecar")
	warmup := flag.Int("warmup", 20, "unmeasured calls per sidecar before measuring")
	verbose := flag.Bool("sidecar-logs", false, "show the sidecars' logs")
	cgo := flag.String("cgo", "", "CGO_ENABLED for building both sidecars (\"\" = as the environment says)")
	tags := flag.String("tags", "", "build tags for both sidecars, e.g. grpcnotrace")
	flag.Parse()
	if err := buildEnv(*cgo, *tags); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}

	dir, err := os.MkdirTemp("", "vfbench")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer os.RemoveAll(dir)
	cfg := bench.Config{Calls: *calls, Warmup: *warmup}
	if *verbose {
		cfg.Log = os.Stderr
	}
	results, err := bench.Run(context.Background(), cfg, dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bindingbench:", err)
		os.Exit(1)
	}
	fmt.Printf("OnDefineDomain, %d calls each (after %d warm-up), same domain XML (%d bytes) and VMI; both built with CGO_ENABLED=%q GOFLAGS=%q:\n",
		*calls, *warmup, results[0].DomainBytesSent, os.Getenv("CGO_ENABLED"), os.Getenv("GOFLAGS"))
	fmt.Print(bench.Format(results))
	v, p := results[0], results[1]
	fmt.Printf("vfnet/passt: p50 %.2fx, p99 %.2fx, RSS %.2fx (goal: p50 and p99 lower, RSS <= 0.6x: %v)\n",
		float64(v.P50)/float64(p.P50), float64(v.P99)/float64(p.P99),
		float64(v.RSSEndKiB)/float64(p.RSSEndKiB),
		v.RSSEndKiB*10 <= p.RSSEndKiB*6 && v.P50 < p.P50 && v.P99 < p.P99)
}

// buildEnv sets what the `go build` of both sidecars inherits.
func buildEnv(cgo, tags string) error {
	if cgo != "" {
		if err := os.Setenv("CGO_ENABLED", cgo); err != nil {
			return err
		}
	}
	if tags != "" {
		return os.Setenv("GOFLAGS", strings.TrimSpace(os.Getenv("GOFLAGS")+" -tags="+tags))
	}
	return nil
}
