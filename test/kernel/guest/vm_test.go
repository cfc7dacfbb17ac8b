//go:build kernelguest

package guest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
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

	libvirt "github.com/digitalocean/go-libvirt"
	ocispec "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/client-go/kubernetes"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
	"libvirt.org/go/libvirtxml"
	"tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/vfnet-io/vfnet/driver/kernel/sysfs"
	"github.com/vfnet-io/vfnet/driver/kernel/vflink"
	"github.com/vfnet-io/vfnet/driver/migration/attach"
	"github.com/vfnet-io/vfnet/pkg/contract/pciaddr"
	hooksinfo "github.com/vfnet-io/vfnet/sidecar/hooksapi/info"
	"github.com/vfnet-io/vfnet/test/kernel/layout"
)

// The example VM (manifests/examples/vm.yaml) and what KubeVirt names for it.
const (
	vmNamespace = "default"
	vmName      = "vm-physnet-a"
	vmIface     = "physnet-a"
	vmMAC       = "02:00:00:00:00:01"
	// vmVLAN is the VLAN of the example's ResourceClaimTemplate
	// (vf-physnet-a-vlan100).
	vmVLAN = 100
	// vmPodClaim and vmRequest name the VM's claim in the pod
	// (spec.resourceClaims[].name) and its request.
	vmPodClaim = "vf"
	vmRequest  = "vf"
	// domainName is virt-launcher's "<namespace>_<name>".
	domainName = vmNamespace + "_" + vmName
	// qemuUID runs the non-root launcher pod's containers.
	qemuUID = 107
	// launcherPodUID stands for the launcher pod's UID (its kubelet
	// volume directory), targetPodUID for the migration target's.
	launcherPodUID = "6b1d4b52-9c3e-4e47-8f8e-vm0physneta1"
	targetPodUID   = "9d2e7f61-4a5b-4c3d-9e8f-vm0physneta2"
)

// launcherPod is the virt-launcher pod of the example VM as the kubelet
// and the container runtime would lay it out: its emptyDir volumes under
// the kubelet pods dir, a mount namespace per container.
type launcherPod struct {
	podsDir, uid string
	vols         map[string]string // volume name -> node path
	procs        []*podProc
}

// podVolumes are the launcher pod's emptyDirs the case needs, with their
// mount paths in the compute container (virt-controller's TemplateService).
var podVolumes = map[string]string{
	"private":              "/var/run/kubevirt-private",
	"public":               "/var/run/kubevirt",
	"ephemeral-disks":      "/var/run/kubevirt-ephemeral-disks",
	"libvirt-runtime":      "/var/run/libvirt",
	"hook-sidecar-sockets": "/var/run/kubevirt-hooks",
	"kernel-boot-volume":   "/var/run/kubevirt-kernel-boot",
}

func newLauncherPod(t *testing.T, podsDir, uid string) *launcherPod {
	t.Helper()
	p := &launcherPod{podsDir: podsDir, uid: uid, vols: map[string]string{}}
	for name := range podVolumes {
		d := filepath.Join(podsDir, uid, "volumes", "kubernetes.io~empty-dir", name)
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		// fsGroup 107 makes the emptyDirs writable for the containers.
		if err := os.Chown(d, qemuUID, qemuUID); err != nil {
			t.Fatal(err)
		}
		p.vols[name] = d
	}
	t.Cleanup(func() {
		p.stopAll(t)
		_ = os.RemoveAll(filepath.Join(podsDir, uid))
	})
	return p
}

func (p *launcherPod) runtimeDir() string { return attach.RuntimeDir(p.podsDir, p.uid) }

// binds are the volume mounts of a container, plus extra.
func (p *launcherPod) binds(names []string, extra ...bind) []bind {
	var out []bind
	for _, n := range names {
		out = append(out, bind{Source: p.vols[n], Target: podVolumes[n]})
	}
	return append(out, extra...)
}

// podProc is one program running in a container of the pod.
type podProc struct {
	name   string
	cmd    *exec.Cmd
	out    *syncBuf
	exited chan error
	done   bool
}

// start runs argv as uid 107 in a mount namespace with binds.
func (p *launcherPod) start(t *testing.T, name string, binds []bind, env []string, argv ...string) *podProc {
	t.Helper()
	return p.startSpec(t, name, containerSpec{Binds: binds, UID: qemuUID, Argv: argv, Env: env})
}

func (p *launcherPod) startSpec(t *testing.T, name string, cs containerSpec) *podProc {
	t.Helper()
	spec, err := json.Marshal(cs)
	if err != nil {
		t.Fatal(err)
	}
	pp := &podProc{name: name, cmd: exec.Command("/proc/self/exe", execInPodArg, string(spec)), out: &syncBuf{}, exited: make(chan error, 1)}
	pp.cmd.Stdout, pp.cmd.Stderr = pp.out, pp.out
	if err := pp.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() { pp.exited <- pp.cmd.Wait() }()
	p.procs = append(p.procs, pp)
	return pp
}

// wait waits for a program that ends by itself (the launcher).
func (pp *podProc) wait(t *testing.T, timeout time.Duration) error {
	t.Helper()
	select {
	case err := <-pp.exited:
		pp.done = true
		return err
	case <-time.After(timeout):
		t.Fatalf("%s did not finish within %s; its output:\n%s", pp.name, timeout, pp.out.String())
		return nil
	}
}

