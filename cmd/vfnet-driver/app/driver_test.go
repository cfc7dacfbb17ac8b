package app_test

import (
	"context"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/vfnet-io/vfnet/test/lib/controlplane"
	"github.com/vfnet-io/vfnet/test/lib/gobuild"
	"github.com/vfnet-io/vfnet/test/lib/pfnetns"
	"github.com/vfnet-io/vfnet/test/lib/procmem"
	"github.com/vfnet-io/vfnet/test/lib/simhost"
	"github.com/vfnet-io/vfnet/test/lib/syncbuf"
)

func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// poolState returns the number of slices and devices of the newest
// generation, and the network of every device.
func poolState(ctx context.Context, t *testing.T, c kubernetes.Interface, node string) (int, int, map[string]string) {
	t.Helper()
	list, err := c.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var gen int64
	for _, s := range list.Items {
		gen = max(gen, s.Spec.Pool.Generation)
	}
	slices, devices := 0, 0
	networks := map[string]string{}
	for _, s := range list.Items {
		if s.Spec.Pool.Name != node || s.Spec.Pool.Generation != gen {
			continue
		}
		slices++
		for _, d := range s.Spec.Devices {
			devices++
			networks[d.Name] = *d.Attributes["vfnet.io/network"].StringValue
		}
	}
	return slices, devices, networks
}

// procStatus returns the kB fields of /proc/<pid>/status.
func procStatus(t *testing.T, pid int) map[string]int {
	t.Helper()
	st, err := procmem.Status(pid)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// memoryBreakdown says where an idle driver's RSS is: the resident kB of
// each mapping kind in /proc/<pid>/smaps, and the Go runtime's own figures
// from the driver's /metrics (heap in use, idle but not yet returned,
// stacks, runtime metadata).
func memoryBreakdown(t *testing.T, pid int, metricsURL string) string {
	t.Helper()
	smaps, err := procmem.Smaps(pid)
	if err != nil {
		t.Fatal(err)
	}
	goRuntime, err := procmem.GoRuntime(t.Context(), metricsURL)
	if err != nil {
		t.Fatal(err)
	}
	return smaps + goRuntime
}

// TestDriverOnAPIServer runs the shipped vfnet-driver on a simulated 4 x 256
// VF host against a real kube-apiserver: 1024 VFs in 8 slices, a config
// edit republished at the next rescan, the idle RSS, and a clean SIGTERM.
// The shipped build has no simulator: it reads the host's sysfs tree as a
// plain sysfs and finds the PF netdevs in a private network namespace
// (test/lib/pfnetns), as a driver pod finds the host's through --host-netns.
// Where no namespace can be made (not root), vfnet-driver-sim --simulate
// runs instead, and its RSS includes test/lib/simhost's code.
func TestDriverOnAPIServer(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a control plane")
	}
	if _, err := controlplane.BinDir(t.Context()); err != nil {
		t.Fatalf("control-plane binaries unavailable: %v (make k8s-bin builds them)", err)
	}
	plane := controlplane.StartForTest(t, controlplane.Options{})
	client, err := plane.AdminClient()
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	const node = "node-large"
	if _, err := client.CoreV1().Nodes().Create(ctx, &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	h, err := simhost.Build(t.TempDir(), simhost.LargeHost())
	if err != nil {
		t.Fatal(err)
	}
	root := h.Root()
	h.Close() // the driver opens it (or reads its tree) itself
	name, hostArgs := "vfnet-driver", []string{"--dev-root", h.DevRoot()}
	if ns, err := pfnetns.ForTree(t, root); err != nil {
		t.Logf("measuring vfnet-driver-sim --simulate, not the shipped build: no network namespace for the PF netdevs: %v", err)
		name, hostArgs = "vfnet-driver-sim", []string{"--simulate"}
	} else {
		// Its NRI plugin dials a socket nobody serves, as on a node whose
		// runtime has NRI off, never this machine's runtime.
		hostArgs = append(hostArgs, "--host-netns", ns, "--nri-socket", filepath.Join(t.TempDir(), "nri.sock"))
	}
	// Built as the Dockerfile builds it (static, CGO_ENABLED=0: a cgo build
	// also maps ld.so and libc), so the RSS below is the shipped binary's (or
	// the simulator-carrying build's, as the log says).
	repo, err := controlplane.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	binDir, err := gobuild.Shipped(t.Context(), repo, cmdPackage(name))
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(binDir, name)
	cfg := filepath.Join(t.TempDir(), "node.yaml")
	writeCfg := func(second string) {
		body := "apiVersion: vfnet.io/v1alpha1\nkind: NodeConfig\npfs:\n- pciAddress: \"0000:3b:00.0\"\n  network: physnet-a\n" +
			"- pciAddress: \"0000:3b:00.1\"\n  network: " + second + "\n- pciAddress: \"0000:86:00.0\"\n  network: physnet-b\n- pciAddress: \"0000:86:00.1\"\n  network: physnet-b\n"
		tmp := cfg + ".tmp"
		if err := os.WriteFile(tmp, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, cfg); err != nil { // atomic, like a ConfigMap update
			t.Fatal(err)
		}
	}
	writeCfg("physnet-a")
	sock, err := os.MkdirTemp("", "vf")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(sock)
	if err := os.Mkdir(filepath.Join(sock, "reg"), 0o700); err != nil {
		t.Fatal(err)
	}
	healthAddr := freePort(t)
	var logs syncbuf.Buffer
	cmd := exec.Command(bin, append(hostArgs, "--kubeconfig", plane.AdminKubeconfig, "--node-name", node,
		"--sysfs-root", root, "--config", cfg, "--rescan-interval", "2s",
		"--registrar-dir", filepath.Join(sock, "reg"), "--plugin-dir", filepath.Join(sock, "plg"), "--cdi-root", filepath.Join(sock, "cdi"),
		"--kubelet-pods-dir", filepath.Join(sock, "pods"), "--health-addr", healthAddr)...)
	cmd.Stdout, cmd.Stderr = &logs, &logs
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	defer func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("driver log:\n%s", logs.String())
		}
	}()

	waitFor := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(90 * time.Second)
		for !cond() {
			select {
			case err := <-done:
				t.Fatalf("driver exited while waiting for %s: %v", what, err)
			default:
			}
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	waitFor("8 slices with 1024 devices", func() bool {
		s, d, _ := poolState(ctx, t, client, node)
		return s == 8 && d == 1024
	})
	if simulated := strings.Contains(logs.String(), "SIMULATED HOST"); simulated != (name == "vfnet-driver-sim") {
		t.Errorf("%s: simulation warning in the log: %v", name, simulated)
	}
	resp, err := http.Get("http://" + healthAddr + "/healthz")
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("/healthz: %v %v", resp, err)
	}
	resp.Body.Close()

	// The config is re-read at the next rescan.
	writeCfg("physnet-c")
	waitFor("the renamed network", func() bool {
		s, d, nets := poolState(ctx, t, client, node)
		c := 0
		for _, n := range nets {
			if n == "physnet-c" {
				c++
			}
		}
		return s == 8 && d == 1024 && c == 256
	})

	// Idle: a few rescans with nothing to publish. VFNET_IDLE_WAIT (a
	// duration) waits longer: 40s is past the resourceslice controller's
	// follow-up sync (30 s after its own writes), which drops the Create and
	// Update results it keeps (a third copy of the devices) until then.
	idle := 10 * time.Second
	if s := os.Getenv("VFNET_IDLE_WAIT"); s != "" {
		if idle, err = time.ParseDuration(s); err != nil {
			t.Fatalf("VFNET_IDLE_WAIT: %v", err)
		}
	}
	time.Sleep(idle)
	st := procStatus(t, cmd.Process.Pid)
	t.Logf("idle %s holding 1024 VFs, %s after the last publish: VmRSS %.1f MiB = RssAnon %.1f MiB (heap, stacks) + RssFile %.1f MiB (binary pages)",
		name, idle, float64(st["VmRSS"])/1024, float64(st["RssAnon"])/1024, float64(st["RssFile"])/1024)
	t.Log(memoryBreakdown(t, cmd.Process.Pid, "http://"+healthAddr+"/metrics"))
	// The goal is < 40 MiB in all (BENCHMARKS.md: driver-idle-rss). The
	// file-backed part is the binary's code, pclntab and rodata touched at
	// init and while serving, each fault mapping up to 64 KiB of page cache
	// around it: nearly all of the binary except parts of the k8s.io/api
	// types every client-go program links. The anonymous part is mostly the
	// live heap, which is the resourceslice controller's copies of the 1024
	// devices. Only the part the driver controls is asserted.
	if st["RssAnon"] > 40*1024 {
		t.Errorf("idle anonymous RSS %.1f MiB, goal < 40 MiB", float64(st["RssAnon"])/1024)
	}

	// A configuration that selects nothing publishes an empty pool, which
	// the API server accepts, and says why in one log line.
	if err := os.WriteFile(cfg, []byte("apiVersion: vfnet.io/v1alpha1\nkind: NodeConfig\npfs:\n- pfName: eth42\n  network: physnet-a\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	waitFor("an empty pool", func() bool {
		s, d, _ := poolState(ctx, t, client, node)
		return s == 1 && d == 0
	})
	if n := strings.Count(logs.String(), "selects none of the 4 SR-IOV PFs"); n != 1 {
		t.Errorf("%d log lines explain the empty pool, want 1", n)
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("exit after SIGTERM: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("driver did not stop within 30s of SIGTERM")
	}
}

