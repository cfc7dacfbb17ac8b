package vfcount_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2/ktesting"

	"github.com/vfnet-io/vfnet/driver/discovery"
	"github.com/vfnet-io/vfnet/driver/kernel/sysfs"
	"github.com/vfnet-io/vfnet/driver/kernel/vfioholders"
	"github.com/vfnet-io/vfnet/driver/publish"
	"github.com/vfnet-io/vfnet/driver/vfcount"
	"github.com/vfnet-io/vfnet/pkg/api/nodeconfig"
	"github.com/vfnet-io/vfnet/pkg/contract/pciaddr"
	"github.com/vfnet-io/vfnet/test/lib/simhost"
)

// env is a simulated host driven through the driver's rescan loop with a
// Reconciler, as the driver runs them; usage is what claims hold.
type env struct {
	t      *testing.T
	ctx    context.Context
	h      *simhost.Host
	cfg    *nodeconfig.Config
	pub    *publisher
	events *record.FakeRecorder
	loop   *publish.Loop
	rec    *vfcount.Reconciler

	nodeLock  sync.Mutex
	mu        sync.Mutex
	prepared  map[string]string // VF address -> claim
	allocated map[string]string // device name -> claim
	// list, if set, answers Allocated instead of allocated (an API client).
	list func(context.Context) (map[string]string, error)
}