// stop SIGTERMs a program and waits for it.
func (pp *podProc) stop() error {
	if pp.done {
		return nil
	}
	pp.done = true
	_ = pp.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-pp.exited:
		return err
	case <-time.After(30 * time.Second):
		_ = pp.cmd.Process.Kill()
		<-pp.exited
		return fmt.Errorf("%s did not stop within 30s of SIGTERM", pp.name)
	}
}

func (p *launcherPod) stopAll(t *testing.T) {
	for _, pp := range slices.Backward(p.procs) {
		if err := pp.stop(); err != nil && !pp.expectedExit(err) {
			t.Logf("%s: %v", pp.name, err)
		}
		if t.Failed() {
			t.Logf("%s output:\n%s", pp.name, pp.out.String())
		}
	}
}

func (pp *podProc) expectedExit(err error) bool {
	var ee *exec.ExitError
	return errors.As(err, &ee) && ee.Sys().(syscall.WaitStatus).Signal() == syscall.SIGTERM
}

// cdiEdits resolves the CDI devices the driver returned for the claim
// (its VF spec and the kubeletplugin helper's metadata spec) as a
// container runtime does: the device nodes and mounts they add.
func cdiEdits(t *testing.T, cdiDir string, ids []string) *ocispec.Spec {
	t.Helper()
	cache, err := cdi.NewCache(cdi.WithSpecDirs(cdiDir), cdi.WithAutoRefresh(false))
	if err != nil {
		t.Fatalf("CDI specs in %s: %v", cdiDir, err)
	}
	spec := &ocispec.Spec{Linux: &ocispec.Linux{}, Process: &ocispec.Process{}}
	if unresolved, err := cache.InjectDevices(spec, ids...); err != nil {
		t.Fatalf("inject CDI devices %v (unresolved %v): %v", ids, unresolved, err)
	}
	return spec
}

