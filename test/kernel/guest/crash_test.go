//go:build kernelguest

package guest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/vfnet-io/vfnet/driver/checkpoint"
	"github.com/vfnet-io/vfnet/driver/kernel/sysfs"
	"github.com/vfnet-io/vfnet/driver/kernel/vflink"
	"github.com/vfnet-io/vfnet/test/kernel/layout"
)

// The kill helper is the driver's prepare code in a process of its own
// (this binary, re-executed) that stops at its N-th step and waits to be
// SIGKILLed there, mid-way through real kernel changes.
const (
	envKillDir  = "VFNET_KILL_DIR"
	envKillAt   = "VFNET_KILL_AT"
	envKillMode = "VFNET_KILL_MODE"
)

// TestKillHelper is the child process; it does nothing in a normal run.
func TestKillHelper(t *testing.T) {
	dir := os.Getenv(envKillDir)
	if dir == "" {
		t.Skip("helper process for TestConcurrentAndKilled")
	}
	m := guest(t)
	at, _ := strconv.Atoi(os.Getenv(envKillAt))
	c := readClaim(t, dir)
	steps, err := os.OpenFile(filepath.Join(dir, "steps"), os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	s := m.state(t, dir, func(step string) {
		n++
		fmt.Fprintln(steps, step)
		if n == at {
			// Renamed into place: the parent never reads a half-written name.
			tmp := filepath.Join(dir, "stopped.tmp")
			if err := os.WriteFile(tmp, []byte(step), 0o644); err == nil {
				_ = os.Rename(tmp, filepath.Join(dir, "stopped"))
			}
			// Wait for SIGKILL. A sleep, not an empty select: with no other
			// goroutine left the runtime would call that a deadlock and exit.
			for {
				time.Sleep(time.Hour)
			}
		}
	}, c)
	ctx := context.Background()
	switch os.Getenv(envKillMode) {
	case "prepare":
		err = prepareClaim(ctx, s, c)
	case "unprepare":
		err = unprepareClaim(ctx, s, c)
	}
	if err != nil {
		t.Fatal(err)
	}
}

func readClaim(t *testing.T, dir string) *resourceapi.ResourceClaim {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, "claim.json"))
	if err != nil {
		t.Fatal(err)
	}
	var c resourceapi.ResourceClaim
	if err := json.Unmarshal(data, &c); err != nil {
		t.Fatal(err)
	}
	return &c
}

// runKilled runs the helper in mode and SIGKILLs it at step at (0: lets it
// finish). It returns the steps the helper took and the one it was killed
// after ("" when it finished).
func runKilled(t *testing.T, dir, mode string, at int) ([]string, string) {
	t.Helper()
	_ = os.Remove(filepath.Join(dir, "stopped"))
	cmd := exec.Command("/proc/self/exe", "-test.run", "^TestKillHelper$", "-test.v")
	cmd.Env = append(os.Environ(), envKillDir+"="+dir, envKillAt+"="+strconv.Itoa(at), envKillMode+"="+mode)
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	var killedAt string
	deadline := time.After(2 * time.Minute)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
wait:
	for {
		select {
		case err := <-exited:
			if err != nil {
				t.Fatalf("%s helper (kill at %d) failed: %v\n%s", mode, at, err, out.String())
			}
			break wait
		case <-deadline:
			_ = cmd.Process.Kill()
			t.Fatalf("%s helper (kill at %d) hung:\n%s", mode, at, out.String())
		case <-tick.C:
			if at == 0 {
				continue
			}
			step, err := os.ReadFile(filepath.Join(dir, "stopped"))
			if err != nil {
				continue
			}
			if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			var ee *exec.ExitError
			if err := <-exited; !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
				t.Fatalf("helper did not die of SIGKILL: %v", err)
			}
			killedAt = string(step)
			break wait
		}
	}
	data, _ := os.ReadFile(filepath.Join(dir, "steps"))
	return strings.Fields(string(data)), killedAt
}

