package app_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/vfnet-io/vfnet/driver/checkpoint"
	"github.com/vfnet-io/vfnet/driver/discovery"
	"github.com/vfnet-io/vfnet/pkg/contract/pciaddr"
	"github.com/vfnet-io/vfnet/test/lib/controlplane"
	"github.com/vfnet-io/vfnet/test/lib/simhost"
	"github.com/vfnet-io/vfnet/test/lib/syncbuf"
)

// driverProc is one running vfnet-driver instance (one DaemonSet pod of a
// rolling update) and the kubelet's connection to it.
type driverProc struct {
	name string
	uid  string
	cmd  *exec.Cmd
	logs *syncbuf.Buffer
	done chan error
	dra  drapb.DRAPluginClient
	dead atomic.Bool
	// inflight counts the kubelet's calls in progress; failed counts the
	// calls that failed and were retried through another instance.
	inflight, failed atomic.Int32
}

var (
	digestRe = regexp.MustCompile(`"(?:Published ResourceSlices|Rescan changed nothing)".* digest="([0-9a-f]+)"`)
	leadRe   = "This vfnet-driver runs the task"
	waitRe   = "Another vfnet-driver on this node runs the task; waiting to take over"
)

// digestsSince returns the digests the instance logged after offset in its
// log.
func (d *driverProc) digestsSince(offset int) []string {
	s := d.logs.String()
	if offset > len(s) {
		offset = len(s)
	}
	var out []string
	for _, m := range digestRe.FindAllStringSubmatch(s[offset:], -1) {
		out = append(out, m[1])
	}
	return out
}

// rollingNode is one simulated node served by several driver instances.
type rollingNode struct {
	t                       *testing.T
	bin, kubeconfig, node   string
	root, cfg, sock, procFS string
}

func (n *rollingNode) start(name, uid string) *driverProc {
	t := n.t
	t.Helper()
	d := &driverProc{name: name, uid: uid, logs: &syncbuf.Buffer{}, done: make(chan error, 1)}
	d.cmd = exec.Command(n.bin, "--simulate", "--kubeconfig", n.kubeconfig, "--node-name", n.node,
		"--sysfs-root", n.root, "--config", n.cfg, "--rescan-interval", "1s", "--pod-uid", uid,
		"--registrar-dir", filepath.Join(n.sock, "reg"), "--plugin-dir", filepath.Join(n.sock, "plg"),
		"--cdi-root", filepath.Join(n.sock, "cdi"), "--kubelet-pods-dir", filepath.Join(n.sock, "pods"),
		"--proc-root", n.procFS, "-v", "4")
	d.cmd.Stdout, d.cmd.Stderr = d.logs, d.logs
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { d.done <- d.cmd.Wait() }()
	t.Cleanup(func() {
		if !d.dead.Load() {
			_ = d.cmd.Process.Kill()
			<-d.done
		}
		if t.Failed() {
			t.Logf("%s log (last 6000 bytes):\n%s", name, tailString(d.logs.String(), 6000))
		}
	})
	// Register it as the kubelet does: its own registration socket (named
	// after the pod UID), GetInfo, then its own DRA socket.
	reg := filepath.Join(n.sock, "reg", discovery.DriverName+"-"+uid+"-reg.sock")
	n.waitFor(d, "registration socket "+reg, func() bool { _, err := os.Stat(reg); return err == nil })
	rc := registerapi.NewRegistrationClient(dialUnix(t, reg))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// As the kubelet's blocking dial: the socket file appears at bind(2),
	// a moment before listen(2) accepts.
	info, err := rc.GetInfo(ctx, &registerapi.InfoRequest{}, grpc.WaitForReady(true))
	if err != nil {
		t.Fatalf("%s: GetInfo: %v", name, err)
	}
	if _, err := rc.NotifyRegistrationStatus(ctx, &registerapi.RegistrationStatus{PluginRegistered: true}); err != nil {
		t.Fatalf("%s: NotifyRegistrationStatus: %v", name, err)
	}
	d.dra = drapb.NewDRAPluginClient(dialUnix(t, info.Endpoint))
	n.waitFor(d, "the first publish", func() bool { return len(d.digestsSince(0)) > 0 })
	return d
}

