package vfcount_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"

	"github.com/vfnet-io/vfnet/driver/discovery"
	"github.com/vfnet-io/vfnet/driver/publish"
	"github.com/vfnet-io/vfnet/driver/vfcount"
	"github.com/vfnet-io/vfnet/pkg/api/nodeconfig"
	"github.com/vfnet-io/vfnet/test/lib/simhost"
)

// The tests here drive a lowering 4 -> 2 of pf0 with a read-back that
// lags, fails, hangs or shows a stale slice: sriov_numvfs is written only
// while the API server's view shows every VF of the PF tainted.

const lowerTo2 = "pfs:\n- pfName: enp59s0f0\n  network: physnet-a\n  numVFs: 2\n"

// logsOf points e's scans at a logger whose output the test can read.
func logsOf(t *testing.T, e *env) func() string {
	t.Helper()
	logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.BufferLogs(true)))
	e.ctx = klog.NewContext(e.ctx, logger)
	return func() string { return logger.GetSink().(ktesting.Underlier).GetBuffer().String() }
}

// watchWrites records, at every write to pf0's sriov_numvfs, the count
// taints the API server's view showed then.
func watchWrites(e *env) *[]map[string]string {
	var at []map[string]string
	e.h.Kernel().SetWriteHook(func(rel string, _ []byte) error {
		if rel == "bus/pci/devices/"+pf0+"/sriov_numvfs" {
			at = append(at, e.pub.apiCountTaints())
		}
		return nil
	})
	return &at
}

// checkWritesAfterTaints fails unless every recorded write saw all four
// VFs of pf0 tainted as the lowering to 2 asks.
func checkWritesAfterTaints(t *testing.T, at []map[string]string) {
	t.Helper()
	if len(at) == 0 {
		t.Fatal("sriov_numvfs was never written")
	}
	for i, view := range at {
		for idx := range 4 {
			want := vfcount.TaintRecreating
			if idx >= 2 {
				want = vfcount.TaintRemoving
			}
			if name := devName(t, fmt.Sprintf("0000:3b:02.%d", idx)); view[name] != want {
				t.Errorf("write %d: the API server showed device %s with count taint %q, want %q (view %v)", i, name, view[name], want, view)
			}
		}
	}
}

// A controller that writes the slices three reads late: first the
// untainted publication stays visible, then the tainted one arrives; the
// write follows that read, not before, and the log says why it waited.
func TestLoweringWaitsForTaintsReadBack(t *testing.T) {
	t.Parallel()
	e := newEnv(t, simhost.E810Host(), "pfs:\n- pfName: enp59s0f0\n  network: physnet-a\n  numVFs: 4\n")
	logs := logsOf(t, e)
	e.scan() // in sync: publishes the four VFs untainted (shown at the first read)
	e.pub.lag = 3
	writes := watchWrites(e)
	e.setConfig(lowerTo2)
	var readsAtWrite int
	for pass := 1; ; pass++ {
		e.scan()
		if n, _ := e.numVFs(pf0); n != 4 {
			readsAtWrite = e.pub.reads
			break
		}
		if pass == 10 {
			t.Fatalf("no write after %d passes, %d reads\n%s", pass, e.pub.reads, logs())
		}
	}
	// Reads 1 (the untainted publication), 2 and 3 show no taint; the 4th
	// shows it.
	if readsAtWrite != 4 {
		t.Errorf("written after read %d, want after read 4 (lag 3)", readsAtWrite)
	}
	checkWritesAfterTaints(t, *writes)
	if w := e.numvfsWrites(pf0); !slices.Equal(w, []string{"0", "2"}) {
		t.Fatalf("writes %q, want 0 then 2", w)
	}
	out := logs()
	for _, want := range []string{
		"waiting for the API server to show the taint vfnet.io/vf-count-change on 4 devices of PF 0000:3b:00.0",
		"The API server shows the VF count taint on every published VF of the PF; the change may go ahead",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks %q:\n%s", want, out)
		}
	}
	if c := strings.Count(out, "VF count change waits for its taints in the API server"); c != 1 {
		t.Errorf("the wait was logged %d times over three passes, want once", c)
	}
}

// The read-back fails: nothing is written, the error is logged once; the
// change is made once reads work again.
func TestLoweringWaitsWhileReadBackFails(t *testing.T) {
	t.Parallel()
	e := newEnv(t, simhost.E810Host(), lowerTo2)
	logs := logsOf(t, e)
	writes := watchWrites(e)
	e.pub.readErr = errors.New(`Get "https://10.0.0.1/apis/resource.k8s.io/v1/resourceslices": connection refused`)
	for range 4 {
		e.scan()
	}
	if n, _ := e.numVFs(pf0); n != 4 || len(*writes) != 0 {
		t.Fatalf("wrote sriov_numvfs (now %d) although the slices could not be read back", n)
	}
	if e.pub.reads < 2 {
		t.Fatalf("read back %d times in 4 passes", e.pub.reads)
	}
	out := logs()
	if c := strings.Count(out, "VF count change waits: cannot read the published ResourceSlices back"); c != 1 || !strings.Contains(out, "connection refused") {
		t.Fatalf("want the read error logged once with its cause, got %d:\n%s", c, out)
	}
	e.pub.readErr = nil
	e.scan()
	if n, links := e.numVFs(pf0); n != 2 || links != 2 {
		t.Fatalf("after reads work again: sriov_numvfs %d, %d links; want 2", n, links)
	}
	checkWritesAfterTaints(t, *writes)
}