// Case 7: two VFs prepared and unprepared concurrently; then the prepare
// process SIGKILLed after each of its steps (and the unprepare process
// after each of its steps), and a restarted one converging: every VF ends
// prepared as asked, or restored.
func TestConcurrentAndKilled(t *testing.T) {
	m := guest(t)
	pf := m.pf(t, layout.RoleMain)
	ctx := context.Background()

	t.Run("concurrent", func(t *testing.T) {
		vfs := []sysfs.VF{pf.VFs[0], pf.VFs[1]}
		var claims []*resourceapi.ResourceClaim
		var before []vfState
		for i, vf := range vfs {
			before = append(before, m.vfState(t, pf, vf))
			claims = append(claims, claim(fmt.Sprintf("conc-%d", i), fmt.Sprintf(`{%s,"mac":"02:00:00:00:07:%02x","vlan":%d,"trust":true}`, vfConfigHead, i, 300+i), vf))
		}
		s := m.state(t, t.TempDir(), nil, claims...)
		each := func(f func(*resourceapi.ResourceClaim) error) {
			var wg sync.WaitGroup
			errs := make([]error, len(claims))
			for i, c := range claims {
				wg.Go(func() { errs[i] = f(c) })
			}
			wg.Wait()
			if err := errors.Join(errs...); err != nil {
				t.Fatal(err)
			}
		}
		each(func(c *resourceapi.ResourceClaim) error { return prepareClaim(ctx, s, c) })
		for i, vf := range vfs {
			m.checkPrepared(t, pf, vf, vflink.VFState{MAC: net.HardwareAddr{2, 0, 0, 0, 7, byte(i)}, VLAN: 300 + i, Trust: true, SpoofChk: before[i].Link.SpoofChk})
		}
		each(func(c *resourceapi.ResourceClaim) error { return unprepareClaim(ctx, s, c) })
		for i, vf := range vfs {
			m.checkRestored(t, pf, vf, before[i], false)
		}
	})

	// The real vfnet-driver process (in a pod-like namespace, against the
	// harness's API server) SIGKILLed while the kubelet's prepare call is
	// in flight, as soon as its checkpoint names the claim; a restarted
	// one finishes the prepare when the kubelet retries and undoes it on
	// unprepare.
	t.Run("real-driver-killed", func(t *testing.T) {
		kube, apiHost := m.apiClient(t)
		ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
		defer cancel()
		apiNode(t, ctx, kube)
		vf := pf.VFs[2]
		before := m.vfState(t, pf, vf)
		ns, dir := podNetns(t, apiHost, m.lay.APIServer), t.TempDir()
		ref := apiClaim(t, ctx, kube, "killed-driver", fmt.Sprintf(`{%s,"mac":"02:00:00:00:09:01","vlan":77,"trust":true}`, vfConfigHead), vf)
		d1 := m.startDriver(t, ctx, ns, dir)
		calls := make(chan error, 1)
		go func() { _, err := d1.prepare(ctx, ref); calls <- err }()
		cp := filepath.Join(dir, "plugin", checkpoint.FileName)
		waitFor(t, ctx, d1.exited, "the claim in the driver's checkpoint", func() bool {
			data, _ := os.ReadFile(cp)
			return strings.Contains(string(data), ref.Uid)
		})
		d1.kill(t)
		err := <-calls
		t.Logf("killed mid-prepare (the kubelet's call: %v): %s", err, m.vfState(t, pf, vf))
		d2 := m.startDriver(t, ctx, ns, dir)
		if _, err := d2.prepare(ctx, ref); err != nil {
			t.Fatalf("prepare after restart: %v", err)
		}
		m.checkPrepared(t, pf, vf, vflink.VFState{MAC: net.HardwareAddr{2, 0, 0, 0, 9, 1}, VLAN: 77, Trust: true, SpoofChk: before.Link.SpoofChk})
		if err := d2.unprepare(ctx, ref); err != nil {
			t.Fatal(err)
		}
		m.checkRestored(t, pf, vf, before, false)
		d2.stop(t)
	})

	vf := pf.VFs[0]
	want := vflink.VFState{MAC: net.HardwareAddr{2, 0, 0, 0, 8, 1}, VLAN: 42, QoS: 1, Trust: true, MaxTxRateMbps: 100}
	c := claim("killed", fmt.Sprintf(`{%s,"mac":"02:00:00:00:08:01","vlan":42,"qos":1,"spoofChk":false,"trust":true,"maxTxRateMbps":100}`, vfConfigHead), vf)
	data, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	newDir := func(t *testing.T) string {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "claim.json"), data, 0o644); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	// One undisturbed run lists the steps.
	dir := newDir(t)
	before := m.vfState(t, pf, vf)
	prepSteps, _ := runKilled(t, dir, "prepare", 0)
	m.checkPrepared(t, pf, vf, want)
	unprepSteps, _ := runKilled(t, dir, "unprepare", 0)
	m.checkRestored(t, pf, vf, before, false)
	t.Logf("prepare steps: %v\nunprepare steps: %v", prepSteps, unprepSteps)
	if len(prepSteps) < 3 || len(unprepSteps) < 2 {
		t.Fatalf("too few hook steps to kill at: %v / %v", prepSteps, unprepSteps)
	}

	for at := 1; at <= len(prepSteps); at++ {
		t.Run(fmt.Sprintf("prepare-killed-at-%d", at), func(t *testing.T) {
			dir := newDir(t)
			before := m.vfState(t, pf, vf)
			_, step := runKilled(t, dir, "prepare", at)
			t.Logf("killed after %s: %s", step, m.vfState(t, pf, vf))
			s := m.state(t, dir, nil, c) // the restarted driver
			if at%2 == 0 {
				// The kubelet retries the prepare.
				if err := prepareClaim(ctx, s, c); err != nil {
					t.Fatalf("prepare after restart: %v", err)
				}
				m.checkPrepared(t, pf, vf, want)
			}
			// The pod goes away.
			if err := unprepareClaim(ctx, s, c); err != nil {
				t.Fatalf("unprepare after restart: %v", err)
			}
			m.checkRestored(t, pf, vf, before, false)
		})
	}
	for at := 1; at <= len(unprepSteps); at++ {
		t.Run(fmt.Sprintf("unprepare-killed-at-%d", at), func(t *testing.T) {
			dir := newDir(t)
			before := m.vfState(t, pf, vf)
			if err := prepareClaim(ctx, m.state(t, dir, nil, c), c); err != nil {
				t.Fatalf("prepare: %v", err)
			}
			_, step := runKilled(t, dir, "unprepare", at)
			t.Logf("killed after %s: %s", step, m.vfState(t, pf, vf))
			s := m.state(t, dir, nil, c)
			if err := unprepareClaim(ctx, s, c); err != nil {
				t.Fatalf("unprepare after restart: %v", err)
			}
			m.checkRestored(t, pf, vf, before, false)
		})
	}
}
