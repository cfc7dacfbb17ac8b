package simhost

import (
	"os"

	"golang.org/x/sys/unix"
)

// TB is the part of testing.TB that TempDir needs (simhost is product code
// and does not import testing).
type TB interface {
	Helper()
	TempDir() string
	Cleanup(func())
	Fatalf(format string, args ...any)
}

// TempDir returns a fresh directory for a synthetic host, removed when the
// test ends. It prefers /dev/shm when that is a writable tmpfs: a 1024-VF
// host is some 40 000 small files, cheap on tmpfs and slow on a journaling
// disk shared with other builds; otherwise it is tb.TempDir().
func TempDir(tb TB) string {
	tb.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs("/dev/shm", &st); err == nil && st.Type == unix.TMPFS_MAGIC {
		if dir, err := os.MkdirTemp("/dev/shm", "simhost-"); err == nil {
			tb.Cleanup(func() { os.RemoveAll(dir) })
			return dir
		}
	}
	return tb.TempDir()
}
