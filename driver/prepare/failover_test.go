package prepare_test

import (
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	"github.com/vfnet-io/vfnet/driver/prepare"
	"github.com/vfnet-io/vfnet/pkg/contract/metadata"
	"github.com/vfnet-io/vfnet/test/lib/preparetest"
	"github.com/vfnet-io/vfnet/test/lib/simhost"
)

// failoverAttr reports the device's vfnet.io/failover attribute: present,
// and its value.
func failoverAttr(t *testing.T, r kubeletplugin.Device) (present, value bool) {
	t.Helper()
	if r.Metadata == nil {
		t.Fatalf("device %s has no metadata", r.DeviceName)
	}
	a, ok := r.Metadata.Attributes[metadata.FailoverAttribute]
	if !ok {
		return false, false
	}
	if a.BoolValue == nil {
		t.Fatalf("device %s: attribute %s is not a bool: %+v", r.DeviceName, metadata.FailoverAttribute, a)
	}
	return true, *a.BoolValue
}

// A failover request without a fixed MAC (no VFConfig.mac, no macAddress on
// the VMI interface, from the class or the claim) is refused at plan time,
// naming the field and the fix, with the host, the CDI directory and the
// checkpoint as they were. With a MAC from either place the device is
// prepared and its metadata carries vfnet.io/failover: true, on the first
// call and on a repeated one; a device without failover carries no such
// attribute.
func TestFailover(t *testing.T) {
	t.Parallel()
	e := preparetest.NewEnv(t, "", simhost.E810Host())
	events := record.NewFakeRecorder(10)
	opts := e.Options(nil)
	opts.Events = events
	s, err := prepare.New(opts)
	if err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name   string
		source resourceapi.AllocationConfigSource
		config string
	}{
		{"claim", fromClaim, `{` + hdr + `,"failover":true}`},
		{"class", fromClass, `{` + hdr + `,"failover":true,"vlan":4}`},
	} {
		noMAC := e.AddVM(t, "ns", "vm-nomac-"+tc.name, "vf-claim", "")
		c := preparetest.ReserveFor(preparetest.Claim("ns", "nomac-"+tc.name, types.UID("uid-nomac-"+tc.name), []string{vf1},
			preparetest.Config(tc.source, tc.config)), noMAC, "vf-claim")
		e.AddClaim(t, c)
		before := e.Snapshot(t)
		r := prepareOne(t, s, c)
		if r.Err == nil {
			t.Fatalf("%s: failover without a MAC was prepared", tc.name)
		}
		for _, want := range []string{"VFConfig.failover is true but the VF has no fixed MAC", "VFConfig.mac", "macAddress", "remove failover: true", vf1, "ns/nomac-" + tc.name} {
			if !strings.Contains(r.Err.Error(), want) {
				t.Errorf("%s: error %q\n  lacks %q", tc.name, r.Err, want)
			}
		}
		if got := prepare.StepOf(r.Err); got != prepare.ErrStepPlan {
			t.Errorf("%s: step %q, want %q", tc.name, got, prepare.ErrStepPlan)
		}
		assertUntouched(t, e, s, before)
	}
	// The refusal replaces the MAC warning: no Event says "not migratable".
	if evs := drainEvents(events); len(evs) != 0 {
		t.Errorf("events %q for refused failover claims", evs)
	}
	// A claim's failover:false overrides the class's true: prepared, no
	// attribute.
	off := e.AddVM(t, "ns", "vm-off", "vf-claim", "")
	cOff := preparetest.ReserveFor(preparetest.Claim("ns", "off", "uid-off", []string{vf1},
		preparetest.Config(fromClass, `{`+hdr+`,"failover":true}`), preparetest.Config(fromClaim, `{`+hdr+`,"failover":false}`)), off, "vf-claim")
	e.AddClaim(t, cOff)
	r := prepareOne(t, s, cOff)
	if r.Err != nil {
		t.Fatal(r.Err)
	}
	if present, _ := failoverAttr(t, r.Devices[0]); present {
		t.Errorf("failover:false device carries %s", metadata.FailoverAttribute)
	}
	if err := unprepareOne(t, s, cOff); err != nil {
		t.Fatal(err)
	}

	withMAC := e.AddVM(t, "ns", "vm-mac", "vf-claim", "02:00:00:00:00:05")
	cVMI := preparetest.ReserveFor(preparetest.Claim("ns", "vmimac", "uid-vmimac", []string{vf1},
		preparetest.Config(fromClass, `{`+hdr+`,"failover":true}`)), withMAC, "vf-claim")
	cCfg := preparetest.Claim("ns", "cfgmac", "uid-cfgmac", []string{"vf-0000-3b-02-2"},
		preparetest.Config(fromClaim, `{`+hdr+`,"failover":true,"mac":"02:aa:00:00:00:03"}`))
	plain := preparetest.Claim("ns", "plain", "uid-plain", []string{"vf-0000-3b-02-3"},
		preparetest.Config(fromClaim, `{`+hdr+`,"mac":"02:aa:00:00:00:04"}`))
	for _, c := range []*resourceapi.ResourceClaim{cVMI, cCfg, plain} {
		e.AddClaim(t, c)
		for call := range 2 { // the second is a repeated call
			r := prepareOne(t, s, c)
			if r.Err != nil {
				t.Fatalf("prepare %s call %d: %v", c.Name, call, r.Err)
			}
			if len(r.Devices) != 1 {
				t.Fatalf("prepare %s: %d devices", c.Name, len(r.Devices))
			}
			d := r.Devices[0]
			present, value := failoverAttr(t, d)
			want := c != plain
			if present != want || (present && !value) {
				t.Errorf("%s call %d: %s present=%v value=%v, want present=%v value=true", c.Name, call, metadata.FailoverAttribute, present, value, want)
			}
			if d.Metadata.NetworkData == nil || d.Metadata.NetworkData.HardwareAddress == "" {
				t.Errorf("%s: no hardwareAddress next to the failover attribute", c.Name)
			}
			if _, ok := d.Metadata.Attributes[metadata.PCIBusIDAttribute]; !ok {
				t.Errorf("%s: the failover attribute replaced the published ones", c.Name)
			}
		}
	}
}
