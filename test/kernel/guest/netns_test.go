//go:build kernelguest

package guest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/vfnet-io/vfnet/driver/discovery"
	"github.com/vfnet-io/vfnet/driver/kernel/sysfs"
	"github.com/vfnet-io/vfnet/driver/kernel/vflink"
	"github.com/vfnet-io/vfnet/pkg/contract/pciaddr"
	"github.com/vfnet-io/vfnet/test/kernel/layout"
)

// podNetns makes a network namespace like a pod's without host networking
// (only its own loopback) and returns a file naming it. A proxy listening
// on the namespace's loopback at listen forwards to target from the guest's
// own namespace: the driver in the pod reaches the API server at the
// address its kubeconfig (and certificate) names.
func podNetns(t *testing.T, listen, target string) string {
	t.Helper()
	path := filepath.Join("/run", "netns-"+strings.ReplaceAll(t.Name(), "/", "-"))
	if err := os.WriteFile(path, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	type made struct {
		ln  net.Listener
		err error
	}
	ch := make(chan made, 1)
	go func() {
		// This thread enters the new namespace and is never unlocked:
		// the runtime ends it with the goroutine instead of reusing it.
		runtime.LockOSThread()
		ch <- func() made {
			if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
				return made{err: fmt.Errorf("unshare a network namespace: %w", err)}
			}
			if err := unix.Mount(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()), path, "", unix.MS_BIND, ""); err != nil {
				return made{err: fmt.Errorf("keep the namespace at %s: %w", path, err)}
			}
			lo, err := netlink.LinkByName("lo")
			if err == nil {
				err = netlink.LinkSetUp(lo)
			}
			if err != nil {
				return made{err: fmt.Errorf("loopback up in the pod namespace: %w", err)}
			}
			ln, err := net.Listen("tcp", listen) // the socket belongs to this thread's namespace
			return made{ln: ln, err: err}
		}()
	}()
	r := <-ch
	t.Cleanup(func() { _ = unix.Unmount(path, unix.MNT_DETACH); os.Remove(path) })
	if r.err != nil {
		t.Fatal(r.err)
	}
	t.Cleanup(func() { r.ln.Close() })
	go func() {
		for {
			in, err := r.ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer in.Close()
				out, err := net.Dial("tcp", target)
				if err != nil {
					return
				}
				defer out.Close()
				go func() { _, _ = io.Copy(out, in); out.(*net.TCPConn).CloseWrite() }()
				_, _ = io.Copy(in, out)
			}()
		}
	}()
	return path
}

