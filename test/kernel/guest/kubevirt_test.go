//go:build kernelguest

package guest

import (
	"bufio"
	"context"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/vfnet-io/vfnet/test/kernel/layout"
	"github.com/vfnet-io/vfnet/test/lib/tcpforward"
)

// ownPIDNamespace names the cases the init starts as the first process of
// a PID namespace of their own (with ownMountNamespace). In it /proc/1 is
// the case, whose mount namespace is the node's: virt-handler (hostPID)
// enters /proc/1/ns/mnt with virt-chroot to mount a VM's kernel into its
// launcher pod, as on a kind node, where the node container's init is
// PID 1. When the case ends, the kernel kills what the node left.
func ownPIDNamespace(c string) bool { return layout.NeedsKubeVirt(c) }

// vmConsoleGlob finds the VM's serial console log: KubeVirt's converter
// logs the serial console to virt-serial0-log in the launcher pod's
// private emptyDir (/var/run/kubevirt-private/<vmi uid>/).
const vmConsoleGlob = "/var/lib/kubelet/pods/*/volumes/kubernetes.io~empty-dir/private/*/virt-serial0-log"

// TestKubeVirtNode is the kubevirt case (issue 33 item 3): a real node in
// the guest, joined to the real-node tier's cluster, where KubeVirt v1.9.0's
// virt-operator runs virt-handler, the chart runs vfnet's driver on the
// guest's VFs, and virt-controller's launcher pod runs the VM. The host's
// test drives and asserts; this case keeps the node up, answers the
// kubernetes Service address, copies the VM's serial console to the
// console (layout.MarkKubeVirt), and ends when the host creates
// layout.GuestStop, printing its pods' logs.
func TestKubeVirtNode(t *testing.T) {
	// Not guest(t): its netlink handles resolve this process by its PID,
	// which the machine's /proc does not show until the node mounts its
	// own.
	if os.Getenv(envCase) != "1" {
		t.Skip("runs only inside the real-kernel guest (test/kernel)")
	}
	lay, err := readLayout()
	if err != nil {
		t.Fatal(err)
	}
	if lay.APIServer == "" {
		t.Fatal("the harness started no API server for this case")
	}
	if os.Getpid() != 1 {
		t.Fatalf("the case runs as pid %d: the init must start it in a PID namespace of its own (ownPIDNamespace)", os.Getpid())
	}
	ctx := t.Context()
	enterNodeRoot(t)
	// The node's own /proc: its PID namespace's.
	if err := unix.Mount("proc", "/proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		t.Fatalf("mount the node's /proc: %v", err)
	}
	kubeconfig, kube := nodeClient(t, lay.APIServer)
	serveServiceIP(t, lay.APIServer)

	start := time.Now()
	containerd := startContainerd(t, ctx)
	images, _ := filepath.Glob(filepath.Join(layout.NodeImageDir, "*.tar"))
	for _, im := range images {
		step := time.Now()
		if out, err := ctr(ctx, "images", "import", im); err != nil {
			t.Fatalf("import %s: %v\n%s", im, err, out)
		}
		console("%s image %s imported in %s", layout.MarkKubeVirt, filepath.Base(im), time.Since(step).Round(100*time.Millisecond))
		// The archive is in the initramfs, in memory: containerd has
		// its own copy now.
		os.Remove(im)
	}
	kubelet := startKubelet(t, kubeconfig)
	daemons := []*daemon{containerd, kubelet}
	t.Cleanup(func() { dumpNodeLogs(kubelet, containerd) })
	waitNodeReady(t, ctx, kube, daemons)
	console("%s node %s Ready %s after containerd's start", layout.MarkKubeVirt, guestNode, time.Since(start).Round(100*time.Millisecond))

	vm := &consoleTail{}
	var vfs string
	for {
		checkAlive(t, daemons...)
		vm.copy()
		// What the PFs hold for their VFs (MAC, VLAN, spoof check), at
		// each change: what the VM's igbvf should read.
		if now := pfVFs(ctx); now != vfs {
			vfs = now
			for _, l := range strings.Split(strings.TrimSpace(now), "\n") {
				console("%s pf: %s", layout.MarkKubeVirt, l)
			}
		}
		_, err := kube.CoreV1().ConfigMaps("default").Get(ctx, layout.GuestStop, metav1.GetOptions{})
		if err == nil {
			console("%s stop: the host's test is done", layout.MarkKubeVirt)
			return
		}
		if !apierrors.IsNotFound(err) {
			console("%s reading %s: %v", layout.MarkKubeVirt, layout.GuestStop, err)
		}
		time.Sleep(2 * time.Second)
	}
}

