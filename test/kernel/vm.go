package kernel

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/vfnet-io/vfnet/test/kernel/layout"
	"github.com/vfnet-io/vfnet/test/lib/sharedlibs"
)

// Env is what hack/kernel-deps.sh prepared ($VFNET_CACHE/kernel/env).
type Env struct {
	Dir           string
	KernelRelease string
	Vmlinux       string
	Modules       string
	QEMU          string
	QEMUVersion   string
	QEMULibPath   string
	QEMUData      []string
	Busybox       string
	IP            string
	GuestLibs     []string
}

// LoadEnv reads dir/env, the file kernel-deps.sh writes last.
func LoadEnv(dir string) (*Env, error) {
	data, err := os.ReadFile(filepath.Join(dir, "env"))
	if err != nil {
		return nil, fmt.Errorf("read what hack/kernel-deps.sh prepared: %w", err)
	}
	kv := map[string]string{}
	for _, l := range strings.Split(string(data), "\n") {
		if k, v, ok := strings.Cut(l, "="); ok {
			kv[k] = v
		}
	}
	e := &Env{
		Dir: dir, KernelRelease: kv["KERNEL_RELEASE"], Vmlinux: kv["VMLINUX"], Modules: kv["MODULES"],
		QEMU: kv["QEMU"], QEMUVersion: kv["QEMU_VERSION"], QEMULibPath: kv["QEMU_LD_LIBRARY_PATH"],
		QEMUData: filepath.SplitList(kv["QEMU_DATA"]), Busybox: kv["BUSYBOX"], IP: kv["IP"],
		GuestLibs: filepath.SplitList(kv["GUEST_LIBS"]),
	}
	for name, p := range map[string]string{"VMLINUX": e.Vmlinux, "MODULES": e.Modules, "QEMU": e.QEMU, "BUSYBOX": e.Busybox, "IP": e.IP} {
		if p == "" {
			return nil, fmt.Errorf("%s/env has no %s: rerun hack/kernel-deps.sh", dir, name)
		}
		if _, err := os.Stat(p); err != nil {
			return nil, fmt.Errorf("%s (%s in %s/env) is missing: remove %s/ready and rerun hack/kernel-deps.sh", p, name, dir, dir)
		}
	}
	return e, nil
}

// GuestModules are the kernel modules the guest loads (with what they need).
func GuestModules() []string {
	return []string{"vfio", "vfio_iommu_type1", "vfio_pci", "igb", "igbvf", "virtio_pci", "virtio_net"}
}

// WireModules are the modules the wire and failover cases load themselves
// (with what they need): bridges, VLAN devices, veth pairs, macvlan, tun
// for the failover standby's tap, and xfrm_user and nfnetlink, without
// which driver/standby's netlink handles fail (vishvananda/netlink's
// NewHandleAt opens the route, xfrm and netfilter families, and the
// guest has no modprobe to load them on demand). Only a machine with the
// wire carries them, so the other cases' boot is unchanged.
func WireModules() []string {
	return []string{"bridge", "8021q", "veth", "macvlan", "tun", "xfrm_user", "nfnetlink"}
}

// Image is what goes into the guest's initramfs besides the system files.
type Image struct {
	// Init is the guest's /init: the static case binary (go test -c).
	Init string
	// Driver is the static vfnet-driver binary.
	Driver string
	Layout layout.Layout
	// Kubeconfig, when set, is copied to layout.Kubeconfig.
	Kubeconfig string
	// Virt, when set, adds libvirt, QEMU and the VM's files (the vm case).
	Virt *VirtImage
	// Wire adds WireModules (the wire case).
	Wire bool
	// Node, when set, adds the kubelet case's node and NodeModules.
	Node *NodeImage
}

