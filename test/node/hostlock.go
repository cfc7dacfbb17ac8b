package node

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// HostLockFile (in the temp dir) is where real-node runs on one machine take
// turns, whatever checkout they run from. Their namespaces are private, but
// the cgroup hierarchies are the host's: runc makes every container's
// cgroups under /k8s.io in each of them, and a run's teardown and its
// CheckClean count the node cgroups the host gained since the run's
// snapshot as that run's own. Two runs at once removed and reported each
// other's (a fresh-clone rehearsal beside a working tree's make test).
const HostLockFile = "vfnet-real-node.lock"

// LockHost takes the exclusive lock on path, waiting until ctx ends. The
// kernel drops a flock with its last file descriptor, so a run killed with
// SIGKILL does not hold it. holder ("pid 123, /tmp/vfnet-node-x") is written
// into the file for the next run's message; waiting is called once, with
// the current holder's, if the lock is taken.
func LockHost(ctx context.Context, path, holder string, waiting func(heldBy string)) (unlock func(), err error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("real-node lock %s: %w", path, err)
	}
	told := false
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			break
		}
		if !errors.Is(err, unix.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("real-node lock %s: %w", path, err)
		}
		heldBy := readHolder(path)
		if !told && waiting != nil {
			waiting(heldBy)
			told = true
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("real-node lock %s: still held by %s: %w", path, heldBy, ctx.Err())
		case <-time.After(500 * time.Millisecond):
		}
	}
	// Only the holder writes, so the next run's message names it.
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(holder+"\n"), 0)
	}
	return func() {
		_ = f.Truncate(0)
		_ = unix.Flock(int(f.Fd()), unix.LOCK_UN)
		f.Close()
	}, nil
}

func readHolder(path string) string {
	b, err := os.ReadFile(path)
	if s := strings.TrimSpace(string(b)); err == nil && s != "" {
		return s
	}
	return "another run"
}