// apiClient talks to the harness's API server from the guest's namespace.
func (m *machine) apiClient(t *testing.T) (kubernetes.Interface, string) {
	t.Helper()
	if m.lay.APIServer == "" {
		t.Fatal("the harness started no API server for this case")
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", layout.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(cfg.Host)
	if err != nil {
		t.Fatal(err)
	}
	var d net.Dialer
	cfg.Dial = func(ctx context.Context, network, _ string) (net.Conn, error) {
		return d.DialContext(ctx, network, m.lay.APIServer)
	}
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return kube, u.Host
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

// driverProc is a real vfnet-driver process in a pod-like network
// namespace, registered with the test playing the kubelet.
type driverProc struct {
	cmd    *exec.Cmd
	exited chan error
	logs   *syncBuf
	dra    drapb.DRAPluginClient
	done   bool
}

// startDriver starts vfnet-driver in the network namespace ns with its
// directories under dir (the same dir for a restart) and registers it.
func (m *machine) startDriver(t *testing.T, ctx context.Context, ns, dir string) *driverProc {
	t.Helper()
	return m.startDriverWith(t, ctx, ns, dir, m.writeNodeConfig(t))
}

// startDriverWith is startDriver with the node config file cfg and extra
// flags.
func (m *machine) startDriverWith(t *testing.T, ctx context.Context, ns, dir, cfg string, extra ...string) *driverProc {
	t.Helper()
	regDir, pluginDir := filepath.Join(dir, "reg"), filepath.Join(dir, "plugin")
	for _, d := range []string{regDir, pluginDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	args := []string{layout.Driver, "--node-name", nodeName, "--kubeconfig", layout.Kubeconfig,
		"--sysfs-root", "/sys", "--dev-root", "/dev", "--config", cfg,
		"--registrar-dir", regDir, "--plugin-dir", pluginDir, "--cdi-root", filepath.Join(dir, "cdi"),
		"--kubelet-pods-dir", filepath.Join(dir, "pods"), "--host-netns", vflink.DefaultHostNetns}
	args = append(args, extra...)
	d := &driverProc{cmd: exec.Command("/proc/self/exe", append([]string{execInNetnsArg, ns}, args...)...),
		exited: make(chan error, 1), logs: &syncBuf{}}
	d.cmd.Stdout, d.cmd.Stderr = d.logs, d.logs
	regSock := filepath.Join(regDir, discovery.DriverName+"-reg.sock")
	_ = os.Remove(regSock) // a killed predecessor's; wait for the new one
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { d.exited <- d.cmd.Wait() }()
	t.Cleanup(func() {
		if !d.done {
			_ = d.cmd.Process.Kill()
			<-d.exited
		}
		if t.Failed() {
			t.Logf("vfnet-driver (pid %d) output:\n%s", d.cmd.Process.Pid, d.logs.String())
		}
	})
	waitFor(t, ctx, d.exited, "the registration socket "+regSock, func() bool { _, err := os.Stat(regSock); return err == nil })
	own, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", d.cmd.Process.Pid))
	host, _ := os.Readlink("/proc/1/ns/net")
	t.Logf("driver pid %d in %s, the PFs in %s", d.cmd.Process.Pid, own, host)
	if own == host || own == "" {
		t.Fatalf("the driver runs in network namespace %q, the host's is %q: want its own", own, host)
	}
	rc := registerapi.NewRegistrationClient(dialUnix(t, regSock))
	// As the kubelet's blocking dial: the socket file appears at bind(2),
	// a moment before listen(2) accepts.
	info, err := rc.GetInfo(ctx, &registerapi.InfoRequest{}, grpc.WaitForReady(true))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rc.NotifyRegistrationStatus(ctx, &registerapi.RegistrationStatus{PluginRegistered: true}); err != nil {
		t.Fatal(err)
	}
	d.dra = drapb.NewDRAPluginClient(dialUnix(t, info.Endpoint))
	return d
}

// kill SIGKILLs the driver.
func (d *driverProc) kill(t *testing.T) {
	t.Helper()
	if err := d.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-d.exited
	d.done = true
}

// stop SIGTERMs the driver, which must exit cleanly.
func (d *driverProc) stop(t *testing.T) {
	t.Helper()
	if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	d.done = true
	select {
	case err := <-d.exited:
		if err != nil {
			t.Errorf("vfnet-driver exited with %v after SIGTERM", err)
		}
	case <-time.After(time.Minute):
		_ = d.cmd.Process.Kill()
		<-d.exited
		t.Errorf("vfnet-driver did not stop within a minute of SIGTERM")
	}
}

func (d *driverProc) prepare(ctx context.Context, ref *drapb.Claim) (*drapb.NodePrepareResourceResponse, error) {
	pr, err := d.dra.NodePrepareResources(ctx, &drapb.NodePrepareResourcesRequest{Claims: []*drapb.Claim{ref}})
	if err != nil {
		return nil, err
	}
	res := pr.Claims[ref.Uid]
	if res == nil {
		return nil, fmt.Errorf("no result for claim %s", ref.Uid)
	}
	if res.Error != "" {
		return res, errors.New(res.Error)
	}
	return res, nil
}

func (d *driverProc) unprepare(ctx context.Context, ref *drapb.Claim) error {
	ur, err := d.dra.NodeUnprepareResources(ctx, &drapb.NodeUnprepareResourcesRequest{Claims: []*drapb.Claim{ref}})
	if err != nil {
		return err
	}
	if r := ur.Claims[ref.Uid]; r == nil || r.Error != "" {
		return fmt.Errorf("NodeUnprepareResources: %+v", r)
	}
	return nil
}

// waitPublished waits until a ResourceSlice of vfnet's offers devName.
func (d *driverProc) waitPublished(t *testing.T, ctx context.Context, kube kubernetes.Interface, devName string) {
	t.Helper()
	waitFor(t, ctx, d.exited, "a ResourceSlice with "+devName, func() bool {
		list, err := kube.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false
		}
		for _, s := range list.Items {
			for _, dev := range s.Spec.Devices {
				if dev.Name == devName && s.Spec.Driver == discovery.DriverName {
					return true
				}
			}
		}
		return false
	})
}

// apiClaim creates an allocated claim for vf with VFConfig params in the
// API server and returns the kubelet's reference to it.
func apiClaim(t *testing.T, ctx context.Context, kube kubernetes.Interface, name, params string, vf sysfs.VF) *drapb.Claim {
	t.Helper()
	return createAllocated(t, ctx, kube, claim(name, params, vf))
}

// createAllocated creates c (an allocated claim as claim() makes it) in the
// API server with its request and config in the spec, then allocates it.
func createAllocated(t *testing.T, ctx context.Context, kube kubernetes.Interface, c *resourceapi.ResourceClaim) *drapb.Claim {
	t.Helper()
	req := c.Status.Allocation.Devices.Results[0].Request
	c.Spec.Devices.Requests = []resourceapi.DeviceRequest{{Name: req, Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "vfnet"}}}
	c.Spec.Devices.Config = []resourceapi.DeviceClaimConfiguration{{DeviceConfiguration: c.Status.Allocation.Devices.Config[0].DeviceConfiguration}}
	status := c.Status
	c.Status = resourceapi.ResourceClaimStatus{}
	c.UID = ""
	created, err := kube.ResourceV1().ResourceClaims(c.Namespace).Create(ctx, c, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create claim: %v", err)
	}
	// The cases share the API server: a claim left allocated would, for one,
	// block the numvfs case's VF count change on that PF.
	t.Cleanup(func() {
		err := kube.ResourceV1().ResourceClaims(created.Namespace).Delete(context.Background(), created.Name, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("delete claim %s: %v", created.Name, err)
		}
	})
	created.Status = status
	if created, err = kube.ResourceV1().ResourceClaims(c.Namespace).UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("allocate claim: %v", err)
	}
	return &drapb.Claim{Namespace: created.Namespace, Name: created.Name, Uid: string(created.UID)}
}