// VirtImage is what the vm case runs inside the guest: libvirt and QEMU at
// the paths their packages install them to (libvirt looks for its driver
// modules, CPU map and helpers there, QEMU for its firmware), and the VM.
type VirtImage struct {
	// Root is where hack/virt-deps.sh unpacked libvirt.
	Root string
	// Libs are the library directories of Root.
	Libs []string
	// Version is `libvirtd --version` (hack/virt-deps.sh checks it is
	// 11.x), for the tier's log: the archive decides the minor.
	Version string
	// Binding is the static vfnet-binding; Launcher test/kubevirt's
	// kernellauncher; VMI the example VM's VMI that test/kubevirt's
	// vmirender wrote.
	Binding, Launcher, VMI string
	// InnerInitrd is the VM's own initramfs (BuildInnerInitramfs); the
	// VM's kernel is the guest's.
	InnerInitrd string
}

// LoadVirt reads dir/env, the file hack/virt-deps.sh writes last.
func LoadVirt(dir string) (*VirtImage, error) {
	data, err := os.ReadFile(filepath.Join(dir, "env"))
	if err != nil {
		return nil, fmt.Errorf("read what hack/virt-deps.sh prepared: %w", err)
	}
	v := &VirtImage{}
	for _, l := range strings.Split(string(data), "\n") {
		if k, val, ok := strings.Cut(l, "="); ok {
			switch k {
			case "VIRT_ROOT":
				v.Root = val
			case "VIRT_LIBS":
				v.Libs = filepath.SplitList(val)
			case "LIBVIRT_VERSION":
				v.Version = val
			}
		}
	}
	if v.Root == "" {
		return nil, fmt.Errorf("%s/env has no VIRT_ROOT: rerun hack/virt-deps.sh", dir)
	}
	return v, nil
}

// virtPrograms are the libvirt files the guest runs or loads, by their
// installed path (relative to VirtImage.Root).
var virtPrograms = []string{
	"usr/sbin/libvirtd", "usr/sbin/virtlogd", "usr/bin/virsh",
	"usr/lib/x86_64-linux-gnu/libvirt/connection-driver/libvirt_driver_qemu.so",
}

// addVirt adds libvirt, QEMU (the one that runs the guest: QEMU 10), their
// libraries and data, the VM's files and the launcher image's users.
func (e *Env) addVirt(c *CPIO, v *VirtImage) error {
	qemuRoot := filepath.Dir(filepath.Dir(filepath.Dir(e.QEMU))) // .../usr/bin/qemu-system-x86_64
	dirs := append(append(filepath.SplitList(e.QEMULibPath), v.Libs...), e.GuestLibs...)
	libs := map[string]string{}
	add := func(bin string) error {
		l, err := sharedlibs.Resolve(bin, dirs)
		if err != nil {
			return err
		}
		for g, h := range l {
			if _, ok := libs[g]; !ok {
				libs[g] = h
			}
		}
		return nil
	}
	if err := add(e.QEMU); err != nil {
		return fmt.Errorf("QEMU: %w", err)
	}
	c.CopyFile("/usr/bin/qemu-system-x86_64", e.QEMU)
	for _, p := range virtPrograms {
		src := filepath.Join(v.Root, p)
		if err := add(src); err != nil {
			return fmt.Errorf("libvirt: %w", err)
		}
		c.CopyFile("/"+p, src)
	}
	for _, g := range slices.Sorted(maps.Keys(libs)) {
		c.CopyFile(g, libs[g])
	}
	// QEMU looks for firmware in its data directory only (libvirt passes no
	// -L): SeaBIOS's files go there too, as Debian's symlinks put them.
	for _, tree := range []struct{ src, dst string }{
		{filepath.Join(qemuRoot, "usr/share/qemu"), "/usr/share/qemu"},
		{filepath.Join(qemuRoot, "usr/share/seabios"), "/usr/share/qemu"},
		{filepath.Join(v.Root, "usr/share/libvirt/cpu_map"), "/usr/share/libvirt/cpu_map"},
	} {
		if err := copyTree(c, tree.src, tree.dst); err != nil {
			return err
		}
	}
	c.CopyFile(layout.Binding, v.Binding)
	c.CopyFile(layout.Launcher, v.Launcher)
	c.CopyFile(layout.VMI, v.VMI)
	c.CopyFile(path.Join(layout.InnerDir, layout.InnerKernel), e.Vmlinux)
	c.CopyFile(path.Join(layout.InnerDir, layout.InnerInitrd), v.InnerInitrd)
	// virt-launcher's image has these users (uid 107 runs the non-root VM).
	c.File("/etc/passwd", 0o644, []byte("root:x:0:0:root:/root:/bin/sh\nqemu:x:107:107:qemu user:/home/qemu:/sbin/nologin\n"))
	c.File("/etc/group", 0o644, []byte("root:x:0:\nkvm:x:36:qemu\nqemu:x:107:\n"))
	return nil
}

