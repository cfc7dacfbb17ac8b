package compat

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "kubevirt.io/api/core/v1"

	"github.com/vfnet-io/vfnet/test/kubevirt/internal/drameta"
	"github.com/vfnet-io/vfnet/test/kubevirt/internal/guestvmi"
	"github.com/vfnet-io/vfnet/test/kubevirt/internal/pcieports"
	"github.com/vfnet-io/vfnet/test/kubevirt/internal/product"
	"github.com/vfnet-io/vfnet/test/kubevirt/internal/vmirender"
	"github.com/vfnet-io/vfnet/test/kubevirt/internal/xmltree"
	"github.com/vfnet-io/vfnet/test/kubevirt/internal/xmlvalidate"
)

// launcherUID is KubeVirt's non-root launcher user (qemu, 107).
const launcherUID = 107

// kernelLauncherScript runs, in the private mount namespace unshare(1) gave
// it, what the real-kernel guest runs: /run is a fresh tmpfs with the
// launcher pod's directories bind-mounted from the test's temp dir, a passwd
// with uid 107 (libvirtd's virGetUserEnt refuses a uid without an entry) is
// bind-mounted over /etc/passwd in this namespace only, then libvirtd
// (session mode), vfnet-binding and kernellauncher run as uid 107. The two
// daemons are stopped by PID when the launcher exits.
const kernelLauncherScript = `set -eu
mount --make-rprivate /
mount -t tmpfs -o mode=0755 tmpfs /run
# The launcher pod's /dev as its container runtime makes it (a tmpfs with
# the default nodes), plus what KubeVirt's device plugins give it: under
# useEmulation virt-controller requests no kvm (KVM=none); KVM=unusable adds
# a node uid 107 cannot open (root 0600), the shape of a node's own /dev/kvm
# where KVM is root-only or absent (then the node opens with ENXIO).
mount -t tmpfs -o mode=0755,nosuid tmpfs "$T/dev"
for n in null zero full random urandom tty; do : >"$T/dev/$n"; mount --bind "/dev/$n" "$T/dev/$n"; done
mkdir "$T/dev/pts" "$T/dev/shm"
mount --bind /dev/pts "$T/dev/pts"
mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs "$T/dev/shm"
ln -s pts/ptmx "$T/dev/ptmx"
ln -s /proc/self/fd "$T/dev/fd"
case "$KVM" in
none) ;;
unusable) mknod -m 0600 "$T/dev/kvm" c 10 232 ;;
*) echo "KVM=$KVM: want none or unusable" >&2; exit 2 ;;
esac
mount --move "$T/dev" /dev
mount --bind "$T/passwd" /etc/passwd
mount --bind "$T/group" /etc/group
for p in kubevirt-private:private kubevirt-hooks:hooks kubevirt:kubevirt kubevirt-kernel-boot:kb kubernetes.io/dra-device-attributes:meta; do
  mkdir -p "/run/${p%%:*}"
  mount --bind "$T/${p##*:}" "/run/${p%%:*}"
done
as107="setpriv --reuid 107 --regid 107 --clear-groups"
$as107 "$LIBVIRTD" >"$T/libvirtd.log" 2>&1 &
libvirtd=$!
NETWORK_BINDING_PLUGIN_NAME=vfnet $as107 "$BINDING" --socket-dir /var/run/kubevirt-hooks/hook-sidecar-0 \
  --metadata-root /var/run/kubernetes.io/dra-device-attributes >"$T/binding.log" 2>&1 &
binding=$!
trap 'kill $libvirtd $binding 2>/dev/null || true; wait $libvirtd $binding 2>/dev/null || true' EXIT
for i in $(seq 150); do [ -S "$XDG_RUNTIME_DIR/libvirt/libvirt-sock" ] && break; sleep 0.2; done
rc=0
$as107 "$LAUNCHER" -vmi "$T/vmi.json" \
  -libvirt-socket "$XDG_RUNTIME_DIR/libvirt/libvirt-sock" -hook-timeout 1m -out "$T/kubevirt/domain.xml" "$@" || rc=$?
exit $rc
`