// apiNode creates the node object the driver's slices belong to.
func apiNode(t *testing.T, ctx context.Context, kube kubernetes.Interface) {
	t.Helper()
	if _, err := kube.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("create node %s: %v", nodeName, err)
	}
}

// Case 6: the real vfnet-driver, in a network namespace of its own as in a
// pod without host networking, publishes the VFs and prepares a VF of a PF
// in the initial namespace through --host-netns, then unprepares it.
func TestDriverInOwnNetns(t *testing.T) {
	m := guest(t)
	kube, apiHost := m.apiClient(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	apiNode(t, ctx, kube)
	pf := m.pf(t, layout.RoleNUMA1)
	vf := pf.VFs[0]
	before := m.vfState(t, pf, vf)
	drv := m.startDriver(t, ctx, podNetns(t, apiHost, m.lay.APIServer), t.TempDir())

	// It publishes the VFs it can prepare: the PFs' netdevs are found
	// through the host namespace although its own has none of them.
	devName, err := pciaddr.DeviceName(vf.Address)
	if err != nil {
		t.Fatal(err)
	}
	drv.waitPublished(t, ctx, kube, devName)

	ref := apiClaim(t, ctx, kube, "netns", `{`+vfConfigHead+`,"mac":"02:00:00:00:06:01","vlan":61,"trust":true}`, vf)
	start := time.Now()
	res, err := drv.prepare(ctx, ref)
	if err != nil || len(res.Devices) != 1 {
		t.Fatalf("NodePrepareResources: %+v, %v", res, err)
	}
	t.Logf("prepared in %s: %v", time.Since(start).Round(time.Millisecond), res.Devices[0].CdiDeviceIds)
	m.checkPrepared(t, pf, vf, vflink.VFState{MAC: net.HardwareAddr{2, 0, 0, 0, 6, 1}, VLAN: 61, Trust: true, SpoofChk: before.Link.SpoofChk})
	if err := drv.unprepare(ctx, ref); err != nil {
		t.Fatal(err)
	}
	m.checkRestored(t, pf, vf, before, false)
	drv.stop(t)
}

// waitFor polls cond until it holds, the driver exits or ctx ends.
func waitFor(t *testing.T, ctx context.Context, exited chan error, what string, cond func() bool) {
	t.Helper()
	for !cond() {
		select {
		case err := <-exited:
			exited <- err
			t.Fatalf("vfnet-driver exited (%v) while waiting for %s", err, what)
		case <-ctx.Done():
			t.Fatalf("no %s: %v", what, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// syncBuf collects a child's output while it runs.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
