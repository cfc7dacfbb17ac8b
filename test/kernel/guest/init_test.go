//go:build kernelguest

// Package guest holds the real-kernel cases (issue 11). It is built only
// with the kernelguest tag, as one static test binary that is the guest's
// /init: as PID 1 it sets the machine up and runs each case in a child
// process of itself (go test -test.run), framing the results on the
// console for the harness (test/kernel). Never run it on a host: the cases
// rebind real PCI devices.
package guest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/vfnet-io/vfnet/test/kernel/layout"
)

// envCase marks a case child: only then do the cases touch the machine.
const envCase = "VFNET_GUEST_CASE"

// caseTests maps the case names of layout.AllCases and OptInCases to their tests.
func caseTests() map[string]string {
	return map[string]string{
		"discovery":   "TestDiscoveryAndInspect",
		"prepare":     "TestPrepareUnprepare",
		"refused":     "TestRefusedSettings",
		"vfio":        "TestVFIOCalls",
		"autoprobe":   "TestNoAutoprobe",
		"netns":       "TestDriverInOwnNetns",
		"crash":       "TestConcurrentAndKilled",
		"sharedgroup": "TestSharedIOMMUGroup",
		"trace":       "TestKernelTrace",
		"recreate":    "TestRecreatedVFs",
		"numvfs":      "TestNumVFs",
		"events":      "TestHostEvents",
		"wire":        "TestWire",
		"vm":          "TestVMOnVF",
		"failover":    "TestFailover",
		"kubelet":     "TestKubeletNode",
		"kubevirt":    "TestKubeVirtNode",
	}
}

func TestMain(m *testing.M) {
	// A case in a PID namespace of its own (ownPIDNamespace) is pid 1
	// too: only the machine's init has no case to run.
	if os.Getpid() == 1 && os.Getenv(envCase) == "" {
		initMain()
		return
	}
	if len(os.Args) > 2 && os.Args[1] == execInNetnsArg {
		execInNetns(os.Args[2], os.Args[3:])
		return
	}
	if len(os.Args) == 3 && os.Args[1] == execInPodArg {
		execInPod(os.Args[2])
		return
	}
	os.Exit(m.Run())
}

// console prints one whole line (a single write, so kernel messages do not
// split it).
func console(format string, args ...any) {
	os.Stdout.Write([]byte(fmt.Sprintf(format, args...) + "\n"))
}

func initMain() {
	defer func() {
		if r := recover(); r != nil {
			console("vfnet init: panic: %v", r)
		}
		console("%s", "VFNET-DONE")
		unix.Sync()
		_ = unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF)
		select {}
	}()
	console("%s", layout.MarkInitStarted)
	start := time.Now()
	lay, err := machineSetup()
	if err != nil {
		console("%s: %v", layout.MarkInitFailed, err)
		for _, c := range selectedCases(lay) {
			console("%s %s FAIL machine setup failed: %v", "VFNET-CASE", c, err)
		}
		return
	}
	up, _ := os.ReadFile("/proc/uptime")
	console("%s after %s (kernel uptime %ss)", layout.MarkInitReady, time.Since(start).Round(time.Millisecond), strings.Fields(string(up) + " ?")[0])
	// Quiet from here: kernel messages would interleave with the cases' lines.
	if err := os.WriteFile("/proc/sys/kernel/printk", []byte(fmt.Sprint(layout.QuietConsoleLevel)), 0); err != nil {
		console("vfnet init: cannot set the console log level: %v", err)
	}
	tests := caseTests()
	for _, c := range selectedCases(lay) {
		runCase(c, tests[c])
	}
}

func selectedCases(lay layout.Layout) []string {
	data, _ := os.ReadFile("/proc/cmdline")
	for _, f := range strings.Fields(string(data)) {
		if v, ok := strings.CutPrefix(f, layout.CasesArg+"="); ok {
			return strings.Split(v, ",")
		}
	}
	if len(lay.Cases) > 0 {
		return lay.Cases
	}
	return layout.AllCases()
}

