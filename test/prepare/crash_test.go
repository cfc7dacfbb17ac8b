package prepare

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	"github.com/vfnet-io/vfnet/driver/checkpoint"
	"github.com/vfnet-io/vfnet/driver/prepare"
	"github.com/vfnet-io/vfnet/test/lib/preparetest"
	"github.com/vfnet-io/vfnet/test/lib/simhost"
)

// The crash test runs the driver in a child process (this test binary,
// re-executed) that exits abruptly at the N-th step of prepare or unprepare:
// no deferred code runs, exactly like a kill. The parent then plays the
// restarted driver and checks the host converges. Modes: prepare,
// unprepare, and prepare-failing (a bind failure makes prepare roll back, so
// the later crash points fall inside the rollback).

const (
	envHelper    = "VFNET_CRASH_HELPER"
	envCrashAt   = "VFNET_CRASH_AT"
	envMode      = "VFNET_CRASH_MODE"
	envHostRoot  = "VFNET_CRASH_HOST"
	envPluginDir = "VFNET_CRASH_PLUGIN"
	envCDIRoot   = "VFNET_CRASH_CDI"
	envClaim     = "VFNET_CRASH_CLAIM"
	envStepFile  = "VFNET_CRASH_STEPFILE"
	envResets    = "VFNET_CRASH_RESETS"
	crashExit    = 17
)

