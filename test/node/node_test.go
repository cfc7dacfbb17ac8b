package node

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"github.com/vfnet-io/vfnet/test/lib/controlplane"
	"github.com/vfnet-io/vfnet/test/lib/ownerdir"
)

// envChild carries the scratch directory to the test binary re-run inside
// the node's namespaces.
const envChild = "VFNET_REAL_NODE_CHILD"

// steps are the subtests run inside, in order; each needs the ones before.
func steps() []string {
	if os.Getenv(EnvGuest) == "1" {
		return guestSteps()
	}
	return []string{"Install", "VFPod", "LauncherPod", "RolloutRestart", "KillDuringPrepare", "HelmInstall", "HelmUpgrade", "Standby", "KubeVirt", "LiveMigration", "HelmUninstall"}
}

// TestRealNode: a real kubelet and containerd with vfnet installed from its
// manifests; see the package doc. The subtests run in a re-executed copy of
// this test binary inside a new mount + network namespace; this (parent)
// process mirrors their results as its own subtests, then kills whatever
// the node left, and CheckClean checks the host is as before.
func TestRealNode(t *testing.T) {
	if dir := os.Getenv(envChild); dir != "" {
		runInside(t, dir)
		return
	}
	if os.Getenv(EnvGate) != "1" {
		t.Skipf("real-node tier is off: set %s=1 (make test-node)", EnvGate)
	}
	ctx := klog.NewContext(context.Background(), klog.Background())
	parts, err := FindParts(ctx)
	if err != nil {
		t.Fatalf("real-node tier: parts missing:\n%v", err)
	}
	repo, err := controlplane.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	if killed := SweepStale(scratchPrefix); len(killed) > 0 {
		t.Logf("killed what an earlier, killed run left: %v", killed)
	}
	dir, err := ownerdir.Make(klog.Background(), scratchPrefix)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	art, err := BuildImages(ctx, repo, dir)
	if err != nil {
		os.RemoveAll(dir)
		t.Fatalf("build images: %v", err)
	}
	t.Logf("images and generators built in %s", time.Since(start).Round(time.Second))
	var guest *GuestArtifacts
	if os.Getenv(EnvGuest) == "1" {
		start := time.Now()
		if guest, err = BuildGuest(ctx, repo, cacheDir(repo), dir, art.Images); err != nil {
			os.RemoveAll(dir)
			t.Fatalf("prepare the guest: %v", err)
		}
		t.Logf("the guest's kernel, binaries and images prepared in %s", time.Since(start).Round(time.Second))
	}
	// From the snapshot to CheckClean the host's node cgroups are this
	// run's alone (HostLockFile).
	lockCtx, cancelLock := context.WithTimeout(ctx, 20*time.Minute)
	waitStart := time.Now()
	unlock, err := LockHost(lockCtx, filepath.Join(os.TempDir(), HostLockFile), fmt.Sprintf("pid %d, %s", os.Getpid(), dir),
		func(heldBy string) {
			t.Logf("waiting for the real-node run of %s to end (one node at a time per machine)", heldBy)
		})
	cancelLock()
	if err != nil {
		os.RemoveAll(dir)
		t.Fatal(err)
	}
	defer unlock()
	if d := time.Since(waitStart); d > time.Second {
		t.Logf("waited %s for the real-node lock", d.Round(time.Second))
	}
	before, err := Snapshot()
	if err != nil {
		os.RemoveAll(dir)
		t.Fatal(err)
	}
	if err := writeJSON(filepath.Join(dir, "handoff.json"), handoff{Parts: parts, Artifacts: *art, Repo: repo, Guest: guest, Before: before}); err != nil {
		t.Fatal(err)
	}
	// Shims daemonize; as a subreaper this process inherits them (and so
	// can find and reap them) instead of init.
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		t.Fatalf("become a subreaper: %v", err)
	}

	nodeStart := time.Now()
	timeout := "-test.timeout=30m"
	if guest != nil {
		timeout = "-test.timeout=90m"
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestRealNode$", "-test.v", "-test.count=1", timeout)
	cmd.Env = append(os.Environ(), envChild+"="+dir)
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNS | syscall.CLONE_NEWNET, Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		t.Fatalf("re-run the test in new namespaces (root needed): %v", err)
	}
	mnt, _ := MountNS(cmd.Process.Pid)
	if err := os.WriteFile(filepath.Join(dir, mntnsFile), []byte(mnt), 0o644); err != nil {
		t.Error(err)
	}
	results := map[string]string{}
	var detail sync.Map
	res := regexp.MustCompile(`^\s*--- (PASS|FAIL|SKIP): TestRealNode/(\S+) \(`)
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	cur := ""
	for sc.Scan() {
		line := sc.Text()
		// Indented, so `go test -json` does not take them for this
		// process's own test events.
		fmt.Println("    | " + line)
		if m := res.FindStringSubmatch(line); m != nil {
			results[m[2]] = m[1]
		}
		if strings.HasPrefix(line, "=== RUN   TestRealNode/") {
			cur = strings.TrimPrefix(line, "=== RUN   TestRealNode/")
		}
		if cur != "" {
			v, _ := detail.LoadOrStore(cur, &strings.Builder{})
			v.(*strings.Builder).WriteString(line + "\n")
		}
	}
	childErr := cmd.Wait()
	t.Logf("node run (namespace, bring-up, subtests, teardown) took %s", time.Since(nodeStart).Round(time.Second))

	for _, s := range steps() {
		t.Run(s, func(t *testing.T) {
			d := ""
			if v, ok := detail.Load(s); ok {
				d = v.(*strings.Builder).String()
			}
			switch results[s] {
			case "PASS":
			case "SKIP":
				// A skipped step tested nothing: the tier would pass empty.
				t.Errorf("skipped inside the node (a skip in this tier is a failure: make it run or fail with the fix):\n%s", d)
			case "FAIL":
				t.Errorf("failed inside the node:\n%s", d)
			default:
				t.Errorf("did not run inside the node (see the node test's output above)")
			}
		})
	}
	if childErr != nil && !t.Failed() {
		t.Errorf("node test process: %v", childErr)
	}

	// Whatever the node left running is killed (and reported below).
	killed, sweepErr := Sweep(mnt, os.Getpid(), 30*time.Second)
	t.Run("CheckClean", func(t *testing.T) {
		if len(killed) > 0 {
			t.Errorf("teardown left processes (now killed): %v", killed)
		}
		if sweepErr != nil {
			t.Error(sweepErr)
		}
		after, err := Snapshot()
		if err != nil {
			t.Fatal(err)
		}
		if left := before.Diff(after); len(left) > 0 {
			t.Errorf("left on the host after teardown: %v", left)
			if err := before.RemoveCgroups(after); err != nil {
				t.Error(err)
			}
		}
		if err := os.RemoveAll(dir); err != nil {
			t.Errorf("remove scratch dir: %v", err)
		}
		if left := Leftovers(mnt, os.Getpid()); len(left) > 0 {
			t.Errorf("processes of the node still running: %v", left)
		}
	})
}

