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
// .cache/), which must be a git checkout at pinnedCommit (`make bench-peers`
// prepares it or says how); its dependencies come from the Go module proxy.
// Under the gate nothing it needs may be missing: a benchmark that measured
// nothing, or another binary, fails instead of passing.
package peers

import (
	"context"
	"debug/buildinfo"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/vfnet-io/vfnet/driver/discovery"
	"github.com/vfnet-io/vfnet/hack/shipbuild"
	"github.com/vfnet-io/vfnet/test/lib/controlplane"
	"github.com/vfnet-io/vfnet/test/lib/pfnetns"
	"github.com/vfnet-io/vfnet/test/lib/procmem"
	"github.com/vfnet-io/vfnet/test/lib/simhost"
	"github.com/vfnet-io/vfnet/test/lib/syncbuf"
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
	// envVfnetGOGC, if set, is vfnet-driver's GOGC (default: unset, so
	// the driver picks its own), to compare GC settings.
	envVfnetGOGC = "VFNET_PEERS_VFNET_GOGC"

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

// peerSource is the dra-example-driver checkout at pinnedCommit, and a
// description of it for the results. Local changes fail unless
// VFNET_PEER_SRC names the copy (a deliberately changed peer, such as one
// that splits its pool); they are then listed.
func peerSource(t *testing.T) (string, string) {
	src, explicit := os.Getenv(envPeerSrc), true
	if src == "" {
		src, explicit = filepath.Join(cacheDir(t), "peers", "dra-example-driver", "src"), false
	}
	changed, err := checkSource(t.Context(), src, pinnedCommit)
	if err != nil {
		t.Fatal(err)
	}
	desc := "kubernetes-sigs/dra-example-driver " + pinnedCommit
	if len(changed) > 0 {
		if !explicit {
			t.Fatalf("%s has local changes (%s), so it is not the pinned commit as published: git -C %s checkout -- . "+
				"(or set %s to that directory to measure the changed copy; the results then list the changes)",
				src, strings.Join(changed, ", "), src, envPeerSrc)
		}
		desc += " with local changes to " + strings.Join(changed, ", ")
	}
	return src, desc
}

// envWithout is this process's environment less the named variables.
func envWithout(names ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if !slices.Contains(names, name) {
			env = append(env, kv)
		}
	}
	return env
}

// goBuild builds pkg in dir static (CGO_ENABLED=0; a cgo build also maps
// ld.so and libc) with flags, and without VCS stamping for both drivers
// alike (the peer's checkout may belong to another user, which git
// refuses).
func goBuild(t *testing.T, dir, out, pkg string, flags []string, env ...string) {
	t.Helper()
	args := append(append([]string{"build", "-buildvcs=false"}, flags...), "-o", out)
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
	// config is how it was built and runs, for the results.
	config     string
	env        []string
	metricsURL string
	cmd        *exec.Cmd
	logs       syncbuf.Buffer
	done       chan error
}

