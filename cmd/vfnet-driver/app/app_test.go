package app_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/yaml"

	"github.com/vfnet-io/vfnet/cmd/vfnet-driver/app"
	"github.com/vfnet-io/vfnet/driver/checkpoint"
	"github.com/vfnet-io/vfnet/driver/vfcount"
	"github.com/vfnet-io/vfnet/test/lib/controlplane"
	"github.com/vfnet-io/vfnet/test/lib/gobuild"
	"github.com/vfnet-io/vfnet/test/lib/simhost"
	"github.com/vfnet-io/vfnet/test/lib/simulate"
)

const mixedConfig = `apiVersion: vfnet.io/v1alpha1
kind: NodeConfig
pfs:
- pfName: enp59s0f0
  network: physnet-a
- vendorID: "15b3"
  network: physnet-b
`

func buildHost(t *testing.T, spec simhost.Spec) string {
	t.Helper()
	h, err := simhost.Build(t.TempDir(), spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return h.Root()
}

func writeFile(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "node.yaml")
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func decodeSlices(t *testing.T, out string) []resourceapi.ResourceSlice {
	t.Helper()
	var slices []resourceapi.ResourceSlice
	for _, doc := range strings.Split(out, "\n---\n") {
		var s resourceapi.ResourceSlice
		if err := yaml.UnmarshalStrict([]byte(doc), &s); err != nil {
			t.Fatalf("document is not a ResourceSlice: %v\n%s", err, doc)
		}
		slices = append(slices, s)
	}
	return slices
}

func TestInspectMixedHost(t *testing.T) {
	t.Parallel()
	root := buildHost(t, simhost.MixedHost())
	var stdout, stderr bytes.Buffer
	code := app.Main([]string{"inspect", "--simulate", "--sysfs-root", root, "--config", writeFile(t, mixedConfig), "--node-name", "node-a"}, &stdout, &stderr, simulate.Open)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	slices := decodeSlices(t, stdout.String())
	if len(slices) != 1 {
		t.Fatalf("%d slices", len(slices))
	}
	s := slices[0]
	if s.APIVersion != "resource.k8s.io/v1" || s.Kind != "ResourceSlice" || s.Spec.Driver != "sriov.vfnet.io" || s.Spec.Pool.Name != "node-a" || *s.Spec.NodeName != "node-a" {
		t.Fatalf("slice header %+v %+v", s.TypeMeta, s.Spec.Pool)
	}
	var names []string
	for _, d := range s.Spec.Devices {
		names = append(names, d.Name+"="+*d.Attributes["vfnet.io/network"].StringValue)
	}
	want := "vf-0000-3b-02-0=physnet-a vf-0000-3b-02-1=physnet-a vf-0000-3b-02-3=physnet-a " +
		"vf-0000-d8-00-2=physnet-b vf-0000-d8-00-3=physnet-b vf-0000-d8-00-4=physnet-b vf-0000-d8-00-5=physnet-b"
	if strings.Join(names, " ") != want {
		t.Fatalf("devices\n got %s\nwant %s", strings.Join(names, " "), want)
	}
	if !strings.Contains(stderr.String(), "not offered: 0000:3b:02.2") {
		t.Errorf("stderr does not explain the skipped vfio-pci VF: %s", stderr.String())
	}
}

func TestInspectLargeHostSplits(t *testing.T) {
	t.Parallel()
	root := buildHost(t, simhost.LargeHost())
	var stdout, stderr bytes.Buffer
	cfg := writeFile(t, "apiVersion: vfnet.io/v1alpha1\nkind: NodeConfig\npfs:\n- deviceID: \"1593\"\n  network: net\n")
	if code := app.Main([]string{"inspect", "--simulate", "--sysfs-root", root, "--node-config", cfg, "--node-name", "big"}, &stdout, &stderr, simulate.Open); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	slices := decodeSlices(t, stdout.String())
	if len(slices) != 8 {
		t.Fatalf("%d slices, want 8", len(slices))
	}
	for i, s := range slices {
		if len(s.Spec.Devices) != 128 || s.Spec.Pool.ResourceSliceCount != 8 || !strings.HasPrefix(s.GenerateName, "0000"+string("01234567"[i])+"-") {
			t.Fatalf("slice %d: %d devices, %s", i, len(s.Spec.Devices), s.GenerateName)
		}
	}
}

func TestInspectNoConfigPublishesEmptySlice(t *testing.T) {
	t.Parallel()
	root := buildHost(t, simhost.E810Host())
	var stdout, stderr bytes.Buffer
	if code := app.Main([]string{"inspect", "--simulate", "--sysfs-root", root, "--node-name", "n"}, &stdout, &stderr, simulate.Open); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	slices := decodeSlices(t, stdout.String())
	if len(slices) != 1 || len(slices[0].Spec.Devices) != 0 {
		t.Fatalf("want one empty slice, got %+v", slices)
	}
	if got := strings.Count(stderr.String(), "\n"); got != 1 || !strings.Contains(stderr.String(), "no node configuration given") {
		t.Fatalf("want one line explaining why, got %q", stderr.String())
	}
}

func TestInspectErrors(t *testing.T) {
	t.Parallel()
	root := buildHost(t, simhost.E810Host())
	for name, tc := range map[string]struct {
		args []string
		code int
		want string
	}{
		"bad field": {[]string{"--config", writeFile(t, "apiVersion: vfnet.io/v1alpha1\nkind: NodeConfig\npfs:\n- pfName: a\n  network: n\n  vf: [1]\n"), "--node-name", "n"},
			1, "node.yaml: pfs[0].vf: unknown field"},
		"bad value": {[]string{"--config", writeFile(t, "apiVersion: vfnet.io/v1alpha1\nkind: NodeConfig\npfs:\n- pfName: a\n  network: Net_A\n"), "--node-name", "n"},
			1, "pfs[0].network: \"Net_A\" is not a DNS label"},
		"missing file": {[]string{"--config", "/nonexistent/node.yaml", "--node-name", "n"}, 1, "/nonexistent/node.yaml"},
		"overlap": {[]string{"--config", writeFile(t, "apiVersion: vfnet.io/v1alpha1\nkind: NodeConfig\npfs:\n- pfName: enp59s0f0\n  network: a\n- vendorID: \"8086\"\n  network: b\n"), "--node-name", "n"},
			1, "is matched by pfs[0] and pfs[1]"},
		"no node":  {[]string{}, 2, "--node-name"},
		"bad flag": {[]string{"--bogus"}, 2, "bogus"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			var stdout, stderr bytes.Buffer
			code := app.Inspect(append([]string{"--simulate", "--sysfs-root", root}, tc.args...), &stdout, &stderr, simulate.Open)
			if code != tc.code || !strings.Contains(stderr.String(), tc.want) || stdout.Len() != 0 {
				t.Fatalf("exit %d (want %d), stdout %q, stderr %q (want %q)", code, tc.code, stdout.String(), stderr.String(), tc.want)
			}
		})
	}
}

