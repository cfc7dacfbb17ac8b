package compat

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vfnet-io/vfnet/test/kubevirt/internal/product"
)

// The two tests below are the evidence for vfnet's PCI domain rule
// (pkg/contract/pciaddr: no VF beyond domain ffff is offered): libvirt 11.3
// takes a hostdev source in a domain an Intel VMD controller creates
// (10000 and up) and hands it to QEMU as vfio-pci's "host", and QEMU 10
// refuses that value, so no VM could start with such a VF.

// vmdHostdevDomain is a domain with one unmanaged VFIO hostdev at
// %s (a libvirt domain attribute, e.g. 0x10000), named %s.
const vmdHostdevDomain = `<domain type='qemu'>
  <name>%s</name>
  <memory unit='MiB'>64</memory>
  <vcpu>1</vcpu>
  <os><type arch='x86_64' machine='q35'>hvm</type></os>
  <devices>
    <hostdev mode='subsystem' type='pci' managed='no'>
      <source><address domain='%s' bus='0x3b' slot='0x02' function='0x1'/></source>
      <alias name='ua-sriov-physnet-a'/>
    </hostdev>
  </devices>
</domain>
`

// virtTools returns the unpacked libvirt and QEMU environments, or ends the
// test (fails under make test-kubevirt, skips otherwise).
func virtTools(t *testing.T) (virt, kernel map[string]string) {
	t.Helper()
	skip := t.Skipf
	if os.Getenv("VFNET_REQUIRE_LIBVIRT") == "1" {
		skip = t.Fatalf
	}
	cache := os.Getenv("VFNET_CACHE")
	if cache == "" {
		repo, err := product.RepoRoot()
		if err != nil {
			t.Fatal(err)
		}
		cache = filepath.Join(repo, ".cache")
	}
	virt, err := readEnvFile(filepath.Join(cache, "virt", "env"))
	if err != nil {
		skip("no libvirt 11.3 unpacked (%v): run hack/virt-deps.sh", err)
	}
	kernel, err = readEnvFile(filepath.Join(cache, "kernel", "env"))
	if err != nil || kernel["QEMU"] == "" {
		skip("no QEMU unpacked (%v): run hack/kernel-deps.sh", err)
	}
	return virt, kernel
}

// QEMU's vfio-pci "host" property (hw/core/qdev-properties-system.c,
// set_pci_host_devaddr) takes a domain of at most ffff: the value libvirt
// passes for a VF at 10000:3b:02.1 is refused while QEMU parses its
// arguments; one at ffff:3b:02.1 parses and only fails to find the device.
func TestQEMUVFIOHostTakesNoDomainBeyondFFFF(t *testing.T) {
	t.Parallel()
	_, kernel := virtTools(t)
	for host, want := range map[string]string{
		"ffff:3b:02.1":  "vfio /sys/bus/pci/devices/ffff:3b:02.1: no such host device",
		"10000:3b:02.1": "Property 'vfio-pci.host' doesn't take value '10000:3b:02.1'",
	} {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		// The -device argument exactly as libvirt 11.3 writes it (see
		// TestLibvirtPassesVMDDomainToQEMU).
		cmd := exec.CommandContext(ctx, kernel["QEMU"], "-M", "q35,accel=tcg", "-nodefaults", "-display", "none", "-S",
			"-device", fmt.Sprintf(`{"driver":"vfio-pci","host":"%s","id":"ua-sriov-physnet-a"}`, host))
		cmd.Env = append(os.Environ(), "LD_LIBRARY_PATH="+kernel["QEMU_LD_LIBRARY_PATH"])
		for _, d := range strings.Split(kernel["QEMU_DATA"], ":") {
			cmd.Args = append(cmd.Args, "-L", d)
		}
		out, err := cmd.CombinedOutput()
		cancel()
		if err == nil || !strings.Contains(string(out), want) {
			t.Errorf("QEMU with vfio-pci host=%s: %v\n%s\nwant it to say %q", host, err, out, want)
		}
	}
}

// libvirt 11.3 defines a domain whose hostdev source is in PCI domain 10000
// (its schema's pciDomain is a uint32 and virPCIDeviceAddressIsValid checks
// no domain), keeps the address, and writes it as vfio-pci's "host" on
// QEMU's command line (virsh domxml-to-native).
func TestLibvirtPassesVMDDomainToQEMU(t *testing.T) {
	virt, kernel := virtTools(t)
	needRoot(t, "libvirtd runs as uid 107 in a private mount namespace (unshare -m)")
	tmp, err := os.MkdirTemp("", "vfvmd") // short: the socket path must fit sun_path
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(tmp) })
	for _, d := range []string{"xdg", "home", "dev"} {
		if err := os.MkdirAll(filepath.Join(tmp, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range []string{"", "xdg", "home"} {
		if err := os.Chown(filepath.Join(tmp, d), launcherUID, launcherUID); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(filepath.Join(tmp, "xdg"), 0o700); err != nil {
		t.Fatal(err)
	}
	writeLauncherAccounts(t, tmp)
	if err := os.WriteFile(filepath.Join(tmp, "vmd.xml"), fmt.Appendf(nil, vmdHostdevDomain, "vmd-hostdev", "0x10000"), 0o644); err != nil {
		t.Fatal(err)
	}
	// The session daemon only needs to see VFIO support (a non-empty
	// kernel/iommu_groups and /dev/vfio/vfio) to build the command line;
	// nothing is opened, so empty files do.
	const script = `set -eu
mount --make-rprivate /
mount --bind "$T/passwd" /etc/passwd
mount --bind "$T/group" /etc/group
mount -t tmpfs tmpfs /sys/kernel/iommu_groups
mkdir /sys/kernel/iommu_groups/7
mount -t tmpfs -o mode=0755 tmpfs "$T/dev"
for n in null zero full random urandom tty; do : >"$T/dev/$n"; mount --bind "/dev/$n" "$T/dev/$n"; done
mkdir "$T/dev/pts" "$T/dev/vfio"
mount --bind /dev/pts "$T/dev/pts"
ln -s pts/ptmx "$T/dev/ptmx"
: >"$T/dev/vfio/vfio"; : >"$T/dev/vfio/7"
mount --move "$T/dev" /dev
as107="setpriv --reuid 107 --regid 107 --clear-groups"
$as107 "$LIBVIRTD" >"$T/libvirtd.log" 2>&1 &
libvirtd=$!
trap 'kill $libvirtd 2>/dev/null || true; wait $libvirtd 2>/dev/null || true' EXIT
for i in $(seq 150); do [ -S "$XDG_RUNTIME_DIR/libvirt/libvirt-sock" ] && break; sleep 0.2; done
virsh="$as107 $VIRSH -c qemu:///session"
$virsh define "$T/vmd.xml"
echo "=== dumpxml"
$virsh dumpxml vmd-hostdev
echo "=== argv"
$virsh domxml-to-native qemu-argv --domain vmd-hostdev
`
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "unshare", "-m", "bash", "-c", script)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.Env = append(sessionDaemonEnv(tmp, virt, kernel),
		"VIRSH="+filepath.Join(virt["VIRT_ROOT"], "usr/bin/virsh"))
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		log, _ := os.ReadFile(filepath.Join(tmp, "libvirtd.log"))
		t.Fatalf("define and domxml-to-native: %v\n%s\nlibvirtd.log:\n%s", err, out.String(), log)
	}
	for _, want := range []string{
		"Domain 'vmd-hostdev' defined",
		`<address domain='0x10000' bus='0x3b' slot='0x02' function='0x1'/>`,
		`"driver":"vfio-pci","host":"10000:3b:02.1"`,
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}