// TestSIGTERMWhileStarting: an API server that never answers keeps the first
// publish waiting; SIGTERM then is still a clean stop (exit 0), as a
// DaemonSet update may come at any time.
func TestSIGTERMWhileStarting(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var conns []net.Conn
	var mu sync.Mutex
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c) // accept and never answer
			mu.Unlock()
		}
	}()
	defer func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	}()
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "http://`+ln.Addr().String()+`"}}]
users: [{name: u, user: {token: x}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`), 0o600); err != nil {
		t.Fatal(err)
	}
	bin := buildCmd(t, "vfnet-driver-sim")
	root := buildHost(t, simhost.E810Host())
	sock, err := os.MkdirTemp("", "vf")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(sock)
	if err := os.Mkdir(filepath.Join(sock, "reg"), 0o700); err != nil {
		t.Fatal(err)
	}
	var logs syncbuf.Buffer
	cmd := exec.Command(bin, "--simulate", "--kubeconfig", kubeconfig, "--node-name", "n", "--sysfs-root", root,
		"--registrar-dir", filepath.Join(sock, "reg"), "--plugin-dir", filepath.Join(sock, "plg"), "--cdi-root", filepath.Join(sock, "cdi"))
	cmd.Stdout, cmd.Stderr = &logs, &logs
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// Serving gRPC (registration socket present) while the publish waits.
	deadline := time.Now().Add(30 * time.Second)
	for {
		if m, _ := filepath.Glob(filepath.Join(sock, "reg", "*.sock")); len(m) > 0 {
			break
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			t.Fatalf("no registration socket; log:\n%s", logs.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	if strings.Contains(logs.String(), "vfnet-driver running") {
		t.Fatalf("the first publish did not wait for the API server:\n%s", logs.String())
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("exit after SIGTERM while starting: %v\n%s", err, logs.String())
		}
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		t.Fatalf("no exit within 30s of SIGTERM:\n%s", logs.String())
	}
}
