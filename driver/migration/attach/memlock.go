package attach

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"
)

// VFIOMemlockOverhead is what libvirt itself adds to guest memory for the
// locked-memory limit of a VFIO guest without vIOMMU.
const VFIOMemlockOverhead = 1 << 30

// MemlockRaiser makes sure QEMU may lock enough memory for VFIO. KubeVirt's
// uid-107 session daemon cannot raise QEMU's limit itself (docs/migration.md).
type MemlockRaiser interface {
	// EnsureMemlock raises RLIMIT_MEMLOCK of the QEMU process running
	// domain in the pod whose libvirt-runtime dir is runtimeDir to at least
	// bytes, if it is lower.
	EnsureMemlock(ctx context.Context, runtimeDir, domain string, bytes uint64) error
}

// Rlimits reads and sets another process's resource limits.
type Rlimits interface {
	Get(pid int, resource int) (unix.Rlimit, error)
	Set(pid int, resource int, lim unix.Rlimit) error
}

// Prlimit is Rlimits through prlimit(2). Setting another process's limit
// needs CAP_SYS_RESOURCE; raising the hard limit too.
type Prlimit struct{}

// Get returns pid's limit.
func (Prlimit) Get(pid, resource int) (unix.Rlimit, error) {
	var old unix.Rlimit
	err := unix.Prlimit(pid, resource, nil, &old)
	return old, err
}

// Set sets pid's limit.
func (Prlimit) Set(pid, resource int, lim unix.Rlimit) error {
	return unix.Prlimit(pid, resource, &lim, nil)
}

// ProcMemlock finds the QEMU process of a launcher pod in the host's /proc
// (the driver needs hostPID: true) and raises its RLIMIT_MEMLOCK.
type ProcMemlock struct {
	// ProcRoot is the host's /proc.
	ProcRoot string
	Limits   Rlimits
}

// EnsureMemlock implements MemlockRaiser.
func (p ProcMemlock) EnsureMemlock(ctx context.Context, runtimeDir, domain string, need uint64) error {
	pid, err := FindQEMU(p.ProcRoot, runtimeDir, domain)
	if err != nil {
		return err
	}
	old, err := p.Limits.Get(pid, unix.RLIMIT_MEMLOCK)
	if err != nil {
		return fmt.Errorf("read RLIMIT_MEMLOCK of QEMU pid %d (domain %s): %w", pid, domain, err)
	}
	if old.Cur >= need && old.Max >= need {
		return nil
	}
	lim := unix.Rlimit{Cur: max(old.Cur, need), Max: max(old.Max, need)}
	if err := p.Limits.Set(pid, unix.RLIMIT_MEMLOCK, lim); err != nil {
		return fmt.Errorf("raise RLIMIT_MEMLOCK of QEMU pid %d (domain %s) from %d/%d to %d bytes: %w (the driver needs CAP_SYS_RESOURCE)",
			pid, domain, old.Cur, old.Max, need, err)
	}
	klog.FromContext(ctx).V(2).Info("Raised QEMU RLIMIT_MEMLOCK", "pid", pid, "domain", domain, "from", old.Cur, "to", need)
	return nil
}

// FindQEMU returns the host pid of the QEMU process that runs domain for the
// launcher whose libvirt-runtime dir is runtimeDir. A candidate must carry
// "-name guest=<domain>" on its command line and see runtimeDir as its
// /var/run/libvirt (same device and inode through /proc/<pid>/root), which
// tells apart two launchers of the same VMI on one node.
func FindQEMU(procRoot, runtimeDir, domain string) (int, error) {
	want, err := os.Stat(runtimeDir)
	if err != nil {
		return 0, fmt.Errorf("find QEMU of domain %s: stat %s: %w", domain, runtimeDir, err)
	}
	ents, err := os.ReadDir(procRoot)
	if err != nil {
		return 0, fmt.Errorf("find QEMU of domain %s: read %s: %w", domain, procRoot, err)
	}
	var found []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid <= 0 {
			continue
		}
		dir := filepath.Join(procRoot, e.Name())
		cmd, err := os.ReadFile(filepath.Join(dir, "cmdline"))
		if err != nil || !runsGuest(cmd, domain) {
			continue
		}
		got, err := os.Stat(filepath.Join(dir, "root", "var", "run", "libvirt"))
		if err != nil || !os.SameFile(want, got) {
			continue
		}
		found = append(found, pid)
	}
	switch len(found) {
	case 1:
		return found[0], nil
	case 0:
		return 0, fmt.Errorf("find QEMU of domain %s: no process in %s has -name guest=%s and %s as /var/run/libvirt (the driver needs hostPID: true and CAP_SYS_PTRACE): %w",
			domain, procRoot, domain, runtimeDir, errNoQEMU)
	default:
		return 0, fmt.Errorf("find QEMU of domain %s: several processes match: %v", domain, found)
	}
}

var errNoQEMU = errors.New("QEMU process not found")

// runsGuest reports whether a NUL-separated command line has "-name" with a
// value "guest=<domain>[,...]" (libvirt's form) or "<domain>[,...]".
func runsGuest(cmdline []byte, domain string) bool {
	args := bytes.Split(bytes.TrimRight(cmdline, "\x00"), []byte{0})
	for i := 0; i+1 < len(args); i++ {
		if string(args[i]) != "-name" {
			continue
		}
		for _, opt := range strings.Split(string(args[i+1]), ",") {
			if opt == "guest="+domain || opt == domain {
				return true
			}
		}
	}
	return false
}

// NoMemlock skips the raise; for the driver's --simulate mode, where no QEMU
// runs behind the fake launcher.
type NoMemlock struct{}

// EnsureMemlock implements MemlockRaiser by doing nothing.
func (NoMemlock) EnsureMemlock(context.Context, string, string, uint64) error { return nil }

// isNotExist reports errors that mean the launcher is not there yet.
func isNotExist(err error) bool {
	return errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, errNoQEMU)
}
