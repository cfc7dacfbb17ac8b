package publish

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/vfnet-io/vfnet/driver/discovery"
	"github.com/vfnet-io/vfnet/pkg/api/nodeconfig"
	"github.com/vfnet-io/vfnet/test/lib/simhost"
)

// BenchmarkDiscoverAndBuildLargeHost is one rescan of a 4 PF x 256 VF host:
// sysfs discovery, selection, attributes and splitting into 8 slices.
// Goal: under 50 ms per run.
func BenchmarkDiscoverAndBuildLargeHost(b *testing.B) {
	h, err := simhost.Build(b.TempDir(), simhost.LargeHost())
	if err != nil {
		b.Fatal(err)
	}
	defer h.Close()
	cfg, err := nodeconfig.Parse([]byte("apiVersion: vfnet.io/v1alpha1\nkind: NodeConfig\npfs:\n- vendorID: \"8086\"\n  deviceID: \"1593\"\n  network: physnet-a\n"), "bench.yaml")
	if err != nil {
		b.Fatal(err)
	}
	s := h.Sysfs()
	ctx := context.Background()
	b.ReportAllocs()
	defer reportCPU(b)()
	for b.Loop() {
		pfs, err := s.Discover(ctx)
		if err != nil {
			b.Fatal(err)
		}
		res, err := discovery.Build(pfs, cfg, discovery.Options{})
		if err != nil {
			b.Fatal(err)
		}
		pool := DriverResources("node", res.Devices, nil).Pools["node"]
		if len(pool.Slices) != 8 || len(res.Devices) != 1024 {
			b.Fatalf("%d slices, %d devices", len(pool.Slices), len(res.Devices))
		}
	}
}

// BenchmarkBuildOnly is the pure part (no sysfs reads) for 1024 VFs.
func BenchmarkBuildOnly(b *testing.B) {
	h, err := simhost.Build(b.TempDir(), simhost.LargeHost())
	if err != nil {
		b.Fatal(err)
	}
	defer h.Close()
	pfs, err := h.Sysfs().Discover(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	cfg, _ := nodeconfig.Parse([]byte("apiVersion: vfnet.io/v1alpha1\nkind: NodeConfig\npfs:\n- deviceID: \"1593\"\n  network: physnet-a\n"), "bench.yaml")
	b.ReportAllocs()
	defer reportCPU(b)()
	for b.Loop() {
		res, err := discovery.Build(pfs, cfg, discovery.Options{})
		if err != nil {
			b.Fatal(err)
		}
		_ = DriverResources("node", res.Devices, nil)
	}
}

// reportCPU adds the process CPU time per op: on a shared, loaded machine
// wall time per op mostly measures the wait for a core.
func reportCPU(b *testing.B) func() {
	cpu := func() time.Duration {
		var ru syscall.Rusage
		if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
			b.Fatal(err)
		}
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	start := cpu()
	return func() {
		b.ReportMetric(float64(cpu()-start)/float64(time.Millisecond)/float64(b.N), "cpu-ms/op")
	}
}
