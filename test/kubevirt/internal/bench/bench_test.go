package bench

import (
	"context"
	"fmt"
	"os"
	"testing"

	"github.com/vfnet-io/vfnet/test/kubevirt/internal/mountns"
	"github.com/vfnet-io/vfnet/test/kubevirt/internal/product"
)

func TestMain(m *testing.M) {
	if _, child, err := mountns.Child(); child {
		fmt.Fprintln(os.Stderr, "bench child:", err)
		os.Exit(1)
	}
	os.Exit(m.Run())
}

// TestRunSmoke runs the benchmark harness end to end with a few calls: both
// sidecars build, start, answer, and produce the output each is meant to
// (Run checks the 8 hostdevs and the passt interface). No timing is asserted.
func TestRunSmoke(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("needs root: KubeVirt's passt sidecar serves only in /var/run/kubevirt-hooks, bind-mounted in a private mount namespace")
	}
	// The binding is part of the product: its absence is a move or a
	// broken tree, which must fail rather than skip the benchmark.
	ok, err := product.HasBinding()
	if err != nil {
		t.Fatalf("cannot tell whether the product has %s: %v", product.BindingPackage, err)
	}
	if !ok {
		t.Fatalf("no %s/main.go in the product tree: the benchmark builds vfnet-binding from there (update product.BindingPackage if it moved)", product.BindingPackage)
	}
	rs, err := Run(context.Background(), Config{Calls: 5, Warmup: 1, AsTiers: true}, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 2 {
		t.Fatalf("%d results", len(rs))
	}
	for _, r := range rs {
		if r.RSSEndKiB <= 0 || r.P50 <= 0 {
			t.Errorf("%s: empty measurement %+v", r.Name, r)
		}
	}
	t.Log("\n" + Format(rs))
}
