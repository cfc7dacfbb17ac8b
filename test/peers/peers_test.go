// Package peers compares vfnet with other DRA drivers on the same real
// control plane. It runs only with VFNET_BENCH_PEERS=1 (`make bench-peers`),
// never in `make test`.
//
// TestIdleMemoryVsExampleDriver measures the idle RSS of vfnet-driver and of
// kubernetes-sigs/dra-example-driver's kubelet plugin, each publishing for
// its own node against one kube-apiserver, read the same way and at the same
// moment: vfnet with 1024 and with 128 VFs, the peer with 128 devices (the
// most it can publish; see the test). The peer is built at run time from
// its source under $VFNET_CACHE/peers/dra-example-driver/src (default
// .cache/; fetch it as the skip message says); its dependencies come from
// the Go module proxy.
package peers

import (
	"context"
	"debug/buildinfo"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/vfnet-io/vfnet/driver/discovery"
	"github.com/vfnet-io/vfnet/internal/pfnetns"
	"github.com/vfnet-io/vfnet/internal/procmem"
	"github.com/vfnet-io/vfnet/internal/syncbuf"
	"github.com/vfnet-io/vfnet/pkg/shipbuild"
	"github.com/vfnet-io/vfnet/pkg/simhost"
	"github.com/vfnet-io/vfnet/test/controlplane"
)

const (
	envGate = "VFNET_BENCH_PEERS"
	// envPeerSrc overrides where the dra-example-driver source is.
	envPeerSrc = "VFNET_PEER_SRC"
	// envPeerDevices overrides how many devices the peer publishes.
	envPeerDevices = "VFNET_PEER_DEVICES"
	// envIdle is TestDriverOnAPIServer's: how long both idle after the
	// last publish before their RSS is read (default 10s).
	envIdle = "VFNET_IDLE_WAIT"

	peerDriver = "gpu.example.com"
	// peerMaxDevices is the most the peer can publish: its pool is one
	// slice, and a slice holds at most 128 devices.
	peerMaxDevices = 128
)

func cacheDir(t *testing.T) string {
	if c := os.Getenv("VFNET_CACHE"); c != "" {
		return c
	}
	root, err := controlplane.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(root, ".cache")
}

// peerSource is the dra-example-driver checkout, or a skip that says how to
// get one.
func peerSource(t *testing.T) string {
	src := os.Getenv(envPeerSrc)
	if src == "" {
		src = filepath.Join(cacheDir(t), "peers", "dra-example-driver", "src")
	}
	if _, err := os.Stat(filepath.Join(src, "cmd", "dra-example-kubeletplugin")); err != nil {
		t.Skipf("no dra-example-driver source in %s (%v); fetch it first:\n"+
			"  git clone --depth 1 https://github.com/kubernetes-sigs/dra-example-driver %s\n"+
			"(or set %s to a checkout)", src, err, src, envPeerSrc)
	}
	return src
}

// goBuild builds pkg in dir static (CGO_ENABLED=0; a cgo build also maps
// ld.so and libc) with flags.
func goBuild(t *testing.T, dir, out, pkg string, flags []string, env ...string) {
	t.Helper()
	args := append(append([]string{"build"}, flags...), "-o", out)
	cmd := exec.Command("go", append(args, pkg)...)
	cmd.Dir = dir
	cmd.Env = append(append(os.Environ(), shipbuild.Env()...), env...)
	start := time.Now()
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build %s in %s: %v\n%s", pkg, dir, err, b)
	}
	st, err := os.Stat(out)
	if err != nil {
		t.Fatal(err)
	}
	dra := "?"
	if bi, err := buildinfo.ReadFile(out); err == nil {
		for _, d := range bi.Deps {
			if d.Path == "k8s.io/dynamic-resource-allocation" {
				dra = d.Version
			}
		}
	}
	t.Logf("built %s in %v: %.1f MB, k8s.io/dynamic-resource-allocation %s", pkg, time.Since(start).Round(time.Second), float64(st.Size())/1e6, dra)
}

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// proc is one driver process under measurement.
type proc struct {
	name, node, driver string
	devices            int // expected in its pool
	metricsURL         string
	cmd                *exec.Cmd
	logs               syncbuf.Buffer
	done               chan error
}