// buildCmd builds cmd/<name> of this module as shipped (test/lib/gobuild).
func buildCmd(t *testing.T, name string) string {
	t.Helper()
	repo, err := controlplane.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	dir, err := gobuild.Shipped(t.Context(), repo, cmdPackage(name))
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(dir, name)
}

// cmdPackage is where the main of the command name lives: the shipped
// programs under cmd/, the simulator-carrying build under test/cmd/.
func cmdPackage(name string) string {
	if name == "vfnet-driver-sim" {
		return "./test/cmd/" + name
	}
	return "./cmd/" + name
}

// TestBuiltCommand runs the real binaries: inspect output and exit codes,
// the driver refusing a bad configuration before touching anything, and the
// shipped build refusing --simulate.
func TestBuiltCommand(t *testing.T) {
	t.Parallel()
	sim, shipped := buildCmd(t, "vfnet-driver-sim"), buildCmd(t, "vfnet-driver")
	root := buildHost(t, simhost.MixedHost())
	good := writeFile(t, mixedConfig)
	out, err := exec.Command(sim, "inspect", "--simulate", "--sysfs-root", root, "--config", good, "--node-name", "node-a").Output()
	if err != nil {
		t.Fatalf("inspect: %v", err)
	}
	if s := decodeSlices(t, string(out)); len(s) != 1 || len(s[0].Spec.Devices) != 7 {
		t.Fatalf("inspect output: %s", out)
	}
	bad := writeFile(t, "apiVersion: vfnet.io/v1alpha1\nkind: NodeConfig\npfs:\n- pfName: a\n")
	run := func(bin string, args ...string) (int, string) {
		cmd := exec.Command(bin, args...)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		err := cmd.Run()
		var exit *exec.ExitError
		if err != nil && !errors.As(err, &exit) {
			t.Fatalf("%s %v: %v", bin, args, err)
		}
		return cmd.ProcessState.ExitCode(), stderr.String()
	}
	for _, args := range [][]string{
		{"inspect", "--simulate", "--sysfs-root", root, "--config", bad, "--node-name", "n"},
		{"--simulate", "--sysfs-root", root, "--config", bad, "--node-name", "n", "--kubeconfig", "/nonexistent"},
	} {
		if code, stderr := run(sim, args...); code != 1 || !strings.Contains(stderr, "pfs[0].network: missing") {
			t.Errorf("%v: exit %d, stderr %s", args, code, stderr)
		}
	}
	// Simulation is refused unless asked for: without --simulate the real
	// kernel paths are used, and a synthetic tree is read as a plain sysfs.
	if code, stderr := run(sim, "--sysfs-root", root, "--node-name", "n", "--kubeconfig", "/nonexistent"); code == 0 || strings.Contains(stderr, "SIMULATED") {
		t.Errorf("driver without --simulate: exit %d %s", code, stderr)
	}
	// The shipped build has no simulator: --simulate is a usage error that
	// names the build that has one, before anything else is read.
	for _, args := range [][]string{
		{"--simulate", "--sysfs-root", root, "--config", good, "--node-name", "n", "--kubeconfig", "/nonexistent"},
		{"inspect", "--simulate", "--sysfs-root", root, "--config", good, "--node-name", "n"},
	} {
		if code, stderr := run(shipped, args...); code != 2 || !strings.Contains(stderr, "--simulate: this vfnet-driver is the shipped build and links no simulator; run vfnet-driver-sim") {
			t.Errorf("shipped %v: exit %d, stderr %s", args, code, stderr)
		}
	}
}

