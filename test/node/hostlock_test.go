package node

import (
	"bufio"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestLockHostOneAtATime: a second run waits while the first holds the
// lock, names the holder, gives up when its context ends, and takes the
// lock once the first lets go.
func TestLockHostOneAtATime(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), HostLockFile)
	unlockA, err := LockHost(context.Background(), path, "pid 1, run A", nil)
	if err != nil {
		t.Fatal(err)
	}

	var heldBy []string
	ctx, cancel := context.WithTimeout(context.Background(), 700*time.Millisecond)
	defer cancel()
	_, err = LockHost(ctx, path, "pid 2, run B", func(h string) { heldBy = append(heldBy, h) })
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "pid 1, run A") {
		t.Fatalf("second LockHost while the first holds it: got %v, want a deadline error naming run A", err)
	}
	if len(heldBy) != 1 || heldBy[0] != "pid 1, run A" {
		t.Fatalf("waiting callback got %q, want once with run A", heldBy)
	}

	got := make(chan error, 1)
	var unlockB func()
	go func() {
		var err error
		unlockB, err = LockHost(context.Background(), path, "pid 2, run B", nil)
		got <- err
	}()
	select {
	case err := <-got:
		t.Fatalf("LockHost returned (%v) while run A still holds the lock", err)
	case <-time.After(300 * time.Millisecond):
	}
	unlockA()
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("LockHost did not take the lock after run A let go")
	}
	if h := readHolder(path); h != "pid 2, run B" {
		t.Fatalf("holder in the lock file: %q, want run B", h)
	}
	unlockB()
	if h := readHolder(path); h != "another run" {
		t.Fatalf("holder after unlock: %q, want none", h)
	}
}

const envLockHelper = "VFNET_TEST_LOCK_HELPER"

// TestLockHostFreedWhenHolderKilled: a run killed with SIGKILL (go test's
// timeout) runs no teardown; the next run must still get the lock.
func TestLockHostFreedWhenHolderKilled(t *testing.T) {
	if path := os.Getenv(envLockHelper); path != "" {
		if _, err := LockHost(context.Background(), path, "pid helper", nil); err != nil {
			os.Exit(3)
		}
		os.Stdout.WriteString("locked\n")
		time.Sleep(time.Minute)
		os.Exit(0)
	}
	t.Parallel()
	path := filepath.Join(t.TempDir(), HostLockFile)
	cmd := exec.Command(os.Args[0], "-test.run=^TestLockHostFreedWhenHolderKilled$")
	cmd.Env = append(os.Environ(), envLockHelper+"="+path)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || line != "locked\n" {
		t.Fatalf("helper did not take the lock: %q, %v", line, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if _, err := LockHost(ctx, path, "pid test", nil); err == nil {
		t.Fatal("took the lock while the helper holds it")
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	ctx2, cancel2 := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel2()
	unlock, err := LockHost(ctx2, path, "pid test", nil)
	if err != nil {
		t.Fatalf("lock after the holder was killed: %v", err)
	}
	unlock()
}