// handoff is what the parent passes to the run inside.
type handoff struct {
	Parts     Parts
	Artifacts Artifacts
	Repo      string
	// Guest is the guest steps' (EnvGuest).
	Guest *GuestArtifacts
	// Before is the host as the parent found it.
	Before HostState
}

func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}

// runInside is the node run: namespace, node, subtests, teardown.
func runInside(t *testing.T, dir string) {
	var h handoff
	b, err := os.ReadFile(filepath.Join(dir, "handoff.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &h); err != nil {
		t.Fatal(err)
	}
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		t.Fatal(err)
	}
	if err := EnterNamespace(dir); err != nil {
		t.Fatalf("enter the node's namespace: %v", err)
	}
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), klog.Background()))
	defer cancel()
	start := time.Now()
	n, err := Up(ctx, dir, h.Parts, h.Artifacts.Images)
	if err != nil {
		t.Fatalf("bring the node up: %v", err)
	}
	t.Logf("node up in %s: %v", time.Since(start).Round(100*time.Millisecond), n.Timings)
	defer func() {
		down := time.Now()
		if err := n.Down(context.Background()); err != nil {
			t.Errorf("teardown: %v", err)
		}
		// Shims that exited were reparented to this subreaper: reap them.
		for {
			if pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil); pid <= 0 || err != nil {
				break
			}
		}
		// runc removes a container's cgroups but not their /k8s.io
		// parents: remove the ones the host did not have.
		if after, err := Snapshot(); err != nil {
			t.Errorf("teardown: %v", err)
		} else if err := h.Before.RemoveCgroups(after); err != nil {
			t.Errorf("teardown: %v", err)
		}
		t.Logf("teardown took %s", time.Since(down).Round(100*time.Millisecond))
	}()
	e := &env{Node: n, art: h.Artifacts, repo: h.Repo, ns: driverNS, guestArt: h.Guest}
	defer e.stopGuest(t)
	run := map[string]func(*testing.T){
		"Install":           e.testInstall,
		"VFPod":             e.testVFPod,
		"LauncherPod":       e.testLauncherPod,
		"RolloutRestart":    e.testRolloutRestart,
		"KillDuringPrepare": e.testKillDuringPrepare,
		"HelmInstall":       e.testHelmInstall,
		"HelmUpgrade":       e.testHelmUpgrade,
		"Standby":           e.testStandby,
		"KubeVirt":          e.testKubeVirt,
		"LiveMigration":     e.testLiveMigration,
		"HelmUninstall":     e.testHelmUninstall,
		"GuestNode":         e.testGuestNode,
		"GuestDriver":       e.testGuestDriver,
		"GuestKubeVirt":     e.testGuestKubeVirt,
	}
	for _, s := range steps() {
		begin, cpu := time.Now(), TreeCPU(os.Getpid())
		if !t.Run(s, run[s]) {
			t.Logf("%s failed: the later steps need it; stopping", s)
			return
		}
		t.Logf("%s took %s, %s CPU in the node's processes", s, time.Since(begin).Round(100*time.Millisecond), (TreeCPU(os.Getpid()) - cpu).Round(100*time.Millisecond))
	}
}