func (n *rollingNode) waitFor(d *driverProc, what string, cond func() bool) {
	n.t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for !cond() {
		if d != nil {
			select {
			case err := <-d.done:
				n.t.Fatalf("%s exited while waiting for %s: %v\n%s", d.name, what, err, tailString(d.logs.String(), 4000))
			default:
			}
		}
		if time.Now().After(deadline) {
			n.t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// sameSlices waits until each instance has scanned the host twice since
// now (so at least one whole scan saw the current host) and checks that
// the latest digests are equal: both publish identical slices.
func (n *rollingNode) sameSlices(insts ...*driverProc) {
	n.t.Helper()
	marks := make([]int, len(insts))
	for i, d := range insts {
		marks[i] = len(d.logs.String())
	}
	var last []string
	for i, d := range insts {
		n.waitFor(d, d.name+" to rescan twice", func() bool { return len(d.digestsSince(marks[i])) >= 2 })
		ds := d.digestsSince(marks[i])
		last = append(last, ds[len(ds)-1])
	}
	for i := range last {
		if last[i] != last[0] {
			n.t.Fatalf("instances publish different slices: %s digest %s, %s digest %s", insts[0].name, last[0], insts[i].name, last[i])
		}
	}
}

// kill SIGKILLs the instance (safe from any goroutine).
func (d *driverProc) kill(t *testing.T) {
	d.dead.Store(true)
	if err := d.cmd.Process.Kill(); err != nil {
		t.Error(err)
	}
	<-d.done
}

func dialUnix(t *testing.T, path string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func tailString(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// vfStates is every VF as prepare changes it: driver, override, link.
func vfStates(t *testing.T, h *simhost.Host) map[string]string {
	t.Helper()
	pfs, err := h.Sysfs().Discover(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, pf := range pfs {
		for _, vf := range pf.VFs {
			ov, err := os.ReadFile(h.Sysfs().Path("bus/pci/devices/" + vf.Address + "/driver_override"))
			if err != nil {
				t.Fatal(err)
			}
			link, err := h.VFState(pf.Uplink(), vf.Index)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := json.Marshal(link)
			out[vf.Address] = fmt.Sprintf("driver=%s override=%s link=%s netdevs=%v", vf.Driver, strings.TrimSpace(string(ov)), b, vf.NetDevs)
		}
	}
	return out
}

func diffStates(want, got map[string]string) string {
	var out []string
	for k, v := range want {
		if got[k] != v {
			out = append(out, fmt.Sprintf("%s: %s, want %s", k, got[k], v))
		}
	}
	sort.Strings(out)
	return strings.Join(out, "\n")
}

func checkpointClaims(t *testing.T, path string) []string {
	t.Helper()
	f, err := checkpoint.Store{Path: path}.Load()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for uid := range f.Claims {
		out = append(out, string(uid))
	}
	sort.Strings(out)
	return out
}

// createClaim stores an allocated claim for one VF with a VFConfig.
func createClaim(t *testing.T, c kubernetes.Interface, node, name, device string, i int) *drapb.Claim {
	t.Helper()
	ctx := context.Background()
	claim := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
			Name: "vf", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "vfnet"}}}}}}
	created, err := c.ResourceV1().ResourceClaims("default").Create(ctx, claim, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	params := fmt.Sprintf(`{"apiVersion":"vfnet.io/v1alpha1","kind":"VFConfig","vlan":%d,"mac":"02:00:00:00:%02x:%02x","trust":true}`, 100+i, i/256, i%256)
	created.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{
		Results: []resourceapi.DeviceRequestAllocationResult{{Request: "vf", Driver: discovery.DriverName, Pool: node, Device: device}},
		Config: []resourceapi.DeviceAllocationConfiguration{{Source: resourceapi.AllocationConfigSourceClaim,
			DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
				Driver: discovery.DriverName, Parameters: runtime.RawExtension{Raw: []byte(params)}}}}},
	}}
	if _, err := c.ResourceV1().ResourceClaims("default").UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	return &drapb.Claim{Namespace: "default", Name: name, Uid: string(created.UID)}
}

