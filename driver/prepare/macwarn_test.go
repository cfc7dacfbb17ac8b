package prepare_test

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/client-go/tools/record"

	"github.com/vfnet-io/vfnet/driver/maclookup"
	"github.com/vfnet-io/vfnet/driver/prepare"
	"github.com/vfnet-io/vfnet/test/lib/preparetest"
	"github.com/vfnet-io/vfnet/test/lib/simhost"
)

func drainEvents(r *record.FakeRecorder) []string {
	var out []string
	for {
		select {
		case e := <-r.Events:
			out = append(out, e)
		default:
			return out
		}
	}
}

// TestMACNotMigratableEvent: prepare of a template claim whose VMI interface
// has no macAddress and whose VFConfig has no mac records one Warning Event
// on the VMI (also across a re-prepare), and still prepares the VF; a MAC
// from either place records none.
func TestMACNotMigratableEvent(t *testing.T) {
	t.Parallel()
	e := preparetest.NewEnv(t, "", simhost.E810Host())
	events := record.NewFakeRecorder(10)
	events.IncludeObject = true
	opts := e.Options(nil)
	opts.Events = events
	s, err := prepare.New(opts)
	if err != nil {
		t.Fatal(err)
	}

	noMAC := e.AddVM(t, "ns", "vm-nomac", "vf-claim", "")
	c := preparetest.ReserveFor(preparetest.Claim("ns", "a", "uid-a", []string{vf1}), noMAC, "vf-claim")
	e.AddClaim(t, c)
	for i := range 2 {
		if r := prepareOne(t, s, c); r.Err != nil {
			t.Fatalf("prepare %d: %v", i, r.Err)
		}
		if i == 0 {
			if err := unprepareOne(t, s, c); err != nil {
				t.Fatal(err)
			}
		}
	}
	evs := drainEvents(events)
	if len(evs) != 1 {
		t.Fatalf("events %q, want exactly one", evs)
	}
	for _, want := range []string{"Warning " + prepare.ReasonMACNotMigratable, `interface "dra-net"`, "ns/a", "spec.domain.devices.interfaces[].macAddress or VFConfig.mac",
		"kind=VirtualMachineInstance", "apiVersion=kubevirt.io/v1"} {
		if !strings.Contains(evs[0], want) {
			t.Errorf("event %q lacks %q", evs[0], want)
		}
	}

	withMAC := e.AddVM(t, "ns", "vm-mac", "vf-claim", "02:00:00:00:00:05")
	c2 := preparetest.ReserveFor(preparetest.Claim("ns", "b", "uid-b", []string{"vf-0000-3b-02-2"}), withMAC, "vf-claim")
	e.AddClaim(t, c2)
	cfgMAC := e.AddVM(t, "ns", "vm-cfgmac", "vf-claim", "")
	c3 := preparetest.ReserveFor(preparetest.Claim("ns", "c", "uid-c", []string{"vf-0000-3b-02-3"},
		preparetest.Config(fromClaim, `{`+hdr+`,"mac":"02:aa:00:00:00:03"}`)), cfgMAC, "vf-claim")
	e.AddClaim(t, c3)
	for _, c := range []*resourceapi.ResourceClaim{c2, c3} {
		if r := prepareOne(t, s, c); r.Err != nil {
			t.Fatalf("prepare %s: %v", c.Name, r.Err)
		}
	}
	if evs := drainEvents(events); len(evs) != 0 {
		t.Fatalf("events %q for claims with a MAC", evs)
	}
}

// fixedFinder answers every lookup with one result.
type fixedFinder struct{ res maclookup.Result }

func (f fixedFinder) Find(context.Context, *resourceapi.ResourceClaim, string) (maclookup.Result, bool, error) {
	return f.res, true, nil
}

// A named claim without MAC gets no MAC warning from prepare: it cannot
// migrate at all, which the migration watcher reports.
func TestNoMACWarningForNamedClaim(t *testing.T) {
	t.Parallel()
	e := preparetest.NewEnv(t, "", simhost.E810Host())
	events := record.NewFakeRecorder(10)
	opts := e.Options(nil)
	opts.Events = events
	opts.MACs = fixedFinder{maclookup.Result{VMI: "ns/vm", Interface: "net1", FromTemplate: false,
		Ref: &corev1.ObjectReference{APIVersion: "kubevirt.io/v1", Kind: "VirtualMachineInstance", Namespace: "ns", Name: "vm", UID: "u"}}}
	s, err := prepare.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	c := preparetest.Claim("ns", "shared", "uid-s", []string{vf1})
	e.AddClaim(t, c)
	if r := prepareOne(t, s, c); r.Err != nil {
		t.Fatal(r.Err)
	}
	if evs := drainEvents(events); len(evs) != 0 {
		t.Fatalf("events %q", evs)
	}
}
