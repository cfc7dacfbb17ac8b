// Package ownerdir makes temporary directories marked with the PID of the
// process that owns them, and removes earlier ones whose owner is gone: a
// test binary killed on timeout (SIGKILL) cannot clean up after itself.
package ownerdir

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"k8s.io/klog/v2"
)

const pidFile = "owner.pid"

// Make removes stale directories named prefix* in the temp dir, then creates
// a new one owned by this process. Keep prefix short: unix socket paths
// below the directory must stay under 108 bytes.
func Make(logger klog.Logger, prefix string) (string, error) {
	RemoveStale(logger, prefix)
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(dir, pidFile), []byte(strconv.Itoa(os.Getpid())), 0o600); err != nil {
		_ = os.RemoveAll(dir)
		return "", fmt.Errorf("write owner pid: %w", err)
	}
	return dir, nil
}

// Stale lists the directories named prefix* in the temp dir whose owner
// process no longer exists (those RemoveStale would delete).
func Stale(prefix string) []string {
	var out []string
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), prefix+"*"))
	for _, d := range dirs {
		data, err := os.ReadFile(filepath.Join(d, pidFile))
		if err != nil {
			continue
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
		if err != nil || pid <= 0 {
			continue
		}
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			out = append(out, d)
		}
	}
	return out
}

// RemoveStale deletes the directories named prefix* in the temp dir whose
// owner process no longer exists. Directories without a readable owner PID
// are left alone: they may belong to something else.
func RemoveStale(logger klog.Logger, prefix string) {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), prefix+"*"))
	for _, d := range dirs {
		data, err := os.ReadFile(filepath.Join(d, pidFile))
		if err != nil {
			continue
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
		if err != nil || pid <= 0 {
			continue
		}
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			logger.Info("Removing stale temporary dir", "dir", d, "ownerPID", pid)
			_ = os.RemoveAll(d)
		}
	}
}
