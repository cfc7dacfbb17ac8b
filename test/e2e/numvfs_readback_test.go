package e2e

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/vfnet-io/vfnet/driver/vfcount"
	"github.com/vfnet-io/vfnet/pkg/contract/pciaddr"
	"github.com/vfnet-io/vfnet/test/lib/controlplane"
	"github.com/vfnet-io/vfnet/test/lib/flow"
)

// Request classes sliceGate can hold.
const (
	sliceWrites = "ResourceSlice writes" // the ResourceSlice controller publishing
	sliceLists  = "ResourceSlice lists"  // the driver reading its slices back
)

// sliceGate holds the driver's ResourceSlice writes, or its ResourceSlice
// lists, without an answer (an apiProxy), as an API server that stopped
// answering them would; every other request (claims, events, watches)
// passes.
type sliceGate struct {
	*apiProxy

	mu    sync.Mutex
	gates map[string]chan struct{} // class -> closed on release; absent: passes
	held  map[string]int           // requests held, by class
	seen  map[string]int           // requests received, by class
}

func startSliceGate(t *testing.T, plane *controlplane.Plane) *sliceGate {
	t.Helper()
	g := &sliceGate{gates: map[string]chan struct{}{}, held: map[string]int{}, seen: map[string]int{}}
	g.apiProxy = startAPIProxy(t, plane, g.intercept)
	// Runs before the proxy's own cleanup: held requests end first.
	t.Cleanup(func() {
		g.release(sliceWrites)
		g.release(sliceLists)
	})
	return g
}

// sliceGateClass names the class of a ResourceSlice write or list ("" otherwise).
func sliceGateClass(r *http.Request) string {
	if !strings.HasPrefix(r.URL.Path, "/apis/resource.k8s.io/") || !strings.Contains(r.URL.Path, "/resourceslices") {
		return ""
	}
	switch r.Method {
	case http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete:
		return sliceWrites
	case http.MethodGet:
		if strings.HasSuffix(r.URL.Path, "/resourceslices") && r.URL.Query().Get("watch") != "true" {
			return sliceLists
		}
	}
	return ""
}

func (g *sliceGate) hold(class string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.gates[class] == nil {
		g.gates[class] = make(chan struct{})
	}
}

func (g *sliceGate) release(class string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if c := g.gates[class]; c != nil {
		close(c)
		delete(g.gates, class)
	}
}

// counts returns how many requests of class were received and held.
func (g *sliceGate) counts(class string) (seen, held int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.seen[class], g.held[class]
}

func (g *sliceGate) intercept(w http.ResponseWriter, r *http.Request) bool {
	class := sliceGateClass(r)
	if class == "" {
		return false
	}
	g.mu.Lock()
	g.seen[class]++
	gate := g.gates[class]
	if gate != nil {
		g.held[class]++
	}
	g.mu.Unlock()
	if gate == nil {
		return false
	}
	select {
	case <-gate:
		return false // released: the request goes on to the API server
	case <-r.Context().Done(): // the driver gave up, or the proxy closes
		return true
	}
}

// countTaintWatch follows a node's ResourceSlices through a watch of the
// test's own client, straight to the API server, and records when the API
// server first showed want (device -> VF count taint value) on every
// occurrence of those devices.
type countTaintWatch struct {
	mu      sync.Mutex
	slices  map[string]resourceapi.ResourceSlice
	shownAt time.Time
	shownRV string
	err     error
}