// serveServiceIP answers the kubernetes Service address (layout.ServiceIP,
// port 443) on the guest's loopback and forwards each connection to the
// API server: pods (virt-handler, vfnet's driver) find it there, as the
// kubelet tells them, and no kube-proxy runs. The API server's
// certificate names the address.
func serveServiceIP(t *testing.T, apiServer string) {
	t.Helper()
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	addr, err := netlink.ParseAddr(layout.ServiceIP + "/32")
	if err != nil {
		t.Fatal(err)
	}
	if err := netlink.AddrReplace(lo, addr); err != nil {
		t.Fatalf("address %s on lo: %v", layout.ServiceIP, err)
	}
	l, err := net.Listen("tcp", net.JoinHostPort(layout.ServiceIP, "443"))
	if err != nil {
		t.Fatalf("serve the kubernetes Service address: %v", err)
	}
	t.Cleanup(func() { l.Close() })
	tcpforward.Serve(l, apiServer)
}

// pfVFs is `ip link show` of the machine's links, only the PFs' VF lines
// with the PF before them.
func pfVFs(ctx context.Context) string {
	out, err := exec.CommandContext(ctx, "ip", "link", "show").CombinedOutput()
	if err != nil {
		return err.Error()
	}
	var b strings.Builder
	dev := ""
	for _, l := range strings.Split(string(out), "\n") {
		if !strings.HasPrefix(l, " ") {
			dev = l
			continue
		}
		if t := strings.TrimSpace(l); strings.HasPrefix(t, "vf ") {
			if dev != "" {
				b.WriteString(strings.SplitN(dev, ":", 3)[1] + ":\n")
				dev = ""
			}
			b.WriteString("  " + t + "\n")
		}
	}
	return b.String()
}

// consoleTail copies what the VM's serial console logs (vmConsoleGlob) to
// the guest's console, line by line, from where it left off.
type consoleTail struct {
	file string
	off  int64
	part string
}

func (c *consoleTail) copy() {
	if c.file == "" {
		files, _ := filepath.Glob(vmConsoleGlob)
		if len(files) == 0 {
			return
		}
		c.file = files[0]
		console("%s vm console: %s", layout.MarkKubeVirt, c.file)
	}
	f, err := os.Open(c.file)
	if err != nil {
		return
	}
	defer f.Close()
	if _, err := f.Seek(c.off, io.SeekStart); err != nil {
		return
	}
	data, _ := io.ReadAll(f)
	c.off += int64(len(data))
	text := c.part + string(data)
	lines := strings.Split(text, "\n")
	c.part = lines[len(lines)-1]
	for _, l := range lines[:len(lines)-1] {
		console("%s vm: %s", layout.MarkKubeVirt, strings.TrimRight(l, "\r"))
	}
}

// dumpNodeLogs prints the end of every container's log (the host's API
// server cannot reach this kubelet for `kubectl logs`), then the kubelet's
// and containerd's.
func dumpNodeLogs(kubelet, containerd *daemon) {
	logs, _ := filepath.Glob("/var/log/pods/*/*/*.log")
	sort.Strings(logs)
	for _, l := range logs {
		rel := strings.TrimPrefix(l, "/var/log/pods/")
		console("%s log %s:", layout.MarkKubeVirt, rel)
		for _, line := range lastLines(l, 40) {
			console("%s | %s", layout.MarkKubeVirt, line)
		}
	}
	for _, d := range []*daemon{kubelet, containerd} {
		console("%s log %s:", layout.MarkKubeVirt, d.name)
		for _, line := range lastLines(d.log, 40) {
			console("%s | %s", layout.MarkKubeVirt, line)
		}
	}
}

func lastLines(path string, n int) []string {
	f, err := os.Open(path)
	if err != nil {
		return []string{err.Error()}
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if len(lines) > n {
			lines = lines[1:]
		}
	}
	return lines
}
