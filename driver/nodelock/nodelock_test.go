package nodelock

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
)

// The cross-process tests re-execute this test binary as the other driver
// instance (TestNodeLockChildProcess); it takes the lock named by the environment
// and reports on stdout.
const (
	envHelper = "VFNET_NODELOCK_HELPER"
	envPath   = "VFNET_NODELOCK_PATH"
)

func TestNodeLockChildProcess(t *testing.T) {
	mode := os.Getenv(envHelper)
	if mode == "" {
		t.Skip("helper process for the cross-process tests")
	}
	path := os.Getenv(envPath)
	switch mode {
	case "hold":
		// Hold the lock until stdin closes, then release it and exit.
		h, err := New(path).Acquire(context.Background())
		if err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
		fmt.Println("held")
		_, _ = io.Copy(io.Discard, os.Stdin)
		h.Release()
		fmt.Println("released")
	case "lead":
		// Lead until killed.
		_ = Lead(context.Background(), path, "test", func(ctx context.Context) error {
			fmt.Println("leading")
			select {}
		})
	}
	os.Exit(0)
}

type child struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines *bufio.Scanner
}

func startChild(t *testing.T, mode, path string) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestNodeLockChildProcess$")
	cmd.Env = append(os.Environ(), envHelper+"="+mode, envPath+"="+path)
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return &child{cmd: cmd, stdin: stdin, lines: bufio.NewScanner(stdout)}
}

func (c *child) expect(t *testing.T, want string) {
	t.Helper()
	if !c.lines.Scan() {
		t.Fatalf("child ended before printing %q: %v", want, c.lines.Err())
	}
	if got := c.lines.Text(); got != want {
		t.Fatalf("child printed %q, want %q", got, want)
	}
}

func TestExclusiveWithinProcess(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "lock")
	// Two Lock values on one path, as two States in one process have.
	a, b := New(path), New(path)
	ha, err := a.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if _, ok, err := b.TryAcquire(); ok || err != nil {
		t.Fatalf("second lock on %s taken while the first is held (ok %v, err %v)", path, ok, err)
	}
	if _, ok, err := a.TryAcquire(); ok || err != nil {
		t.Fatalf("the same Lock taken twice (ok %v, err %v)", ok, err)
	}
	// Many goroutines over both values: the counter is only ever touched by
	// one holder at a time (the race detector and the check below see it).
	ha.Release()
	var inside, total int
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i := range 40 {
		l := a
		if i%2 == 1 {
			l = b
		}
		wg.Go(func() {
			h, err := l.Acquire(context.Background())
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			inside++
			n := inside
			mu.Unlock()
			if n != 1 {
				t.Errorf("%d holders at once", n)
			}
			total++ // unsynchronised on purpose: the lock is the only guard
			mu.Lock()
			inside--
			mu.Unlock()
			h.Release()
		})
	}
	wg.Wait()
	if total != 40 {
		t.Fatalf("%d acquisitions, want 40", total)
	}
}

func TestExclusiveAcrossProcesses(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "lock")
	c := startChild(t, "hold", path)
	c.expect(t, "held")
	l := New(path)
	if _, ok, err := l.TryAcquire(); ok || err != nil {
		t.Fatalf("lock taken while another process holds it (ok %v, err %v)", ok, err)
	}
	got := make(chan *Held, 1)
	go func() {
		h, err := l.Acquire(context.Background())
		if err != nil {
			t.Error(err)
		}
		got <- h
	}()
	// Acquire cannot return while the child holds the lock.
	select {
	case <-got:
		t.Fatal("Acquire returned while another process holds the lock")
	default:
	}
	c.stdin.Close()
	c.expect(t, "released")
	h := <-got
	if h == nil {
		t.Fatal("no lock after the other process released it")
	}
	h.Release()
	if err := c.cmd.Wait(); err != nil {
		t.Fatal(err)
	}
}

func TestLeadTakesOverFromDeadHolder(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "migration.lock")
	c := startChild(t, "lead", path)
	c.expect(t, "leading")

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	leading := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- Lead(ctx, path, "test", func(ctx context.Context) error {
			close(leading)
			<-ctx.Done()
			return nil
		})
	}()
	if _, ok, _ := New(path).TryAcquire(); ok {
		t.Fatal("lead lock free while the other process leads")
	}
	select {
	case <-leading:
		t.Fatal("two leaders at once")
	default:
	}
	// The holder dies without releasing anything; the kernel drops its lock.
	if err := c.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-leading
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// Released when the task ended.
	h, ok, err := New(path).TryAcquire()
	if !ok || err != nil {
		t.Fatalf("lead lock not released after the task ended (ok %v, err %v)", ok, err)
	}
	h.Release()
}

func TestLeadStopsWaitingOnCancel(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "migration.lock")
	holder, err := New(path).Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	stop := errors.New("driver shutting down")
	done := make(chan error, 1)
	go func() {
		done <- Lead(ctx, path, "test", func(ctx context.Context) error {
			t.Error("task ran although another holder has the lock")
			return nil
		})
	}()
	cancel(stop)
	if err := <-done; !errors.Is(err, stop) {
		t.Fatalf("Lead returned %v, want the cancel cause", err)
	}
	// The abandoned wait must not keep the lock once the holder lets go.
	holder.Release()
	h, err := New(path).Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	h.Release()
}

// BenchmarkAcquireRelease is the lock's cost per prepare/unprepare call
// when nobody else holds it: open, flock, close.
func BenchmarkAcquireRelease(b *testing.B) {
	l := New(filepath.Join(b.TempDir(), "lock"))
	for b.Loop() {
		h, err := l.Acquire(context.Background())
		if err != nil {
			b.Fatal(err)
		}
		h.Release()
	}
}