// call runs one kubelet call for claim through the preferred instance and,
// like the kubelet, retries through the other when it fails (a killed
// instance refuses the connection; a claim another instance was preparing
// when it died is finished by this one).
func call(insts []*driverProc, pref int, claim *drapb.Claim, prepare bool) error {
	var errs []error
	for attempt := range 12 {
		d := insts[(pref+attempt)%len(insts)]
		if d.dead.Load() {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
		d.inflight.Add(1)
		var msg string
		if prepare {
			resp, err := d.dra.NodePrepareResources(ctx, &drapb.NodePrepareResourcesRequest{Claims: []*drapb.Claim{claim}})
			if err != nil {
				msg = "rpc: " + err.Error()
			} else if r := resp.Claims[claim.Uid]; r == nil {
				msg = "no result"
			} else {
				msg = r.Error
			}
		} else {
			resp, err := d.dra.NodeUnprepareResources(ctx, &drapb.NodeUnprepareResourcesRequest{Claims: []*drapb.Claim{claim}})
			if err != nil {
				msg = "rpc: " + err.Error()
			} else if r := resp.Claims[claim.Uid]; r == nil {
				msg = "no result"
			} else {
				msg = r.Error
			}
		}
		cancel()
		d.inflight.Add(-1)
		if msg == "" {
			return nil
		}
		d.failed.Add(1)
		errs = append(errs, fmt.Errorf("%s: %s", d.name, msg))
	}
	return errors.Join(errs...)
}

// TestRollingUpdateTwoDrivers runs two real vfnet-driver processes
// (kubeletplugin.RollingUpdate, two pod UIDs) on one plugin directory and
// one simulated host against a real API server, and drives them as the
// kubelet does through their own registration and DRA sockets: a claim
// prepared through one is unprepared through the other, claims are
// prepared and unprepared concurrently through both while one is
// SIGKILLed, and a replacement instance joins. Every VF ends restored, no
// checkpoint entry comes back, exactly one instance at a time runs the
// migration watcher, and both publish identical slices.
func TestRollingUpdateTwoDrivers(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a control plane and three driver processes")
	}
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("needs the go tool to build vfnet-driver")
	}
	plane := startPlane(t)
	client, err := plane.AdminClient()
	if err != nil {
		t.Fatal(err)
	}
	const node = "node-roll"
	if _, err := client.CoreV1().Nodes().Create(context.Background(), &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	bin := buildCmd(t, "vfnet-driver-sim")
	pf1 := simhost.E810PF("0000:3b:00.1", "enp59s0f1", 16)
	pf1.VFOffset = 16 + 128 - 1
	h, err := simhost.Build(simhost.TempDir(t), simhost.Spec{PFs: []simhost.PFSpec{simhost.E810PF("0000:3b:00.0", "enp59s0f0", 16), pf1}})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close() // the test reads the host; the drivers open it themselves
	sock, err := os.MkdirTemp("", "vf")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(sock)
	for _, d := range []string{"reg", "plg", "cdi"} {
		if err := os.Mkdir(filepath.Join(sock, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	n := &rollingNode{t: t, bin: bin, kubeconfig: plane.AdminKubeconfig, node: node, root: h.Root(), sock: sock, procFS: h.ProcRoot(),
		cfg: writeFile(t, "apiVersion: vfnet.io/v1alpha1\nkind: NodeConfig\npfs:\n- pfName: enp59s0f0\n  network: physnet-a\n- pfName: enp59s0f1\n  network: physnet-a\n")}
	cpPath := filepath.Join(sock, "plg", checkpoint.FileName)
	initial := vfStates(t, h)

	pfs, err := h.Sysfs().Discover(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var devices []string
	var bdfs []string
	for _, pf := range pfs {
		for _, vf := range pf.VFs {
			name, err := pciaddr.DeviceName(vf.Address)
			if err != nil {
				t.Fatal(err)
			}
			devices, bdfs = append(devices, name), append(bdfs, vf.Address)
		}
	}
	if len(devices) != 32 {
		t.Fatalf("%d VFs, want 32", len(devices))
	}

	a := n.start("instance A", "pod-a-0001")
	b := n.start("instance B", "pod-b-0002")
	insts := []*driverProc{a, b}
	// One migration watcher: the first instance leads, the second waits.
	n.waitFor(b, "B waiting for the migration lead", func() bool { return strings.Contains(b.logs.String(), waitRe) })
	if !strings.Contains(a.logs.String(), leadRe) || strings.Contains(b.logs.String(), leadRe) {
		t.Fatalf("migration lead: A leads %v, B leads %v; want A only", strings.Contains(a.logs.String(), leadRe), strings.Contains(b.logs.String(), leadRe))
	}

	// Prepared through A, used by a VM (QEMU holds its group node open),
	// unprepared through B.
	c0 := createClaim(t, client, node, "c00", devices[0], 0)
	if err := call(insts, 0, c0, true); err != nil {
		t.Fatal(err)
	}
	fn, err := h.Sysfs().Function(bdfs[0])
	if err != nil || fn.Driver != "vfio-pci" {
		t.Fatalf("VF %s after prepare through A: %+v %v", bdfs[0], fn, err)
	}
	release, err := h.HoldVFIOGroup(fn.IOMMUGroup, 4242, "qemu-kvm")
	if err != nil {
		t.Fatal(err)
	}
	// B knows the VF is vfnet's (from the checkpoint), so it keeps offering
	// it exactly as A does.
	n.sameSlices(a, b)
	if err := release(); err != nil {
		t.Fatal(err)
	}
	if err := call(insts, 1, c0, false); err != nil {
		t.Fatal(err)
	}
	assertAllReleased(t, "after prepare through A and unprepare through B", initial, vfStates(t, h), cpPath)

	// The storm: claim i is prepared through instance i%2 and unprepared
	// through the other, all at once; A is killed once a third of the
	// prepares are done.
	const storm = 30
	claims := make([]*drapb.Claim, storm)
	for i := range storm {
		claims[i] = createClaim(t, client, node, fmt.Sprintf("s%02d", i), devices[1+i], 1+i)
	}
	var prepared, inflight atomic.Int32
	var killOnce sync.Once
	var wg sync.WaitGroup
	errs := make([]error, storm)
	for i := range storm {
		wg.Go(func() {
			if err := call(insts, i%2, claims[i], true); err != nil {
				errs[i] = fmt.Errorf("prepare %s: %w", claims[i].Name, err)
				return
			}
			if prepared.Add(1) == storm/3 {
				killOnce.Do(func() {
					inflight.Store(a.inflight.Load())
					a.kill(t)
				})
			}
			if err := call(insts, (i+1)%2, claims[i], false); err != nil {
				errs[i] = fmt.Errorf("unprepare %s: %w", claims[i].Name, err)
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if !a.dead.Load() {
		t.Fatal("instance A was not killed during the storm")
	}
	t.Logf("A was SIGKILLed with %d kubelet calls in flight; %d calls through A failed and were retried through B", inflight.Load(), a.failed.Load())
	assertAllReleased(t, "after the storm", initial, vfStates(t, h), cpPath)
	// B took over the migration watcher from the dead A.
	n.waitFor(b, "B to take over the migration lead", func() bool { return strings.Contains(b.logs.String(), leadRe) })

	// The rolling update goes on: a replacement instance joins B.
	a2 := n.start("instance A2", "pod-a-0003")
	insts = []*driverProc{a2, b}
	n.waitFor(a2, "A2 waiting for the migration lead", func() bool { return strings.Contains(a2.logs.String(), waitRe) })
	if strings.Contains(a2.logs.String(), leadRe) {
		t.Fatal("A2 runs the migration watcher while B does")
	}
	// No entry comes back: B, which prepared half of the storm's claims,
	// writes the checkpoint again.
	last := createClaim(t, client, node, "last", devices[31], 31)
	if err := call(insts, 1, last, true); err != nil {
		t.Fatal(err)
	}
	if got := checkpointClaims(t, cpPath); len(got) != 1 || got[0] != last.Uid {
		t.Fatalf("checkpoint holds %v, want only %s", got, last.Uid)
	}
	n.sameSlices(a2, b)
	if err := call(insts, 0, last, false); err != nil {
		t.Fatal(err)
	}
	assertAllReleased(t, "at the end", initial, vfStates(t, h), cpPath)
	ents, err := os.ReadDir(filepath.Join(sock, "cdi"))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), ".") {
			t.Errorf("CDI spec %s left behind", e.Name())
		}
	}
	// The pool in the API server: one generation, every VF.
	n.waitFor(nil, "one pool generation with 32 devices", func() bool {
		s, d, _ := poolState(context.Background(), t, client, node)
		return s == 1 && d == 32
	})
	for _, d := range []*driverProc{a2, b} {
		if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		if err := <-d.done; err != nil {
			t.Errorf("%s exit after SIGTERM: %v", d.name, err)
		}
		d.dead.Store(true)
	}
}

// startPlane starts a control plane, or fails naming how to build its
// binaries.
func startPlane(t *testing.T) *controlplane.Plane {
	t.Helper()
	if _, err := controlplane.BinDir(t.Context()); err != nil {
		t.Fatalf("control-plane binaries unavailable: %v (make k8s-bin builds them)", err)
	}
	return controlplane.StartForTest(t, controlplane.Options{})
}

// assertAllReleased fails t unless every VF is as it was before the test and
// the checkpoint holds no claim.
func assertAllReleased(t *testing.T, when string, initial, now map[string]string, cpPath string) {
	t.Helper()
	if d := diffStates(initial, now); d != "" {
		t.Fatalf("%s: VFs not restored:\n%s", when, d)
	}
	if got := checkpointClaims(t, cpPath); len(got) != 0 {
		t.Fatalf("%s: checkpoint keeps %v", when, got)
	}
}
