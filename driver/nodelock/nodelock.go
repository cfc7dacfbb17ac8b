// Package nodelock is a node-local exclusive lock shared by every process
// that opens the same file: flock(2) on a file in the plugin data
// directory. During a rolling update two vfnet-driver pods serve one node
// (kubeletplugin.RollingUpdate); the lock makes their prepare and unprepare
// calls take turns on the shared checkpoint, and Lead lets exactly one of
// them run the live-migration watcher.
//
// flock is used, not a lease object or a PID file: the kernel drops the lock
// when its holder dies, however it dies (SIGKILL, OOM kill), so a waiter
// takes over without a timeout and a stale holder can never be mistaken for
// a live one. Both pods mount the same hostPath, so they lock one inode.
// The lock files are never removed or replaced: a waiter on a removed inode
// and a holder of a new one would both think they hold the lock.
package nodelock

import (
	"context"
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"
)

// Lock is an exclusive lock on the file at Path. Separate Lock values (in
// one process or in several) on the same path exclude each other, because
// every acquisition opens the file anew and flock locks belong to the open
// file description.
type Lock struct {
	path string
	// sem lets one goroutine of this Lock at a time wait in flock, so a
	// burst of waiters in one process occupies one OS thread, not many.
	sem chan struct{}
}

// New returns the lock on path. The directory must exist; the file is
// created on first use.
func New(path string) *Lock {
	return &Lock{path: path, sem: make(chan struct{}, 1)}
}

// Path is the lock file.
func (l *Lock) Path() string { return l.path }

// Held is an acquired lock.
type Held struct {
	f   *os.File
	sem chan struct{}
}

// Release drops the lock. It is safe to call more than once.
func (h *Held) Release() {
	if h == nil || h.f == nil {
		return
	}
	_ = h.f.Close() // closing the last descriptor releases the flock
	h.f = nil
	<-h.sem
}

func (l *Lock) open() (*os.File, error) {
	f, err := os.OpenFile(l.path, os.O_RDWR|os.O_CREATE|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open lock file %s: %w", l.path, err)
	}
	return f, nil
}

func flock(f *os.File, how int) error {
	for {
		err := unix.Flock(int(f.Fd()), how)
		if !errors.Is(err, unix.EINTR) {
			return err
		}
	}
}

// Acquire waits until the lock is held or ctx ends.
func (l *Lock) Acquire(ctx context.Context) (*Held, error) {
	select {
	case l.sem <- struct{}{}:
	case <-ctx.Done():
		return nil, fmt.Errorf("wait for node lock %s: %w", l.path, context.Cause(ctx))
	}
	f, err := l.open()
	if err != nil {
		<-l.sem
		return nil, err
	}
	if flock(f, unix.LOCK_EX|unix.LOCK_NB) == nil {
		return &Held{f: f, sem: l.sem}, nil
	}
	// Contended: block in a goroutine so ctx can end the wait. A wait that
	// is given up finishes in the background and drops the lock at once.
	got := make(chan error, 1)
	go func() { got <- flock(f, unix.LOCK_EX) }()
	select {
	case err := <-got:
		if err != nil {
			f.Close()
			<-l.sem
			return nil, fmt.Errorf("lock %s: %w", l.path, err)
		}
		return &Held{f: f, sem: l.sem}, nil
	case <-ctx.Done():
		go func() {
			<-got
			f.Close()
			<-l.sem
		}()
		return nil, fmt.Errorf("wait for node lock %s: %w", l.path, context.Cause(ctx))
	}
}

// TryAcquire takes the lock if nobody holds it; ok is false otherwise.
func (l *Lock) TryAcquire() (h *Held, ok bool, err error) {
	select {
	case l.sem <- struct{}{}:
	default:
		return nil, false, nil
	}
	f, err := l.open()
	if err != nil {
		<-l.sem
		return nil, false, err
	}
	switch err := flock(f, unix.LOCK_EX|unix.LOCK_NB); {
	case err == nil:
		return &Held{f: f, sem: l.sem}, true, nil
	case errors.Is(err, unix.EWOULDBLOCK):
		f.Close()
		<-l.sem
		return nil, false, nil
	default:
		f.Close()
		<-l.sem
		return nil, false, fmt.Errorf("lock %s: %w", l.path, err)
	}
}

// Lead runs fn while this process holds the lock on path, as the node's
// only runner of a singleton task. It waits for the lock (another instance
// leads meanwhile; when that one stops or dies the kernel hands the lock
// over), calls fn, and releases the lock when fn returns. It returns fn's
// error, or ctx's cause if ctx ended while waiting.
func Lead(ctx context.Context, path, what string, fn func(ctx context.Context) error) error {
	logger := klog.FromContext(ctx).WithValues("task", what, "lock", path)
	l := New(path)
	h, ok, err := l.TryAcquire()
	if err != nil {
		return err
	}
	if !ok {
		logger.Info("Another vfnet-driver on this node runs the task; waiting to take over")
		if h, err = l.Acquire(ctx); err != nil {
			return err
		}
	}
	defer h.Release()
	logger.Info("This vfnet-driver runs the task")
	return fn(ctx)
}