// copyTree adds the regular files and symlinks under src as dst.
func copyTree(c *CPIO, src, dst string) error {
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return fmt.Errorf("copy %s into the guest: %w", src, err)
		}
		rel, _ := filepath.Rel(src, p)
		g := path.Join(dst, filepath.ToSlash(rel))
		switch {
		case d.Type()&fs.ModeSymlink != 0:
			t, err := os.Readlink(p)
			if err != nil {
				return err
			}
			c.Symlink(g, t)
		case d.Type().IsRegular():
			c.CopyFile(g, p)
		}
		return nil
	})
}

// BuildInnerInitramfs writes the VM's own initramfs to out: busybox, the
// igbvf and virtio-net modules (virtio_net brings net_failover), and an
// init that reports on its console every Intel 82576 VF (8086:10ca) it
// sees and the MAC its igbvf netdev has, and any net_failover master with
// its slaves, again at each change (the VF leaving and coming back with
// hot-plug).
func (e *Env) BuildInnerInitramfs(out string) error {
	mods, err := LoadModules(e.Modules)
	if err != nil {
		return err
	}
	order, err := mods.Order([]string{"igbvf", "virtio_pci", "virtio_net"})
	if err != nil {
		return err
	}
	return writeArchive(out, func(c *CPIO) error {
		for _, d := range []string{"dev", "proc", "sys", "bin", "lib/modules"} {
			c.Dir(d, 0o755)
		}
		c.CopyFile(layout.Busybox, e.Busybox)
		c.Symlink("/bin/sh", "busybox")
		for i, p := range order {
			c.CopyFile(fmt.Sprintf("/lib/modules/%02d-%s.ko", i, ModuleName(p)), p)
		}
		c.File("/init", 0o755, []byte(innerInit))
		return nil
	})
}