func watchCountTaints(ctx context.Context, t *testing.T, env *flow.Env, node string, want map[string]string) *countTaintWatch {
	t.Helper()
	opts := metav1.ListOptions{FieldSelector: resourceapi.ResourceSliceSelectorNodeName + "=" + node + "," + resourceapi.ResourceSliceSelectorDriver + "=" + flow.DriverName}
	list, err := env.Client.ResourceV1().ResourceSlices().List(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	opts.ResourceVersion = list.ResourceVersion
	w, err := env.Client.ResourceV1().ResourceSlices().Watch(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Stop)
	cw := &countTaintWatch{slices: map[string]resourceapi.ResourceSlice{}}
	for _, s := range list.Items {
		cw.slices[s.Name] = s
	}
	if cw.tainted(want) {
		t.Fatalf("node %s: the API server shows the VF count taint before the change was asked for", node)
	}
	go func() {
		for ev := range w.ResultChan() {
			at := time.Now()
			cw.mu.Lock()
			switch s, ok := ev.Object.(*resourceapi.ResourceSlice); {
			case ev.Type == watch.Error || !ok:
				cw.err = fmt.Errorf("watch of node %s's ResourceSlices: %s %v", node, ev.Type, ev.Object)
			case ev.Type == watch.Deleted:
				delete(cw.slices, s.Name)
			default:
				cw.slices[s.Name] = *s
				if cw.shownAt.IsZero() && cw.tainted(want) {
					cw.shownAt, cw.shownRV = at, s.ResourceVersion
				}
			}
			cw.mu.Unlock()
		}
	}()
	return cw
}

// tainted reports whether every occurrence of every device of want carries
// its taint, and each occurs. The caller holds mu (or owns cw).
func (cw *countTaintWatch) tainted(want map[string]string) bool {
	seen := map[string]bool{}
	for _, s := range cw.slices {
		for _, d := range s.Spec.Devices {
			v, ok := want[d.Name]
			if !ok {
				continue
			}
			seen[d.Name] = true
			found := false
			for _, taint := range d.Taints {
				found = found || taint.Key == vfcount.TaintKey && taint.Value == v && taint.Effect == resourceapi.DeviceTaintEffectNoSchedule
			}
			if !found {
				return false
			}
		}
	}
	return len(seen) == len(want)
}

func (cw *countTaintWatch) shown() (time.Time, string, error) {
	cw.mu.Lock()
	defer cw.mu.Unlock()
	return cw.shownAt, cw.shownRV, cw.err
}

// pfSampler samples a simulated PF's SR-IOV state every 2 ms. A write to
// sriov_numvfs changes it: the simulated kernel records the change in its
// journal (.simhost/journal.json, test/lib/simhost/journal.go) before its first
// effect, then removes VFs and writes the new count. So a change began
// after the last sample that still saw the PF as it was.
type pfSampler struct {
	mu           sync.Mutex
	lastSame     time.Time
	firstChanged time.Time
	changedTo    string
}

func samplePF(ctx context.Context, t *testing.T, root, pf string) *pfSampler {
	t.Helper()
	state := func() string {
		// The journal first: without it, an operation that began before
		// this sample has ended, and the count shows it.
		busy := ""
		if _, err := os.Stat(filepath.Join(root, ".simhost", "journal.json")); !errors.Is(err, fs.ErrNotExist) {
			busy = ", a kernel operation under way"
		}
		dir := filepath.Join(root, "bus/pci/devices", pf)
		n, err := os.ReadFile(filepath.Join(dir, "sriov_numvfs"))
		if err != nil {
			return "sriov_numvfs: " + err.Error()
		}
		links, _ := filepath.Glob(filepath.Join(dir, "virtfn*"))
		return fmt.Sprintf("sriov_numvfs %s, %d virtfn links%s", strings.TrimSpace(string(n)), len(links), busy)
	}
	first := state()
	s := &pfSampler{lastSame: time.Now()}
	t.Logf("PF %s: %s", pf, first)
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			at := time.Now()
			st := state()
			s.mu.Lock()
			if st == first {
				s.lastSame = at
			} else {
				s.firstChanged, s.changedTo = at, st
			}
			s.mu.Unlock()
			if st != first {
				return
			}
			time.Sleep(2 * time.Millisecond)
		}
	}()
	return s
}

// changed returns the time of the last sample that saw the PF as it was
// and, once it changed, the first one that did not.
func (s *pfSampler) changed() (lastSame, firstChanged time.Time, to string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lastSame, s.firstChanged, s.changedTo
}

// pollReadBack polls cond every 50 ms until it holds or timeout passes.
func pollReadBack(ctx context.Context, timeout time.Duration, cond func() bool) bool {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for !cond() {
		select {
		case <-ctx.Done():
			return false
		case <-time.After(50 * time.Millisecond):
		}
	}
	return true
}

