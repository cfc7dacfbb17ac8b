// Package pfnetns lets the shipped vfnet-driver, which links no simulator,
// run on a test/lib/simhost tree: a private network namespace holding a netdev
// named as each PF, for --host-netns. Discovery and publishing read
// everything else from --sysfs-root and offer a PF once its netdev resolves
// over netlink, so the idle driver measured this way is the shipped binary
// doing what it does on a node. VF settings would need the real PF drivers:
// prepare stays with vfnet-driver-sim.
package pfnetns

import (
	"fmt"
	"os/exec"
	"strconv"
	"syscall"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/vfnet-io/vfnet/driver/kernel/sysfs"
)

// New creates the namespace, held by a child process (sleep) until the test
// ends, with a bridge named as each of netdevs (only the name is looked up;
// a bridge because every kernel has it, unlike dummy), and returns the
// namespace's file. It needs CAP_SYS_ADMIN and CAP_NET_ADMIN.
func New(tb testing.TB, netdevs ...string) (string, error) {
	tb.Helper()
	holder := exec.Command("sleep", "infinity")
	holder.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET, Pdeathsig: syscall.SIGKILL}
	if err := holder.Start(); err != nil {
		return "", fmt.Errorf("start a process in a new network namespace: %w", err)
	}
	tb.Cleanup(func() {
		_ = holder.Process.Kill()
		_ = holder.Wait()
	})
	path := "/proc/" + strconv.Itoa(holder.Process.Pid) + "/ns/net"
	ns, err := netns.GetFromPath(path)
	if err != nil {
		return "", fmt.Errorf("open %s: %w", path, err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return "", fmt.Errorf("netlink in %s: %w", path, err)
	}
	defer h.Close()
	for _, name := range netdevs {
		if err := h.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: name}}); err != nil {
			return "", fmt.Errorf("add netdev %s in %s: %w", name, path, err)
		}
	}
	return path, nil
}

// ForTree is New with the netdevs of the PFs that sysfs discovery finds
// under sysfsRoot.
func ForTree(tb testing.TB, sysfsRoot string) (string, error) {
	tb.Helper()
	pfs, err := sysfs.New(sysfsRoot).Discover(tb.Context())
	if err != nil {
		return "", err
	}
	var netdevs []string
	for _, pf := range pfs {
		if pf.NetDev != "" {
			netdevs = append(netdevs, pf.NetDev)
		}
	}
	return New(tb, netdevs...)
}