// An API server that never answers: each read gives up after the timeout
// and the loop carries on; nothing is written.
func TestLoweringWaitsWhileReadBackHangs(t *testing.T) {
	t.Parallel()
	e := newEnv(t, simhost.E810Host(), lowerTo2)
	logs := logsOf(t, e)
	writes := watchWrites(e)
	hang := true
	e.loop = publish.NewLoop(publish.LoopOptions{NodeName: "node-1", Discoverer: e.h.Sysfs(), Publisher: e.pub,
		LoadConfig: func() (*nodeconfig.Config, error) { return e.cfg, nil }, VFCount: e.rec,
		ReadBackTimeout: 100 * time.Millisecond,
		PublishedSlices: func(ctx context.Context) ([]resourceapi.ResourceSlice, error) {
			if hang {
				<-ctx.Done()
				return nil, ctx.Err()
			}
			return e.pub.PublishedSlices(ctx)
		}})
	start := time.Now()
	for range 3 {
		e.scan()
	}
	if n, _ := e.numVFs(pf0); n != 4 || len(*writes) != 0 {
		t.Fatalf("wrote sriov_numvfs (now %d) while the read-back hung", n)
	}
	if d := time.Since(start); d < 200*time.Millisecond || d > 20*time.Second {
		t.Errorf("three passes with two hanging reads took %v, want about 2 x 100ms", d)
	}
	if out := logs(); !strings.Contains(out, "no answer within 100ms") {
		t.Fatalf("log lacks the timeout:\n%s", out)
	}
	hang = false
	e.scan()
	if n, _ := e.numVFs(pf0); n != 2 {
		t.Fatalf("after the API server answers: sriov_numvfs %d, want 2", n)
	}
	checkWritesAfterTaints(t, *writes)
}

// A slice of an older generation still offers a VF without the taint
// (the controller has not replaced it yet): the scheduler may still see
// it, so the write waits until it is gone.
func TestLoweringWaitsForStaleSlice(t *testing.T) {
	t.Parallel()
	e := newEnv(t, simhost.E810Host(), lowerTo2)
	writes := watchWrites(e)
	node := "node-1"
	stale := resourceapi.ResourceSlice{Spec: resourceapi.ResourceSliceSpec{
		Driver: discovery.DriverName, NodeName: &node,
		Pool:    resourceapi.ResourcePool{Name: node, Generation: 1, ResourceSliceCount: 1},
		Devices: []resourceapi.Device{{Name: devName(t, "0000:3b:02.3")}},
	}}
	e.pub.extra = []resourceapi.ResourceSlice{stale}
	for range 3 {
		e.scan()
	}
	if n, _ := e.numVFs(pf0); n != 4 || len(*writes) != 0 {
		t.Fatalf("wrote sriov_numvfs (now %d) while a slice offered VF 3 untainted", n)
	}
	e.pub.extra = nil
	e.scan()
	if n, _ := e.numVFs(pf0); n != 2 {
		t.Fatalf("after the stale slice went: sriov_numvfs %d, want 2", n)
	}
	checkWritesAfterTaints(t, *writes)
}

// Without a way to read the slices back a lowering is never made (nothing
// is written unconfirmed), while creating VFs from 0 needs no taint.
func TestNoReadBackNeverLowers(t *testing.T) {
	t.Parallel()
	e := newEnv(t, simhost.MixedHost(), "pfs:\n- pfName: enp59s0f0\n  network: physnet-a\n  numVFs: 2\n- pfName: enp59s0f1\n  network: physnet-b\n  numVFs: 3\n")
	logs := logsOf(t, e)
	e.loop = publish.NewLoop(publish.LoopOptions{NodeName: "node-1", Discoverer: e.h.Sysfs(), Publisher: e.pub,
		LoadConfig: func() (*nodeconfig.Config, error) { return e.cfg, nil }, VFCount: e.rec})
	for range 3 {
		e.scan()
	}
	if n, _ := e.numVFs(pf0); n != 4 {
		t.Fatalf("lowered pf0 to %d without reading the slices back", n)
	}
	if n, _ := e.numVFs(pf1); n != 3 {
		t.Fatalf("pf1 from 0: sriov_numvfs %d, want 3", n)
	}
	if out := logs(); !strings.Contains(out, "no PublishedSlices configured") {
		t.Fatalf("log does not say why:\n%s", out)
	}
}
