package sysfs_test

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/vfnet-io/vfnet/test/lib/simhost"
)

// cpuTime is this process's user+system CPU time. The benchmark reports it
// per op next to wall time: on a machine shared with other builds, wall
// time mostly measures the queue for a CPU.
func cpuTime(tb testing.TB) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkDiscoverLargeHost discovers 4 PFs x 256 VFs.
func BenchmarkDiscoverLargeHost(b *testing.B) {
	h, err := simhost.Build(simhost.TempDir(b), simhost.LargeHost())
	if err != nil {
		b.Fatal(err)
	}
	defer h.Close()
	s := h.Sysfs()
	ctx := context.Background()
	b.ReportAllocs()
	start := cpuTime(b)
	for b.Loop() {
		pfs, err := s.Discover(ctx)
		if err != nil {
			b.Fatal(err)
		}
		n := 0
		for _, pf := range pfs {
			n += len(pf.VFs)
		}
		if n != 1024 {
			b.Fatalf("discovered %d VFs, want 1024", n)
		}
	}
	b.ReportMetric(float64(cpuTime(b)-start)/float64(b.N)/1e6, "cpu-ms/op")
}