// readEnvFile reads KEY=VALUE lines (values are not shell-quoted).
func readEnvFile(path string) (map[string]string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	env := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), "="); ok {
			env[k] = v
		}
	}
	return env, sc.Err()
}

// TestKernelLauncherDefinesVFOnFreeRootPort runs cmd/kernellauncher against
// a real libvirtd 11.3 (session mode, uid 107, QEMU 10 for its capability
// probe) with the real vfnet-binding, up to the last define: a domain with
// a VFIO hostdev cannot start on a host without VFIO. It checks what issue
// 21 asks of virt-launcher v1.9.0's defined domain: the sidecar's VF hostdev
// sits on a pcie-root-port, and root ports are left free for hotplug (at
// least KubeVirt's own hotplugMinRequiredFreePorts, 3), so a re-attached VF
// finds one.
func TestKernelLauncherDefinesVFOnFreeRootPort(t *testing.T) {
	bin := needBinding(t)
	// make test-kubevirt prepares libvirt and QEMU first and sets this:
	// then a missing piece fails the test instead of skipping it.
	skip := t.Skipf
	if os.Getenv("VFNET_REQUIRE_LIBVIRT") == "1" {
		skip = t.Fatalf
	}
	needRoot(t, "libvirtd, the sidecar and the launcher run as uid 107 in a private mount namespace (unshare -m)")
	root, err := product.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	virtEnv, kernelEnv := virtTools(t)
	for _, tool := range []string{"unshare", "setpriv", "mount"} {
		if _, err := exec.LookPath(tool); err != nil {
			skip("needs %s (util-linux): %v", tool, err)
		}
	}

	// A short path: the libvirt socket path must fit sun_path.
	tmp, err := os.MkdirTemp("", "vfkl")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(tmp) })
	if err := os.Chmod(tmp, 0o755); err != nil {
		t.Fatal(err)
	}
	launcher := filepath.Join(tmp, "kernellauncher")
	build := exec.Command("go", "build", "-trimpath", "-o", launcher, "./cmd/kernellauncher")
	build.Dir, build.Env = filepath.Join(root, "test", "kubevirt"), append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build cmd/kernellauncher: %v\n%s", err, out)
	}

	const bdf = "0000:3b:02.1"
	claim := drameta.Claim{
		Namespace: "default", Name: "vm-physnet-a-vf-x7k2p", UID: "5f0c1a7e-0000-4000-8000-00000000000a",
		PodClaimName: "vf", Request: "vf",
		Devices: []drameta.Device{{Pool: "node-a", Name: "vf-0000-3b-02-1", PCIBusID: bdf, MAC: "02:00:00:00:00:01"}},
	}
	if _, err := claim.Write(filepath.Join(tmp, "meta")); err != nil {
		t.Fatal(err)
	}
	// The VMI, rendered as the real-kernel tier renders it on its host.
	vmi, err := vmirender.Render(vmirender.Options{
		VMFile:       filepath.Join(root, "manifests", "examples", "vm.yaml"),
		KubeVirtFile: filepath.Join(root, "manifests", "kubevirt", "binding-patch.yaml"),
		UID:          "0b5e6a3c-0000-4000-8000-000000000001", KernelImage: "quay.io/vfnet-io/test-kernel:guest",
		KernelPath: "/boot/vmlinuz", InitrdPath: "/boot/initrd.img", KernelArgs: "console=ttyS0", Memory: "256Mi",
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := guestvmi.Write(filepath.Join(tmp, "vmi.json"), vmi); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"private", "hooks/hook-sidecar-0", "kubevirt", "kb/boot", "xdg", "home", "dev"} {
		if err := os.MkdirAll(filepath.Join(tmp, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// Kernel boot artifacts at the kernel-boot volume view paths; define
	// only needs them to exist.
	for _, f := range []string{"kb/boot/vmlinuz", "kb/boot/initrd.img"} {
		if err := os.WriteFile(filepath.Join(tmp, f), []byte("not booted: define only\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range []string{"private", "hooks", "hooks/hook-sidecar-0", "kubevirt", "xdg", "home"} {
		if err := os.Chown(filepath.Join(tmp, d), launcherUID, launcherUID); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(filepath.Join(tmp, "xdg"), 0o700); err != nil {
		t.Fatal(err)
	}
	writeLauncherAccounts(t, tmp)

	env := append(sessionDaemonEnv(tmp, virtEnv, kernelEnv),
		"REPO="+root, "LAUNCHER="+launcher, "BINDING="+bin)
	// v1.9.0's allocateHotplugPorts, then main's (-v110, PR 17605), in a
	// launcher pod without /dev/kvm (useEmulation). Then v1.9.0 where the
	// pod's /dev has a kvm node uid 107 cannot open, as the host's own
	// node is on many machines: the launcher must still emulate, or the
	// uid-107 libvirtd refuses the domain ("does not support virt type
	// 'kvm'").
	for _, v := range []struct {
		name, kvm, why string
		extra          []string
	}{
		{"v1.9.0", "none", `"/dev/kvm absent: emulation"`, nil},
		{"main", "none", `"/dev/kvm absent: emulation"`, []string{"-v110"}},
		{"v1.9.0-unusable-kvm-node", "unusable", `"/dev/kvm not usable by uid 107 (`, nil},
	} {
		t.Run(v.name, func(t *testing.T) {
			env := append(env[:len(env):len(env)], "KVM="+v.kvm)
			output := runKernelLauncher(t, tmp, env, bdf, filepath.Join("/var/run/kubevirt", "domain-"+v.name+".xml"), filepath.Join(tmp, "kubevirt", "domain-"+v.name+".xml"), v.extra...)
			if !strings.Contains(output, "hypervisor-device="+v.why) {
				t.Errorf("the convert step does not say hypervisor-device=%s", v.why)
			}
		})
	}
	// Main's step where it takes effect: a root port's bus from its index,
	// libvirt's rule, instead of the busNr libvirt never writes (the "main"
	// case: nothing switched off). The step sees the VF's guest address
	// the two ways KubeVirt's code has it: libvirt's read-back after a
	// define without placeholders (d021b4c56e; the slot-count annotation
	// leaves none), and the interface's pciAddress, which vfnet-binding
	// writes on every define. Either way the step switches the VF's port
	// off and vfnet-binding must turn it back; then two started twins of
	// the domain take the migration's detach by alias and the re-attach.
	if err := writeQEMUConf(tmp); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		mod  func(*v1.VirtualMachineInstance)
		bus  int // the VF's guest bus when the VMI fixes it
	}{
		{"main-bus-known-no-placeholders", func(vmi *v1.VirtualMachineInstance) {
			if vmi.Annotations == nil {
				vmi.Annotations = map[string]string{}
			}
			vmi.Annotations[v1.PciInterfaceSlotCountAnnotation] = "1"
		}, -1},
		{"main-bus-known-pciAddress", func(vmi *v1.VirtualMachineInstance) {
			for i, iface := range vmi.Spec.Domain.Devices.Interfaces {
				if iface.Name == "physnet-a" {
					vmi.Spec.Domain.Devices.Interfaces[i].PciAddress = "0000:02:00.0"
				}
			}
		}, 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := vmi
			f.VMI = vmi.VMI.DeepCopy()
			c.mod(f.VMI)
			vmiFile := filepath.Join(tmp, "vmi-"+c.name+".json")
			if err := guestvmi.Write(vmiFile, f); err != nil {
				t.Fatal(err)
			}
			hostOut := filepath.Join(tmp, "kubevirt", "domain-"+c.name+".xml")
			output := runKernelLauncher(t, tmp, append(env[:len(env):len(env)], "KVM=none"), bdf, filepath.Join("/var/run/kubevirt", "domain-"+c.name+".xml"), hostOut,
				"-vmi", vmiFile, "-v110", "-v110-root-port-bus", "index", "-hotplug-check", "-firmware-dirs", kernelEnv["QEMU_DATA"])
			s := parseV110(t, output)
			if s.busKey != "index" || s.vfBus < 0 || !slices.Contains(s.off, s.vfBus) {
				t.Fatalf("the step (bus-key=%s) switched off %v, not the VF's port %d: this case no longer tests what it is for", s.busKey, s.off, s.vfBus)
			}
			if slices.Contains(s.offAfterHooks, s.vfBus) {
				t.Errorf("vfnet-binding left hotplug='off' on the VF's port %d", s.vfBus)
			}
			for _, p := range s.off {
				if p != s.vfBus && !slices.Contains(s.offAfterHooks, p) {
					t.Errorf("vfnet-binding turned hot-plug back on for port %d, which is not the VF's", p)
				}
			}
			defined, err := os.ReadFile(hostOut + ".defined")
			if err != nil {
				t.Fatal(err)
			}
			rep, err := pcieports.Analyze(defined)
			if err != nil {
				t.Fatal(err)
			}
			if c.bus >= 0 && (s.vfBus != c.bus || rep.Hostdevs["ua-sriov-physnet-a"] != c.bus) {
				t.Errorf("the VF is on bus %d (the step saw %d), want its pciAddress's %d", rep.Hostdevs["ua-sriov-physnet-a"], s.vfBus, c.bus)
			}
			m := regexp.MustCompile(`(?m)^VFNET-LAUNCHER step hotplug-check \S+ alias=ua-sriov-physnet-a vf-bus=(\d+) detach=(.*) reattach=(.*) reattach-bus=(-?\d+)$`).FindStringSubmatch(output)
			if m == nil {
				t.Fatalf("no hotplug-check step line")
			}
			if m[2] != "accepted" || m[3] != "accepted" {
				t.Errorf("on the started twins, libvirt answered the VF's detach by alias with %q and its re-attach with %q; both must be accepted", m[2], m[3])
			}
			bus, _ := strconv.Atoi(m[4])
			port, ok := rep.Port(bus)
			switch {
			case !ok:
				t.Errorf("the re-attached NIC is on bus %d, no pcie-root-port", bus)
			case port.Hotplug == "off":
				t.Errorf("the re-attached NIC is on root port %d, which is hotplug='off'", bus)
			case c.bus >= 0 && bus != c.bus:
				t.Errorf("the re-attached NIC is on bus %d, want its pciAddress's %d", bus, c.bus)
			}
		})
	}
	// The migration target's preparation: the hooks run on the converted
	// domain and nothing is defined.
	t.Run("migration-target", func(t *testing.T) {
		output := execKernelLauncher(t, tmp, append(env[:len(env):len(env)], "KVM=none"), "-migration-target")
		for _, want := range []string{"step hook-collect ", "step target-hooks "} {
			if !strings.Contains(output, want) {
				t.Errorf("output lacks %q", want)
			}
		}
		if strings.Contains(output, "step define-") || strings.Contains(output, "step libvirt-connect ") {
			t.Errorf("-migration-target defined a domain or dialled libvirt")
		}
	})
	// A claim asking for failover: libvirt 11.3 (QEMU 10's capabilities)
	// accepts the sidecar's standby interface with <teaming>, keeps it in
	// the defined domain, and the MIGRATABLE XML after v1.9.0
	// migratableDomXML's libvirtxml round trip still carries all of it, so
	// the target defines the same pair. Define only: the standby's tap
	// does not exist here (the node plumbing that creates it is not built).
	t.Run("failover-migratable", func(t *testing.T) {
		fo := claim
		fo.Devices = slices.Clone(claim.Devices)
		fo.Devices[0].Failover = true
		if _, err := fo.Write(filepath.Join(tmp, "meta")); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if _, err := claim.Write(filepath.Join(tmp, "meta")); err != nil {
				t.Error(err)
			}
		})
		const name = "domain-failover"
		output := execKernelLauncher(t, tmp, append(env[:len(env):len(env)], "KVM=none"), "-define-only", "-cleanup",
			"-out", filepath.Join("/var/run/kubevirt", name+".xml"), "-migratable-out", filepath.Join("/var/run/kubevirt", name+".migratable.xml"))
		if !strings.Contains(output, "VFNET-LAUNCHER step write-migratable ") {
			t.Fatalf("no write-migratable step")
		}
		defined, err := os.ReadFile(filepath.Join(tmp, "kubevirt", name+".xml.defined"))
		if err != nil {
			t.Fatal(err)
		}
		migratable, err := os.ReadFile(filepath.Join(tmp, "kubevirt", name+".migratable.xml"))
		if err != nil {
			t.Fatal(err)
		}
		const alias = standbyAliasPrefix + "physnet-a"
		d, ok := standbyInterfaces(t, string(defined))[alias]
		if !ok {
			t.Fatalf("libvirt's defined domain has no %s", alias)
		}
		want := describeStandby(d)
		for _, part := range []string{"type=ethernet ", "mac=02:00:00:00:00:01 ", "target=vfsb", "managed=no ", "model=virtio ", "teaming=persistent ", "rom=no"} {
			if !strings.Contains(want, part) {
				t.Errorf("defined %s: %s lacks %s", alias, want, part)
			}
		}
		m, ok := standbyInterfaces(t, string(migratable))[alias]
		if !ok {
			t.Fatalf("the migratable XML after the round trip has no %s", alias)
		}
		if got := describeStandby(m); got != want {
			t.Errorf("%s in the migratable XML:\n %s\nwant (defined)\n %s", alias, got, want)
		}
		// Both pass the RelaxNG schema of the libvirt that defined them
		// (11.3): the host's virt-xml-validate (libvirt 9.0 on Debian 12)
		// predates <topology clusters=...> that 11.3 writes into <cpu>.
		rng := filepath.Join(virtEnv["VIRT_ROOT"], "usr/share/libvirt/schemas/domain.rng")
		for _, doc := range []struct {
			name string
			data []byte
		}{{"defined", defined}, {"migratable", migratable}} {
			f := filepath.Join(t.TempDir(), doc.name+".xml")
			if err := os.WriteFile(f, xmlvalidate.StripKubeVirtEmpties(doc.data), 0o644); err != nil {
				t.Fatal(err)
			}
			if out, err := exec.Command("xmllint", "--noout", "--relaxng", rng, f).CombinedOutput(); err != nil {
				t.Errorf("the %s domain fails libvirt 11.3's schema %s: %v\n%s", doc.name, rng, err, out)
			}
		}
	})
}

// execKernelLauncher runs the script with the launcher's flags and returns
// its output; the launcher must end with OK.
func execKernelLauncher(t *testing.T, tmp string, env []string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "unshare", append([]string{"-m", "bash", "-c", kernelLauncherScript, "kernellauncher"}, args...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	// On timeout, end the process group this test started (unshare, the
	// script and the daemons it started).
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.Env = env
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	runErr := cmd.Run()
	t.Logf("launcher output:\n%s", stdout.String())
	if runErr != nil || !strings.Contains(stdout.String(), "VFNET-LAUNCHER OK\n") {
		libvirtLog, _ := os.ReadFile(filepath.Join(tmp, "libvirtd.log"))
		bindingLog, _ := os.ReadFile(filepath.Join(tmp, "binding.log"))
		t.Fatalf("kernellauncher: %v\nstderr:\n%s\nlibvirtd.log:\n%s\nbinding.log:\n%s", runErr, stderr.String(), libvirtLog, bindingLog)
	}
	return stdout.String()
}

// runKernelLauncher runs the launcher with its extra flags, writing
// the domain to out (the launcher's view) = hostOut (the test's), and checks
// the defined domain.
func runKernelLauncher(t *testing.T, tmp string, env []string, bdf, out, hostOut string, extra ...string) string {
	output := execKernelLauncher(t, tmp, env, append([]string{"-define-only", "-cleanup", "-out", out}, extra...)...)
	steps := map[string]bool{}
	stepRE := regexp.MustCompile(`(?m)^VFNET-LAUNCHER step (\S+) (\S+)`)
	for _, m := range stepRE.FindAllStringSubmatch(output, -1) {
		if _, err := time.ParseDuration(m[2]); err != nil {
			t.Errorf("step %s: duration %q: %v", m[1], m[2], err)
		}
		steps[m[1]] = true
	}
	// v1.9.0 with one binding interface: 3 placeholders, then the domain
	// without them, then the extra root ports: three defines, each through
	// the hooks. A slot-count annotation that leaves no placeholder drops
	// the first.
	defines := 3
	if strings.Contains(output, "VFNET-LAUNCHER hotplug placeholders=0 ") {
		defines = 2
	}
	want := []string{"vmi", "kernel-boot-links", "private-dir", "convert", "libvirt-connect", "hook-collect", "lookup",
		"allocate-hotplug-ports", "write-defined"}
	for i := 1; i <= defines; i++ {
		want = append(want, fmt.Sprintf("define-%d", i))
	}
	for _, s := range want {
		if !steps[s] {
			t.Errorf("no step line for %s", s)
		}
	}
	if steps[fmt.Sprintf("define-%d", defines+1)] || steps["start"] || steps["write-live"] {
		t.Errorf("more than %d defines, or a start with -define-only", defines)
	}
	for _, want := range []string{"change: containerDisk disk+volume containerdisk replaced by spec.domain.firmware.kernelBoot", "change: spec.domain.memory.guest 1Gi -> 256Mi"} {
		if !strings.Contains(output, want) {
			t.Errorf("output lacks %q", want)
		}
	}
	if n := strings.Count(output, "change: "); n != 2 {
		t.Errorf("%d change lines, want 2 (kernel boot, memory)", n)
	}

	defined, err := os.ReadFile(hostOut + ".defined")
	if err != nil {
		t.Fatal(err)
	}
	rep, err := pcieports.Analyze(defined)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("defined domain: %s", rep)
	bus, ok := rep.Hostdevs["ua-sriov-physnet-a"]
	if !ok {
		t.Fatalf("the defined domain has no hostdev ua-sriov-physnet-a: %s", rep)
	}
	port, ok := rep.Port(bus)
	if !ok {
		t.Fatalf("hostdev ua-sriov-physnet-a is on bus %d, which is no pcie-root-port: %s", bus, rep)
	}
	if len(port.Devices) != 1 {
		t.Errorf("root port %d holds %v, want only the VF", port.Index, port.Devices)
	}
	// KubeVirt's migration source detaches the VF by alias: its port must
	// stay hot-pluggable, under main's hotplug='off' step too.
	if port.Hotplug == "off" {
		t.Errorf("root port %d of the VF has hotplug='off': the migration detach would be refused", port.Index)
	}
	if free := rep.Free(); free < 3 {
		t.Errorf("%d free pcie-root-ports, want at least KubeVirt's hotplugMinRequiredFreePorts (3): %s", free, rep)
	}
	// The VF is the metadata's, as the sidecar resolved it.
	dom, err := xmltree.Parse(defined)
	if err != nil {
		t.Fatal(err)
	}
	hd := dom.Find(func(n *xmltree.Node) bool {
		a := n.Child("alias")
		return n.Name.Local == "hostdev" && a != nil && a.Attr("name") == "ua-sriov-physnet-a"
	})
	if len(hd) != 1 || hd[0].Child("source") == nil || hd[0].Child("source").Child("address") == nil {
		t.Fatalf("hostdev ua-sriov-physnet-a without source address")
	}
	src := hd[0].Child("source").Child("address")
	got := fmt.Sprintf("%04x:%02x:%02x.%x", hexAttr(t, src, "domain"), hexAttr(t, src, "bus"), hexAttr(t, src, "slot"), hexAttr(t, src, "function"))
	if got != bdf {
		t.Errorf("hostdev source %s, want the metadata's %s", got, bdf)
	}
	// No launcher pod here is given a usable /dev/kvm.
	if dom.Attr("type") != "qemu" {
		t.Errorf("domain type %q, want qemu (useEmulation, no usable /dev/kvm)", dom.Attr("type"))
	}
	if slices.Contains(extra, "-v110") {
		checkV110(t, output, rep)
	}
	return output
}

// v110Step is what -v110 printed: the step's decision and what the
// sidecars left of it.
type v110Step struct {
	busKey             string
	withBusNr          int
	sidecars           int
	off, offAfterHooks []int
	vfBus              int // the VF hostdev's guest bus in the spec the step saw, -1 for none
}

var (
	v110RE      = regexp.MustCompile(`(?m)^VFNET-LAUNCHER v110 bus-key=(\S+) root-ports=\d+ with-busNr=(\d+) hotplug-off=\[([\d ]*)\] vf-hostdev-guest-bus-in-spec=(\S+)$`)
	v110HooksRE = regexp.MustCompile(`(?m)^VFNET-LAUNCHER v110 hooks-returned sidecars=(\d+) hotplug-off=\[([\d ]*)\]$`)
)

// checkV110 checks main's hotplug='off' step (PR 17605) in a -v110 run:
// libvirt gave no root port a busNr, vfnet-binding saw the step's domain,
// and the defined domain has no root port that KubeVirt's migration would
// trip on: the VF's port hot-pluggable, and no free port switched off (a
// port the VF left would be lost to the re-attach: libvirt refuses a
// hot-plug there).
func checkV110(t *testing.T, output string, rep pcieports.Report) {
	t.Helper()
	s := parseV110(t, output)
	// libvirt refuses a busNr on a pcie-root-port and writes none back.
	if s.withBusNr != 0 {
		t.Errorf("with-busNr=%d: libvirt gave a pcie-root-port a busNr; PR 17605 as merged would now take effect: revisit vfnet's port handling", s.withBusNr)
	}
	if s.busKey == "busNr" && len(s.off) > 0 {
		t.Errorf("keyed on busNr without any, the step still switched off %v", s.off)
	}
	if s.sidecars != 1 {
		t.Errorf("the last define went to %d sidecars, want vfnet-binding", s.sidecars)
	}
	var offNow []int
	for _, p := range rep.Ports {
		if p.Hotplug != "off" {
			continue
		}
		offNow = append(offNow, p.Index)
		switch {
		case len(p.Devices) == 0:
			t.Errorf("root port %d is free and hotplug='off': lost to hot-plug (libvirt refuses a hot-plug there)", p.Index)
		case slices.ContainsFunc(p.Devices, func(d string) bool { return strings.HasPrefix(d, "hostdev/ua-sriov-") }):
			t.Errorf("root port %d holds %v and is hotplug='off': the migration's detach by alias would be refused", p.Index, p.Devices)
		}
	}
	if !slices.Equal(offNow, s.offAfterHooks) {
		t.Errorf("the defined domain has hotplug='off' on ports %v, the sidecars returned it on %v", offNow, s.offAfterHooks)
	}
}

// parseV110 reads the v110 lines of a -v110 run.
func parseV110(t *testing.T, output string) v110Step {
	t.Helper()
	ints := func(s string) []int {
		var out []int
		for _, f := range strings.Fields(s) {
			n, _ := strconv.Atoi(f)
			out = append(out, n)
		}
		return out
	}
	m, h := v110RE.FindStringSubmatch(output), v110HooksRE.FindStringSubmatch(output)
	if m == nil || h == nil {
		t.Fatalf("-v110 printed no v110 decision and hooks-returned lines")
	}
	s := v110Step{busKey: m[1], off: ints(m[3]), offAfterHooks: ints(h[2]), vfBus: -1}
	s.withBusNr, _ = strconv.Atoi(m[2])
	s.sidecars, _ = strconv.Atoi(h[1])
	if m[4] != "none" {
		b, err := strconv.ParseInt(m[4], 0, 32)
		if err != nil {
			t.Fatalf("vf-hostdev-guest-bus-in-spec=%q: %v", m[4], err)
		}
		s.vfBus = int(b)
	}
	return s
}

func hexAttr(t *testing.T, n *xmltree.Node, name string) int64 {
	t.Helper()
	v, err := strconv.ParseInt(n.Attr(name), 0, 32)
	if err != nil {
		t.Fatalf("address %s=%q: %v", name, n.Attr(name), err)
	}
	return v
}

// writeQEMUConf gives the session libvirtd a qemu.conf that logs QEMU's
// output to a file: its default, virtlogd, is looked for at /usr/sbin, and
// here it is unpacked under the cache. Only a start needs it.
func writeQEMUConf(tmp string) error {
	dir := filepath.Join(tmp, "home", ".config", "libvirt")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "qemu.conf"), []byte("stdio_handler = \"file\"\n"), 0o644); err != nil {
		return err
	}
	for _, d := range []string{filepath.Join(tmp, "home", ".config"), dir} {
		if err := os.Chown(d, launcherUID, launcherUID); err != nil {
			return err
		}
	}
	return nil
}

// writeLauncherAccounts writes passwd and group files into tmp: the host's
// entries plus the launcher's qemu user (uid and gid 107, home tmp/home), as
// a launcher image has them, for the mount namespace the test runs in.
func writeLauncherAccounts(t *testing.T, tmp string) {
	t.Helper()
	for file, line := range map[string]string{
		"passwd": fmt.Sprintf("qemu:x:%d:%d:qemu:%s:/usr/sbin/nologin\n", launcherUID, launcherUID, filepath.Join(tmp, "home")),
		"group":  fmt.Sprintf("qemu:x:%d:\n", launcherUID),
	} {
		host, err := os.ReadFile(filepath.Join("/etc", file))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(tmp, file), append(host, line...), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// sessionDaemonEnv is the environment of a script that runs the tier's
// libvirtd (virt: virt-deps' env, kernel: kernel-deps') as the launcher's
// session daemon, with its runtime, config, cache and home under tmp ($T).
func sessionDaemonEnv(tmp string, virt, kernel map[string]string) []string {
	return append(os.Environ(),
		"T="+tmp,
		"LIBVIRTD="+filepath.Join(virt["VIRT_ROOT"], "usr/sbin/libvirtd"),
		"LIBVIRT_DRIVER_DIR="+filepath.Join(virt["VIRT_ROOT"], "usr/lib/x86_64-linux-gnu/libvirt/connection-driver"),
		"LD_LIBRARY_PATH="+virt["VIRT_LIBS"]+":"+kernel["QEMU_LD_LIBRARY_PATH"],
		"PATH="+filepath.Dir(kernel["QEMU"])+":"+os.Getenv("PATH"),
		"XDG_RUNTIME_DIR="+filepath.Join(tmp, "xdg"),
		"XDG_CONFIG_HOME="+filepath.Join(tmp, "home/.config"),
		"XDG_CACHE_HOME="+filepath.Join(tmp, "home/.cache"),
		"HOME="+filepath.Join(tmp, "home"),
	)
}