func newEnv(t *testing.T, spec simhost.Spec, config string) *env {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	h, err := simhost.Build(simhost.TempDir(t), spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	e := &env{t: t, ctx: ctx, h: h, pub: &publisher{}, events: record.NewFakeRecorder(100),
		prepared: map[string]string{}, allocated: map[string]string{}}
	e.setConfig(config)
	e.rec = vfcount.New(vfcount.Options{
		NodeName: "node-1", Sysfs: h.Sysfs(), Writer: h.Kernel(), Events: e.events,
		Prepared: func() map[string]string { e.mu.Lock(); defer e.mu.Unlock(); return clone(e.prepared) },
		Exclusive: func(ctx context.Context, fn func(map[string]string) error) error {
			e.nodeLock.Lock() // stands in for the prepare node lock
			defer e.nodeLock.Unlock()
			e.mu.Lock()
			prepared := clone(e.prepared)
			e.mu.Unlock()
			return fn(prepared)
		},
		Allocated: func(ctx context.Context) (map[string]string, error) {
			if e.list != nil {
				return e.list(ctx)
			}
			e.mu.Lock()
			defer e.mu.Unlock()
			return clone(e.allocated), nil
		},
		Holders: func(nodes []string) (map[string][]string, error) {
			got, err := vfioholders.Scanner{ProcRoot: h.ProcRoot(), DevRoot: h.DevRoot()}.Holders(nodes)
			out := map[string][]string{}
			for n, hs := range got {
				for _, x := range hs {
					out[n] = append(out[n], x.String())
				}
			}
			return out, err
		},
	})
	e.loop = publish.NewLoop(publish.LoopOptions{NodeName: "node-1", Discoverer: h.Sysfs(), Publisher: e.pub,
		LoadConfig: func() (*nodeconfig.Config, error) { return e.cfg, nil }, VFCount: e.rec, PublishedSlices: e.pub.PublishedSlices})
	return e
}

func clone(m map[string]string) map[string]string {
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

func (e *env) setConfig(doc string) {
	e.t.Helper()
	c, err := nodeconfig.Parse([]byte("apiVersion: vfnet.io/v1alpha1\nkind: NodeConfig\n"+doc), "node.yaml")
	if err != nil {
		e.t.Fatal(err)
	}
	e.cfg = c
}

func (e *env) scan() {
	e.t.Helper()
	if _, err := e.loop.Scan(e.ctx); err != nil {
		e.t.Fatal(err)
	}
}

// numVFs reads the PF's sriov_numvfs and counts its virtfn links.
func (e *env) numVFs(pf string) (int, int) {
	e.t.Helper()
	dir := filepath.Join(e.h.Root(), "bus/pci/devices", pf)
	v, err := os.ReadFile(filepath.Join(dir, "sriov_numvfs"))
	if err != nil {
		e.t.Fatal(err)
	}
	ents, _ := os.ReadDir(dir)
	links := 0
	for _, ent := range ents {
		if strings.HasPrefix(ent.Name(), "virtfn") {
			links++
		}
	}
	var n int
	fmt.Sscan(string(v), &n)
	return n, links
}

// numvfsWrites returns the values written to pf's sriov_numvfs so far.
func (e *env) numvfsWrites(pf string) []string {
	var out []string
	for _, w := range e.h.Kernel().Writes() {
		if w.Rel == "bus/pci/devices/"+pf+"/sriov_numvfs" {
			s := w.Data
			if w.Err != nil {
				s += "!" + w.Err.Error()
			}
			out = append(out, s)
		}
	}
	return out
}

func (e *env) drainEvents() []string {
	var out []string
	for {
		select {
		case ev := <-e.events.Events:
			out = append(out, ev)
		default:
			return out
		}
	}
}

// publisher records every publication and stands in for the API server
// behind the asynchronous ResourceSlice controller: PublishedSlices shows a
// publication only from the (lag+1)th read after it (lag 0: at once).
type publisher struct {
	mu   sync.Mutex
	pubs []resourceslice.DriverResources
	// lag applies to publications from now on; readErr fails reads; extra
	// slices are shown with every read (a stale generation).
	lag     int
	readErr error
	extra   []resourceapi.ResourceSlice
	queued  []queuedPub
	shown   *resourceslice.DriverResources
	reads   int
}

type queuedPub struct {
	res    resourceslice.DriverResources
	hidden int // reads it stays unseen
}

func (p *publisher) PublishResources(_ context.Context, r resourceslice.DriverResources) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.pubs = append(p.pubs, r)
	p.queued = append(p.queued, queuedPub{res: r, hidden: p.lag})
	return nil
}

// PublishedSlices is what the driver reads back (plugin.PublishedSlices).
func (p *publisher) PublishedSlices(context.Context) ([]resourceapi.ResourceSlice, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.reads++
	if p.readErr != nil {
		return nil, p.readErr
	}
	for len(p.queued) > 0 && p.queued[0].hidden <= 0 {
		p.shown = &p.queued[0].res
		p.queued = p.queued[1:]
	}
	for i := range p.queued {
		p.queued[i].hidden--
	}
	out := slices.Clone(p.extra)
	if p.shown != nil {
		out = append(out, publish.ResourceSlices(discovery.DriverName, "node-1", *p.shown)...)
	}
	return out, nil
}

// apiCountTaints is the count taint of every device the last read showed,
// by name ("" untainted), without reading.
func (p *publisher) apiCountTaints() map[string]string {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := map[string]string{}
	if p.shown == nil {
		return out
	}
	for _, s := range p.shown.Pools["node-1"].Slices {
		for _, d := range s.Devices {
			out[d.Name] = countTaint(d)
		}
	}
	return out
}

// last returns the last publication's devices by name.
func (p *publisher) last() map[string]resourceapi.Device {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := map[string]resourceapi.Device{}
	if len(p.pubs) == 0 {
		return out
	}
	for _, s := range p.pubs[len(p.pubs)-1].Pools["node-1"].Slices {
		for _, d := range s.Devices {
			out[d.Name] = d
		}
	}
	return out
}

func countTaint(d resourceapi.Device) string {
	for _, t := range d.Taints {
		if t.Key == vfcount.TaintKey && t.Effect == resourceapi.DeviceTaintEffectNoSchedule {
			return t.Value
		}
	}
	return ""
}

func devName(t *testing.T, addr string) string {
	t.Helper()
	n, err := pciaddr.DeviceName(addr)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

const (
	pf0 = "0000:3b:00.0" // E810 enp59s0f0, 4 VFs at 0000:3b:02.0-3
	pf1 = "0000:3b:00.1" // E810 enp59s0f1, 4 VFs in E810Host
)

// From 0 VFs: one write of N, at once (no VF to taint), the new VFs come
// up on their VF driver with netdevs and are published in the same scan.
func TestCreateFromZero(t *testing.T) {
	t.Parallel()
	e := newEnv(t, simhost.MixedHost(), "pfs:\n- pfName: enp59s0f1\n  network: physnet-b\n  numVFs: 3\n")
	e.scan()
	if n, links := e.numVFs(pf1); n != 3 || links != 3 {
		t.Fatalf("sriov_numvfs %d, %d virtfn links; want 3", n, links)
	}
	if w := e.numvfsWrites(pf1); !slices.Equal(w, []string{"3"}) {
		t.Fatalf("writes to sriov_numvfs: %q, want only 3", w)
	}
	for _, vf := range pfOf(t, e, pf1).VFs {
		if vf.Driver != simhost.DriverIAVF || len(vf.NetDevs) != 1 {
			t.Errorf("new VF %s: driver %q netdevs %v, want iavf with a netdev", vf.Address, vf.Driver, vf.NetDevs)
		}
	}
	got := e.pub.last()
	if len(got) != 3 {
		t.Fatalf("published %d devices after the change, want the 3 new VFs", len(got))
	}
	for name, d := range got {
		if len(d.Taints) != 0 {
			t.Errorf("new device %s has taints %+v", name, d.Taints)
		}
	}
	if evs := e.drainEvents(); len(evs) != 1 || !strings.Contains(evs[0], vfcount.ReasonChanged) || !strings.Contains(evs[0], "3 VFs now") {
		t.Errorf("events %q, want one %s", evs, vfcount.ReasonChanged)
	}
	// In sync: later scans write nothing.
	e.scan()
	if w := e.numvfsWrites(pf1); len(w) != 1 {
		t.Fatalf("writes after a scan in sync: %q", w)
	}
}

// Lowering and raising go through 0, only after a publication carried the
// taints (removing for indexes >= N, recreating below); the slices follow.
func TestLowerAndRaise(t *testing.T) {
	t.Parallel()
	e := newEnv(t, simhost.E810Host(), "pfs:\n- pfName: enp59s0f0\n  network: physnet-a\n  numVFs: 2\n")
	e.scan()
	if n, _ := e.numVFs(pf0); n != 4 {
		t.Fatalf("first scan changed the VFs (%d) before tainting them", n)
	}
	got := e.pub.last()
	for i := range 4 {
		want := vfcount.TaintRecreating
		if i >= 2 {
			want = vfcount.TaintRemoving
		}
		name := devName(t, fmt.Sprintf("0000:3b:02.%d", i))
		if v := countTaint(got[name]); v != want {
			t.Errorf("device %s: count taint %q, want %q (taints %+v)", name, v, want, got[name].Taints)
		}
	}
	e.scan()
	if n, links := e.numVFs(pf0); n != 2 || links != 2 {
		t.Fatalf("after the second scan: sriov_numvfs %d, %d links; want 2", n, links)
	}
	if w := e.numvfsWrites(pf0); !slices.Equal(w, []string{"0", "2"}) {
		t.Fatalf("writes %q, want 0 then 2", w)
	}
	got = e.pub.last()
	if len(got) != 2 {
		t.Fatalf("published %d devices, want 2", len(got))
	}
	for name, d := range got {
		if len(d.Taints) != 0 {
			t.Errorf("device %s still tainted: %+v", name, d.Taints)
		}
	}

	e.setConfig("pfs:\n- pfName: enp59s0f0\n  network: physnet-a\n  numVFs: 5\n")
	e.scan()
	if n, _ := e.numVFs(pf0); n != 2 {
		t.Fatalf("raised before tainting: %d", n)
	}
	for name, d := range e.pub.last() {
		if countTaint(d) != vfcount.TaintRecreating {
			t.Errorf("raise: device %s taint %+v, want recreating", name, d.Taints)
		}
	}
	e.scan()
	if n, links := e.numVFs(pf0); n != 5 || links != 5 || len(e.pub.last()) != 5 {
		t.Fatalf("after raise: sriov_numvfs %d, %d links, %d published; want 5", n, links, len(e.pub.last()))
	}
	if w := e.numvfsWrites(pf0); !slices.Equal(w, []string{"0", "2", "0", "5"}) {
		t.Fatalf("writes %q", w)
	}
}

// A prepared VF blocks the change: nothing is written, the VFs stay
// offered (tainted), the claim is named in the log line, Event and plan;
// once unprepared the change is made.
func TestBlockedByPreparedVFThenApplied(t *testing.T) {
	t.Parallel()
	e := newEnv(t, simhost.E810Host(), "pfs:\n- pfName: enp59s0f0\n  network: physnet-a\n  numVFs: 1\n")
	e.prepared["0000:3b:02.1"] = "vms/vm-a-vf"
	for range 3 {
		e.scan()
	}
	if n, _ := e.numVFs(pf0); n != 4 || len(e.numvfsWrites(pf0)) != 0 {
		t.Fatalf("changed with a prepared VF: numvfs %d, writes %q", n, e.numvfsWrites(pf0))
	}
	if len(e.pub.last()) != 4 || !e.rec.Waiting() {
		t.Fatalf("published %d devices (want 4 kept), waiting %v", len(e.pub.last()), e.rec.Waiting())
	}
	evs := e.drainEvents()
	if len(evs) != 1 || !strings.Contains(evs[0], vfcount.ReasonBlocked) || !strings.Contains(evs[0], "vms/vm-a-vf") || !strings.Contains(evs[0], "VF 1 (0000:3b:02.1) prepared") {
		t.Fatalf("events %q: want one %s naming the claim and VF", evs, vfcount.ReasonBlocked)
	}
	e.mu.Lock()
	delete(e.prepared, "0000:3b:02.1")
	e.mu.Unlock()
	e.scan()
	if n, links := e.numVFs(pf0); n != 1 || links != 1 || len(e.pub.last()) != 1 {
		t.Fatalf("after unprepare: sriov_numvfs %d, %d links, %d published; want 1", n, links, len(e.pub.last()))
	}
	if e.rec.Waiting() {
		t.Fatal("still waiting after the change")
	}
}

// A claim allocated one of the VFs (not yet prepared) blocks too; and a
// claim that appears between planning and the write (checked again under
// the node lock) stops the write.
func TestBlockedByAllocatedClaim(t *testing.T) {
	t.Parallel()
	e := newEnv(t, simhost.E810Host(), "pfs:\n- pfName: enp59s0f0\n  network: physnet-a\n  numVFs: 0\n")
	e.allocated[devName(t, "0000:3b:02.3")] = "vms/vm-b-vf"
	e.scan()
	e.scan()
	plans := e.rec.Plan(e.ctx, e.cfg, mustDiscover(t, e))
	if len(plans) != 1 || plans[0].State != vfcount.Blocked || len(plans[0].Blockers) != 1 ||
		plans[0].Blockers[0].Claim != "vms/vm-b-vf" || plans[0].Blockers[0].How != "allocated" {
		t.Fatalf("plans %+v: want blocked by vms/vm-b-vf", plans)
	}
	if n, _ := e.numVFs(pf0); n != 4 {
		t.Fatalf("removed VFs under an allocated claim: %d", n)
	}
	// Deallocated: the plan is due (its taints were published by the
	// scans above); a claim prepared meanwhile (seen only under the lock)
	// still stops the write.
	e.mu.Lock()
	delete(e.allocated, devName(t, "0000:3b:02.3"))
	e.mu.Unlock()
	plans = e.rec.Plan(e.ctx, e.cfg, mustDiscover(t, e))
	if plans[0].State != vfcount.Pending {
		t.Fatalf("plan %+v: want pending", plans[0])
	}
	e.mu.Lock()
	e.prepared["0000:3b:02.0"] = "vms/late"
	e.mu.Unlock()
	if e.rec.Apply(e.ctx, plans) {
		t.Fatal("Apply changed the PF although a claim was prepared under the lock")
	}
	if n, _ := e.numVFs(pf0); n != 4 {
		t.Fatalf("VFs changed under a late claim: %d", n)
	}
	e.mu.Lock()
	delete(e.prepared, "0000:3b:02.0")
	e.mu.Unlock()
	e.scan()
	if n, links := e.numVFs(pf0); n != 0 || links != 0 || len(e.pub.last()) != 0 {
		t.Fatalf("numVFs 0: sriov_numvfs %d, %d links, %d published", n, links, len(e.pub.last()))
	}
}

func pfOf(t *testing.T, e *env, addr string) sysfs.PF {
	t.Helper()
	for _, pf := range mustDiscover(t, e) {
		if pf.Address == addr {
			return pf
		}
	}
	t.Fatalf("no PF %s", addr)
	return sysfs.PF{}
}

func mustDiscover(t *testing.T, e *env) []sysfs.PF {
	t.Helper()
	pfs, err := e.h.Sysfs().Discover(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	return pfs
}

// Above sriov_totalvfs, a switchdev e-switch, a device without SR-IOV: a
// refusal naming the PF, the value and the fix; nothing written, nothing
// tainted.
func TestRefused(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		spec   simhost.Spec
		config string
		pf     string
		want   []string
	}{
		"above totalvfs": {simhost.E810Host(), "pfs:\n- pfName: enp59s0f0\n  network: a\n  numVFs: 129\n", pf0,
			[]string{"PF 0000:3b:00.0 (enp59s0f0)", "node.yaml: pfs[0].numVFs is 129, above the PF's sriov_totalvfs 128: set it to at most 128"}},
		"switchdev": {simhost.SwitchdevHost(), "pfs:\n- pciAddress: \"0000:d8:00.0\"\n  network: a\n  numVFs: 2\n", "0000:d8:00.0",
			[]string{"PF 0000:d8:00.0", "numVFs is 2", "switchdev mode", "devlink dev eswitch set pci/0000:d8:00.0 mode legacy"}},
		"no sr-iov": {simhost.MixedHost(), "pfs:\n- pfName: enp2s0\n  network: a\n  numVFs: 2\n", "0000:02:00.0",
			[]string{"PF 0000:02:00.0 (enp2s0)", "pfs[0].numVFs is 2", "no SR-IOV capability (no sriov_totalvfs)", "name an SR-IOV PF or drop numVFs"}},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, tc.spec, tc.config)
			before := len(e.h.Kernel().Writes())
			e.scan()
			e.scan()
			plans := e.rec.Plan(e.ctx, e.cfg, mustDiscover(t, e))
			if len(plans) != 1 || plans[0].State != vfcount.Refused {
				t.Fatalf("plans %+v, want one refused", plans)
			}
			for _, w := range tc.want {
				if !strings.Contains(plans[0].String(), w) {
					t.Errorf("refusal %q lacks %q", plans[0].String(), w)
				}
			}
			for _, w := range e.h.Kernel().Writes()[before:] {
				if strings.HasSuffix(w.Rel, "sriov_numvfs") {
					t.Errorf("wrote %q to %s", w.Data, w.Rel)
				}
			}
			for n, d := range e.pub.last() {
				if countTaint(d) != "" {
					t.Errorf("device %s tainted for a refused change", n)
				}
			}
			if evs := e.drainEvents(); len(evs) != 1 || !strings.Contains(evs[0], vfcount.ReasonRefused) {
				t.Errorf("events %q, want one %s", evs, vfcount.ReasonRefused)
			}
		})
	}
}

