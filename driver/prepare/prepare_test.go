package prepare_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	"github.com/vfnet-io/vfnet/driver/checkpoint"
	"github.com/vfnet-io/vfnet/driver/discovery"
	"github.com/vfnet-io/vfnet/driver/prepare"
	"github.com/vfnet-io/vfnet/pkg/contract/pciaddr"
	"github.com/vfnet-io/vfnet/test/lib/preparetest"
	"github.com/vfnet-io/vfnet/test/lib/simhost"
)

const (
	hdr    = `"apiVersion":"vfnet.io/v1alpha1","kind":"VFConfig"`
	vf1    = "vf-0000-3b-02-1"
	vf1BDF = "0000:3b:02.1"
	pf0    = "enp59s0f0"
)

var (
	fromClass = resourceapi.AllocationConfigSourceClass
	fromClaim = resourceapi.AllocationConfigSourceClaim
)

func prepareOne(t *testing.T, s *prepare.State, c *resourceapi.ResourceClaim) kubeletplugin.PrepareResult {
	t.Helper()
	res, err := s.Prepare(context.Background(), []*resourceapi.ResourceClaim{c})
	if err != nil {
		t.Fatal(err)
	}
	r, ok := res[c.UID]
	if !ok || len(res) != 1 {
		t.Fatalf("result %v lacks claim %s", res, c.UID)
	}
	return r
}

