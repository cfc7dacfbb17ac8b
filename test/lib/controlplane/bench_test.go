package controlplane

import (
	"testing"

	"k8s.io/klog/v2/ktesting"
)

// BenchmarkStart measures starting the whole plane until every component is
// ready (and stopping it, outside the timer).
func BenchmarkStart(b *testing.B) {
	_, ctx := ktesting.NewTestContext(b)
	for b.Loop() {
		p, err := Start(ctx, Options{})
		if err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		if err := p.Stop(); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
}
