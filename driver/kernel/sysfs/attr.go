// Reading one sysfs attribute, link or directory, with errors that name it.

package sysfs

import (
	"fmt"
	"io/fs"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// attrAt names an entry of an open directory; errors carry the full path.
type attrAt struct {
	dfd       int
	dir, name string
}

func (a attrAt) err(op string, err error) error {
	return &fs.PathError{Op: op, Path: filepath.Join(a.dir, a.name), Err: err}
}

func (a attrAt) read() (string, error) {
	fd, err := unix.Openat(a.dfd, a.name, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", a.err("open", err)
	}
	var buf [128]byte
	n, err := unix.Read(fd, buf[:])
	unix.Close(fd)
	if err != nil {
		return "", a.err("read", err)
	}
	return strings.TrimSpace(string(buf[:max(n, 0)])), nil
}

func (a attrAt) hexID() (string, error) {
	v, err := a.read()
	if err != nil {
		return "", err
	}
	id := strings.ToLower(strings.TrimPrefix(strings.TrimPrefix(v, "0x"), "0X"))
	if len(id) != 4 || !isHex(id) {
		return "", fmt.Errorf("%s: want a 16-bit hex ID like 0x8086, got %q", filepath.Join(a.dir, a.name), v)
	}
	return id, nil
}

func (a attrAt) readlink() (string, error) {
	for size := 256; ; size *= 2 {
		buf := make([]byte, size)
		n, err := unix.Readlinkat(a.dfd, a.name, buf)
		if err != nil {
			return "", a.err("readlink", err)
		}
		if n < size { // a full buffer may be a truncated target
			return string(buf[:n]), nil
		}
	}
}

func (a attrAt) dirNames() ([]string, error) {
	fd, err := unix.Openat(a.dfd, a.name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, a.err("open", err)
	}
	defer unix.Close(fd)
	names, err := direntNames(fd)
	if err != nil {
		return nil, a.err("readdirent", err)
	}
	return names, nil
}

func openDir(dir string) (int, error) {
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, &fs.PathError{Op: "open", Path: dir, Err: err}
	}
	return fd, nil
}

// readAttr reads a small sysfs attribute and trims the trailing newline.
// It uses raw syscalls: os.Open registers every file with the poller, which
// dominates the cost of reading thousands of 5-byte files.
func readAttr(path string) (string, error) {
	fd, err := syscall.Open(path, syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return "", &fs.PathError{Op: "open", Path: path, Err: err}
	}
	var buf [128]byte
	n, err := syscall.Read(fd, buf[:])
	syscall.Close(fd)
	if err != nil {
		return "", &fs.PathError{Op: "read", Path: path, Err: err}
	}
	if n < 0 {
		n = 0
	}
	return strings.TrimSpace(string(buf[:n])), nil
}

// readDirNames lists a directory with raw syscalls (open, getdents, close);
// os.ReadDir costs several more calls per directory.
func readDirNames(dir string) ([]string, error) {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: dir, Err: err}
	}
	defer unix.Close(fd)
	names, err := direntNames(fd)
	if err != nil {
		return nil, &fs.PathError{Op: "readdirent", Path: dir, Err: err}
	}
	return names, nil
}

func direntNames(fd int) ([]string, error) {
	var names []string
	buf := make([]byte, 2048)
	for {
		n, err := unix.ReadDirent(fd, buf)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, err
		}
		if n <= 0 {
			return names, nil
		}
		_, _, names = unix.ParseDirent(buf[:n], -1, names)
	}
}
