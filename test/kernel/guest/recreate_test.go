//go:build kernelguest

package guest

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/vfnet-io/vfnet/driver/checkpoint"
	"github.com/vfnet-io/vfnet/driver/kernel/sysfs"
	"github.com/vfnet-io/vfnet/driver/kernel/vflink"
	"github.com/vfnet-io/vfnet/driver/prepare"
	"github.com/vfnet-io/vfnet/test/kernel/layout"
)

// recreateVFs destroys pf's VFs and makes n new ones, as a node reboot
// does (the node's SR-IOV setup writes sriov_numvfs again at boot): the
// kernel goes through 0 (it refuses one non-zero count over another with
// EBUSY), frees the VFs' PCI devices, IOMMU groups and PF-side settings, and
// probes the new VFs with igbvf. It waits until each new VF has its netdev.
func recreateVFs(t *testing.T, pf sysfs.PF, n int) {
	t.Helper()
	knob := "/sys/bus/pci/devices/" + pf.Address + "/sriov_numvfs"
	if err := os.WriteFile(knob, []byte(fmt.Sprint(n+1)), 0); err == nil {
		t.Fatalf("%s accepted %d over %d VFs; the kernel refuses a non-zero count over another", knob, n+1, pf.NumVFs)
	}
	start := time.Now()
	if err := os.WriteFile(knob, []byte("0"), 0); err != nil {
		t.Fatalf("remove the VFs of %s: %v", pf.Address, err)
	}
	for _, vf := range pf.VFs {
		if _, err := os.Stat("/sys/bus/pci/devices/" + vf.Address); !os.IsNotExist(err) {
			t.Fatalf("VF %s still in sysfs after sriov_numvfs=0 (%v)", vf.Address, err)
		}
	}
	if err := os.WriteFile(knob, []byte(fmt.Sprint(n)), 0); err != nil {
		t.Fatalf("create %d VFs on %s: %v", n, pf.Address, err)
	}
	for i := range n {
		dev, err := filepath.EvalSymlinks(fmt.Sprintf("/sys/bus/pci/devices/%s/virtfn%d", pf.Address, i))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := waitNetdev(dev, 60*time.Second); err != nil {
			t.Fatalf("re-created VF %d of %s: %v", i, pf.Address, err)
		}
	}
	t.Logf("VFs of %s re-created in %s", pf.Address, time.Since(start).Round(time.Millisecond))
}