// innerInit runs in the VM (busybox sh; the applets linked into /bin). Its
// loop uses only the shell's builtins (read, test, a read with a timeout
// on a FIFO as the sleep): under nested TCG every fork and exec costs the
// host a large fraction of a CPU-second, and a loop of cat and sleep took
// about 40 of them a second for the VM's whole life.
//
// A failover master (net_failover: a netdev with lower_* slaves and no
// master) gets layout.FailoverVMAddr once, the only configuration a guest
// needs; without a master (the standby detached) the VF's own netdev gets
// it each time it appears, as a guest without failover is set up; the report names each slave (primary: a PCI device of vendor
// 0x8086, the VF; standby: the virtio one) with its operstate, and which
// one net_failover transmits on (the primary while it is up).
const innerInit = `#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
read up rest < /proc/uptime
echo "` + layout.MarkInner + ` up $up"
for m in /lib/modules/*.ko; do insmod "$m" || echo "` + layout.MarkInner + ` insmod $m failed"; done
mkfifo /tick
last=unset
folast=unset
addressed=""
vfaddressed=""
while :; do
  fo=""
  for n in /sys/class/net/*; do
    [ -e $n/master ] && continue
    lowers=""
    for l in $n/lower_*; do [ -e "$l" ] && lowers="$lowers ${l##*/lower_}"; done
    [ -n "$lowers" ] || continue
    m=${n##*/}
    if [ "$addressed" != "$m" ]; then
      ip addr add ` + layout.FailoverVMAddr + ` dev $m && ip link set $m up && addressed=$m
    fi
    primary=none; standby=none; active=none
    for s in $lowers; do
      read st < /sys/class/net/$s/operstate
      v=none; [ -e /sys/class/net/$s/device/vendor ] && read v < /sys/class/net/$s/device/vendor
      if [ "$v" = 0x8086 ]; then primary=$s:$st; else standby=$s:$st; fi
    done
    case $standby in *:up) active=standby;; esac
    case $primary in *:up) active=primary;; esac
    fo="$fo master=$m primary=$primary standby=$standby active=$active"
  done
  # Without a master (failover off: the standby left the domain) the
  # address goes on the VF's own netdev, again each time it comes back.
  if [ -z "$fo" ]; then
    for n in /sys/class/net/*; do
      [ -e $n/master ] || [ ! -e $n/device/vendor ] && continue
      read v < $n/device/vendor
      [ "$v" = 0x8086 ] || continue
      read ix < $n/ifindex
      if [ "$vfaddressed" != "$ix" ]; then
        ip addr add ` + layout.FailoverVMAddr + ` dev ${n##*/} && ip link set ${n##*/} up && vfaddressed=$ix
      fi
    done
  fi
  if [ "$fo" != "$folast" ]; then
    read up rest < /proc/uptime
    echo "` + layout.MarkInner + ` failover${fo:- none} at $up"
    folast=$fo
  fi
  cur=""
  for d in /sys/bus/pci/devices/*; do
    read v < $d/vendor; read p < $d/device
    [ "$v" = 0x8086 ] && [ "$p" = 0x10ca ] || continue
    mac=none
    for n in $d/net/*; do [ -e "$n/address" ] && read mac < "$n/address"; done
    cur="$cur ${d##*/}=$mac"
  done
  if [ "$cur" != "$last" ]; then
    read up rest < /proc/uptime
    echo "` + layout.MarkInner + ` vfs${cur:- none} at $up"
    last=$cur
  fi
  read -t 1 x <> /tick
done
`

// BuildInitramfs writes the guest's initramfs to out.
func (e *Env) BuildInitramfs(out string, img Image) error {
	mods, err := LoadModules(e.Modules)
	if err != nil {
		return err
	}
	order, err := mods.Order(GuestModules())
	if err != nil {
		return err
	}
	// Only what the boot has not loaded already.
	extraOrder := func(more []string) ([]string, error) {
		all, err := mods.Order(append(GuestModules(), more...))
		if err != nil {
			return nil, err
		}
		return slices.DeleteFunc(all, func(p string) bool { return slices.Contains(order, p) }), nil
	}
	var wireOrder, nodeOrder []string
	if img.Wire {
		if wireOrder, err = extraOrder(WireModules()); err != nil {
			return err
		}
	}
	if img.Node != nil {
		if nodeOrder, err = extraOrder(NodeModules()); err != nil {
			return err
		}
	}
	libs, err := sharedlibs.Resolve(e.IP, e.GuestLibs)
	if err != nil {
		return fmt.Errorf("iproute2's ip: %w", err)
	}
	lay, err := json.MarshalIndent(img.Layout, "", "  ")
	if err != nil {
		return err
	}
	return writeArchive(out, func(c *CPIO) error {
		if err := e.fillInitramfs(c, img, order, libs, lay); err != nil {
			return err
		}
		for _, set := range []struct {
			on    bool
			dir   string
			order []string
			list  string
		}{
			{img.Wire, "wire", wireOrder, layout.WireModuleOrder},
			{img.Node != nil, "node", nodeOrder, layout.NodeModuleOrder},
		} {
			if !set.on {
				continue
			}
			var list bytes.Buffer
			for i, p := range set.order {
				g := fmt.Sprintf("/lib/modules/%s/%02d-%s.ko", set.dir, i, ModuleName(p))
				c.CopyFile(g, p)
				fmt.Fprintln(&list, g)
			}
			c.File(set.list, 0o644, list.Bytes())
		}
		return nil
	})
}

