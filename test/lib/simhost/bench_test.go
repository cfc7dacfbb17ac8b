package simhost

import (
	"syscall"
	"testing"
	"time"
)

// cpuTime is this process's user+system CPU time. The benchmarks report it
// per op next to wall time: on a machine shared with other builds, wall
// time mostly measures the queue for a CPU.
func cpuTime(tb testing.TB) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func BenchmarkBuildLargeHost(b *testing.B) {
	start := cpuTime(b)
	for b.Loop() {
		dir := TempDir(b)
		h, err := Build(dir, LargeHost())
		if err != nil {
			b.Fatal(err)
		}
		h.Close()
	}
	b.ReportMetric(float64(cpuTime(b)-start)/float64(b.N)/1e6, "cpu-ms/op")
}