func runCase(name, test string) {
	console("VFNET-CASE %s BEGIN", name)
	if test == "" {
		console("VFNET-CASE %s FAIL no such case in the guest binary", name)
		return
	}
	start := time.Now()
	limit := 15 * time.Minute
	if layout.NeedsKubeVirt(name) {
		// Its host's test ends it (layout.GuestStop) after KubeVirt's
		// install and the VM's life on a loaded machine.
		limit = 45 * time.Minute
	}
	ctx, cancel := context.WithTimeout(context.Background(), limit+time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "/init", "-test.run", "^"+test+"$", "-test.v", "-test.timeout", limit.String())
	cmd.Env = append(os.Environ(), envCase+"=1", "PATH=/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/tmp", "TMPDIR=/tmp")
	if ownMountNamespace(name) {
		cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNS}
	}
	if ownPIDNamespace(name) {
		cmd.SysProcAttr.Cloneflags |= syscall.CLONE_NEWPID
	}
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	var out strings.Builder
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			console("%s", sc.Text())
			out.WriteString(sc.Text() + "\n")
		}
	}()
	err := cmd.Run()
	pw.Close()
	<-done
	took := time.Since(start).Round(time.Millisecond)
	o := out.String()
	switch {
	case err == nil && strings.Contains(o, "testing: warning: no tests to run"):
		console("VFNET-CASE %s FAIL %s is not in the guest binary (%s)", name, test, took)
	case err == nil && strings.Contains(o, "--- SKIP: "):
		// The case's test or any of its subtests: either tested nothing.
		console("VFNET-CASE %s SKIP %s (%s)", name, skipped(o), took)
	case err == nil:
		console("VFNET-CASE %s PASS (%s)", name, took)
	case ctx.Err() != nil:
		console("VFNET-CASE %s FAIL timed out after %s", name, took)
	default:
		console("VFNET-CASE %s FAIL %v (%s)", name, err, took)
	}
}

// machineSetup mounts the kernel file systems, loads the modules, creates
// the layout's VFs and brings the PFs up (igb refuses a TX rate limit while
// the PF has no carrier).
func machineSetup() (layout.Layout, error) {
	var lay layout.Layout
	mounts := []struct{ src, dst, fs string }{
		{"proc", "/proc", "proc"}, {"sysfs", "/sys", "sysfs"}, {"devtmpfs", "/dev", "devtmpfs"},
		{"tmpfs", "/tmp", "tmpfs"}, {"tmpfs", "/run", "tmpfs"},
	}
	for _, m := range mounts {
		if err := os.MkdirAll(m.dst, 0o755); err != nil {
			return lay, err
		}
		if err := unix.Mount(m.src, m.dst, m.fs, 0, ""); err != nil && !errors.Is(err, unix.EBUSY) {
			return lay, fmt.Errorf("mount %s on %s: %w", m.fs, m.dst, err)
		}
	}
	lay, err := readLayout()
	if err != nil {
		return lay, err
	}
	order, err := os.ReadFile(layout.ModuleOrder)
	if err != nil {
		return lay, err
	}
	for _, p := range strings.Fields(string(order)) {
		if err := loadModule(p); err != nil {
			return lay, err
		}
	}
	if lo, err := netlink.LinkByName("lo"); err == nil {
		_ = netlink.LinkSetUp(lo)
	}
	for _, pf := range lay.PFs {
		if err := createVFs(pf); err != nil {
			return lay, err
		}
	}
	if lay.APIServer != "" {
		if err := userNetwork(lay.Peer); err != nil {
			return lay, err
		}
	}
	return lay, nil
}

// userNetwork configures the virtio NIC on QEMU's user-mode network; the
// virtio NIC at peer (the wire case's, when there is one) is not it.
func userNetwork(peer string) error {
	ents, _ := os.ReadDir("/sys/class/net")
	for _, e := range ents {
		drv, _ := os.Readlink("/sys/class/net/" + e.Name() + "/device/driver")
		if filepath.Base(drv) != "virtio_net" {
			continue
		}
		if peer != "" && pciAddressOf(e.Name()) == peer {
			continue
		}
		l, err := netlink.LinkByName(e.Name())
		if err != nil {
			return err
		}
		addr, err := netlink.ParseAddr(layout.GuestAddr)
		if err != nil {
			return err
		}
		if err := netlink.AddrAdd(l, addr); err != nil {
			return fmt.Errorf("address %s on %s: %w", layout.GuestAddr, e.Name(), err)
		}
		if err := netlink.LinkSetUp(l); err != nil {
			return err
		}
		gw := &netlink.Route{LinkIndex: l.Attrs().Index, Gw: net.ParseIP(layout.GuestGateway)}
		if err := netlink.RouteAdd(gw); err != nil {
			return fmt.Errorf("default route via %s: %w", layout.GuestGateway, err)
		}
		console("vfnet init: %s on the user-mode network (%s)", e.Name(), layout.GuestAddr)
		return nil
	}
	return errors.New("no virtio_net interface for the API server's network")
}