// fillInitramfs adds the guest's files.
func (e *Env) fillInitramfs(c *CPIO, img Image, order []string, libs map[string]string, lay []byte) error {
	for _, d := range []string{"dev", "proc", "sys", "tmp", "run", "etc/vfnet", "var/lib", "usr/bin", "usr/sbin", "bin", "sbin"} {
		c.Dir(d, 0o755)
	}
	c.CopyFile("/init", img.Init)
	c.CopyFile(layout.Driver, img.Driver)
	c.CopyFile(layout.Busybox, e.Busybox)
	c.Symlink("/bin/sh", "busybox")
	c.CopyFile(layout.IP, e.IP)
	guestLibs := slices.Sorted(func(yield func(string) bool) {
		for g := range libs {
			if !yield(g) {
				return
			}
		}
	})
	for _, g := range guestLibs {
		c.CopyFile(g, libs[g])
	}
	c.File(layout.File, 0o644, lay)
	if img.Virt != nil {
		if err := e.addVirt(c, img.Virt); err != nil {
			return fmt.Errorf("the vm case's files: %w", err)
		}
	}
	if img.Node != nil {
		if err := e.addNode(c, img.Node); err != nil {
			return fmt.Errorf("the kubelet case's files: %w", err)
		}
	}
	if img.Kubeconfig != "" {
		c.CopyFile(layout.Kubeconfig, img.Kubeconfig)
	}
	var list bytes.Buffer
	for i, p := range order {
		g := fmt.Sprintf("/lib/modules/%02d-%s.ko", i, ModuleName(p))
		c.CopyFile(g, p)
		fmt.Fprintln(&list, g)
	}
	c.File(layout.ModuleOrder, 0o644, list.Bytes())
	return nil
}