func unprepareOne(t *testing.T, s *prepare.State, c *resourceapi.ResourceClaim) error {
	t.Helper()
	res, err := s.Unprepare(context.Background(), []kubeletplugin.NamespacedObject{{UID: c.UID, NamespacedName: types.NamespacedName{Namespace: c.Namespace, Name: c.Name}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := res[c.UID]; !ok {
		t.Fatalf("result %v lacks claim %s", res, c.UID)
	}
	return res[c.UID]
}

func TestPrepareUnprepareRoundTrip(t *testing.T) {
	t.Parallel()
	e := preparetest.NewEnv(t, "", simhost.E810Host())
	pod := e.AddVM(t, "ns", "vm1", "vf-claim", "02:00:00:00:00:01")
	c := preparetest.ReserveFor(preparetest.Claim("ns", "vm1-vf", "uid-1", []string{vf1},
		preparetest.Config(fromClaim, `{`+hdr+`,"qos":3,"spoofChk":false}`),
		preparetest.Config(fromClass, `{`+hdr+`,"vlan":100,"trust":true,"maxTxRateMbps":2000}`),
	), pod, "vf-claim")
	// Another driver's status entry must survive.
	c.Status.Devices = []resourceapi.AllocatedDeviceStatus{{Driver: "gpu.example.com", Pool: "p", Device: "gpu0"}}
	e.AddClaim(t, c)
	before := e.Snapshot(t)
	s := e.NewState(t, nil)

	r := prepareOne(t, s, c)
	if r.Err != nil {
		t.Fatal(r.Err)
	}
	if len(r.Devices) != 1 {
		t.Fatalf("devices %+v", r.Devices)
	}
	d := r.Devices[0]
	if d.DeviceName != vf1 || d.PoolName != preparetest.Node || d.Requests[0] != "vf" || d.CDIDeviceIDs[0] != "sriov.vfnet.io/vf=uid-1-"+vf1 {
		t.Fatalf("device %+v", d)
	}
	if got := d.Metadata.Attributes["resource.kubernetes.io/pciBusID"]; got.StringValue == nil || *got.StringValue != vf1BDF {
		t.Fatalf("pciBusID attribute %+v", d.Metadata.Attributes)
	}
	if got := d.Metadata.Attributes["vfnet.io/pfName"]; got.StringValue == nil || *got.StringValue != pf0 {
		t.Fatalf("pfName attribute %+v", d.Metadata.Attributes)
	}
	if d.Metadata.NetworkData == nil || d.Metadata.NetworkData.HardwareAddress != "02:00:00:00:00:01" {
		t.Fatalf("network data %+v", d.Metadata.NetworkData)
	}
	after := e.Snapshot(t)
	v := after.VFs[vf1BDF]
	if v.Driver != "vfio-pci" || v.Override != "vfio-pci" || len(v.NetDevs) != 0 {
		t.Fatalf("VF after prepare: %+v", v)
	}
	l := v.Link
	if l.MAC.String() != "02:00:00:00:00:01" || l.VLAN != 100 || l.QoS != 3 || l.SpoofChk || !l.Trust || l.MaxTxRateMbps != 2000 {
		t.Fatalf("link after prepare: %+v", l)
	}
	if len(after.CDIFiles) != 1 || len(after.DevVFIO) != len(before.DevVFIO)+1 {
		t.Fatalf("cdi %v dev %v", after.CDIFiles, after.DevVFIO)
	}
	// Other VFs are untouched.
	for bdf, vs := range before.VFs {
		if bdf != vf1BDF && after.VFs[bdf].Driver != vs.Driver {
			t.Fatalf("VF %s changed", bdf)
		}
	}
	st := e.GetClaim(t, "ns", "vm1-vf").Status.Devices
	if len(st) != 2 || st[0].Driver != "gpu.example.com" || st[1].Device != vf1 || st[1].NetworkData == nil || st[1].NetworkData.HardwareAddress != "02:00:00:00:00:01" {
		t.Fatalf("status.devices %+v", st)
	}
	if !s.Owned(vf1BDF) || s.Owned("0000:3b:02.0") {
		t.Fatal("Owned is wrong")
	}

	// Repeating prepare changes nothing on the host.
	writes := len(e.Host.Kernel().Writes())
	r2 := prepareOne(t, s, c)
	if r2.Err != nil || len(r2.Devices) != 1 || r2.Devices[0].CDIDeviceIDs[0] != d.CDIDeviceIDs[0] {
		t.Fatalf("repeat: %+v", r2)
	}
	if n := len(e.Host.Kernel().Writes()); n != writes {
		t.Fatalf("repeated prepare wrote to sysfs %d times", n-writes)
	}
	if again := e.Snapshot(t); again.String() != after.String() {
		t.Fatalf("repeated prepare changed the host:\n%s\nwant\n%s", again, after)
	}

	// A restarted driver knows the claim from the checkpoint.
	s = e.NewState(t, nil)
	if err := unprepareOne(t, s, c); err != nil {
		t.Fatal(err)
	}
	if got := e.Snapshot(t); got.String() != before.String() {
		t.Fatalf("host after unprepare:\n%s\nwant\n%s", got, before)
	}
	if cp := s.Snapshot(); len(cp.Claims) != 0 {
		t.Fatalf("checkpoint keeps %v", cp.Claims)
	}
	st = e.GetClaim(t, "ns", "vm1-vf").Status.Devices
	if len(st) != 1 || st[0].Driver != "gpu.example.com" {
		t.Fatalf("status.devices after unprepare %+v", st)
	}
	writes = len(e.Host.Kernel().Writes())
	if err := unprepareOne(t, s, c); err != nil {
		t.Fatal(err)
	}
	if n := len(e.Host.Kernel().Writes()); n != writes {
		t.Fatal("repeated unprepare touched sysfs")
	}
	// Unknown claims succeed.
	if err := unprepareOne(t, s, preparetest.Claim("ns", "never", "uid-x", nil)); err != nil {
		t.Fatal(err)
	}
}

func TestMACChoice(t *testing.T) {
	t.Parallel()
	e := preparetest.NewEnv(t, "", simhost.E810Host())
	pod := e.AddVM(t, "ns", "vm1", "vf-claim", "02:00:00:00:00:01")
	s := e.NewState(t, nil)
	// The config's MAC wins over the VM's.
	c := preparetest.ReserveFor(preparetest.Claim("ns", "a", "uid-a", []string{vf1}, preparetest.Config(fromClaim, `{`+hdr+`,"mac":"02:aa:00:00:00:01"}`)), pod, "vf-claim")
	e.AddClaim(t, c)
	r := prepareOne(t, s, c)
	if r.Err != nil || r.Devices[0].Metadata.NetworkData.HardwareAddress != "02:aa:00:00:00:01" {
		t.Fatalf("%+v", r)
	}
	// Without config MAC and VM the VF keeps its MAC (unset here: no
	// network data is reported then).
	c2 := preparetest.Claim("ns", "b", "uid-b", []string{"vf-0000-3b-02-2"})
	e.AddClaim(t, c2)
	r = prepareOne(t, s, c2)
	if r.Err != nil || r.Devices[0].Metadata.NetworkData != nil {
		t.Fatalf("%+v", r)
	}
	link, _ := e.Host.VFState(pf0, 2)
	if link.MAC.String() != "00:00:00:00:00:00" {
		t.Fatalf("MAC changed to %s", link.MAC)
	}
}

func TestNoIOMMU(t *testing.T) {
	t.Parallel()
	e := preparetest.NewEnv(t, "", simhost.NoIOMMUHost())
	c := preparetest.Claim("ns", "a", "uid-a", []string{vf1})
	e.AddClaim(t, c)
	before := e.Snapshot(t)
	// Without the node configuration's allowUnsafeNoIOMMU, prepare refuses.
	if r := prepareOne(t, e.NewState(t, nil), c); r.Err == nil || !strings.Contains(r.Err.Error(), "allowUnsafeNoIOMMU") {
		t.Fatalf("prepare without the noiommu opt-in: %v", r.Err)
	}
	if got := e.Snapshot(t); got.String() != before.String() {
		t.Fatalf("host after refused prepare:\n%s\nwant\n%s", got, before)
	}
	opts := e.Options(nil)
	opts.CheckVF = func(bdf string) error {
		return discovery.CheckVF(e.Host.Sysfs(), bdf, discovery.Policy{AllowUnsafeNoIOMMU: true}, nil)
	}
	s, err := prepare.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	if r := prepareOne(t, s, c); r.Err != nil {
		t.Fatal(r.Err)
	}
	spec, err := os.ReadFile(filepath.Join(e.CDIRoot, "sriov.vfnet.io-vf_uid-a.json"))
	if err != nil || !strings.Contains(string(spec), `"/dev/vfio/noiommu-`) || !strings.Contains(string(spec), `"/dev/vfio/vfio"`) {
		t.Fatalf("CDI spec %s: %v", spec, err)
	}
	if err := unprepareOne(t, s, c); err != nil {
		t.Fatal(err)
	}
	if got := e.Snapshot(t); got.String() != before.String() {
		t.Fatalf("host after unprepare:\n%s\nwant\n%s", got, before)
	}
}

// Each bad input gives a clear error and leaves the host as it was.
func TestBadInputs(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		spec    func() simhost.Spec
		devices []string
		configs []resourceapi.DeviceAllocationConfiguration
		setup   func(t *testing.T, e *preparetest.Env, s *prepare.State)
		want    []string
		step    string // prepare.StepOf: the metrics' step label
	}{
		{name: "malformed VFConfig", configs: []resourceapi.DeviceAllocationConfiguration{preparetest.Config(fromClaim, `{`+hdr+`,"vlan":"one hundred"}`)},
			want: []string{"device " + vf1, "config[0] (FromClaim)", "decode vfnet.io/v1alpha1 VFConfig", "vlan"}, step: prepare.ErrStepPlan},
		{name: "not an object", configs: []resourceapi.DeviceAllocationConfiguration{preparetest.Config(fromClass, `[1,2]`)},
			want: []string{"config[0] (FromClass)", "decode vfnet.io/v1alpha1 VFConfig"}, step: prepare.ErrStepPlan},
		{name: "unknown field", configs: []resourceapi.DeviceAllocationConfiguration{preparetest.Config(fromClaim, `{`+hdr+`,"vlanid":5}`)},
			want: []string{`unknown field "vlanid"`}, step: prepare.ErrStepPlan},
		{name: "vlan out of range", configs: []resourceapi.DeviceAllocationConfiguration{preparetest.Config(fromClass, `{`+hdr+`,"vlan":4095}`)},
			want: []string{"vlan: 4095 is out of range; allowed 0-4094"}, step: prepare.ErrStepPlan},
		{name: "bad mac", configs: []resourceapi.DeviceAllocationConfiguration{preparetest.Config(fromClaim, `{`+hdr+`,"mac":"02:00:00:00:00:zz"}`)},
			want: []string{`mac: "02:00:00:00:00:zz" is not a 48-bit MAC address`}, step: prepare.ErrStepPlan},
		{name: "vanished VF", devices: []string{vf1, "vf-0000-3b-02-7"},
			want: []string{"vf-0000-3b-02-7", "no VF at 0000:3b:02.7 on this node"}, step: prepare.ErrStepPlan},
		{name: "vfio-pci not loaded", spec: func() simhost.Spec { s := simhost.E810Host(); s.NoVFIOPCI = true; return s },
			want: []string{"modprobe vfio-pci", "on node node-a"}, step: prepare.ErrStepCheck},
		{name: "bind fails after unbind", devices: []string{vf1, "vf-0000-3b-02-2"},
			setup: func(t *testing.T, e *preparetest.Env, s *prepare.State) {
				// The second VF's bind fails: the first, fully bound
				// one must be rolled back too.
				e.Host.Kernel().SetWriteHook(func(rel string, data []byte) error {
					if rel == "bus/pci/drivers/vfio-pci/bind" && string(data) == "0000:3b:02.2" {
						return syscall.EIO
					}
					return nil
				})
			},
			want: []string{"VF 0000:3b:02.2 (vf-0000-3b-02-2, enp59s0f0 vf 2): bind to vfio-pci: bind 0000:3b:02.2 to vfio-pci", "input/output error", "everything done for the claim was undone"},
			step: prepare.ErrStepBind},
		{name: "link setting fails", configs: []resourceapi.DeviceAllocationConfiguration{preparetest.Config(fromClaim, `{`+hdr+`,"vlan":10,"trust":true}`)},
			setup: func(t *testing.T, e *preparetest.Env, s *prepare.State) {
				e.Host.Links().Fail(simhost.OpSetTrust, syscall.EOPNOTSUPP, 1)
			},
			want: []string{"VF " + vf1BDF, "apply VF link settings through the PF", "trust true: PF driver ice (PF enp59s0f0) does not support it (EOPNOTSUPP)", "undone"},
			step: prepare.ErrStepLink},
		{name: "second claim on a prepared VF",
			setup: func(t *testing.T, e *preparetest.Env, s *prepare.State) {
				first := preparetest.Claim("other-ns", "first", "uid-first", []string{vf1})
				e.AddClaim(t, first)
				if r := prepareOne(t, s, first); r.Err != nil {
					t.Fatal(r.Err)
				}
			},
			want: []string{"is already prepared for claim other-ns/first (uid uid-first)"}, step: prepare.ErrStepRecord},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			spec := simhost.E810Host()
			if tc.spec != nil {
				spec = tc.spec()
			}
			e := preparetest.NewEnv(t, "", spec)
			s := e.NewState(t, nil)
			if tc.setup != nil {
				tc.setup(t, e, s)
			}
			devices := tc.devices
			if devices == nil {
				devices = []string{vf1}
			}
			c := preparetest.Claim("ns", "bad", "uid-bad", devices, tc.configs...)
			e.AddClaim(t, c)
			before := e.Snapshot(t)
			cpBefore := s.Snapshot()
			r := prepareOne(t, s, c)
			if r.Err == nil {
				t.Fatal("prepare succeeded")
			}
			for _, w := range tc.want {
				if !strings.Contains(r.Err.Error(), w) {
					t.Errorf("error %q\nlacks %q", r.Err, w)
				}
			}
			if got := prepare.StepOf(r.Err); got != tc.step {
				t.Errorf("step %q, want %q", got, tc.step)
			}
			if got := e.Snapshot(t); got.String() != before.String() {
				t.Fatalf("host changed:\n%s\nwant\n%s", got, before)
			}
			if cp := s.Snapshot(); len(cp.Claims) != len(cpBefore.Claims) {
				t.Fatalf("checkpoint changed: %v", cp.Claims)
			}
		})
	}
}