// A driver killed between the writes (0 written, N not): the restarted
// driver, with a new Reconciler and loop, sees 0 VFs and writes N.
func TestCrashBetweenWritesConverges(t *testing.T) {
	t.Parallel()
	e := newEnv(t, simhost.E810Host(), "pfs:\n- pfName: enp59s0f0\n  network: physnet-a\n  numVFs: 3\n")
	e.scan() // taints
	// The process dies right after its 0 reached the kernel: the N write
	// never arrives (the hook refuses it as if the writer were gone).
	errDied := errors.New("writer died")
	e.h.Kernel().SetWriteHook(func(rel string, data []byte) error {
		if strings.HasSuffix(rel, "/sriov_numvfs") && string(data) != "0" {
			return errDied
		}
		return nil
	})
	e.scan()
	if n, links := e.numVFs(pf0); n != 0 || links != 0 {
		t.Fatalf("after the interrupted change: sriov_numvfs %d, %d links; want 0", n, links)
	}
	e.h.Kernel().SetWriteHook(nil)

	restarted := newEnvOn(t, e, "pfs:\n- pfName: enp59s0f0\n  network: physnet-a\n  numVFs: 3\n")
	restarted.scan()
	if n, links := restarted.numVFs(pf0); n != 3 || links != 3 || len(restarted.pub.last()) != 3 {
		t.Fatalf("restart: sriov_numvfs %d, %d links, %d published; want 3", n, links, len(restarted.pub.last()))
	}
}