// prepareVFIO is what virt-handler does for a non-root VMI's VFIO devices
// (KubeVirt v1.9.0 pkg/virt-handler/non-root.go prepareVFIO): the
// container's /dev/vfio/vfio becomes 0666 and every group node is chowned
// to 107.
func prepareVFIO(t *testing.T, nodes []ocispec.LinuxDevice) []string {
	t.Helper()
	var groups []string
	for _, n := range nodes {
		if !strings.HasPrefix(n.Path, "/dev/vfio/") {
			continue
		}
		if n.Path == "/dev/vfio/vfio" {
			if err := os.Chmod(n.Path, 0o666); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := os.Chown(n.Path, qemuUID, qemuUID); err != nil {
			t.Fatal(err)
		}
		groups = append(groups, n.Path)
	}
	if len(groups) == 0 {
		t.Fatalf("the CDI spec names no VFIO group node: %+v", nodes)
	}
	return groups
}

// vmClaim creates the claim the ResourceClaim controller makes from the
// VM's template (the pod-claim-name annotation decides where the metadata
// is mounted), allocated to vf, with the template's VLAN and the VM's MAC,
// and extra VFConfig fields (",\"failover\":true").
func vmClaim(t *testing.T, ctx context.Context, kube kubernetes.Interface, vf sysfs.VF, extra string) *drapb.Claim {
	t.Helper()
	c := claim(vmName+"-vf-x7k2p", fmt.Sprintf(`{%s,"mac":%q,"vlan":%d%s}`, vfConfigHead, vmMAC, vmVLAN, extra), vf)
	c.Annotations = map[string]string{resourceapi.PodResourceClaimAnnotation: vmPodClaim}
	c.Status.Allocation.Devices.Results[0].Request = vmRequest
	return createAllocated(t, ctx, kube, c)
}

// libvirtConn is a root client of the pod's libvirt session daemon, as the
// node reaches it (the socket path is too long for sun_path: dialled
// through an O_PATH descriptor of its directory, as attach.SessionDialer).
func libvirtConn(t *testing.T, runtimeDir string) *libvirt.Libvirt {
	t.Helper()
	fd, err := unix.Open(runtimeDir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	lv := libvirt.NewWithDialer(dialerFunc(func() (net.Conn, error) {
		return net.DialTimeout("unix", fmt.Sprintf("/proc/self/fd/%d/%s", fd, attach.SocketName), 10*time.Second)
	}))
	if err := lv.ConnectToURI(libvirt.QEMUSession); err != nil {
		t.Fatalf("connect to the pod's libvirt: %v", err)
	}
	t.Cleanup(func() { _ = lv.Disconnect() })
	return lv
}

type dialerFunc func() (net.Conn, error)

func (f dialerFunc) Dial() (net.Conn, error) { return f() }

// liveDomain reads and parses the running domain.
func liveDomain(t *testing.T, lv *libvirt.Libvirt) (libvirt.Domain, *libvirtxml.Domain, string) {
	t.Helper()
	dom, err := lv.DomainLookupByName(domainName)
	if err != nil {
		t.Fatalf("look up domain %s: %v", domainName, err)
	}
	x, err := lv.DomainGetXMLDesc(dom, 0)
	if err != nil {
		t.Fatal(err)
	}
	var d libvirtxml.Domain
	if err := d.Unmarshal(x); err != nil {
		t.Fatal(err)
	}
	return dom, &d, x
}

// vfHostdev returns the domain's hostdev with alias, or nil.
func vfHostdev(d *libvirtxml.Domain, alias string) *libvirtxml.DomainHostdev {
	if d.Devices == nil {
		return nil
	}
	for i, h := range d.Devices.Hostdevs {
		if h.Alias != nil && h.Alias.Name == alias {
			return &d.Devices.Hostdevs[i]
		}
	}
	return nil
}

// freeRootPorts lists the pcie-root-port controllers (by index) that no
// device sits behind: where a hot-plugged device can go. Every device's
// guest PCI address names the controller index it sits behind as its bus.
func freeRootPorts(d *libvirtxml.Domain, raw string) []uint {
	busy := map[uint]bool{}
	for _, m := range pciBusAttr.FindAllStringSubmatch(raw, -1) {
		if n, err := strconv.ParseUint(m[1], 0, 32); err == nil {
			busy[uint(n)] = true
		}
	}
	var free []uint
	for _, c := range d.Devices.Controllers {
		if c.Type == "pci" && c.Model == "pcie-root-port" && c.Index != nil && !busy[*c.Index] {
			free = append(free, *c.Index)
		}
	}
	return free
}

var pciBusAttr = regexp.MustCompile(`<address type=["']pci["'][^>]*\sbus=["'](0x[0-9a-fA-F]+|[0-9]+)["']`)

// qmpDevice is a device of QEMU's query-pci.
type qmpDevice struct {
	Bus, Slot, Function int
	ID                  struct{ Vendor, Device int }
	QdevID              string `json:"qdev_id"`
	Bridge              *struct {
		Devices []qmpDevice
	} `json:"pci_bridge"`
}

// qmpVF is where QEMU's own PCI model has the VF: the device with the
// 82576 VF's IDs (read by QEMU from the real VF's config space through
// VFIO), and the qdev id of the bridge it sits behind.
type qmpVF struct {
	QdevID, Port string
	Slot         int
}

// queryVFs asks QEMU (QMP query-pci, through libvirt's monitor
// pass-through) for every 8086:10ca device.
func queryVFs(t *testing.T, lv *libvirt.Libvirt, dom libvirt.Domain) ([]qmpVF, string) {
	t.Helper()
	out, err := lv.QEMUDomainMonitorCommand(dom, `{"execute":"query-pci"}`, 0)
	if err != nil {
		t.Fatalf("QMP query-pci: %v", err)
	}
	var resp struct {
		Return []struct{ Devices []qmpDevice }
	}
	if err := json.Unmarshal([]byte(out), &resp); err != nil {
		t.Fatalf("QMP query-pci answer %q: %v", out, err)
	}
	var vfs []qmpVF
	var walk func(port string, ds []qmpDevice)
	walk = func(port string, ds []qmpDevice) {
		for _, d := range ds {
			if d.ID.Vendor == 0x8086 && d.ID.Device == 0x10ca {
				vfs = append(vfs, qmpVF{QdevID: d.QdevID, Port: port, Slot: d.Slot})
			}
			if d.Bridge != nil {
				walk(d.QdevID, d.Bridge.Devices)
			}
		}
	}
	for _, b := range resp.Return {
		walk("pcie.0", b.Devices)
	}
	return vfs, out
}

// checkVFInQEMU checks that QEMU holds the VF as the domain's hostdev
// alias, behind the root port and slot libvirt assigned it, and returns
// the root port's controller index. query-pci lists a device behind a root
// port only once the VM's firmware has numbered the port's bus, so it asks
// again until then.
func checkVFInQEMU(t *testing.T, ctx context.Context, lv *libvirt.Libvirt, alias string) uint {
	t.Helper()
	dom, d, _ := liveDomain(t, lv)
	h := vfHostdev(d, alias)
	if h == nil || h.Address == nil || h.Address.PCI == nil || h.Address.PCI.Bus == nil || h.Address.PCI.Slot == nil {
		t.Fatalf("the live domain has no hostdev %s with a guest PCI address", alias)
	}
	bus, slot := *h.Address.PCI.Bus, *h.Address.PCI.Slot
	want := qmpVF{QdevID: alias, Port: fmt.Sprintf("pci.%d", bus), Slot: int(slot)}
	for {
		vfs, raw := queryVFs(t, lv, dom)
		if len(vfs) == 1 && vfs[0] == want {
			t.Logf("QMP query-pci: VF 8086:10ca is %q behind %s slot %d, where libvirt put hostdev %s", vfs[0].QdevID, vfs[0].Port, vfs[0].Slot, alias)
			return bus
		}
		if len(vfs) > 0 || ctx.Err() != nil {
			t.Fatalf("QMP query-pci lists 8086:10ca devices %+v; want exactly %+v (libvirt's address bus %d slot %d)\n%s", vfs, want, bus, slot, raw)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// qemuHoldsGroup checks that the QEMU process of the domain has the VFIO
// group node open, and returns its pid.
func qemuHoldsGroup(t *testing.T, runtimeDir string, groups []string) int {
	t.Helper()
	pid, err := attach.FindQEMU("/proc", runtimeDir, domainName)
	if err != nil {
		t.Fatal(err)
	}
	fds, _ := filepath.Glob(fmt.Sprintf("/proc/%d/fd/*", pid))
	open := map[string]bool{}
	for _, fd := range fds {
		if l, err := os.Readlink(fd); err == nil {
			open[l] = true
		}
	}
	for _, g := range groups {
		if !open[g] {
			t.Errorf("QEMU (pid %d) does not have %s open", pid, g)
		}
	}
	st, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	uid := regexp.MustCompile(`(?m)^Uid:\s+(\d+)`).FindSubmatch(st)
	if len(uid) < 2 || string(uid[1]) != strconv.Itoa(qemuUID) {
		t.Errorf("QEMU (pid %d) runs as uid %s, want %d", pid, uid, qemuUID)
	}
	return pid
}

// serialLog is the VM's serial console as KubeVirt logs it.
func (p *launcherPod) serialLog(t *testing.T) string {
	t.Helper()
	logs, _ := filepath.Glob(filepath.Join(p.vols["private"], "*", "virt-serial0-log"))
	if len(logs) != 1 {
		return ""
	}
	data, _ := os.ReadFile(logs[0])
	return string(data)
}

// waitInner waits up to limit for the VM's own init to report the VFs it
// sees as want (" none" or " <addr>=<mac>", as innerInit prints) and
// returns how long that took.
func (p *launcherPod) waitInner(t *testing.T, ctx context.Context, limit time.Duration, want *regexp.Regexp, what string) time.Duration {
	t.Helper()
	return p.waitReport(t, ctx, limit, "vfs", want, what)
}

// waitReport waits up to limit for the VM's init's last report of kind
// ("vfs", "failover") to match want, and returns how long that took.
func (p *launcherPod) waitReport(t *testing.T, ctx context.Context, limit time.Duration, kind string, want *regexp.Regexp, what string) time.Duration {
	t.Helper()
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	progress := time.NewTicker(time.Minute)
	defer progress.Stop()
	for {
		sc := bufio.NewScanner(strings.NewReader(p.serialLog(t)))
		var last, any string
		for sc.Scan() {
			l := sc.Text()
			if strings.TrimSpace(l) != "" {
				any = l
			}
			if strings.Contains(l, layout.MarkInner+" "+kind+" ") {
				last = l
			}
		}
		if last != "" && want.MatchString(last) {
			return time.Since(start)
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the VM did not report %s within %s (last report: %q); its serial console:\n%s\nQEMU's log:\n%s",
				what, limit, last, tail(p.serialLog(t), 40), tail(p.qemuLog(), 30))
		case <-progress.C:
			t.Logf("waiting %s for the VM to report %s; its console's last line: %q", time.Since(start).Round(time.Second), what, any)
		case <-time.After(time.Second):
		}
	}
}

// qemuLog is libvirt's log of the domain's QEMU (session mode: under
// XDG_CACHE_HOME, the private volume).
func (p *launcherPod) qemuLog() string {
	data, err := os.ReadFile(filepath.Join(p.vols["private"], "libvirt", "qemu", "log", domainName+".log"))
	if err != nil {
		return err.Error()
	}
	return string(data)
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// inDefinition reports whether the domain's persistent definition has the
// hostdev alias.
func inDefinition(t *testing.T, lv *libvirt.Libvirt, dom libvirt.Domain, alias string) bool {
	t.Helper()
	x, err := lv.DomainGetXMLDesc(dom, libvirt.DomainXMLInactive)
	if err != nil {
		t.Fatal(err)
	}
	var d libvirtxml.Domain
	if err := d.Unmarshal(x); err != nil {
		t.Fatal(err)
	}
	return vfHostdev(&d, alias) != nil
}

// detachLikeKubeVirt detaches the hostdev by its alias as KubeVirt's
// migration source does (v1.9.0 hostdevice.SafelyDetachHostDevices: the
// hostdev's XML, live and config, then wait until the device is gone).
func detachLikeKubeVirt(t *testing.T, ctx context.Context, lv *libvirt.Libvirt, alias string) time.Duration {
	t.Helper()
	dom, d, _ := liveDomain(t, lv)
	h := vfHostdev(d, alias)
	if h == nil {
		t.Fatalf("no hostdev %s to detach", alias)
	}
	x, err := h.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	err = lv.DomainDetachDeviceFlags(dom, x, uint32(libvirt.DomainAffectLive|libvirt.DomainAffectConfig))
	if err != nil && !inDefinition(t, lv, dom, alias) {
		// KubeVirt detaches from the live domain and its definition; a
		// re-attach by vfnet must have put the VF back into both.
		t.Fatalf("KubeVirt's detach (live and config) of %s refused: %v: the persistent definition lacks the hostdev, so an earlier attach did not restore it there", alias, err)
	}
	if err != nil {
		t.Fatalf("detach %s: %v", alias, err)
	}
	for {
		_, d, _ := liveDomain(t, lv)
		if vfHostdev(d, alias) == nil {
			return time.Since(start)
		}
		select {
		case <-ctx.Done():
			t.Fatalf("hostdev %s still in the live domain %s after the detach", alias, time.Since(start).Round(time.Second))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// vmOptions are what a case changes in the VM startVM runs.
type vmOptions struct {
	// config is added to the claim's VFConfig (`,"failover":true`).
	config string
	// driverArgs are extra vfnet-driver flags.
	driverArgs []string
	// plumb, if set, runs once the launcher pod exists, before its
	// libvirtd starts (the failover case makes the standby's tap there).
	plumb func(pod *launcherPod)
}

// vmRun is a VM on a VF, as startVM left it: QEMU holds the VF and the
// VM's igbvf reports the claim's MAC.
type vmRun struct {
	m         *machine
	pf        sysfs.PF
	vf        sysfs.VF
	before    vfState
	dir       string
	drv       *driverProc
	ref       *drapb.Claim
	groups    []string
	metaBinds []bind
	pod       *launcherPod
	lv        *libvirt.Libvirt
	alias     string
	// port is the root port the VF sits behind.
	port uint
	// vfIn matches the VM's report of its VF with the claim's MAC.
	vfIn *regexp.Regexp
}

// startVM runs what a node runs for the example VM, up to the VM's own
// kernel driving the VF: the real driver prepares the claim, a launcher
// pod runs libvirtd and the real sidecar, kernellauncher defines and
// starts the domain.
func startVM(t *testing.T, ctx context.Context, m *machine, o vmOptions) *vmRun {
	t.Helper()
	kube, apiHost := m.apiClient(t)
	for _, mt := range []struct{ fs, dst string }{{"devpts", "/dev/pts"}, {"tmpfs", "/dev/shm"}} {
		_ = os.MkdirAll(mt.dst, 0o755)
		if err := unix.Mount(mt.fs, mt.dst, mt.fs, 0, ""); err != nil && !errors.Is(err, unix.EBUSY) {
			t.Fatalf("mount %s: %v", mt.dst, err)
		}
	}
	apiNode(t, ctx, kube)
	pf := m.pf(t, layout.RoleWire)
	vf := pf.VFs[0]
	before := m.vfState(t, pf, vf)
	dir := t.TempDir()
	drv := m.startDriverWith(t, ctx, podNetns(t, apiHost, m.lay.APIServer), dir, m.writeNodeConfig(t), o.driverArgs...)
	devName, err := pciaddr.DeviceName(vf.Address)
	if err != nil {
		t.Fatal(err)
	}
	drv.waitPublished(t, ctx, kube, devName)

	// 1. The driver prepares the VF; the CDI specs say what the pod gets.
	ref := vmClaim(t, ctx, kube, vf, o.config)
	res, err := drv.prepare(ctx, ref)
	if err != nil || len(res.Devices) != 1 {
		t.Fatalf("NodePrepareResources: %+v, %v", res, err)
	}
	mac, _ := net.ParseMAC(vmMAC)
	m.checkPrepared(t, pf, vf, vflink.VFState{MAC: mac, VLAN: vmVLAN, SpoofChk: before.Link.SpoofChk})
	edits := cdiEdits(t, filepath.Join(dir, "cdi"), res.Devices[0].CdiDeviceIds)
	groups := prepareVFIO(t, edits.Linux.Devices)
	var metaBinds []bind
	for _, mnt := range edits.Mounts {
		metaBinds = append(metaBinds, bind{Source: mnt.Source, Target: mnt.Destination})
	}
	if len(metaBinds) == 0 {
		t.Fatalf("the CDI specs mount no device metadata: %+v", edits.Mounts)
	}
	t.Logf("CDI: device nodes %v, mounts %+v", groups, metaBinds)

	// 2. The launcher pod: libvirtd in the compute container.
	pod := newLauncherPod(t, attach.DefaultKubeletPodsDir, launcherPodUID)
	pod.linkKernelFiles(t)
	if o.plumb != nil {
		o.plumb(pod)
	}
	step := time.Now()
	libvirtd := pod.startLibvirtd(t, ctx)
	t.Logf("libvirtd (session, uid %d) listening after %s", qemuUID, time.Since(step).Round(time.Millisecond))

	// 3. The sidecar: the real vfnet-binding with the metadata mount.
	pod.startSidecar(t, metaBinds)

	// 4. virt-launcher's part: convert, hooks, define, start.
	domOut := filepath.Join(pod.vols["private"], "domain.xml")
	step = time.Now()
	launcher := pod.start(t, "kernellauncher", pod.binds(computeVolumes), launcherEnv, layout.Launcher,
		"-vmi", layout.VMI, "-libvirt-socket", "/var/run/libvirt/libvirt-sock", "-hook-sidecars", "1",
		"-out", "/var/run/kubevirt-private/domain.xml")
	if err := launcher.wait(t, 10*time.Minute); err != nil {
		t.Fatalf("kernellauncher: %v\n%s\nlibvirtd:\n%s", err, launcher.out.String(), libvirtd.out.String())
	}
	started := time.Since(step)
	launched := time.Now()
	t.Logf("kernellauncher (define with hooks, start) took %s:\n%s", started.Round(time.Millisecond), launcher.out.String())
	if _, err := os.Stat(domOut); err != nil {
		t.Fatalf("kernellauncher wrote no live domain: %v", err)
	}

	// 5. QEMU holds the VF where libvirt put it, with the group open.
	lv := libvirtConn(t, pod.runtimeDir())
	alias := attach.Alias(vmIface)
	port := checkVFInQEMU(t, ctx, lv, alias)
	qemuPid := qemuHoldsGroup(t, pod.runtimeDir(), groups)
	// The launcher's start step is libvirt's DomainCreateWithFlags.
	if m := startStep.FindStringSubmatch(launcher.out.String()); m != nil {
		if d, err := time.ParseDuration(m[1]); err == nil {
			t.Logf("from DomainCreate to QMP listing the VF: %s (create %s, then %s)", (d + time.Since(launched)).Round(time.Millisecond), d.Round(time.Millisecond), time.Since(launched).Round(time.Millisecond))
		}
	}
	var lim unix.Rlimit
	if err := unix.Prlimit(qemuPid, unix.RLIMIT_MEMLOCK, nil, &lim); err == nil {
		t.Logf("QEMU pid %d RLIMIT_MEMLOCK %d/%d", qemuPid, lim.Cur, lim.Max)
	}
	// The VM's own kernel sees the VF and igbvf reads the MAC the claim set.
	// Its boot under nested TCG took 1.5-2 min on an idle machine and 5 min
	// inside a full make test (the unit tier compiling beside it).
	vfIn := regexp.MustCompile(` vfs [0-9a-f:.]+=` + regexp.QuoteMeta(vmMAC) + ` at`)
	took := pod.waitInner(t, ctx, 12*time.Minute, vfIn, "its VF with MAC "+vmMAC)
	t.Logf("the VM's igbvf reports %s %s after QMP listed the VF", vmMAC, took.Round(time.Second))
	return &vmRun{m: m, pf: pf, vf: vf, before: before, dir: dir, drv: drv, ref: ref, groups: groups, metaBinds: metaBinds,
		pod: pod, lv: lv, alias: alias, port: port, vfIn: vfIn}
}

// attacher is vfnet's production attach (driver/migration/attach) as the
// driver builds it, and the request for the VM's VF in pod podUID.
func (r *vmRun) attacher(t *testing.T) (attach.Attacher, func(podUID string) attach.Request) {
	t.Helper()
	src, err := pciaddr.Parse(r.vf.Address)
	if err != nil {
		t.Fatal(err)
	}
	a := attach.Attacher{Dialer: attach.SessionDialer{}, Memlock: attach.ProcMemlock{ProcRoot: "/proc", Limits: attach.Prlimit{}}, PodsDir: r.pod.podsDir}
	return a, func(podUID string) attach.Request {
		return attach.Request{PodUID: podUID, Domain: domainName, Hostdevs: []attach.Hostdev{{Interface: vmIface, Source: src}}}
	}
}

// teardown destroys the domain, stops the pod and unprepares: the VF is
// back on igbvf as it was.
func (r *vmRun) teardown(t *testing.T, ctx context.Context) {
	t.Helper()
	step := time.Now()
	destroyDomain(t, ctx, r.lv)
	t.Logf("domain destroyed in %s", time.Since(step).Round(time.Millisecond))
	r.pod.stopAll(t)
	r.pod.procs = nil
	// libvirtd started virtlogd for the session; it goes with the pod.
	for _, p := range processesNamed("virtlogd") {
		_ = syscall.Kill(p, syscall.SIGTERM)
	}
	waitFor(t, ctx, r.drv.exited, "no libvirtd, virtlogd or QEMU left", func() bool {
		return len(processesNamed("libvirtd", "virtlogd", "qemu-system-x86")) == 0
	})
	if err := r.drv.unprepare(ctx, r.ref); err != nil {
		t.Fatal(err)
	}
	r.m.checkRestored(t, r.pf, r.vf, r.before, false)
	r.drv.stop(t)
}

// migrationTarget is a migration's target half while the VF is out of
// the source (issue 21): a second launcher pod with its own libvirtd,
// sidecar and virt-launcher's prepareMigrationTarget, whose domain comes
// from the source's migratable XML (v1.9.0 migratableDomXML) and has no
// VF; vfnet's attach puts the VF there. Changed for the guest: libvirt's
// incoming migration would start that XML's QEMU paused and fill it with
// the source's state; here it boots (the firmware numbers the root ports'
// buses, which QMP needs to list the VF) and no memory moves, which vfnet
// does not touch. The source is paused meanwhile, as libvirt pauses it at
// the switch-over, and resumed after, as after a failed migration; the
// target goes, which releases the VF for the source's re-attach.
func (r *vmRun) migrationTarget(t *testing.T, ctx context.Context, a attach.Attacher, req func(string) attach.Request) {
	t.Helper()
	srcDom, _, _ := liveDomain(t, r.lv)
	migratable, err := r.lv.DomainGetXMLDesc(srcDom, libvirt.DomainXMLMigratable)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.lv.DomainSuspend(srcDom); err != nil {
		t.Fatal(err)
	}
	paused := time.Now()
	logdsBefore := processesNamed("virtlogd")
	tgt := newLauncherPod(t, r.pod.podsDir, targetPodUID)
	tgt.linkKernelFiles(t)
	tgt.startLibvirtd(t, ctx)
	tgt.startSidecar(t, r.metaBinds)
	prep := tgt.start(t, "kernellauncher-target", tgt.binds(computeVolumes), launcherEnv, layout.Launcher,
		"-vmi", layout.VMI, "-migration-target", "-hook-sidecars", "1")
	if err := prep.wait(t, 5*time.Minute); err != nil {
		t.Fatalf("kernellauncher -migration-target: %v\n%s", err, prep.out.String())
	}
	t.Logf("migration target prepared:\n%s", prep.out.String())
	tlv := libvirtConn(t, tgt.runtimeDir())
	// Defined, not transient: KubeVirt migrates with MIGRATE_PERSIST_DEST.
	step := time.Now()
	tdom, err := tlv.DomainDefineXML(migratable)
	if err != nil {
		t.Fatalf("define the target domain from the source's migratable XML: %v", err)
	}
	if err := tlv.DomainCreate(tdom); err != nil {
		t.Fatalf("start the target domain: %v", err)
	}
	targetStart := time.Since(step)
	_, td, traw := liveDomain(t, tlv)
	if vfHostdev(td, r.alias) != nil {
		t.Fatalf("the source's migratable XML still has hostdev %s after the detach", r.alias)
	}
	targetFree := freeRootPorts(td, traw)
	step = time.Now()
	targetAttach, targetPort := attachVF(t, ctx, a, req(targetPodUID), tlv, tgt, r.groups, targetFree, "the migration target")
	t.Logf("migration target: define and start %s; free root ports %v; vfnet's attach %s, QMP lists the VF behind root port %d %s after the attach began",
		targetStart.Round(time.Millisecond), targetFree, targetAttach.Round(time.Millisecond), targetPort, time.Since(step).Round(time.Millisecond))
	destroyDomain(t, ctx, tlv)
	tgt.stopAll(t)
	tgt.procs = nil
	for _, p := range processesNamed("virtlogd") {
		if !slices.Contains(logdsBefore, p) {
			_ = syscall.Kill(p, syscall.SIGTERM)
		}
	}
	if err := r.lv.DomainResume(srcDom); err != nil {
		t.Fatal(err)
	}
	t.Logf("the migration target's whole phase (second pod, its domain, the attach, its teardown): %s", time.Since(paused).Round(time.Millisecond))
}

// computeVolumes are the compute container's volumes, launcherEnv its
// environment (KubeVirt v1.9.0's non-root virt-launcher: libvirt's session
// directories in the private volume and /var/run).
var (
	computeVolumes = []string{"private", "public", "ephemeral-disks", "libvirt-runtime", "hook-sidecar-sockets", "kernel-boot-volume"}
	launcherEnv    = []string{"XDG_CACHE_HOME=/var/run/kubevirt-private", "XDG_CONFIG_HOME=/var/run/kubevirt-private", "XDG_RUNTIME_DIR=/var/run", "HOME=/var/run/kubevirt-private", "USER=qemu"}
)

// startSidecar starts the real vfnet-binding with the claim's metadata
// mount. Its container mounts its own subdirectory of the hooks volume
// (subPath hook-sidecar-0); the hook manager looks in each subdirectory.
func (p *launcherPod) startSidecar(t *testing.T, metaBinds []bind) {
	t.Helper()
	sidecarDir := filepath.Join(p.vols["hook-sidecar-sockets"], "hook-sidecar-0")
	if err := os.Mkdir(sidecarDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(sidecarDir, qemuUID, qemuUID); err != nil {
		t.Fatal(err)
	}
	p.start(t, "vfnet-binding", append(slices.Clone(metaBinds), bind{Source: sidecarDir, Target: podVolumes["hook-sidecar-sockets"]}),
		[]string{"NETWORK_BINDING_PLUGIN_NAME=vfnet"}, layout.Binding)
	warmSidecar(t, sidecarDir)
}

// warmSidecar waits for the binding's socket and asks it Info once.
// KubeVirt's hook manager gives the first Info call one second
// (pkg/hooks/manager.go processSideCarSocket) and fails the launcher when
// it runs out; a freshly started Go process in this TCG guest on a loaded
// host can take longer than that to answer its first call (rehearsal of
// 2026-12-06: served 4 ms after the call arrived, 6.6 s after it started
// listening), which on a real node it does in milliseconds.
func warmSidecar(t *testing.T, dir string) {
	t.Helper()
	var sock string
	deadline := time.Now().Add(2 * time.Minute)
	for sock == "" {
		ents, _ := os.ReadDir(dir)
		for _, e := range ents {
			if strings.HasSuffix(e.Name(), ".sock") {
				sock = filepath.Join(dir, e.Name())
			}
		}
		if sock == "" {
			if time.Now().After(deadline) {
				t.Fatalf("vfnet-binding made no socket in %s within 2 minutes", dir)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	// The kubelet-length path does not fit sun_path: dial it through an
	// O_PATH descriptor of its directory, as the driver's attach does.
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = unix.Close(fd) }()
	short := fmt.Sprintf("/proc/self/fd/%d/%s", fd, filepath.Base(sock))
	conn, err := grpc.NewClient("unix://"+short, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.WaitForReady(true)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	start := time.Now()
	if _, err := hooksinfo.NewInfoClient(conn).Info(ctx, &hooksinfo.InfoParams{}); err != nil {
		t.Fatalf("vfnet-binding's first Info call: %v", err)
	}
	t.Logf("vfnet-binding answered its first Info call in %s", time.Since(start).Round(time.Millisecond))
}

// linkKernelFiles puts the VM's kernel and initramfs into the pod's
// kernel-boot volume, as the kernel-boot container's init container
// copies them there. They are on the guest's root file system, which the
// kubelet's pods dir is on too.
func (p *launcherPod) linkKernelFiles(t *testing.T) {
	t.Helper()
	dir := filepath.Join(p.vols["kernel-boot-volume"], layout.VMKernelDir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{layout.InnerKernel, layout.InnerInitrd} {
		if err := os.Link(filepath.Join(layout.InnerDir, f), filepath.Join(dir, f)); err != nil {
			t.Fatal(err)
		}
	}
}

// startLibvirtd starts the pod's session libvirtd as uid 107 with
// virt-launcher's configuration (v1.9.0 cmd/virt-launcher virtqemud.conf,
// and qemu.conf at the non-root path) and, once it listens, raises its
// locked-memory limit as virt-handler does before a VMI with VFIO devices
// starts or receives a migration (v1.9.0 pkg/hypervisor/kvm
// AdjustResources); QEMU inherits it.
func (p *launcherPod) startLibvirtd(t *testing.T, ctx context.Context) *podProc {
	t.Helper()
	writeOwned(t, filepath.Join(p.vols["libvirt-runtime"], "libvirtd.conf"), "listen_tls = 0\nlisten_tcp = 0\nlog_outputs = \"1:stderr\"\n")
	writeOwned(t, filepath.Join(p.vols["private"], "libvirt", "qemu.conf"),
		"stdio_handler = \"logd\"\nvnc_listen = \"0.0.0.0\"\nvnc_tls = 0\nvnc_sasl = 0\nuser = \"qemu\"\ngroup = \"qemu\"\ndynamic_ownership = 1\nremember_owner = 0\nnamespaces = [ ]\ncgroup_controllers = [ ]\n")
	others := processesNamed("libvirtd")
	libvirtd := p.startSpec(t, "libvirtd", containerSpec{Binds: p.binds(computeVolumes), UID: qemuUID, Env: launcherEnv, Reaper: true,
		Argv: []string{"/usr/sbin/libvirtd", "-f", "/var/run/libvirt/libvirtd.conf"}})
	sock := filepath.Join(p.runtimeDir(), "libvirt-sock")
	waitFor(t, ctx, libvirtd.exited, "libvirtd's socket", func() bool { _, err := os.Stat(sock); return err == nil })
	// Debian ships libvirtd, whose session socket is libvirt-sock; KubeVirt's
	// virtqemud listens on virtqemud-sock in the same directory, the name
	// vfnet's attach dials.
	if err := os.Symlink("libvirt-sock", filepath.Join(p.runtimeDir(), attach.SocketName)); err != nil {
		t.Fatal(err)
	}
	var mine []int
	for _, pid := range processesNamed("libvirtd") {
		if !slices.Contains(others, pid) {
			mine = append(mine, pid)
		}
	}
	if len(mine) != 1 {
		t.Fatalf("want one new libvirtd process, found %v (others %v)", mine, others)
	}
	memlock := uint64(parseMi(t, layout.VMMemory)) + attach.VFIOMemlockOverhead
	if err := unix.Prlimit(mine[0], unix.RLIMIT_MEMLOCK, &unix.Rlimit{Cur: memlock, Max: memlock}, nil); err != nil {
		t.Fatal(err)
	}
	return libvirtd
}

// attachVF runs vfnet's attach for req and checks that the domain's QEMU
// (reached through lv, in pod) lists the VF behind one of the root ports
// that were free, with the VFIO group open. It returns how long the attach
// took and the root port.
func attachVF(t *testing.T, ctx context.Context, a attach.Attacher, req attach.Request, lv *libvirt.Libvirt, pod *launcherPod, groups []string, free []uint, where string) (time.Duration, uint) {
	t.Helper()
	alias := attach.Alias(req.Hostdevs[0].Interface)
	start := time.Now()
	r, err := a.Attach(ctx, req)
	if err != nil {
		t.Fatalf("vfnet's attach on %s: %v", where, err)
	}
	took := time.Since(start)
	if len(r.Attached) != 1 || r.Attached[0] != alias {
		t.Fatalf("attach result on %s %+v; want %s attached", where, r, alias)
	}
	port := checkVFInQEMU(t, ctx, lv, alias)
	if !slices.Contains(free, port) {
		t.Errorf("on %s, the VF sits behind root port %d, which was not free (%v)", where, port, free)
	}
	qemuHoldsGroup(t, pod.runtimeDir(), groups)
	return took, port
}

// destroyDomain destroys the domain as virt-launcher does on a VMI's
// deletion. libvirt gives QEMU about 15 s to die after SIGKILL and then
// reports EBUSY although the kill goes on: a QEMU releasing a VFIO device
// under TCG can take longer. KubeVirt retries; so does this, until libvirt
// reports the domain shut off.
func destroyDomain(t *testing.T, ctx context.Context, lv *libvirt.Libvirt) {
	t.Helper()
	dom, err := lv.DomainLookupByName(domainName)
	if err != nil {
		t.Fatal(err)
	}
	for attempt := 1; ; attempt++ {
		err := lv.DomainDestroy(dom)
		state, _, serr := lv.DomainGetState(dom, 0)
		if serr == nil && libvirt.DomainState(state) == libvirt.DomainShutoff {
			if err != nil {
				t.Logf("destroy attempt %d: %v (then shut off)", attempt, err)
			}
			return
		}
		if ctx.Err() != nil || attempt == 10 {
			t.Fatalf("destroy the domain: attempt %d: %v (state %d, %v)", attempt, err, state, serr)
		}
		t.Logf("destroy attempt %d: %v; trying again; QEMU: %s", attempt, err, procState(processesNamed("qemu-system-x86")))
		time.Sleep(2 * time.Second)
	}
}

// procState says where each process is: its state and kernel stack.
func procState(pids []int) string {
	var b strings.Builder
	for _, pid := range pids {
		st, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
		state := regexp.MustCompile(`(?m)^State:\s+(.*)$`).FindSubmatch(st)
		stack, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stack", pid))
		wchan, _ := os.ReadFile(fmt.Sprintf("/proc/%d/wchan", pid))
		fmt.Fprintf(&b, "\npid %d state %s wchan %s\n%s", pid, state, wchan, stack)
		tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*", pid))
		for _, task := range tasks {
			ts, _ := os.ReadFile(task + "/stack")
			if len(ts) > 0 && !bytes.Equal(ts, stack) {
				fmt.Fprintf(&b, "thread %s:\n%s", filepath.Base(task), ts)
			}
		}
	}
	return b.String()
}

var startStep = regexp.MustCompile(`VFNET-LAUNCHER step start (\S+)`)

// processesNamed lists the pids whose comm starts with one of names.
func processesNamed(names ...string) []int {
	var pids []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		comm, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "comm"))
		for _, n := range names {
			if strings.HasPrefix(strings.TrimSpace(string(comm)), n) {
				pids = append(pids, pid)
			}
		}
	}
	return pids
}

func writeOwned(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{filepath.Dir(path), path} {
		if err := os.Chown(p, qemuUID, qemuUID); err != nil {
			t.Fatal(err)
		}
	}
}

func parseMi(t *testing.T, q string) int64 {
	t.Helper()
	n, err := strconv.ParseInt(strings.TrimSuffix(q, "Mi"), 10, 64)
	if err != nil || !strings.HasSuffix(q, "Mi") {
		t.Fatalf("memory %q: want <n>Mi", q)
	}
	return n << 20
}