// pciAddressOf is the PCI address of netdev's device: the device itself,
// or for a virtio NIC the PCI function its virtio device sits on
// (…/0000:00:06.0/virtio1); "" when it has none.
func pciAddressOf(netdev string) string {
	dev, err := filepath.EvalSymlinks("/sys/class/net/" + netdev + "/device")
	if err != nil {
		return ""
	}
	if strings.HasPrefix(filepath.Base(dev), "virtio") {
		dev = filepath.Dir(dev)
	}
	return filepath.Base(dev)
}

// execInNetnsArg makes this binary a launcher: it enters the network
// namespace of the file after it and execs the program after that there
// (execve keeps the calling thread's namespaces), as a container runtime
// starts a pod's process.
const execInNetnsArg = "-vfnet-exec-in-netns"

func execInNetns(nsPath string, argv []string) {
	runtime.LockOSThread()
	fd, err := unix.Open(nsPath, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err == nil {
		err = unix.Setns(fd, unix.CLONE_NEWNET)
	}
	if err == nil {
		err = unix.Exec(argv[0], argv, os.Environ())
	}
	fmt.Fprintf(os.Stderr, "exec %v in network namespace %s: %v\n", argv, nsPath, err)
	os.Exit(1)
}

func loadModule(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.FinitModule(int(f.Fd()), "", 0); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("load kernel module %s: %w", filepath.Base(path), err)
	}
	return nil
}

// createVFs makes pf.VFs VFs on pf, waits until igbvf drives them, and sets
// the PF's link up with carrier.
func createVFs(pf layout.PF) error {
	dev := "/sys/bus/pci/devices/" + pf.Address
	netdev, err := waitNetdev(dev, 60*time.Second)
	if err != nil {
		return fmt.Errorf("PF %s (%s): %w", pf.Address, pf.Role, err)
	}
	link, err := netlink.LinkByName(netdev)
	if err != nil {
		return err
	}
	if err := netlink.LinkSetUp(link); err != nil {
		return fmt.Errorf("set PF %s up: %w", netdev, err)
	}
	if err := os.WriteFile(dev+"/sriov_numvfs", []byte(fmt.Sprint(pf.VFs)), 0); err != nil {
		return fmt.Errorf("create %d VFs on %s: %w", pf.VFs, pf.Address, err)
	}
	for i := 0; i < pf.VFs; i++ {
		vf, err := filepath.EvalSymlinks(fmt.Sprintf("%s/virtfn%d", dev, i))
		if err != nil {
			return err
		}
		if _, err := waitNetdev(vf, 60*time.Second); err != nil {
			return fmt.Errorf("VF %d of %s: %w", i, pf.Address, err)
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, _ := os.ReadFile("/sys/class/net/" + netdev + "/carrier")
		if strings.TrimSpace(string(c)) == "1" {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("PF %s has no carrier after 30s", netdev)
		}
		time.Sleep(100 * time.Millisecond)
	}
	console("vfnet init: %s PF %s (%s) up with %d VFs", pf.Role, pf.Address, netdev, pf.VFs)
	return nil
}

// waitNetdev waits for a netdev under the PCI device directory dev.
func waitNetdev(dev string, timeout time.Duration) (string, error) {
	deadline := time.Now().Add(timeout)
	for {
		ents, _ := os.ReadDir(dev + "/net")
		if len(ents) > 0 {
			return ents[0].Name(), nil
		}
		if time.Now().After(deadline) {
			drv, _ := os.Readlink(dev + "/driver")
			return "", fmt.Errorf("no netdev under %s after %s (driver %q)", dev, timeout, filepath.Base(drv))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// skipped names the skipped tests and subtests in a case's go test -v
// output ("--- SKIP: TestX/sub (0.00s)"), for the case's SKIP line.
func skipped(out string) string {
	var names []string
	for _, line := range strings.Split(out, "\n") {
		if _, rest, ok := strings.Cut(line, "--- SKIP: "); ok {
			name, _, _ := strings.Cut(rest, " ")
			names = append(names, name)
		}
	}
	return strings.Join(names, ",")
}