func TestCorruptCheckpointStopsStartup(t *testing.T) {
	t.Parallel()
	e := preparetest.NewEnv(t, "", simhost.E810Host())
	if err := os.WriteFile(e.CheckpointPath(), []byte(`{"version":1,"claims":{"u":`), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := prepare.New(e.Options(nil))
	if !errors.Is(err, checkpoint.ErrCorrupt) || !strings.Contains(err.Error(), e.CheckpointPath()) {
		t.Fatalf("New = %v", err)
	}
}

// A VF that disappears while prepared (sriov_numvfs lowered, PF removed)
// leaves nothing to restore: unprepare succeeds and forgets the claim.
func TestUnprepareVanishedVF(t *testing.T) {
	t.Parallel()
	e := preparetest.NewEnv(t, "", simhost.E810Host())
	s := e.NewState(t, nil)
	c := preparetest.Claim("ns", "a", "uid-a", []string{vf1, "vf-0000-3b-12-1"})
	e.AddClaim(t, c)
	if r := prepareOne(t, s, c); r.Err != nil {
		t.Fatal(r.Err)
	}
	if err := e.Host.SetNumVFs("0000:3b:00.0", 0); err != nil {
		t.Fatal(err)
	}
	if err := unprepareOne(t, s, c); err != nil {
		t.Fatal(err)
	}
	if len(s.Snapshot().Claims) != 0 {
		t.Fatal("claim kept")
	}
	// The VF on the other PF is restored.
	v := e.Snapshot(t).VFs["0000:3b:12.1"]
	if v.Driver != "iavf" || v.Override != "(null)" {
		t.Fatalf("VF on the other PF: %+v", v)
	}
}

// The VF's PF and index come from sysfs for every NIC layout (offsets,
// strides, mlx5's shared PF/VF driver, a VF left unbound).
func TestLocateAcrossNICs(t *testing.T) {
	t.Parallel()
	e := preparetest.NewEnv(t, "", simhost.MixedHost())
	s := e.NewState(t, nil)
	pfs, err := e.Host.Sysfs().Discover(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	before := e.Snapshot(t)
	n := 0
	for _, pf := range pfs {
		for _, vf := range pf.VFs {
			if vf.Driver == "vfio-pci" {
				continue // pre-bound by the admin; covered elsewhere
			}
			name, err := pciaddr.DeviceName(vf.Address)
			if err != nil {
				t.Fatal(err)
			}
			uid := types.UID("uid-" + name)
			c := preparetest.Claim("ns", name, uid, []string{name}, preparetest.Config(fromClaim, `{`+hdr+`,"vlan":77}`))
			e.AddClaim(t, c)
			r := prepareOne(t, s, c)
			if r.Err != nil {
				t.Fatal(r.Err)
			}
			if a := r.Devices[0].Metadata.Attributes["vfnet.io/vfIndex"]; a.IntValue == nil || *a.IntValue != int64(vf.Index) {
				t.Fatalf("%s: vfIndex attribute %+v, want %d", name, a, vf.Index)
			}
			link, err := e.Host.VFState(pf.NetDevs[0], vf.Index)
			if err != nil || link.VLAN != 77 {
				t.Fatalf("%s: VLAN not set on %s vf %d: %+v %v", name, pf.NetDevs[0], vf.Index, link, err)
			}
			if err := unprepareOne(t, s, c); err != nil {
				t.Fatal(err)
			}
			n++
		}
	}
	if n < 8 {
		t.Fatalf("only %d VFs tried", n)
	}
	if got := e.Snapshot(t); got.String() != before.String() {
		t.Fatalf("host changed:\n%s\nwant\n%s", got, before)
	}
}

// A VF the admin bound to vfio-pci before is used as is and left so.
func TestPreboundVFIO(t *testing.T) {
	t.Parallel()
	e := preparetest.NewEnv(t, "", simhost.MixedHost())
	s := e.NewState(t, nil)
	before := e.Snapshot(t)
	c := preparetest.Claim("ns", "a", "uid-a", []string{"vf-0000-3b-02-2"})
	e.AddClaim(t, c)
	if r := prepareOne(t, s, c); r.Err != nil {
		t.Fatal(r.Err)
	}
	if err := unprepareOne(t, s, c); err != nil {
		t.Fatal(err)
	}
	if got := e.Snapshot(t); got.String() != before.String() {
		t.Fatalf("host changed:\n%s\nwant\n%s", got, before)
	}
	if v := before.VFs["0000:3b:02.2"]; v.Driver != "vfio-pci" {
		t.Fatalf("fixture changed: %+v", v)
	}
}

// A PF renamed between prepare and unprepare: the VF settings are restored
// through the PF's current name, found from its PCI address.
func TestUnprepareAfterPFRename(t *testing.T) {
	t.Parallel()
	e := preparetest.NewEnv(t, "", simhost.E810Host())
	c := preparetest.Claim("ns", "a", "uid-a", []string{vf1}, preparetest.Config(fromClaim, `{`+hdr+`,"vlan":100,"trust":true}`))
	e.AddClaim(t, c)
	before, err := e.Host.VFState(pf0, 1)
	if err != nil {
		t.Fatal(err)
	}
	s := e.NewState(t, nil)
	if r := prepareOne(t, s, c); r.Err != nil {
		t.Fatal(r.Err)
	}
	if err := e.Host.SetOperState(pf0, "down"); err != nil {
		t.Fatal(err)
	}
	if err := e.Host.RenameNetdev(pf0, "wan0"); err != nil {
		t.Fatal(err)
	}
	if err := unprepareOne(t, s, c); err != nil {
		t.Fatalf("unprepare after the PF was renamed: %v", err)
	}
	after, err := e.Host.VFState("wan0", 1)
	if err != nil {
		t.Fatal(err)
	}
	if after.VLAN != before.VLAN || after.Trust != before.Trust {
		t.Fatalf("VF settings after unprepare %+v, want %+v", after, before)
	}
	fn, err := e.Host.Sysfs().Function(vf1BDF)
	if err != nil || fn.Driver != "iavf" {
		t.Fatalf("VF driver after unprepare %q (%v), want iavf", fn.Driver, err)
	}
}

// A VF left on vfio-pci by another stack is prepared with vfio-pci as the
// driver to restore: unprepare leaves it there, settings restored.
func TestPrepareVFAlreadyOnVFIO(t *testing.T) {
	t.Parallel()
	e := preparetest.NewEnv(t, "", simhost.MixedHost())
	const dev = "vf-0000-3b-02-2"
	c := preparetest.Claim("ns", "a", "uid-a", []string{dev}, preparetest.Config(fromClaim, `{`+hdr+`,"vlan":7}`))
	e.AddClaim(t, c)
	before := e.Snapshot(t)
	s := e.NewState(t, nil)
	if r := prepareOne(t, s, c); r.Err != nil {
		t.Fatal(r.Err)
	}
	d := s.Snapshot().Claims["uid-a"].Devices[0]
	if d.OriginalDriver != "vfio-pci" || d.OriginalOverride != "vfio-pci" {
		t.Fatalf("recorded original driver %q override %q, want vfio-pci", d.OriginalDriver, d.OriginalOverride)
	}
	if st, _ := e.Host.VFState(pf0, 2); st.VLAN != 7 {
		t.Fatalf("VLAN %d, want 7", st.VLAN)
	}
	if err := unprepareOne(t, s, c); err != nil {
		t.Fatal(err)
	}
	if got := e.Snapshot(t); got.String() != before.String() {
		t.Fatalf("host after unprepare:\n%s\nwant\n%s", got, before)
	}
}

// Prepare checks the group again just before binding: a VF whose group is
// shared (no ACS) is refused and the host is left as it was.
func TestPrepareRefusesSharedIOMMUGroup(t *testing.T) {
	t.Parallel()
	e := preparetest.NewEnv(t, "", simhost.NoACSHost())
	c := preparetest.Claim("ns", "a", "uid-a", []string{vf1}, preparetest.Config(fromClaim, `{`+hdr+`,"vlan":7}`))
	e.AddClaim(t, c)
	before := e.Snapshot(t)
	r := prepareOne(t, e.NewState(t, nil), c)
	if r.Err == nil || !strings.Contains(r.Err.Error(), "also holds 0000:3b:00.0 (ice)") || !strings.Contains(r.Err.Error(), "enable ACS") {
		t.Fatalf("prepare of a VF in a shared group: %v", r.Err)
	}
	if got := e.Snapshot(t); got.String() != before.String() {
		t.Fatalf("host after refused prepare:\n%s\nwant\n%s", got, before)
	}
}

// Exclusive holds the node lock: a prepare asked meanwhile cannot take it
// (here with a context that is already over, so it gives up instead of
// waiting), and fn sees the checkpoint as it is (what a VF count change
// checks before its writes). AfterUnprepare runs after every Unprepare.
func TestExclusiveAndAfterUnprepare(t *testing.T) {
	t.Parallel()
	e := preparetest.NewEnv(t, "", simhost.E810Host())
	c := preparetest.Claim("ns", "c1", "uid-1", []string{vf1})
	e.AddClaim(t, c)
	opts := e.Options(nil)
	unprepared := 0
	opts.AfterUnprepare = func() { unprepared++ }
	s, err := prepare.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	err = s.Exclusive(context.Background(), func(cp *checkpoint.File) error {
		if len(prepare.PreparedVFs(cp)) != 0 {
			return errors.New("checkpoint not empty before the prepare")
		}
		if _, err := s.Prepare(gone, []*resourceapi.ResourceClaim{c}); err == nil || !strings.Contains(err.Error(), "node lock") {
			return errors.New("a prepare got past the node lock Exclusive holds")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(prepare.PreparedVFs(s.Snapshot())) != 0 {
		t.Fatal("the refused prepare changed the checkpoint")
	}
	if r := prepareOne(t, s, c); r.Err != nil {
		t.Fatal(r.Err)
	}
	if err := s.Exclusive(context.Background(), func(cp *checkpoint.File) error {
		if got := prepare.PreparedVFs(cp)[vf1BDF]; got != "ns/c1" {
			return errors.New("checkpoint names " + got + " for " + vf1BDF + ", want ns/c1")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := unprepareOne(t, s, c); err != nil {
		t.Fatal(err)
	}
	if unprepared != 1 {
		t.Fatalf("AfterUnprepare called %d times, want 1", unprepared)
	}
}