// TestNoSimulator: without a Simulator (the shipped main), --simulate is
// refused naming the flag and vfnet-driver-sim, its help says so, and
// --simulate=false is the real kernel path.
func TestNoSimulator(t *testing.T) {
	t.Parallel()
	h := buildSim(t, simhost.E810Host())
	for _, args := range [][]string{
		{"--simulate", "--sysfs-root", h.Root(), "--node-name", "n"},
		{"inspect", "--simulate", "--sysfs-root", h.Root(), "--node-name", "n"},
	} {
		var stdout, stderr bytes.Buffer
		code := app.Main(args, &stdout, &stderr, nil)
		if want := "--simulate: this vfnet-driver is the shipped build and links no simulator; run vfnet-driver-sim (test/cmd/vfnet-driver-sim) for a simulated host, or drop --simulate to act on this host's kernel\n"; code != 2 || !strings.HasSuffix(stderr.String(), want) {
			t.Errorf("%v: exit %d, stderr %q, want it to end %q", args, code, stderr.String(), want)
		}
	}
	for _, args := range [][]string{{"--help"}, {"inspect", "--help"}} {
		var stdout, stderr bytes.Buffer
		app.Main(args, &stdout, &stderr, nil)
		if !strings.Contains(stderr.String(), "not in this build, which links no simulator: vfnet-driver-sim") {
			t.Errorf("%v: the help does not say --simulate is missing:\n%s", args, stderr.String())
		}
	}
	missing := filepath.Join(t.TempDir(), "proc", "1", "ns", "net")
	var stdout, stderr bytes.Buffer
	code := app.Main([]string{"inspect", "--simulate=false", "--sysfs-root", h.Root(), "--node-name", "n", "--host-netns", missing}, &stdout, &stderr, nil)
	if code != 1 || !strings.Contains(stderr.String(), "--host-netns: network namespace "+missing) {
		t.Errorf("--simulate=false: exit %d, stderr %s", code, stderr.String())
	}
}