// writeArchive writes the cpio archive fill makes to out (through a
// temporary file, so a failed build leaves no partial archive).
func writeArchive(out string, fill func(*CPIO) error) error {
	tmp := out + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	defer os.Remove(tmp)
	w := bufio.NewWriterSize(f, 1<<20)
	c := NewCPIO(w)
	err = fill(c)
	if err == nil {
		err = c.Close()
	}
	if err == nil {
		err = w.Flush()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	return os.Rename(tmp, out)
}

// QEMUArgs is the machine: q35 with an emulated Intel IOMMU (interrupt
// remapping needs the split irqchip; caching-mode lets vfio map DMA), two
// NUMA nodes, and the igb PFs of the layout each behind its own root port.
// With userNet, a virtio NIC on QEMU's user-mode network lets the guest
// reach the host's loopback (the harness's API server) at 10.0.2.2. When
// the cases need the wire (layout.NeedsWire), a fourth igb PF
// (layout.WirePF) gets one: a QEMU hub joining it to a second outer NIC
// (layout.PeerNIC); the other PFs have no network backend.
func (e *Env) QEMUArgs(initrd string, cases []string, userNet bool) []string {
	args := []string{}
	for _, d := range e.QEMUData {
		args = append(args, "-L", d)
	}
	cmdline := []string{
		"console=ttyS0", "intel_iommu=on", "iommu=pt",
		// Without it a loaded host can panic the guest early: "timer
		// doesn't work through Interrupt-remapped IO-APIC".
		"no_timer_check",
		// The boot is verbose so that a hang shows where it stopped; the
		// init quiets the console to warnings once the machine is ready
		// (layout.QuietConsoleLevel), before the cases print. nokaslr lets
		// a stalled guest's vCPU addresses be read against vmlinux's symbols.
		"panic=-1", "loglevel=7", "nokaslr", "rdinit=/init",
		// An emulated CPU has nothing for these to protect, and TCG runs
		// them at full cost: the crypto self-tests at boot, zeroing every
		// kernel allocation, retpolines and RSB filling on every switch.
		"cryptomgr.notests", "init_on_alloc=0", "mitigations=off",
	}
	if len(cases) > 0 {
		cmdline = append(cmdline, layout.CasesArg+"="+strings.Join(cases, ","))
	}
	wire := len(cases) == 0 || slices.ContainsFunc(cases, layout.NeedsWire)
	if wire {
		// The wire case maps the PF's register BAR read-only to log the
		// receive filters; Debian's IO_STRICT_DEVMEM refuses a BAR a
		// driver holds without it.
		cmdline = append(cmdline, "iomem=relaxed")
	}
	// MiB per NUMA node. The vm case's initramfs is about 250 MiB larger,
	// and its VM's memory is locked for VFIO; the kubelet case's is as
	// much larger, and its node's daemons and image store live in memory.
	node := 384
	if len(cases) == 0 || slices.ContainsFunc(cases, layout.NeedsVirt) || slices.ContainsFunc(cases, layout.NeedsNode) {
		node = 1024
	}
	if slices.ContainsFunc(cases, layout.NeedsKubeVirt) {
		// Its node holds KubeVirt's images (about 500 MiB of archives),
		// unpacked again by containerd, and virt-handler, vfnet's driver
		// and the launcher pod with its VM.
		node = 3072
	}
	cpu := "qemu64,-monitor"
	var hole64 []string
	if 2*node > q35LowMemMiB {
		// The guest has memory above 4 GiB. SeaBIOS then maps every 64-bit prefetchable BAR, the
		// igb PF's VF BARs among them, high in the 64-bit window (when
		// the CPU has 36 or more physical address bits), and QEMU's igb
		// VFs mapped there never see the guest's writes: igbvf's reset
		// never reached the device and no VF read its MAC (the kubevirt
		// case, 2026-12-06; QEMU's igb trace showed it). With 35 bits
		// SeaBIOS keeps them under 4 GiB, where the cases with less
		// memory have them; the 64-bit hole shrinks to fit the 35 bits.
		cpu += ",phys-bits=35"
		hole64 = []string{"-global", "q35-pcihost.pci-hole64-size=2G"}
	}
	args = append(args,
		// One host thread runs both vCPUs in turn (thread=single): with a
		// thread each, a vCPU whose peer has lost the host CPU can only
		// spin on it in locks and IPIs. Beside two CPU burners, crash and
		// vm took 315 CPU-s instead of 356, and 332 s instead of 365 s.
		"-machine", "q35,kernel-irqchip=split", "-accel", "tcg,thread=single",
		// No MONITOR/MWAIT: TCG runs a multi-vCPU guest's mwait as a pause,
		// so idle vCPUs spun in acpi_processor_ffh_cstate_enter, and a boot
		// on a loaded host stalled there for 8 minutes with init's
		// usleep_range never woken (rehearsal, 2026-12-04). Without the
		// feature the guest idles in HLT, which TCG sleeps on.
		"-cpu", cpu,
		"-smp", "2", "-m", fmt.Sprintf("%dM", 2*node),
		"-object", fmt.Sprintf("memory-backend-ram,id=m0,size=%dM", node), "-object", fmt.Sprintf("memory-backend-ram,id=m1,size=%dM", node),
		"-numa", "node,nodeid=0,cpus=0,memdev=m0", "-numa", "node,nodeid=1,cpus=1,memdev=m1",
		"-nodefaults", "-display", "none", "-no-reboot", "-serial", "stdio", "-monitor", "none",
		"-kernel", e.Vmlinux, "-initrd", initrd, "-append", strings.Join(cmdline, " "),
		"-device", "intel-iommu,intremap=on,caching-mode=on",
		// main: 0000:01:00.0
		"-device", "pcie-root-port,id=rp1,bus=pcie.0,addr=0x2,chassis=1",
		"-device", "igb,bus=rp1,addr=0x0",
		// shared-group: 0000:02:00.0, no ACS on its port
		"-device", "pcie-root-port,id=rp2,bus=pcie.0,addr=0x3,chassis=2,disable-acs=on",
		"-device", "igb,bus=rp2,addr=0x0",
		// numa1: a second root complex on NUMA node 1, 0000:81:00.0
		"-device", "pxb-pcie,id=pxb1,bus=pcie.0,addr=0x4,bus_nr=0x80,numa_node=1",
		"-device", "pcie-root-port,id=rp3,bus=pxb1,addr=0x0,chassis=3",
		"-device", "igb,bus=rp3,addr=0x0",
	)
	args = append(args, hole64...)
	if wire {
		// A hub of two ports forwards each frame to the other: the wire
		// from the main PF to the peer NIC, with no host networking.
		args = append(args,
			// layout.WirePF: 0000:03:00.0 (the firmware numbers the buses
			// of bus 0's bridges in slot order).
			"-device", "pcie-root-port,id=rp4,bus=pcie.0,addr=0x7,chassis=4",
			"-device", "igb,bus=rp4,addr=0x0,netdev=wire0",
			"-netdev", "hubport,id=wire0,hubid=1", "-netdev", "hubport,id=wire1,hubid=1",
			"-device", "virtio-net-pci,netdev=wire1,bus=pcie.0,addr=0x6,romfile=")
	}
	if userNet {
		args = append(args, "-netdev", "user,id=api,ipv6=off", "-device", "virtio-net-pci,netdev=api,bus=pcie.0,addr=0x5,romfile=")
	}
	return args
}

// BootStallError is a guest that did not get through its machine set-up
// in time: a kernel or init that hangs says nothing on the console, so it
// carries where the vCPUs were.
type BootStallError struct {
	After time.Duration
	// Started is true when the init had begun (the kernel booted).
	Started bool
	// CPUs is where each vCPU was, sampled a few times (cpuSamples).
	CPUs string
}

func (e *BootStallError) Error() string {
	stage := "the kernel never started the init (nothing after the kernel's own messages)"
	if e.Started {
		stage = "the init started but its machine set-up (modules, VFs) did not finish"
	}
	return fmt.Sprintf("the guest stalled during boot: %s within %s; where the vCPUs were:\n%s", stage, e.After, e.CPUs)
}

// q35LowMemMiB is the most guest memory q35 keeps under 4 GiB whole
// (0xb0000000, where its PCIe configuration space starts); with more it
// puts all but 2 GiB above 4 GiB.
const q35LowMemMiB = 2816

// EnvQEMUTrace names QEMU trace events (comma-separated patterns) that Run
// enables, logged to last-qemu-trace.log in the Env's directory
// (last-<case>-qemu-trace.log for a boot of one case).
const EnvQEMUTrace = "VFNET_QEMU_TRACE"

// RunOptions is one boot of the guest.
type RunOptions struct {
	Initrd  string
	Cases   []string
	UserNet bool
	// Console receives everything the guest prints.
	Console io.Writer
	// CaseCPU, when set, also reads the console and measures each case.
	CaseCPU *CaseCPU
	// BootTimeout bounds the time from QEMU's start to the init's "machine
	// ready"; 0: no bound.
	BootTimeout time.Duration
}

// Run boots the guest, copies its console to o.Console, and waits for the
// guest to power off or ctx to end. A boot that stalls past o.BootTimeout
// is stopped with a *BootStallError.
func (e *Env) Run(ctx context.Context, o RunOptions) error {
	qmpDir, err := os.MkdirTemp("", "vfnet-qmp-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(qmpDir)
	sock := filepath.Join(qmpDir, "qmp.sock")
	args := append(e.QEMUArgs(o.Initrd, o.Cases, o.UserNet), "-qmp", "unix:"+sock+",server=on,wait=off")
	if p := os.Getenv(EnvQEMUTrace); p != "" {
		// A diagnosis aid: what the emulated devices did, e.g. igb's VF
		// mailbox and resets (VFNET_QEMU_TRACE='igb_*').
		name := "last-qemu-trace.log"
		if len(o.Cases) == 1 {
			name = "last-" + o.Cases[0] + "-qemu-trace.log"
		}
		log := filepath.Join(e.Dir, name)
		for _, ev := range strings.Split(p, ",") {
			args = append(args, "-trace", "enable="+ev)
		}
		args = append(args, "-D", log, "-msg", "timestamp=on")
	}
	runCtx, kill := context.WithCancel(ctx)
	defer kill()
	cmd := exec.CommandContext(runCtx, e.QEMU, args...)
	cmd.Env = append(os.Environ(), "LD_LIBRARY_PATH="+e.QEMULibPath)
	// A case's mark also shows the set-up ended: a kernel message written
	// into the middle of the ready line could hide it.
	console := o.Console
	if o.CaseCPU != nil {
		console = io.MultiWriter(o.Console, o.CaseCPU)
	}
	w := newMarkWatcher(console, layout.MarkInitStarted, layout.MarkInitReady, layout.MarkInitFailed, MarkCase+" ")
	cmd.Stdout = w
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start QEMU %s: %w", e.QEMU, err)
	}
	if o.CaseCPU != nil {
		o.CaseCPU.start(cmd.Process.Pid)
	}
	watchdog := make(chan *BootStallError, 1)
	go func() { watchdog <- e.watchBoot(runCtx, w, sock, o.BootTimeout, kill) }()
	err = cmd.Wait()
	kill() // ends a watchdog still waiting
	stall := <-watchdog
	switch {
	case stall != nil:
		return stall
	case ctx.Err() != nil:
		return fmt.Errorf("the guest did not power off in time (%w); QEMU said: %s", ctx.Err(), stderr.String())
	case err != nil:
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return fmt.Errorf("QEMU failed (%v): %s", err, stderr.String())
		}
		return fmt.Errorf("QEMU %s: %w", e.QEMU, err)
	}
	return nil
}