// newEnvOn is a restarted driver on e's host: a fresh Reconciler and loop.
func newEnvOn(t *testing.T, e *env, config string) *env {
	t.Helper()
	r := &env{t: t, ctx: e.ctx, h: e.h, pub: &publisher{}, events: record.NewFakeRecorder(100),
		prepared: map[string]string{}, allocated: map[string]string{}}
	r.setConfig(config)
	r.rec = vfcount.New(vfcount.Options{NodeName: "node-1", Sysfs: e.h.Sysfs(), Writer: e.h.Kernel(), Events: r.events,
		Exclusive: func(ctx context.Context, fn func(map[string]string) error) error { return fn(nil) }})
	r.loop = publish.NewLoop(publish.LoopOptions{NodeName: "node-1", Discoverer: e.h.Sysfs(), Publisher: r.pub,
		LoadConfig: func() (*nodeconfig.Config, error) { return r.cfg, nil }, VFCount: r.rec, PublishedSlices: r.pub.PublishedSlices})
	return r
}

// With the PF's sriov_drivers_autoprobe 0 the new VFs stay unbound (the
// admin's choice); they are offered all the same.
func TestAutoprobeOffLeavesVFsUnbound(t *testing.T) {
	t.Parallel()
	e := newEnv(t, simhost.MixedHost(), "pfs:\n- pfName: enp59s0f1\n  network: physnet-b\n  numVFs: 2\n")
	if err := e.h.Kernel().WriteFile("bus/pci/devices/"+pf1+"/sriov_drivers_autoprobe", []byte("0")); err != nil {
		t.Fatal(err)
	}
	e.scan()
	vfs := pfOf(t, e, pf1).VFs
	if len(vfs) != 2 {
		t.Fatalf("VFs %+v", vfs)
	}
	for _, vf := range vfs {
		if vf.Driver != "" || len(vf.NetDevs) != 0 {
			t.Errorf("VF %s bound to %q with netdevs %v; autoprobe is off", vf.Address, vf.Driver, vf.NetDevs)
		}
	}
	if len(e.pub.last()) != 2 {
		t.Fatalf("published %d devices, want the 2 unbound VFs", len(e.pub.last()))
	}
}