// TestCrashChildProcess is the child process; it does nothing in a normal run.
func TestCrashChildProcess(t *testing.T) {
	if os.Getenv(envHelper) != "1" {
		t.Skip("helper process for TestCrashAtEveryStep")
	}
	crashAt, _ := strconv.Atoi(os.Getenv(envCrashAt))
	h, err := simhost.Open(os.Getenv(envHostRoot))
	if err != nil {
		t.Fatal(err)
	}
	if os.Getenv(envResets) == "1" {
		h.SetVFResets(crashResets)
	}
	data, err := os.ReadFile(os.Getenv(envClaim))
	if err != nil {
		t.Fatal(err)
	}
	var claim resourceapi.ResourceClaim
	if err := json.Unmarshal(data, &claim); err != nil {
		t.Fatal(err)
	}
	n := 0
	s, err := prepare.New(prepare.Options{
		NodeName: preparetest.Node, Sysfs: h.Sysfs(), Writer: h.Kernel(), Links: h.Links(), DevRoot: h.DevRoot(),
		CheckpointPath: filepath.Join(os.Getenv(envPluginDir), checkpoint.FileName), CDIRoot: os.Getenv(envCDIRoot),
		Kube: fake.NewClientset(&claim),
		Hook: func(step string) {
			n++
			if n == crashAt {
				_ = os.WriteFile(os.Getenv(envStepFile), []byte(step), 0o644)
				os.Exit(crashExit) // no defers, no cleanup: a kill
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	switch os.Getenv(envMode) {
	case "prepare-failing":
		// The second VF's bind fails, so prepare rolls back: the crash
		// points past the failure are inside the rollback.
		h.Kernel().SetWriteHook(func(rel string, data []byte) error {
			if rel == "bus/pci/drivers/vfio-pci/bind" && string(data) == "0000:3b:02.3" {
				return syscall.EIO
			}
			return nil
		})
		res, _ := s.Prepare(ctx, []*resourceapi.ResourceClaim{&claim})
		if res[claim.UID].Err == nil {
			t.Fatal("prepare succeeded despite the injected bind failure")
		}
	case "prepare":
		res, _ := s.Prepare(ctx, []*resourceapi.ResourceClaim{&claim})
		if res[claim.UID].Err != nil {
			t.Fatal(res[claim.UID].Err)
		}
	case "park", "unpark":
		// parkClaim is prepared; its VF's MAC is parked or restored.
		if _, err := s.SetMACParked(ctx, parkBDF, os.Getenv(envMode) == "park"); err != nil {
			t.Fatal(err)
		}
	case "unprepare":
		res, _ := s.Unprepare(ctx, []kubeletplugin.NamespacedObject{{UID: claim.UID, NamespacedName: types.NamespacedName{Namespace: claim.Namespace, Name: claim.Name}}})
		if res[claim.UID] != nil {
			t.Fatal(res[claim.UID])
		}
	}
}

// crashResets are the VF resets of the reset-injecting runs: every MAC,
// VLAN and trust change and every VF driver change puts the VF in reset for
// a few milliseconds, in which the PF refuses settings with EBUSY (ice).
// Prepare, unprepare and the rollback must ride them out at every crash
// point. Real time: the child is another process.
var crashResets = simhost.VFResets{Window: 3 * time.Millisecond}

// crashClaim has two VFs and sets every link setting, so that prepare and
// unprepare go through as many steps as they can.
func crashClaim() *resourceapi.ResourceClaim {
	return preparetest.Claim("ns", "crash", "uid-crash", []string{"vf-0000-3b-02-1", "vf-0000-3b-02-3"},
		preparetest.Config(resourceapi.AllocationConfigSourceClass, `{"apiVersion":"vfnet.io/v1alpha1","kind":"VFConfig","vlan":42,"qos":5,"vlanProtocol":"802.1ad","spoofChk":false,"trust":true,"linkState":"enable","minTxRateMbps":10,"maxTxRateMbps":100}`),
		preparetest.Config(resourceapi.AllocationConfigSourceClaim, `{"apiVersion":"vfnet.io/v1alpha1","kind":"VFConfig","mac":"02:00:00:00:0a:01"}`, "vf"),
		preparetest.Config(resourceapi.AllocationConfigSourceClaim, `{"apiVersion":"vfnet.io/v1alpha1","kind":"VFConfig","mac":"02:00:00:00:0a:02"}`, "vfx"),
	)
}

// runChild runs mode in a child that exits at step crashAt. It returns the
// step it crashed after, or "" when it finished without reaching crashAt.
func runChild(t *testing.T, e *preparetest.Env, mode string, crashAt int, resets bool) string {
	t.Helper()
	var extra []string
	if resets {
		extra = append(extra, envResets+"=1")
	}
	step := runHelper(t, e, "TestCrashChildProcess", mode, crashAt, extra...)
	if resets {
		e.Host.SetVFResets(crashResets)
	}
	return step
}

// runHelper runs the test function helper in a child process on e's host,
// plugin and CDI directories, for crashClaim, in mode, to stop at its
// crashAt-th crash point; extraEnv is added to the child's environment. It
// returns the step the child stopped at (it exits with crashExit or kills
// itself with SIGKILL there), or "" when the child finished first.
func runHelper(t *testing.T, e *preparetest.Env, helper, mode string, crashAt int, extraEnv ...string) string {
	t.Helper()
	claimFile := filepath.Join(e.Dir, "claim.json")
	data, _ := json.Marshal(crashClaim())
	if err := os.WriteFile(claimFile, data, 0o644); err != nil {
		t.Fatal(err)
	}
	stepFile := filepath.Join(e.Dir, "step")
	_ = os.Remove(stepFile)
	e.Host.Close() // the child owns the host now
	cmd := exec.Command(os.Args[0], "-test.run=^"+helper+"$", "-test.count=1")
	cmd.Env = append(os.Environ(), envHelper+"=1", envCrashAt+"="+strconv.Itoa(crashAt), envMode+"="+mode,
		envHostRoot+"="+e.Host.Root(), envPluginDir+"="+e.PluginDir, envCDIRoot+"="+e.CDIRoot,
		envClaim+"="+claimFile, envStepFile+"="+stepFile)
	cmd.Env = append(cmd.Env, extraEnv...)
	out, err := cmd.CombinedOutput()
	e.Reopen(t)
	var exit *exec.ExitError
	switch {
	case err == nil:
		return ""
	case errors.As(err, &exit) && (exit.ExitCode() == crashExit || killed(exit)):
		step, _ := os.ReadFile(stepFile)
		return string(step)
	default:
		t.Fatalf("child %s %s (crash at %d) failed: %v\n%s", helper, mode, crashAt, err, out)
		return ""
	}
}

func killed(exit *exec.ExitError) bool {
	ws, ok := exit.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL
}

func unprepareClaim(t *testing.T, s *prepare.State, c *resourceapi.ResourceClaim) {
	t.Helper()
	res, err := s.Unprepare(context.Background(), []kubeletplugin.NamespacedObject{{UID: c.UID, NamespacedName: types.NamespacedName{Namespace: c.Namespace, Name: c.Name}}})
	if err != nil || res[c.UID] != nil {
		t.Fatalf("unprepare: %v %v", err, res[c.UID])
	}
}

func prepareClaim(t *testing.T, s *prepare.State, c *resourceapi.ResourceClaim) {
	t.Helper()
	res, err := s.Prepare(context.Background(), []*resourceapi.ResourceClaim{c})
	if err != nil || res[c.UID].Err != nil {
		t.Fatalf("prepare: %v %v", err, res[c.UID].Err)
	}
}

func TestCrashAtEveryStep(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns many child processes")
	}
	if raceEnabled {
		// What it checks happens across processes, where the race
		// detector sees nothing; it only made each child about 20 times
		// slower. The other tests of this package race prepare's goroutines.
		t.Skip("runs without -race: make test-unit runs it as go test -run '^TestCrashAtEveryStep$' ./test/prepare")
	}
	t.Parallel()
	// Reference states: the host as built and the host fully prepared.
	ref := preparetest.NewEnv(t, preparetest.FastDir(), simhost.E810Host())
	initial := ref.Snapshot(t).String()
	ref.AddClaim(t, crashClaim())
	prepareClaim(t, ref.NewState(t, nil), crashClaim())
	prepared := ref.Snapshot(t).String()
	if prepared == initial {
		t.Fatal("prepare changed nothing")
	}

	for _, resets := range []bool{false, true} {
		for _, mode := range []string{"prepare", "unprepare", "prepare-failing"} {
			thens := []string{"unprepare", "prepare"}
			if resets {
				// One continuation per mode: what resets change is how each
				// step's sets go, which both continuations exercise alike.
				thens = thens[:1]
			}
			for _, then := range thens {
				name := mode + "-then-" + then
				if resets {
					name += "-with-vf-resets"
				}
				t.Run(name, func(t *testing.T) {
					t.Parallel()
					steps := 0
					for n := 1; ; n++ {
						e := preparetest.NewEnv(t, preparetest.FastDir(), simhost.E810Host())
						if resets {
							e.Host.SetVFResets(crashResets)
						}
						e.AddClaim(t, crashClaim())
						if mode == "unprepare" {
							prepareClaim(t, e.NewState(t, nil), crashClaim())
						}
						step := runChild(t, e, mode, n, resets)
						if step == "" {
							break // the child finished: every step was covered
						}
						steps++
						// The restarted driver gets the kubelet's next call.
						s := e.NewState(t, nil)
						var want string
						if then == "unprepare" {
							unprepareClaim(t, s, crashClaim())
							want = initial
						} else {
							prepareClaim(t, s, crashClaim())
							want = prepared
						}
						if got := e.Snapshot(t).String(); got != want {
							t.Fatalf("%s crashed after step %d (%s), then %s: host is\n%s\nwant\n%s", mode, n, step, then, got, want)
						}
						if then == "unprepare" {
							if cp := s.Snapshot(); len(cp.Claims) != 0 {
								t.Fatalf("%s crashed after step %d (%s): checkpoint keeps %v", mode, n, step, cp.Claims)
							}
						} else {
							// And the claim can still be undone exactly.
							unprepareClaim(t, s, crashClaim())
							if got := e.Snapshot(t).String(); got != initial {
								t.Fatalf("%s crashed after step %d (%s), prepared again, then unprepared: host is\n%s\nwant\n%s", mode, n, step, got, initial)
							}
						}
					}
					if steps < 5 {
						t.Fatalf("only %d crash points in %s", steps, mode)
					}
					t.Logf("%s: crashed after each of %d steps", name, steps)
				})
			}
		}
	}
}
