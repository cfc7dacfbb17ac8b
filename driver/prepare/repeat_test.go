package prepare_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/vfnet-io/vfnet/driver/checkpoint"
	"github.com/vfnet-io/vfnet/test/lib/preparetest"
	"github.com/vfnet-io/vfnet/test/lib/simhost"
)

// A repeated prepare of a claim the checkpoint marks prepared looks at the
// host before it reports the devices: after a reboot, a lowered VF count or
// an admin's change, the checkpoint alone would hand out CDI devices no
// spec defines for a VF that is not on vfio-pci.

func repeatClaim() *resourceapi.ResourceClaim {
	return preparetest.Claim("ns", "vm", "uid-rep", []string{vf1, "vf-0000-3b-12-1"},
		preparetest.Config(fromClass, `{`+hdr+`,"vlan":42,"qos":2,"trust":true,"spoofChk":false,"maxTxRateMbps":500}`),
		preparetest.Config(fromClaim, `{`+hdr+`,"mac":"02:00:00:00:0c:01"}`, "vf"),
		preparetest.Config(fromClaim, `{`+hdr+`,"mac":"02:00:00:00:0c:02"}`, "vfx"))
}

// prepared prepares repeatClaim on a fresh host and returns the host before
// and after.
func prepared(t *testing.T) (*preparetest.Env, *resourceapi.ResourceClaim, preparetest.Snapshot, preparetest.Snapshot) {
	t.Helper()
	e := preparetest.NewEnv(t, "", simhost.E810Host())
	c := repeatClaim()
	e.AddClaim(t, c)
	before := e.Snapshot(t)
	if r := prepareOne(t, e.NewState(t, nil), c); r.Err != nil {
		t.Fatal(r.Err)
	}
	return e, c, before, e.Snapshot(t)
}

func TestRepeatedPrepareAfterReboot(t *testing.T) {
	t.Parallel()
	e, c, before, after := prepared(t)
	e.Reboot(t)
	if got := e.Snapshot(t); got.String() != before.String() {
		t.Fatalf("rebooted host is\n%s\nwant the host as built\n%s", got, before)
	}
	// The kubelet restarts the pod's containers and prepares again, with a
	// driver started on the rebooted node.
	s := e.NewState(t, nil)
	r := prepareOne(t, s, c)
	if r.Err != nil {
		t.Fatal(r.Err)
	}
	if len(r.Devices) != 2 || r.Devices[0].CDIDeviceIDs[0] != "sriov.vfnet.io/vf=uid-rep-"+vf1 {
		t.Fatalf("devices %+v", r.Devices)
	}
	if got := e.Snapshot(t); got.String() != after.String() {
		t.Fatalf("host after the repeated prepare:\n%s\nwant it prepared again\n%s", got, after)
	}
	if cp := s.Snapshot(); cp.Claims["uid-rep"] == nil || cp.Claims["uid-rep"].Phase != checkpoint.PhasePrepared {
		t.Fatalf("checkpoint %+v", cp.Claims)
	}
	if err := unprepareOne(t, s, c); err != nil {
		t.Fatal(err)
	}
	if got := e.Snapshot(t); got.String() != before.String() {
		t.Fatalf("host after unprepare:\n%s\nwant\n%s", got, before)
	}
}

func TestRepeatedPrepareRepairsDrift(t *testing.T) {
	t.Parallel()
	for name, change := range map[string]func(t *testing.T, e *preparetest.Env){
		"VLAN reset by an admin": func(t *testing.T, e *preparetest.Env) {
			if err := e.Host.Links().SetVLAN(pf0, 1, 0, 0, "802.1Q"); err != nil {
				t.Fatal(err)
			}
		},
		"MAC and trust changed": func(t *testing.T, e *preparetest.Env) {
			if err := e.Host.Links().SetMAC("enp59s0f1", 1, []byte{2, 0, 0, 0, 0, 0x99}); err != nil {
				t.Fatal(err)
			}
			if err := e.Host.Links().SetTrust("enp59s0f1", 1, false); err != nil {
				t.Fatal(err)
			}
		},
		"CDI spec deleted": func(t *testing.T, e *preparetest.Env) {
			snap := e.Snapshot(t)
			for _, f := range snap.CDIFiles {
				if err := removeFile(e.CDIRoot, f); err != nil {
					t.Fatal(err)
				}
			}
		},
		"VF rebound to iavf": func(t *testing.T, e *preparetest.Env) {
			for _, w := range [][2]string{
				{"bus/pci/drivers/vfio-pci/unbind", vf1BDF},
				{"bus/pci/devices/" + vf1BDF + "/driver_override", "\n"},
				{"bus/pci/drivers/iavf/bind", vf1BDF},
			} {
				if err := e.Host.Kernel().WriteFile(w[0], []byte(w[1])); err != nil {
					t.Fatal(err)
				}
			}
		},
		"VF count lowered to 0 and raised again": func(t *testing.T, e *preparetest.Env) {
			if err := e.Host.SetNumVFs("0000:3b:00.1", 0); err != nil {
				t.Fatal(err)
			}
			if err := e.Host.SetNumVFs("0000:3b:00.1", 4); err != nil {
				t.Fatal(err)
			}
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e, c, before, after := prepared(t)
			change(t, e)
			if got := e.Snapshot(t); got.String() == after.String() {
				t.Fatal("the change changed nothing")
			}
			s := e.NewState(t, nil)
			if r := prepareOne(t, s, c); r.Err != nil {
				t.Fatal(r.Err)
			}
			if got := e.Snapshot(t); got.String() != after.String() {
				t.Fatalf("host after the repeated prepare:\n%s\nwant\n%s", got, after)
			}
			if err := unprepareOne(t, s, c); err != nil {
				t.Fatal(err)
			}
			if got := e.Snapshot(t); got.String() != before.String() {
				t.Fatalf("host after unprepare:\n%s\nwant\n%s", got, before)
			}
		})
	}
}

func TestRepeatedPrepareVFGone(t *testing.T) {
	t.Parallel()
	e, c, _, _ := prepared(t)
	// VF 1 of the first PF goes away: 4 VFs lowered to 1.
	if err := e.Host.SetNumVFs("0000:3b:00.0", 1); err != nil {
		t.Fatal(err)
	}
	s := e.NewState(t, nil)
	r := prepareOne(t, s, c)
	if r.Err == nil {
		t.Fatalf("repeated prepare of a claim whose VF is gone succeeded: %+v", r.Devices)
	}
	for _, want := range []string{vf1BDF, "no longer exists", "sriov_numvfs", "delete the pod"} {
		if !strings.Contains(r.Err.Error(), want) {
			t.Errorf("error %q lacks %q", r.Err, want)
		}
	}
	// The claim stays recorded until the kubelet unprepares it, which then
	// restores the VF that is left and removes the CDI spec.
	if cp := s.Snapshot(); cp.Claims["uid-rep"] == nil {
		t.Fatal("claim dropped from the checkpoint before unprepare")
	}
	if err := unprepareOne(t, s, c); err != nil {
		t.Fatal(err)
	}
	snap := e.Snapshot(t)
	if v := snap.VFs["0000:3b:12.1"]; v.Driver != "iavf" || v.Link.VLAN != 0 {
		t.Fatalf("remaining VF after unprepare: %+v", v)
	}
	if len(snap.CDIFiles) != 0 || len(s.Snapshot().Claims) != 0 {
		t.Fatalf("CDI files %v, checkpoint %v after unprepare", snap.CDIFiles, s.Snapshot().Claims)
	}
}

func removeFile(dir, name string) error { return os.Remove(filepath.Join(dir, name)) }