func (p *proc) start(t *testing.T) {
	t.Helper()
	p.cmd.Stdout, p.cmd.Stderr = &p.logs, &p.logs
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p.done = make(chan error, 1)
	go func() { p.done <- p.cmd.Wait() }()
	t.Cleanup(func() {
		if p.cmd.ProcessState == nil {
			_ = p.cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			t.Logf("%s log:\n%s", p.name, p.logs.String())
		}
	})
}

// stop sends SIGTERM and waits up to 30 s for a clean exit.
func (p *proc) stop(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-p.done:
		if err != nil {
			t.Errorf("%s: exit after SIGTERM: %v", p.name, err)
		}
	case <-time.After(30 * time.Second):
		t.Errorf("%s did not stop within 30s of SIGTERM", p.name)
	}
}

// published counts the slices and devices of the newest generation of p's
// pool (pool name = node name for both drivers).
func (p *proc) published(ctx context.Context, c kubernetes.Interface) (int, int, error) {
	list, err := c.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
	if err != nil {
		return 0, 0, err
	}
	var gen int64
	for _, s := range list.Items {
		if s.Spec.Driver == p.driver && s.Spec.Pool.Name == p.node {
			gen = max(gen, s.Spec.Pool.Generation)
		}
	}
	slices, devices := 0, 0
	for _, s := range list.Items {
		if s.Spec.Driver == p.driver && s.Spec.Pool.Name == p.node && s.Spec.Pool.Generation == gen {
			slices++
			devices += len(s.Spec.Devices)
		}
	}
	return slices, devices, nil
}

func mib(kb int) float64 { return float64(kb) / 1024 }

// vfnetCmd runs vfnet-driver as TestDriverOnAPIServer starts it
// (simhost.LargeHost, 2 s rescans; unlike that test, no configuration edit
// and republish follows), with cfg as its node configuration and its
// directories under dir. shipped: bin is the shipped build, which reads the
// tree as a plain sysfs and finds the PF netdevs in a namespace of their own
// (internal/pfnetns); else it is vfnet-driver-sim, run with --simulate.
func vfnetCmd(t *testing.T, bin, kubeconfig string, p *proc, cfg, dir string, shipped bool) {
	t.Helper()
	h, err := simhost.Build(t.TempDir(), simhost.LargeHost())
	if err != nil {
		t.Fatal(err)
	}
	sysfs := h.Root()
	h.Close() // the driver opens it (or reads its tree) itself
	hostArgs := []string{"--simulate"}
	if shipped {
		ns, err := pfnetns.ForTree(t, sysfs)
		if err != nil {
			t.Fatal(err)
		}
		hostArgs = []string{"--host-netns", ns, "--dev-root", h.DevRoot()}
	}
	cfgFile := filepath.Join(t.TempDir(), "node.yaml")
	if err := os.WriteFile(cfgFile, []byte("apiVersion: vfnet.io/v1alpha1\nkind: NodeConfig\npfs:\n"+cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "reg"), 0o700); err != nil {
		t.Fatal(err)
	}
	health := freePort(t)
	p.metricsURL = fmt.Sprintf("http://127.0.0.1:%d/metrics", health)
	p.cmd = exec.Command(bin, append(hostArgs, "--kubeconfig", kubeconfig, "--node-name", p.node,
		"--sysfs-root", sysfs, "--config", cfgFile, "--rescan-interval", "2s",
		"--registrar-dir", filepath.Join(dir, "reg"), "--plugin-dir", filepath.Join(dir, "plg"), "--cdi-root", filepath.Join(dir, "cdi"),
		"--kubelet-pods-dir", filepath.Join(dir, "pods"), "--health-addr", fmt.Sprintf("127.0.0.1:%d", health))...)
}