// TestInspectCountsPreparedVFs: a VF the running driver bound to vfio-pci
// for a claim (it is in the checkpoint) stays offered.
func TestInspectCountsPreparedVFs(t *testing.T) {
	t.Parallel()
	root := buildHost(t, simhost.MixedHost())
	pluginDir := t.TempDir()
	cp := &checkpoint.File{Version: checkpoint.Version, Claims: map[types.UID]*checkpoint.Claim{
		"uid-1": {Namespace: "ns", Name: "c", Phase: checkpoint.PhasePrepared, Devices: []checkpoint.Device{{BDF: "0000:3b:02.2", Device: "vf-0000-3b-02-2"}}},
	}}
	if err := (checkpoint.Store{Path: filepath.Join(pluginDir, checkpoint.FileName)}).Save(cp); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	code := app.Main([]string{"inspect", "--simulate", "--sysfs-root", root, "--config", writeFile(t, mixedConfig), "--node-name", "n", "--plugin-dir", pluginDir}, &stdout, &stderr, simulate.Open)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	s := decodeSlices(t, stdout.String())
	if len(s) != 1 || len(s[0].Spec.Devices) != 8 || s[0].Spec.Devices[2].Name != "vf-0000-3b-02-2" || strings.Contains(stderr.String(), "not offered") {
		t.Fatalf("devices %d, stderr %s", len(s[0].Spec.Devices), stderr.String())
	}
}

func buildSim(t *testing.T, spec simhost.Spec) *simhost.Host {
	t.Helper()
	h, err := simhost.Build(t.TempDir(), spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return h
}

func inspect(t *testing.T, h *simhost.Host, cfg string, extra ...string) (stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	args := append([]string{"inspect", "--simulate", "--sysfs-root", h.Root(), "--config", writeFile(t, cfg), "--node-name", "n",
		"--dev-root", h.DevRoot(), "--proc-root", h.ProcRoot()}, extra...)
	if code := app.Main(args, &out, &errOut, simulate.Open); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	return out.String(), errOut.String()
}

// Functions skipped inside sysfs discovery are reported with their path
// and reason, in the same "# not offered" form as discovery-level skips.
func TestInspectReportsSysfsSkips(t *testing.T) {
	t.Parallel()
	h := buildSim(t, simhost.E810Host())
	const pf0 = "devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0"
	const vf2 = "devices/pci0000:3a/0000:3a:00.0/0000:3b:02.2"
	virtfn := filepath.Join(h.Root(), pf0, "virtfn1")
	if err := os.Remove(virtfn); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../0000:3b:09.1", virtfn); err != nil {
		t.Fatal(err)
	}
	vendor := filepath.Join(h.Root(), vf2, "vendor")
	if err := os.Remove(vendor); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(vendor, 0o755); err != nil { // unreadable: EISDIR
		t.Fatal(err)
	}
	out, stderr := inspect(t, h, "apiVersion: vfnet.io/v1alpha1\nkind: NodeConfig\npfs:\n- pfName: enp59s0f0\n  network: a\n")
	for _, want := range []string{
		"# not offered: " + virtfn + ": unusable sysfs entry: dangling link -> ../0000:3b:09.1",
		"# not offered: " + filepath.Join(h.Root(), pf0, "virtfn2") + ": unusable sysfs entry: read " + vendor,
	} {
		if !strings.Contains(stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, stderr)
		}
	}
	if n := len(decodeSlices(t, out)[0].Spec.Devices); n != 2 {
		t.Errorf("%d devices, want 2", n)
	}
}