// The kernel's refusals during the write are reported with the PF and the
// fix, e.g. a PF driver unbound between planning and writing (ENOENT).
func TestWriteCountErrors(t *testing.T) {
	t.Parallel()
	h, err := simhost.Build(simhost.TempDir(t), simhost.E810Host())
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	k := h.Kernel()
	// N over M without 0 first is EBUSY in the kernel; WriteCount goes through 0.
	if err := k.WriteFile("bus/pci/devices/"+pf0+"/sriov_numvfs", []byte("2")); !errors.Is(err, syscall.EBUSY) {
		t.Fatalf("direct 4 -> 2: %v, want EBUSY", err)
	}
	if err := vfcount.WriteCount(k, pf0, "enp59s0f0", 4, 2); err != nil {
		t.Fatal(err)
	}
	if err := k.WriteFile("bus/pci/drivers/ice/unbind", []byte(pf1)); err != nil {
		t.Fatal(err)
	}
	err = vfcount.WriteCount(k, pf1, "enp59s0f1", 0, 2)
	if !errors.Is(err, syscall.ENOENT) || !strings.Contains(err.Error(), "PF 0000:3b:00.1 (enp59s0f1): create 2 VFs") || !strings.Contains(err.Error(), "bind the PF's own driver") {
		t.Fatalf("no PF driver: %v", err)
	}
}