// TestIdleMemoryVsExampleDriver: see the package comment. Three runs:
// -count=3.
//
// The example driver publishes its whole pool as one ResourceSlice, and the
// API server takes at most 128 devices in a slice: with NUM_DEVICES=1024
// every create is refused ("spec.devices: Too many: 1024: must have at most
// 128 items") and retried with backoff, forever. So the peer publishes 128
// devices, its largest pool, and a second vfnet-driver publishes the same
// 128 (VFs 0-127 of one PF) next to the 1024 one: the ratio at an equal
// device count is vfnet-128 / peer. VFNET_PEER_DEVICES changes the peer's
// count (with VFNET_PEER_SRC naming a build that splits its pool).
func TestIdleMemoryVsExampleDriver(t *testing.T) {
	if os.Getenv(envGate) != "1" {
		t.Skipf("benchmark against other DRA drivers; runs with %s=1 (make bench-peers)", envGate)
	}
	src := peerSource(t)
	if _, err := controlplane.BinDir(t.Context()); err != nil {
		t.Skipf("control-plane binaries unavailable: %v", err)
	}
	peerDevices := peerMaxDevices
	if s := os.Getenv(envPeerDevices); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n <= 0 {
			t.Fatalf("%s=%q: want a positive number", envPeerDevices, s)
		}
		peerDevices = n
	}
	idle := 10 * time.Second
	if s := os.Getenv(envIdle); s != "" {
		var err error
		if idle, err = time.ParseDuration(s); err != nil {
			t.Fatalf("%s: %v", envIdle, err)
		}
	}

	// Both built before the plane starts, so neither build competes with
	// the measurement.
	bins := t.TempDir()
	root, err := controlplane.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	// The shipped build, unless no network namespace can be made for the
	// PF netdevs (not root): then the one with the simulator, --simulate.
	vfnetName, shipped := "vfnet-driver", true
	if _, err := pfnetns.New(t); err != nil {
		t.Logf("measuring vfnet-driver-sim --simulate, not the shipped build: no network namespace: %v", err)
		vfnetName, shipped = "vfnet-driver-sim", false
	}
	vfnetBin := filepath.Join(bins, vfnetName)
	goBuild(t, root, vfnetBin, "github.com/vfnet-io/vfnet/cmd/"+vfnetName, shipbuild.Args())
	peerBin := filepath.Join(bins, "dra-example-kubeletplugin")
	// Its own module, outside this one: GOWORK=off, and go.mod may need
	// updating without a vendor directory (-mod=mod). Nothing is written
	// to this repository.
	// The peer as vfnet's images are built, less vfnet's own grpcnotrace tag.
	goBuild(t, src, peerBin, "./cmd/dra-example-kubeletplugin", []string{"-trimpath", "-ldflags=-s -w"}, "GOWORK=off", "GOFLAGS=-mod=mod -buildvcs=false")

	plane := controlplane.StartForTest(t, controlplane.Options{})
	client, err := plane.AdminClient()
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()

	vfnet := &proc{name: vfnetName, node: "node-vfnet", driver: discovery.DriverName, devices: 1024}
	vfnetSmall := &proc{name: vfnetName, node: "node-vfnet-small", driver: discovery.DriverName, devices: 128}
	peer := &proc{name: "dra-example-kubeletplugin", node: "node-example", driver: peerDriver, devices: peerDevices}
	procs := []*proc{vfnet, vfnetSmall, peer}
	for _, p := range procs {
		if _, err := client.CoreV1().Nodes().Create(ctx, &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: p.node}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	// Short directory: unix socket paths are limited to 108 bytes.
	sock, err := os.MkdirTemp("", "vfpeer")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sock) })
	// All 4 PFs x 256 VFs, as TestDriverOnAPIServer.
	vfnetCmd(t, vfnetBin, plane.AdminKubeconfig, vfnet,
		"- pciAddress: \"0000:3b:00.0\"\n  network: physnet-a\n- pciAddress: \"0000:3b:00.1\"\n  network: physnet-a\n"+
			"- pciAddress: \"0000:86:00.0\"\n  network: physnet-b\n- pciAddress: \"0000:86:00.1\"\n  network: physnet-b\n",
		filepath.Join(sock, "v1"), shipped)
	// The same host; 128 VFs of one PF offered.
	vfnetCmd(t, vfnetBin, plane.AdminKubeconfig, vfnetSmall,
		"- pciAddress: \"0000:3b:00.0\"\n  network: physnet-a\n  vfs: [\"0-127\"]\n",
		filepath.Join(sock, "v2"), shipped)

	// The peer as its Helm chart deploys it (deployments/helm: environment
	// variables, gpu profile, gRPC health service and /metrics on), with
	// its paths in the temporary directory.
	pdir := filepath.Join(sock, "p")
	if err := os.MkdirAll(filepath.Join(pdir, "reg"), 0o700); err != nil {
		t.Fatal(err)
	}
	metrics := freePort(t)
	peer.metricsURL = fmt.Sprintf("http://127.0.0.1:%d/metrics", metrics)
	peer.cmd = exec.Command(peerBin, "--kubeconfig", plane.AdminKubeconfig)
	peer.cmd.Env = append(os.Environ(),
		"NODE_NAME="+peer.node,
		"DEVICE_PROFILE=gpu",
		"NUM_DEVICES="+strconv.Itoa(peerDevices),
		"CDI_ROOT="+filepath.Join(pdir, "cdi"),
		"KUBELET_REGISTRAR_DIRECTORY_PATH="+filepath.Join(pdir, "reg"),
		"KUBELET_PLUGINS_DIRECTORY_PATH="+filepath.Join(pdir, "plg"),
		"HEALTHCHECK_PORT="+strconv.Itoa(freePort(t)),
		"METRICS_PORT="+strconv.Itoa(metrics),
	)

	for _, p := range procs {
		p.start(t)
	}
	deadline := time.Now().Add(90 * time.Second)
	for _, p := range procs {
		for {
			s, d, err := p.published(ctx, client)
			if err != nil {
				t.Fatal(err)
			}
			if d == p.devices {
				t.Logf("%s: %d devices in %d slices in pool %s", p.name, d, s, p.node)
				break
			}
			select {
			case err := <-p.done:
				t.Fatalf("%s (%s) exited while publishing (%d of %d devices published): %v", p.name, p.node, d, p.devices, err)
			default:
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s (%s): %d of %d devices published after 90s", p.name, p.node, d, p.devices)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}

	// All idle the same time after the last publish (as
	// TestDriverOnAPIServer), then all are read at the same moment.
	cpu0 := map[*proc]time.Duration{}
	for _, p := range procs {
		if cpu0[p], err = procmem.CPU(p.cmd.Process.Pid); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(idle)
	st := map[*proc]map[string]int{}
	cpu := map[*proc]time.Duration{}
	for _, p := range procs {
		if st[p], err = procmem.Status(p.cmd.Process.Pid); err != nil {
			t.Fatal(err)
		}
		if cpu[p], err = procmem.CPU(p.cmd.Process.Pid); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range procs {
		s := st[p]
		t.Logf("idle %s, %d devices, %s after the last publish: VmRSS %.1f MiB = RssAnon %.1f MiB + RssFile %.1f MiB; peak VmHWM %.1f MiB; CPU while idle %.1f%% of a core",
			p.name, p.devices, idle, mib(s["VmRSS"]), mib(s["RssAnon"]), mib(s["RssFile"]), mib(s["VmHWM"]),
			100*(cpu[p]-cpu0[p]).Seconds()/idle.Seconds())
		smaps, err := procmem.Smaps(p.cmd.Process.Pid)
		if err != nil {
			t.Fatal(err)
		}
		goRuntime, err := procmem.GoRuntime(ctx, p.metricsURL)
		if err != nil {
			goRuntime = fmt.Sprintf("; Go runtime: %v", err)
		}
		t.Logf("  %s%s", smaps, goRuntime)
	}
	ratio := func(a, b *proc, field string) float64 { return float64(st[a][field]) / float64(st[b][field]) }
	t.Logf("RESULT VmRSS (RssAnon + RssFile) [VmHWM] MiB: vfnet %d devices %.1f (%.1f + %.1f) [%.1f], vfnet %d devices %.1f (%.1f + %.1f) [%.1f], dra-example %d devices %.1f (%.1f + %.1f) [%.1f]",
		vfnet.devices, mib(st[vfnet]["VmRSS"]), mib(st[vfnet]["RssAnon"]), mib(st[vfnet]["RssFile"]), mib(st[vfnet]["VmHWM"]),
		vfnetSmall.devices, mib(st[vfnetSmall]["VmRSS"]), mib(st[vfnetSmall]["RssAnon"]), mib(st[vfnetSmall]["RssFile"]), mib(st[vfnetSmall]["VmHWM"]),
		peer.devices, mib(st[peer]["VmRSS"]), mib(st[peer]["RssAnon"]), mib(st[peer]["RssFile"]), mib(st[peer]["VmHWM"]))
	for _, v := range []*proc{vfnet, vfnetSmall} {
		t.Logf("RESULT vfnet %d devices / dra-example %d devices: VmRSS %.2f, RssAnon %.2f, RssFile %.2f",
			v.devices, peer.devices, ratio(v, peer, "VmRSS"), ratio(v, peer, "RssAnon"), ratio(v, peer, "RssFile"))
	}
	t.Logf("RESULT vfnet per extra device (%d -> %d): %.1f KiB",
		vfnetSmall.devices, vfnet.devices, float64(st[vfnet]["VmRSS"]-st[vfnetSmall]["VmRSS"])/float64(vfnet.devices-vfnetSmall.devices))

	for _, p := range procs {
		p.stop(t)
	}
}