// watchBoot waits for the init's machine set-up to end (ready, failed, or
// a case already running); past timeout it samples the vCPUs, stops QEMU
// with kill and returns the stall. It returns nil once ctx ends (QEMU
// exited) or when timeout is 0 and nothing is bounded.
func (e *Env) watchBoot(ctx context.Context, w *markWatcher, sock string, timeout time.Duration, kill func()) *BootStallError {
	if timeout <= 0 {
		return nil
	}
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case <-w.seen[layout.MarkInitReady]:
	case <-w.seen[layout.MarkInitFailed]:
	case <-w.seen[MarkCase+" "]:
	case <-ctx.Done():
	case <-timer.C:
		cpus := cpuSamples(sock, e.symbols(), 5)
		// Whether the init had started is read after sampling, as the
		// console shows it when QEMU is stopped.
		stall := &BootStallError{After: timeout, Started: w.has(layout.MarkInitStarted), CPUs: cpus}
		kill()
		return stall
	}
	return nil
}

// symbols reads the kernel's exported symbols from vmlinux; nil when it
// cannot (the samples are then addresses only).
func (e *Env) symbols() *symbols {
	s, err := loadKsymtab(e.Vmlinux)
	if err != nil {
		return nil
	}
	return s
}

// markWatcher passes writes through and closes a channel the first time
// each mark appears in the stream (a mark may span writes).
type markWatcher struct {
	out  io.Writer
	mu   sync.Mutex
	tail []byte
	max  int
	seen map[string]chan struct{}
}

func newMarkWatcher(out io.Writer, marks ...string) *markWatcher {
	w := &markWatcher{out: out, seen: map[string]chan struct{}{}}
	for _, m := range marks {
		w.seen[m] = make(chan struct{})
		w.max = max(w.max, len(m))
	}
	return w
}

func (w *markWatcher) Write(p []byte) (int, error) {
	w.mu.Lock()
	buf := append(w.tail, p...)
	for m, ch := range w.seen {
		select {
		case <-ch:
		default:
			if bytes.Contains(buf, []byte(m)) {
				close(ch)
			}
		}
	}
	if len(buf) > w.max {
		buf = buf[len(buf)-w.max:]
	}
	w.tail = append(w.tail[:0], buf...)
	w.mu.Unlock()
	return w.out.Write(p)
}

func (w *markWatcher) has(mark string) bool {
	select {
	case <-w.seen[mark]:
		return true
	default:
		return false
	}
}