// A VF on vfio-pci that a process vfnet knows nothing of holds open (a VM
// of another tool) blocks the change too: the kernel's removal of that VF
// would wait for the process, with the write and the node lock stuck.
func TestBlockedByHeldVFIOGroup(t *testing.T) {
	t.Parallel()
	e := newEnv(t, simhost.MixedHost(), "pfs:\n- pfName: enp59s0f0\n  network: physnet-a\n  numVFs: 2\n")
	fn, err := e.h.Sysfs().Function("0000:3b:02.2") // bound to vfio-pci by the fixture
	if err != nil {
		t.Fatal(err)
	}
	release, err := e.h.HoldVFIOGroup(discovery.GroupNode(fn), 4242, "qemu-kvm")
	if err != nil {
		t.Fatal(err)
	}
	e.scan()
	e.scan()
	plans := e.rec.Plan(e.ctx, e.cfg, mustDiscover(t, e))
	if len(plans) != 1 || plans[0].State != vfcount.Blocked || !strings.Contains(plans[0].Reason, "VF 2 (0000:3b:02.2) is on vfio-pci and in use: /dev/vfio/"+discovery.GroupNode(fn)+" held open by pid 4242 (qemu-kvm)") {
		t.Fatalf("plans %+v: want blocked by pid 4242", plans)
	}
	if n, _ := e.numVFs(pf0); n != 4 {
		t.Fatalf("changed to %d VFs while a VF is held open", n)
	}
	if err := release(); err != nil {
		t.Fatal(err)
	}
	e.scan()
	if n, links := e.numVFs(pf0); n != 2 || links != 2 {
		t.Fatalf("after release: sriov_numvfs %d, %d links; want 2", n, links)
	}
}