// Case 10: a node's VFs are destroyed and made anew under a surviving
// checkpoint: the kernel state a reboot leaves, which driver/prepare's
// TestRepeatedPrepareAfterReboot shows in simulation. A restarted driver
// prepares again the claim the kubelet prepares again (the VM pod's
// containers restart): back onto vfio-pci, with its settings and a new CDI
// spec (the reboot emptied the tmpfs holding them) that names the group's
// node. It unprepares the claim deleted meanwhile without an error. Both
// VFs end as they were.
func TestRecreatedVFs(t *testing.T) {
	m := guest(t)
	pf := m.pf(t, layout.RoleMain)
	kept, gone := pf.VFs[0], pf.VFs[1]
	beforeKept, beforeGone := m.vfState(t, pf, kept), m.vfState(t, pf, gone)
	cKept := claim("recreate-kept", `{`+vfConfigHead+`,"mac":"02:00:00:0a:0b:1c","vlan":210,"trust":true}`, kept)
	// Each with a MAC: without one, what the PF reports once vfio-pci holds
	// the VF depends on what earlier cases left (a MAC the VF set itself).
	cGone := claim("recreate-gone", `{`+vfConfigHead+`,"mac":"02:00:00:0a:0b:1d","vlan":211}`, gone)
	dir := t.TempDir()
	ctx := context.Background()
	s := m.state(t, dir, nil, cKept, cGone)
	for _, c := range []*resourceapi.ResourceClaim{cKept, cGone} {
		if err := prepareClaim(ctx, s, c); err != nil {
			t.Fatalf("prepare %s: %v", c.Name, err)
		}
	}
	wantKept := vflink.VFState{MAC: net.HardwareAddr{2, 0, 0, 0x0a, 0x0b, 0x1c}, VLAN: 210, SpoofChk: beforeKept.Link.SpoofChk, Trust: true}
	m.checkPrepared(t, pf, kept, wantKept)
	m.checkPrepared(t, pf, gone, vflink.VFState{MAC: net.HardwareAddr{2, 0, 0, 0x0a, 0x0b, 0x1d}, VLAN: 211, SpoofChk: beforeGone.Link.SpoofChk, Trust: beforeGone.Link.Trust})
	groupsBefore := map[string]string{kept.Address: m.group(t, kept), gone.Address: m.group(t, gone)}

	recreateVFs(t, pf, pf.NumVFs)
	// What the kernel gives back: igbvf, no override, no PF-side settings.
	for _, vf := range []sysfs.VF{kept, gone} {
		st := m.vfState(t, pf, vf)
		t.Logf("re-created VF %s: %s (IOMMU group %s, was %s)", vf.Address, st, m.group(t, vf), groupsBefore[vf.Address])
		if st.Driver != "igbvf" || st.Override != "" || st.Link.VLAN != 0 || st.Link.Trust {
			t.Errorf("re-created VF %s: %s; want igbvf, no override, VLAN 0, trust off", vf.Address, st)
		}
	}

	// A reboot also empties /var/run/cdi (tmpfs), where the specs live.
	if err := os.RemoveAll(filepath.Join(dir, "cdi")); err != nil {
		t.Fatal(err)
	}
	// The driver restarts with the checkpoint as it was.
	s = m.state(t, dir, nil, cKept, cGone)
	if cp := s.Snapshot(); len(cp.Claims) != 2 {
		t.Fatalf("restarted driver's checkpoint holds %d claims, want both", len(cp.Claims))
	}
	start := time.Now()
	if err := prepareClaim(ctx, s, cKept); err != nil {
		t.Fatalf("prepare %s again after the VFs were re-created: %v", cKept.Name, err)
	}
	t.Logf("repeated prepare took %s", time.Since(start).Round(time.Millisecond))
	m.checkPrepared(t, pf, kept, wantKept)
	if e := s.Snapshot().Claims[cKept.UID]; e == nil || e.Phase != checkpoint.PhasePrepared {
		t.Errorf("checkpoint entry of %s after the repeated prepare: %+v", cKept.Name, e)
	}
	specPath := prepare.CDIWriter{Root: filepath.Join(dir, "cdi")}.SpecPath(cKept.UID)
	spec, err := os.ReadFile(specPath)
	if err != nil {
		t.Fatalf("CDI spec of %s after the repeated prepare: %v", cKept.Name, err)
	}
	if node := "/dev/vfio/" + m.group(t, kept); !strings.Contains(string(spec), `"`+node+`"`) {
		t.Errorf("CDI spec %s does not name %s, the re-created VF's group node:\n%s", specPath, node, spec)
	}

	if err := unprepareClaim(ctx, s, cGone); err != nil {
		t.Errorf("unprepare %s, whose VF was re-created: %v", cGone.Name, err)
	}
	if err := unprepareClaim(ctx, s, cKept); err != nil {
		t.Errorf("unprepare %s: %v", cKept.Name, err)
	}
	// Checked once both are undone: /dev/vfio lists every prepared group.
	m.checkRestored(t, pf, gone, beforeGone, false)
	m.checkRestored(t, pf, kept, beforeKept, false)
	if n := len(s.Snapshot().Claims); n != 0 {
		t.Errorf("checkpoint holds %d claims after both were unprepared", n)
	}
	if left, _ := filepath.Glob(filepath.Join(dir, "cdi", "*")); len(left) != 0 {
		t.Errorf("CDI specs left: %v", left)
	}
}

// group is vf's IOMMU group as sysfs reads it now.
func (m *machine) group(t *testing.T, vf sysfs.VF) string {
	t.Helper()
	fn, err := m.sysfs.Function(vf.Address)
	if err != nil {
		t.Fatal(err)
	}
	return fn.IOMMUGroup
}
