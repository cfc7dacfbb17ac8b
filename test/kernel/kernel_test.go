package kernel

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vfnet-io/vfnet/test/kernel/layout"
	"github.com/vfnet-io/vfnet/test/lib/controlplane"
)

// Gate and selection.
const (
	envGate  = "VFNET_REAL_KERNEL"  // "1": run the tier (make test-kernel sets it)
	envCases = "VFNET_KERNEL_CASES" // comma-separated cases of layout.AllCases and OptInCases
	// envBootTimeout overrides the bound on QEMU start -> the init's
	// machine ready (default 8m), for a slower machine.
	envBootTimeout = "VFNET_KERNEL_BOOT_TIMEOUT"
)

func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := controlplane.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return root
}

func cacheDir(t *testing.T, repo string) string {
	if c := os.Getenv("VFNET_CACHE"); c != "" {
		return c
	}
	return filepath.Join(repo, ".cache")
}

// TestRealKernel boots a Debian kernel under QEMU with emulated igb SR-IOV
// NICs behind an emulated Intel IOMMU and runs the guest cases
// (test/kernel/guest) there, one subtest each. Everything it needs comes
// from hack/kernel-deps.sh; when the gate is set and something is missing,
// it fails naming it.
func TestRealKernel(t *testing.T) {
	if os.Getenv(envGate) != "1" {
		t.Skipf("the real-kernel tier runs with %s=1 (make test-kernel)", envGate)
	}
	repo := repoRoot(t)
	cache := cacheDir(t, repo)
	start := time.Now()
	deps := exec.Command(filepath.Join(repo, "hack", "kernel-deps.sh"))
	deps.Env = append(os.Environ(), "VFNET_CACHE="+cache)
	if out, err := deps.CombinedOutput(); err != nil {
		t.Fatalf("hack/kernel-deps.sh failed (%v): the real-kernel tier cannot run:\n%s", err, out)
	}
	t.Logf("kernel-deps: %s", time.Since(start).Round(time.Millisecond))
	env, err := LoadEnv(filepath.Join(cache, "kernel"))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("kernel %s, %s", env.KernelRelease, env.QEMUVersion)

	cases := layout.AllCases()
	if v := os.Getenv(envCases); v != "" {
		cases = strings.Split(v, ",")
		for _, c := range cases {
			if !layout.Known(c) {
				t.Fatalf("%s names %q; the cases are %v, and opt-in %v", envCases, c, layout.AllCases(), layout.OptInCases())
			}
			if layout.NeedsKubeVirt(c) {
				t.Fatalf("%s names %q, which needs KubeVirt's control plane on a real node: run it with make test-kubevirt-guest", envCases, c)
			}
		}
	}

	work := t.TempDir()
	lay := layout.Default()
	lay.Cases = cases
	var kubeconfig string
	if slices.ContainsFunc(cases, layout.NeedsAPIServer) {
		// The real driver needs an API server: the guest reaches this
		// one through QEMU's user-mode network.
		var opts controlplane.Options
		if slices.ContainsFunc(cases, layout.NeedsNode) {
			// The kubelet's pods mount the kube-root-ca.crt ConfigMap
			// (their service account token's projected volume).
			opts.ExtraControllers = []string{"root-ca-certificate-publisher-controller"}
		}
		plane := controlplane.StartForTest(t, opts)
		u, err := url.Parse(plane.URL)
		if err != nil {
			t.Fatal(err)
		}
		lay.APIServer = net.JoinHostPort(layout.GuestGateway, u.Port())
		kubeconfig = plane.AdminKubeconfig
	}
	virt := slices.ContainsFunc(cases, layout.NeedsVirt)
	wire := slices.ContainsFunc(cases, layout.NeedsWire)
	if wire {
		lay.Peer = layout.PeerNIC
		lay.PFs = append(lay.PFs, layout.WirePF)
	}
	step := time.Now()
	// Built into the cache, not the test's temp dir: go build leaves an
	// up-to-date binary alone, so a warm run skips the links (about 25
	// CPU-seconds, on this tier's critical path before the guest boots).
	binDir := filepath.Join(cache, "kernel", "bin")
	if err := os.MkdirAll(binDir, 0o755); err != nil {
		t.Fatal(err)
	}
	bins, err := BuildGuestBinaries(t.Context(), repo, binDir, virt)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("guest binaries built: %s", time.Since(step).Round(time.Millisecond))
	img := Image{Init: bins.Init, Driver: bins.Driver, Layout: lay, Kubeconfig: kubeconfig, Wire: wire}
	if virt {
		img.Virt = virtImage(t, repo, cache, env, work, bins)
	}
	if slices.ContainsFunc(cases, layout.NeedsNode) {
		step := time.Now()
		if img.Node, err = FindNodeImage(t.Context(), repo, work, env.Busybox); err != nil {
			t.Fatalf("the kubelet case's node: %v", err)
		}
		t.Logf("node parts and images: %s", time.Since(step).Round(time.Millisecond))
	}
	step = time.Now()
	initrd := filepath.Join(env.Dir, "initramfs.cpio")
	if err := env.BuildInitramfs(initrd, img); err != nil {
		t.Fatalf("build the guest initramfs: %v", err)
	}
	st, _ := os.Stat(initrd)
	t.Logf("initramfs %d MiB built: %s", st.Size()>>20, time.Since(step).Round(time.Millisecond))

	logPath := filepath.Join(env.Dir, "last-console.log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	// A boot that stalls (a guest under TCG on a loaded host has hung
	// before its init with nothing on the console) is stopped after
	// bootTimeout, shown with where its vCPUs were, and tried once more;
	// the whole run is bounded well inside CI's time.
	const attempts = 2
	bootTimeout := 8 * time.Minute
	if v := os.Getenv(envBootTimeout); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			t.Fatalf("%s=%q: want a positive duration such as 12m", envBootTimeout, v)
		}
		bootTimeout = d
	}
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Minute)
	defer cancel()
	var console bytes.Buffer
	var runErr error
	var cpu *CaseCPU
	for attempt := 1; attempt <= attempts; attempt++ {
		console.Reset()
		fmt.Fprintf(logf, "=== boot %d of at most %d\n", attempt, attempts)
		step = time.Now()
		cpu = NewCaseCPU()
		runErr = env.Run(ctx, RunOptions{
			Initrd: initrd, Cases: cases, UserNet: lay.APIServer != "",
			Console: io.MultiWriter(logf, &console), BootTimeout: bootTimeout, CaseCPU: cpu,
		})
		t.Logf("guest ran %s (console: %s)", time.Since(step).Round(time.Second), logPath)
		var stall *BootStallError
		if !errors.As(runErr, &stall) {
			break
		}
		t.Logf("boot %d stalled: %v\nits console's last lines:\n%s", attempt, runErr, tail(console.String(), 60))
	}
	saveTrace(t, console.String(), filepath.Join(env.Dir, "last-trace.json"))
	logWire(t, console.String())
	windows := cpu.Windows()
	for _, name := range slices.Sorted(maps.Keys(windows)) {
		t.Logf("%s %s: QEMU used %.1f CPU-s", layout.MarkWindow, name, windows[name].Seconds())
	}
	parsed, err := ParseConsole(bytes.NewReader(console.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	if runErr != nil {
		t.Errorf("%v\nlast console lines:\n%s", runErr, tail(console.String(), 40))
	} else if !parsed.Done {
		t.Errorf("the guest's init never finished; last console lines:\n%s", tail(console.String(), 40))
	}
	for _, c := range cases {
		t.Run(c, func(t *testing.T) {
			r, ok := parsed.Case(c)
			switch {
			case !ok && runErr != nil:
				// Each case says why: CI shows the failing subtests first.
				t.Fatalf("case %s reported nothing: %v\nlast console lines:\n%s", c, runErr, tail(console.String(), 40))
			case !ok:
				t.Fatalf("case %s reported nothing; last console lines:\n%s", c, tail(console.String(), 40))
			case r.Status == "PASS":
				if used, ok := cpu.Used(c); ok {
					t.Logf("%s, QEMU used %.1f CPU-s", r.Detail, used.Seconds())
				} else {
					t.Logf("%s", r.Detail)
				}
			case r.Status == "SKIP":
				// A skipped case tested nothing: the tier would pass empty.
				t.Fatalf("case %s skipped in the guest %s (a skip in this tier is a failure: make it run or fail with the fix):\n%s", c, r.Detail, r.Output)
			case r.Status == "":
				t.Fatalf("case %s never finished (guest died or hung); its output:\n%s", c, r.Output)
			default:
				t.Fatalf("case %s failed: %s\nguest output:\n%s", c, r.Detail, r.Output)
			}
		})
	}
}

// saveTrace keeps the trace case's JSON, to update
// test/kernel/scenario/kernel-trace.json from when the kernel changes.
func saveTrace(t *testing.T, console, path string) {
	for _, l := range strings.Split(console, "\n") {
		if i := strings.Index(l, layout.MarkTrace+" "); i >= 0 {
			data := strings.TrimSpace(l[i+len(layout.MarkTrace)+1:])
			if err := os.WriteFile(path, []byte(data+"\n"), 0o644); err != nil {
				t.Error(err)
			}
			t.Logf("kernel trace saved to %s", path)
		}
	}
}

// virtImage prepares what the vm case adds to the guest: libvirt from
// hack/virt-deps.sh, the binaries, the example VM's VMI and the VM's
// initramfs.
func virtImage(t *testing.T, repo, cache string, env *Env, work string, bins GuestBinaries) *VirtImage {
	t.Helper()
	start := time.Now()
	deps := exec.Command(filepath.Join(repo, "hack", "virt-deps.sh"))
	deps.Env = append(os.Environ(), "VFNET_CACHE="+cache)
	if out, err := deps.CombinedOutput(); err != nil {
		t.Fatalf("hack/virt-deps.sh failed (%v): the vm case cannot run:\n%s", err, out)
	}
	v, err := LoadVirt(filepath.Join(cache, "virt"))
	if err != nil {
		t.Fatal(err)
	}
	v.Binding, v.Launcher = bins.Binding, bins.Launcher
	// The VMI is rendered here: virt-api's mutators, which render it, take
	// 4 s to initialize natively and minutes under the guest's nested TCG.
	v.VMI = filepath.Join(work, "vmi.json")
	render := exec.Command(bins.VMIRender,
		"-vm", filepath.Join(repo, "manifests", "examples", "vm.yaml"),
		"-kubevirt", filepath.Join(repo, "manifests", "kubevirt", "binding-patch.yaml"),
		"-memory", layout.VMMemory, "-kernel-args", layout.VMKernelArgs,
		"-kernel-path", path.Join(layout.VMKernelDir, layout.InnerKernel), "-initrd-path", path.Join(layout.VMKernelDir, layout.InnerInitrd),
		"-out", v.VMI)
	if out, err := render.CombinedOutput(); err != nil {
		t.Fatalf("render the example VM's VMI (test/kubevirt cmd/vmirender): %v\n%s", err, out)
	}
	v.InnerInitrd = filepath.Join(work, "inner-initrd.cpio")
	if err := env.BuildInnerInitramfs(v.InnerInitrd); err != nil {
		t.Fatalf("build the VM's initramfs: %v", err)
	}
	t.Logf("virt-deps (%s) and the VM's initramfs: %s", v.Version, time.Since(start).Round(time.Millisecond))
	return v
}

// logWire logs the measured figures of the wire, failover and kubelet
// cases (their layout.MarkWire, MarkFailover and MarkKubelet lines), for
// BENCHMARKS.md.
func logWire(t *testing.T, console string) {
	for _, l := range strings.Split(console, "\n") {
		for _, mark := range []string{layout.MarkWire, layout.MarkFailover, layout.MarkKubelet} {
			if i := strings.Index(l, mark+" "); i >= 0 {
				t.Logf("%s: %s", mark, strings.TrimSpace(l[i+len(mark)+1:]))
			}
		}
	}
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