// TestNumVFsWritesAfterAPIServerShowsTaint lowers numVFs 2 -> 1 with the
// real driver against a real API server, with a proxy in between that
// stops the API server from taking the driver's ResourceSlice writes, and
// then from answering its ResourceSlice lists:
//   - while the API server cannot show the tainted slices, sriov_numvfs is
//     not written, however many retry passes go by, and the driver says it
//     waits for the taint;
//   - once the tainted slices are in, but the driver cannot read them back,
//     it still does not write (it never writes unconfirmed);
//   - once it can read them back it writes, and the API server showed the
//     taint (seen by the test's own watch) before the simulated kernel got
//     the write.
func TestNumVFsWritesAfterAPIServerShowsTaint(t *testing.T) {
	t.Parallel()
	ctx, env := newEnv(t)
	install(ctx, t, env)
	gate := startSliceGate(t, env.Plane)
	n, _ := startNode(ctx, t, env, flow.NodeOptions{Name: "node-a", Spec: flow.DemoHost(), NodeConfig: fmt.Sprintf(numVFsConfig, 2),
		DriverAPIServer: gate.endpoint(), ExtraDriverArgs: []string{"--vf-count-retry-interval=1s"}}, 3)
	const pf = "0000:3b:00.0" // enp59s0f0, VFs 0000:3b:02.0 and .1
	want := map[string]string{}
	for addr, v := range map[string]string{"0000:3b:02.0": vfcount.TaintRecreating, "0000:3b:02.1": vfcount.TaintRemoving} {
		name, err := pciaddr.DeviceName(addr)
		if err != nil {
			t.Fatal(err)
		}
		want[name] = v
	}
	taints := watchCountTaints(ctx, t, env, n.Name, want)
	host := samplePF(ctx, t, n.Host.Root(), pf)
	logHas := func(s string) bool { return strings.Contains(n.DriverLog(1<<24), s) }
	fail := func(format string, args ...any) {
		t.Helper()
		t.Fatalf(format+"\n--- vfnet-driver log ---\n%s", append(args, n.DriverLog(6000))...)
	}

	// 1. The API server takes no ResourceSlice write from the driver; numVFs 1.
	gate.hold(sliceWrites)
	if err := os.WriteFile(n.NodeConfig, fmt.Appendf(nil, numVFsConfig, 1), 0o644); err != nil {
		t.Fatal(err)
	}
	written := func() bool { _, at, _ := host.changed(); return !at.IsZero() }
	waiting := "waiting for the API server to show the taint " + vfcount.TaintKey + " on 2 devices of PF " + pf
	pollReadBack(ctx, 30*time.Second, func() bool { return logHas(waiting) || written() })
	if _, at, to := host.changed(); !at.IsZero() {
		fail("sriov_numvfs written (%s) while the API server could not show the tainted slices", to)
	}
	if !logHas(waiting) {
		fail("the driver never said %q", waiting)
	}
	if _, held := gate.counts(sliceWrites); held == 0 {
		fail("the driver waits, but its ResourceSlice controller never tried to write the tainted slices")
	}
	// Three more read-backs (retry passes) that see no taint.
	lists, _ := gate.counts(sliceLists)
	if !pollReadBack(ctx, 30*time.Second, func() bool { l, _ := gate.counts(sliceLists); return l >= lists+3 || written() }) {
		fail("the driver stopped reading its slices back while the change waits")
	}
	if _, at, to := host.changed(); !at.IsZero() {
		fail("sriov_numvfs written (%s) while the API server could not show the tainted slices", to)
	}
	if at, _, _ := taints.shown(); !at.IsZero() {
		t.Fatal("the API server showed the taint although the proxy held every ResourceSlice write")
	}

	// 2. The writes go through; the driver's lists get no answer.
	gate.hold(sliceLists)
	released := time.Now()
	gate.release(sliceWrites)
	var shownAt time.Time
	var shownRV string
	var err error
	if !pollReadBack(ctx, 30*time.Second, func() bool {
		shownAt, shownRV, err = taints.shown()
		return !shownAt.IsZero() || err != nil
	}) || err != nil {
		fail("the API server did not show the taint after the writes went through: %v", err)
	}
	if shownAt.Before(released) {
		t.Fatalf("taint shown at %s, before the writes were released at %s", shownAt, released)
	}
	cannot := "VF count change waits: cannot read the published ResourceSlices back"
	pollReadBack(ctx, 40*time.Second, func() bool { return logHas(cannot) || written() })
	if _, at, to := host.changed(); !at.IsZero() {
		fail("sriov_numvfs written (%s) while the driver could not read its slices back", to)
	}
	if !logHas(cannot) {
		fail("the driver never said %q while its lists got no answer", cannot)
	}

	// 3. The lists are answered again: the change is made.
	resumed := time.Now()
	gate.release(sliceLists)
	if !pollReadBack(ctx, 30*time.Second, written) {
		fail("sriov_numvfs not written within 30s of the API server answering again")
	}
	lastSame, changedAt, to := host.changed()
	t.Logf("measured: taint shown by the API server (watch, resourceVersion %s) at %s; PF %s last seen unchanged %v later, %s seen %v later",
		shownRV, shownAt.Format("15:04:05.000"), pf, lastSame.Sub(shownAt).Round(time.Millisecond), to, changedAt.Sub(shownAt).Round(time.Millisecond))
	if !shownAt.Before(lastSame) {
		t.Fatalf("the write began before %s, not after the API server showed the taint at %s", lastSame, shownAt)
	}
	if changedAt.Before(resumed) {
		t.Fatalf("PF changed at %s, before the driver could read its slices back (%s)", changedAt, resumed)
	}
	if !logHas("The API server shows the VF count taint on every published VF of the PF; the change may go ahead") {
		fail("the driver changed the VFs without logging the confirmation")
	}
	if _, err := env.WaitSlices(ctx, n.Name, 2, time.Minute); err != nil {
		fail("%v", err)
	}
	if pfs, err := n.Host.Sysfs().Discover(ctx); err != nil || pfs[0].Address != pf || pfs[0].NumVFs != 1 {
		fail("after the change: PFs %+v, %v; want %s with 1 VF", pfs, err, pf)
	}
	last, err := countTaints(ctx, env, n.Name)
	if err != nil || len(last) != 1 {
		fail("physnet-a devices %v (%v), want one", last, err)
	}
	for d, v := range last {
		if v != "" {
			fail("device %s still tainted %s", d, v)
		}
	}
	if bad := n.ForbiddenLogLines(); len(bad) > 0 {
		t.Errorf("driver was refused: %q", bad)
	}
}
