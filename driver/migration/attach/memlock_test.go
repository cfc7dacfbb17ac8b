package attach_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/vfnet-io/vfnet/driver/migration/attach"
)

// fakeProc builds a /proc with processes whose root/var/run/libvirt points
// at a given directory, as /proc/<pid>/root does for a container process.
type fakeProc struct {
	t    *testing.T
	root string
}

func newFakeProc(t *testing.T) fakeProc {
	p := fakeProc{t: t, root: filepath.Join(t.TempDir(), "proc")}
	if err := os.MkdirAll(p.root, 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func (p fakeProc) add(pid int, libvirtDir string, args ...string) {
	dir := filepath.Join(p.root, strconv.Itoa(pid))
	rootfs := filepath.Join(p.root, "..", "rootfs-"+strconv.Itoa(pid))
	for _, d := range []string{dir, filepath.Join(rootfs, "var", "run")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			p.t.Fatal(err)
		}
	}
	if err := os.Symlink(libvirtDir, filepath.Join(rootfs, "var", "run", "libvirt")); err != nil {
		p.t.Fatal(err)
	}
	if err := os.Symlink(rootfs, filepath.Join(dir, "root")); err != nil {
		p.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "cmdline"), []byte(strings.Join(args, "\x00")+"\x00"), 0o644); err != nil {
		p.t.Fatal(err)
	}
}

type fakeRlimits struct {
	lims map[int]unix.Rlimit
	sets int
}

func (f *fakeRlimits) Get(pid, res int) (unix.Rlimit, error) {
	if res != unix.RLIMIT_MEMLOCK {
		return unix.Rlimit{}, unix.EINVAL
	}
	l, ok := f.lims[pid]
	if !ok {
		return l, unix.ESRCH
	}
	return l, nil
}

func (f *fakeRlimits) Set(pid, res int, l unix.Rlimit) error {
	if _, ok := f.lims[pid]; !ok || res != unix.RLIMIT_MEMLOCK {
		return unix.ESRCH
	}
	if l.Cur > l.Max {
		return unix.EINVAL // as the kernel does
	}
	f.sets++
	f.lims[pid] = l
	return nil
}

func TestFindQEMUMatchesDomainAndLauncher(t *testing.T) {
	t.Parallel()
	base := t.TempDir()
	mine, other := filepath.Join(base, "mine"), filepath.Join(base, "other")
	for _, d := range []string{mine, other} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	p := newFakeProc(t)
	qemu := func(name string) []string {
		return []string{"/usr/libexec/qemu-kvm", "-name", "guest=" + name + ",debug-threads=on", "-S"}
	}
	p.add(10, mine, "/usr/bin/virt-launcher", "--name", "vm1")
	p.add(11, other, qemu("default_vm1")...) // same VMI, other launcher pod
	p.add(12, mine, qemu("default_vm10")...) // name prefix only
	p.add(13, mine, qemu("default_vm1")...)  // the one
	p.add(14, mine, "sh", "-c", "echo -name guest=default_vm1")
	pid, err := attach.FindQEMU(p.root, mine, "default_vm1")
	if err != nil || pid != 13 {
		t.Fatalf("FindQEMU = %d, %v; want 13", pid, err)
	}
	if _, err := attach.FindQEMU(p.root, mine, "default_vm2"); err == nil || !strings.Contains(err.Error(), "hostPID") {
		t.Fatalf("missing QEMU: %v, want an error naming hostPID", err)
	}
}

func TestProcMemlockRaisesOnlyWhenLower(t *testing.T) {
	t.Parallel()
	rd := t.TempDir()
	p := newFakeProc(t)
	p.add(42, rd, "qemu-system-x86_64", "-name", "guest=ns_vm")
	lims := &fakeRlimits{lims: map[int]unix.Rlimit{42: {Cur: 64 << 10, Max: 64 << 10}}}
	m := attach.ProcMemlock{ProcRoot: p.root, Limits: lims}
	need := uint64(3 << 30)
	if err := m.EnsureMemlock(context.Background(), rd, "ns_vm", need); err != nil {
		t.Fatal(err)
	}
	if got := lims.lims[42]; got.Cur != need || got.Max != need {
		t.Fatalf("limit %+v, want %d/%d", got, need, need)
	}
	if err := m.EnsureMemlock(context.Background(), rd, "ns_vm", need-1); err != nil || lims.sets != 1 {
		t.Fatalf("second call: err %v, %d sets; a sufficient limit must be left alone", err, lims.sets)
	}
	lims.lims[42] = unix.Rlimit{Cur: 1 << 20, Max: unix.RLIM_INFINITY}
	if err := m.EnsureMemlock(context.Background(), rd, "ns_vm", need); err != nil {
		t.Fatal(err)
	}
	if got := lims.lims[42]; got.Cur != need || got.Max != unix.RLIM_INFINITY {
		t.Fatalf("limit %+v: the hard limit must never be lowered", got)
	}
}

// TestPrlimitOnSelf checks the prlimit(2) wiring on this process: reading
// and re-setting its own RLIMIT_MEMLOCK needs no privilege.
func TestPrlimitOnSelf(t *testing.T) {
	t.Parallel()
	pid := os.Getpid()
	var p attach.Prlimit
	before, err := p.Get(pid, unix.RLIMIT_MEMLOCK)
	if err != nil {
		t.Fatal(err)
	}
	var want unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_MEMLOCK, &want); err != nil {
		t.Fatal(err)
	}
	if before != want {
		t.Fatalf("Prlimit.Get = %+v, getrlimit = %+v", before, want)
	}
	if err := p.Set(pid, unix.RLIMIT_MEMLOCK, before); err != nil {
		t.Fatal(err)
	}
}