// inspect says why a VF is not offered and what to fix, for each host-level
// reason, and which VFs it takes over from vfio-pci.
func TestInspectExplainsHostProblems(t *testing.T) {
	t.Parallel()
	hdr := "apiVersion: vfnet.io/v1alpha1\nkind: NodeConfig\n"
	for name, tc := range map[string]struct {
		spec    simhost.Spec
		cfg     string
		devices int
		want    string
	}{
		"shared group": {simhost.NoACSHost(), "pfs:\n- pfName: enp59s0f0\n  network: a\n", 0,
			"# not offered: 0000:3b:02.0: IOMMU group 16 also holds 0000:3b:00.0 (ice), 0000:3b:00.1 (ice), 0000:3b:02.1 (iavf) and 6 more: a group is passed to one VM as a whole"},
		"noiommu":          {simhost.NoIOMMUHost(), "pfs:\n- pfName: enp59s0f0\n  network: a\n", 0, "set allowUnsafeNoIOMMU: true in the node configuration"},
		"noiommu opted in": {simhost.NoIOMMUHost(), "allowUnsafeNoIOMMU: true\npfs:\n- pfName: enp59s0f0\n  network: a\n", 4, ""},
		"switchdev": {simhost.SwitchdevHost(), "pfs:\n- vendorID: \"15b3\"\n  network: a\n  allowSwitchdev: false\n", 4, // port 1 is legacy
			"# not offered: 0000:d8:00.0: PF ens8f0np0 runs its e-switch in switchdev mode"},
		"infiniband": {simhost.InfinibandHost(), "pfs:\n- pfName: ibp216s0f0\n  network: a\n", 0, "# not offered: 0000:d8:00.0: PF ibp216s0f0 is InfiniBand"},
		"vfio-pci takeover": {simhost.MixedHost(), "pfs:\n- pfName: enp59s0f0\n  network: a\n", 4,
			"# offered: 0000:3b:02.2: already bound to vfio-pci and /dev/vfio/27 is not held open by any process"},
		"no numa_node": {simhost.NoNUMAHost(), "pfs:\n- pfName: enp59s0f0\n  network: a\n", 4, ""},
		// pciaddr's domain rule: QEMU's vfio-pci opens no host device
		// beyond PCI domain ffff, so the PF behind Intel VMD offers none.
		"VMD domain": {simhost.VMDHost(), "pfs:\n- vendorID: \"8086\"\n  network: a\n", 4,
			"# not offered: " + simhost.VMDPFAddress + ": PF ens10f0: PCI domain 10000 is beyond ffff (Intel VMD numbers its domains from 10000): QEMU's vfio-pci cannot open such a host device"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			h := buildSim(t, tc.spec)
			out, stderr := inspect(t, h, hdr+tc.cfg)
			s := decodeSlices(t, out)
			got := 0
			for _, sl := range s {
				got += len(sl.Spec.Devices)
				for _, d := range sl.Spec.Devices {
					if _, ok := d.Attributes["resource.kubernetes.io/numaNode"]; ok && name == "no numa_node" {
						t.Errorf("%s has a numaNode attribute without a numa_node file", d.Name)
					}
				}
			}
			if got != tc.devices {
				t.Errorf("%d devices, want %d; stderr:\n%s", got, tc.devices, stderr)
			}
			if !strings.Contains(stderr, tc.want) {
				t.Errorf("stderr lacks %q:\n%s", tc.want, stderr)
			}
		})
	}
}

// A VF on vfio-pci whose group node a process holds open stays withheld,
// and inspect names the process.
func TestInspectVFIOHeld(t *testing.T) {
	t.Parallel()
	h := buildSim(t, simhost.MixedHost())
	release, err := h.HoldVFIOGroup("27", 4242, "qemu-kvm")
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	out, stderr := inspect(t, h, "apiVersion: vfnet.io/v1alpha1\nkind: NodeConfig\npfs:\n- pfName: enp59s0f0\n  network: a\n")
	if n := len(decodeSlices(t, out)[0].Spec.Devices); n != 3 ||
		!strings.Contains(stderr, "# not offered: 0000:3b:02.2: VF is bound to vfio-pci and in use: /dev/vfio/27 is held open by pid 4242 (qemu-kvm)") {
		t.Fatalf("%d devices; stderr:\n%s", n, stderr)
	}
}