func (p *proc) start(t *testing.T) {
	t.Helper()
	p.cmd.Stdout, p.cmd.Stderr = &p.logs, &p.logs
	p.cmd.Env = p.env
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
// (simhost.LargeHost; unlike that test, no configuration edit and
// republish follows), with its default intervals (events, a 5 min resync), with cfg as its node configuration and its
// directories under dir. bin is the shipped build: it reads the tree as a
// plain sysfs and finds the PF netdevs in a namespace of their own
// (test/lib/pfnetns).
func vfnetCmd(t *testing.T, bin, kubeconfig string, p *proc, cfg, dir string) {
	t.Helper()
	h, err := simhost.Build(t.TempDir(), simhost.LargeHost())
	if err != nil {
		t.Fatal(err)
	}
	sysfs := h.Root()
	h.Close() // the driver opens it (or reads its tree) itself
	ns, err := pfnetns.ForTree(t, sysfs)
	if err != nil {
		t.Fatal(err)
	}
	// The NRI plugin dials a socket nobody serves (a node whose runtime has
	// NRI off), never this machine's runtime.
	hostArgs := []string{"--host-netns", ns, "--dev-root", h.DevRoot(), "--nri-socket", filepath.Join(t.TempDir(), "nri.sock")}
	cfgFile := filepath.Join(t.TempDir(), "node.yaml")
	if err := os.WriteFile(cfgFile, []byte("apiVersion: vfnet.io/v1alpha1\nkind: NodeConfig\npfs:\n"+cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "reg"), 0o700); err != nil {
		t.Fatal(err)
	}
	health := freePort(t)
	p.metricsURL = fmt.Sprintf("http://127.0.0.1:%d/metrics", health)
	// GOGC unset: vfnet-driver picks its own (cmd/vfnet-driver/app).
	p.env = envWithout("GOGC", "GOMEMLIMIT")
	if g := os.Getenv(envVfnetGOGC); g != "" {
		p.env = append(p.env, "GOGC="+g)
		p.config += ", GOGC=" + g
	}
	p.cmd = exec.Command(bin, append(hostArgs, "--kubeconfig", kubeconfig, "--node-name", p.node,
		"--sysfs-root", sysfs, "--config", cfgFile,
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
//
// Build flags are not the same for both as shipped: vfnet-driver has
// -tags grpcnotrace and sets GOGC=10 itself, the peer has neither. So the
// peer runs twice, side by side: with Go's defaults, as it ships, and built
// and run in vfnet's configuration; the ratio against the second is vfnet's
// code alone, without its tuning.
func TestIdleMemoryVsExampleDriver(t *testing.T) {
	if os.Getenv(envGate) != "1" {
		t.Skipf("benchmark against other DRA drivers; runs with %s=1 (make bench-peers)", envGate)
	}
	// Everything checked before the first build: under the gate a missing
	// piece fails, it never skips.
	src, peerDesc := peerSource(t)
	if _, err := controlplane.BinDir(t.Context()); err != nil {
		t.Fatalf("control-plane binaries: %v", err)
	}
	// No fallback to vfnet-driver-sim: it links the simulator, so its RSS is
	// not the shipped driver's that the results name.
	if _, err := pfnetns.New(t); err != nil {
		t.Fatalf("vfnet-driver runs as shipped, with its PF netdevs in a network namespace of their own, and none could be made (%v): run as root", err)
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
	const vfnetName = "vfnet-driver"
	vfnetBin := filepath.Join(bins, vfnetName)
	goBuild(t, root, vfnetBin, "github.com/vfnet-io/vfnet/cmd/"+vfnetName, shipbuild.Args())
	// Its own module, outside this one: GOWORK=off, and its go.mod and
	// go.sum as committed (-mod=readonly: the pinned commit's dependencies,
	// and nothing written to the checkout). GOFLAGS keeps the caller's, as
	// vfnet's build does.
	peerEnv := []string{"GOWORK=off", strings.TrimSpace("GOFLAGS=" + os.Getenv("GOFLAGS") + " -mod=readonly")}
	// As vfnet's images are built, less vfnet's own grpcnotrace tag.
	peerFlags := []string{"-trimpath", "-ldflags=-s -w"}
	peerBin := filepath.Join(bins, "dra-example-kubeletplugin")
	goBuild(t, src, peerBin, "./cmd/dra-example-kubeletplugin", peerFlags, peerEnv...)
	// Exactly vfnet's flags.
	peerTunedBin := filepath.Join(bins, "dra-example-kubeletplugin-as-vfnet")
	goBuild(t, src, peerTunedBin, "./cmd/dra-example-kubeletplugin", shipbuild.Args(), peerEnv...)

	plane := controlplane.StartForTest(t, controlplane.Options{})
	client, err := plane.AdminClient()
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()

	vfnetConfig := strings.Join(shipbuild.Args(), " ") + ", GOGC=10"
	vfnet := &proc{name: vfnetName, node: "node-vfnet", driver: discovery.DriverName, devices: 1024, config: vfnetConfig + " (its own default)"}
	vfnetSmall := &proc{name: vfnetName, node: "node-vfnet-small", driver: discovery.DriverName, devices: 128, config: vfnet.config}
	peer := &proc{name: "dra-example-kubeletplugin", node: "node-example", driver: peerDriver, devices: peerDevices,
		config: strings.Join(peerFlags, " ") + ", GOGC=100 (Go's default; the peer sets none)"}
	peerTuned := &proc{name: "dra-example-kubeletplugin", node: "node-example-as-vfnet", driver: peerDriver, devices: peerDevices,
		config: vfnetConfig + " (vfnet's configuration)"}
	procs := []*proc{vfnet, vfnetSmall, peer, peerTuned}
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
		filepath.Join(sock, "v1"))
	// The same host; 128 VFs of one PF offered.
	vfnetCmd(t, vfnetBin, plane.AdminKubeconfig, vfnetSmall,
		"- pciAddress: \"0000:3b:00.0\"\n  network: physnet-a\n  vfs: [\"0-127\"]\n",
		filepath.Join(sock, "v2"))

	// The peer as its Helm chart deploys it (deployments/helm: environment
	// variables, gpu profile, gRPC health service and /metrics on), with
	// its paths in the temporary directory.
	for i, pc := range []struct {
		p    *proc
		bin  string
		gogc []string
	}{{peer, peerBin, nil}, {peerTuned, peerTunedBin, []string{"GOGC=10"}}} {
		pdir := filepath.Join(sock, "p"+strconv.Itoa(i))
		if err := os.MkdirAll(filepath.Join(pdir, "reg"), 0o700); err != nil {
			t.Fatal(err)
		}
		metrics := freePort(t)
		pc.p.metricsURL = fmt.Sprintf("http://127.0.0.1:%d/metrics", metrics)
		pc.p.cmd = exec.Command(pc.bin, "--kubeconfig", plane.AdminKubeconfig)
		pc.p.env = append(append(envWithout("GOGC", "GOMEMLIMIT"),
			"NODE_NAME="+pc.p.node,
			"DEVICE_PROFILE=gpu",
			"NUM_DEVICES="+strconv.Itoa(peerDevices),
			"CDI_ROOT="+filepath.Join(pdir, "cdi"),
			"KUBELET_REGISTRAR_DIRECTORY_PATH="+filepath.Join(pdir, "reg"),
			"KUBELET_PLUGINS_DIRECTORY_PATH="+filepath.Join(pdir, "plg"),
			"HEALTHCHECK_PORT="+strconv.Itoa(freePort(t)),
			"METRICS_PORT="+strconv.Itoa(metrics),
		), pc.gogc...)
	}

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
		t.Logf("idle %s (%s), %d devices, %s after the last publish: VmRSS %.1f MiB = RssAnon %.1f MiB + RssFile %.1f MiB; peak VmHWM %.1f MiB; CPU while idle %.1f%% of a core",
			p.name, p.node, p.devices, idle, mib(s["VmRSS"]), mib(s["RssAnon"]), mib(s["RssFile"]), mib(s["VmHWM"]),
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
	t.Logf("RESULT peer source: %s", peerDesc)
	for _, p := range procs {
		t.Logf("RESULT %s (%s) built and run with %s", p.name, p.node, p.config)
	}
	row := func(label string, p *proc) string {
		return fmt.Sprintf("%s %d devices %.1f (%.1f + %.1f) [%.1f] %.2f%%", label, p.devices,
			mib(st[p]["VmRSS"]), mib(st[p]["RssAnon"]), mib(st[p]["RssFile"]), mib(st[p]["VmHWM"]),
			100*(cpu[p]-cpu0[p]).Seconds()/idle.Seconds())
	}
	t.Logf("RESULT VmRSS (RssAnon + RssFile) [VmHWM] MiB, CPU over %s idle in %% of a core: %s, %s, %s, %s", idle,
		row("vfnet", vfnet), row("vfnet", vfnetSmall), row("dra-example at Go's defaults", peer), row("dra-example as vfnet", peerTuned))
	for _, v := range []*proc{vfnet, vfnetSmall} {
		for _, pp := range []struct {
			label string
			p     *proc
		}{{"at Go's defaults", peer}, {"as vfnet", peerTuned}} {
			t.Logf("RESULT vfnet %d devices / dra-example %d devices %s: VmRSS %.2f, RssAnon %.2f, RssFile %.2f",
				v.devices, pp.p.devices, pp.label, ratio(v, pp.p, "VmRSS"), ratio(v, pp.p, "RssAnon"), ratio(v, pp.p, "RssFile"))
		}
	}
	t.Logf("RESULT vfnet per extra device (%d -> %d): %.1f KiB",
		vfnetSmall.devices, vfnet.devices, float64(st[vfnet]["VmRSS"]-st[vfnetSmall]["VmRSS"])/float64(vfnet.devices-vfnetSmall.devices))

	for _, p := range procs {
		p.stop(t)
	}
}