// inspect run in the wrong network namespace (a pod without hostPID) says
// per PF that its netdev is not there and offers nothing; a namespace file
// that does not exist is an error naming it and the fix.
func TestInspectWrongNetns(t *testing.T) {
	t.Parallel()
	h := buildSim(t, simhost.E810Host())
	podNs, err := h.AddNetns("driver-pod")
	if err != nil {
		t.Fatal(err)
	}
	cfg := "apiVersion: vfnet.io/v1alpha1\nkind: NodeConfig\npfs:\n- pfName: enp59s0f0\n  network: a\n"
	stdout, stderr := inspect(t, h, cfg, "--simulate", "--host-netns", podNs)
	if s := decodeSlices(t, stdout); len(s) != 1 || len(s[0].Spec.Devices) != 0 {
		t.Fatalf("wrong namespace offers %d devices", len(s[0].Spec.Devices))
	}
	for _, want := range []string{
		"# not offered: 0000:3b:00.0: PF netdev enp59s0f0 not found in network namespace " + podNs + ":",
		"hostPID: true", "# none of the 1 selected PF netdevs is in network namespace " + podNs,
	} {
		if !strings.Contains(stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, stderr)
		}
	}
	// The simulated host's own namespace (the default, also spelt out)
	// offers them.
	for _, args := range [][]string{{"--simulate"}, {"--simulate", "--host-netns", "/proc/1/ns/net"}} {
		stdout, _ = inspect(t, h, cfg, args...)
		if s := decodeSlices(t, stdout); len(s[0].Spec.Devices) != 4 {
			t.Fatalf("%v: host namespace offers %d devices", args, len(s[0].Spec.Devices))
		}
	}
	missing := filepath.Join(t.TempDir(), "proc", "1", "ns", "net")
	for _, sim := range []string{"--simulate", "--simulate=false"} {
		var out, errOut bytes.Buffer
		code := app.Main([]string{"inspect", sim, "--sysfs-root", h.Root(), "--node-name", "n", "--host-netns", missing}, &out, &errOut, simulate.Open)
		if code != 1 || !strings.Contains(errOut.String(), "--host-netns: network namespace "+missing) || !strings.Contains(errOut.String(), "hostPID: true") {
			t.Errorf("%s, missing namespace: exit %d, stderr %s", sim, code, errOut.String())
		}
	}
}

// inspect says per numVFs PF what the driver would do: create, wait for a
// prepared VF's claim (and taint the VFs in the slices it prints), refuse
// with the fix; it changes nothing.
func TestInspectNumVFs(t *testing.T) {
	t.Parallel()
	h := buildSim(t, simhost.MixedHost())
	pluginDir := t.TempDir()
	cp := &checkpoint.File{Version: checkpoint.Version, Claims: map[types.UID]*checkpoint.Claim{
		"uid-1": {Namespace: "vms", Name: "vm-a", Phase: checkpoint.PhasePrepared, Devices: []checkpoint.Device{{BDF: "0000:3b:02.1", Device: "vf-0000-3b-02-1"}}},
	}}
	if err := (checkpoint.Store{Path: filepath.Join(pluginDir, checkpoint.FileName)}).Save(cp); err != nil {
		t.Fatal(err)
	}
	cfg := `apiVersion: vfnet.io/v1alpha1
kind: NodeConfig
pfs:
- pfName: enp59s0f0
  network: physnet-a
  numVFs: 2
- pfName: enp59s0f1
  network: physnet-b
  numVFs: 3
- pfName: enp1s0f0
  network: physnet-c
  numVFs: 8
- pfName: enp2s0
  network: physnet-d
  numVFs: 1
`
	stdout, stderr := inspect(t, h, cfg, "--plugin-dir", pluginDir)
	for _, want := range []string{
		"# numVFs: PF 0000:3b:00.0 (enp59s0f0): waiting to replace its 4 VFs by 2",
		"VF 1 (0000:3b:02.1) prepared for claim vms/vm-a",
		"# numVFs: PF 0000:3b:00.1 (enp59s0f1): create 3 VFs",
		"# numVFs: PF 0000:01:00.0 (enp1s0f0): not changing its VFs: ",
		"pfs[2].numVFs is 8, above the PF's sriov_totalvfs 7: set it to at most 7",
		"# numVFs: PF 0000:02:00.0 (enp2s0): not changing its VFs: ",
		"has no SR-IOV capability",
	} {
		if !strings.Contains(stderr, want) {
			t.Errorf("inspect stderr lacks %q:\n%s", want, stderr)
		}
	}
	tainted := map[string]string{}
	for _, s := range decodeSlices(t, stdout) {
		for _, d := range s.Spec.Devices {
			for _, tn := range d.Taints {
				if tn.Key == vfcount.TaintKey {
					tainted[d.Name] = tn.Value
				}
			}
		}
	}
	want := map[string]string{"vf-0000-3b-02-0": "recreating", "vf-0000-3b-02-1": "recreating", "vf-0000-3b-02-2": "removing", "vf-0000-3b-02-3": "removing"}
	if fmt.Sprint(tainted) != fmt.Sprint(want) {
		t.Errorf("count taints %v, want %v", tainted, want)
	}
	pfs, err := h.Sysfs().Discover(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, pf := range pfs {
		if pf.Address == "0000:3b:00.1" && pf.NumVFs != 0 {
			t.Errorf("inspect changed %s to %d VFs", pf.Address, pf.NumVFs)
		}
	}
}
