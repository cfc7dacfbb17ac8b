// Package kernel runs vfnet's kernel-facing code against a real Linux kernel:
// a Debian kernel booted under QEMU's software emulation with an emulated
// Intel 82576 NIC (igb, SR-IOV) behind an emulated Intel IOMMU. This file
// and its siblings build the guest (an initramfs) and read its console;
// TestRealKernel boots it and reports one subtest per guest case
// (test/kernel/guest).
package kernel

import (
	"fmt"
	"io"
	"os"
	"path"
	"strings"
)

// CPIO writes an uncompressed "newc" cpio archive, the format the kernel
// unpacks as an initramfs. Uncompressed: decompressing under TCG costs
// seconds of boot time, a larger image costs only guest memory.
type CPIO struct {
	w    io.Writer
	ino  uint32
	off  int64
	dirs map[string]bool
	err  error
}

// NewCPIO starts an archive on w.
func NewCPIO(w io.Writer) *CPIO {
	return &CPIO{w: w, ino: 1, dirs: map[string]bool{"": true, ".": true}}
}

const (
	modeDir  = 0o040000
	modeReg  = 0o100000
	modeLink = 0o120000
)

func (c *CPIO) write(p []byte) {
	if c.err != nil {
		return
	}
	n, err := c.w.Write(p)
	c.off += int64(n)
	c.err = err
}

func (c *CPIO) pad() {
	if r := c.off % 4; r != 0 {
		c.write(make([]byte, 4-r))
	}
}

// header writes one entry's header and name; the body follows.
func (c *CPIO) header(name string, mode uint32, size int64) {
	if size > 0xffffffff {
		c.err = fmt.Errorf("cpio: %s is %d bytes, over the newc limit of 4 GiB", name, size)
		return
	}
	c.ino++
	nlink := 1
	if mode&0o170000 == modeDir {
		nlink = 2
	}
	// 13 eight-digit hex fields after the magic: ino, mode, uid, gid, nlink,
	// mtime, filesize, devmajor, devminor, rdevmajor, rdevminor, namesize, check.
	hdr := fmt.Sprintf("070701%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x",
		c.ino, mode, 0, 0, nlink, 0, size, 0, 0, 0, 0, len(name)+1, 0)
	c.write([]byte(hdr))
	c.write([]byte(name + "\x00"))
	c.pad()
}

// parents adds the missing parent directories of name.
func (c *CPIO) parents(name string) {
	dir := path.Dir(name)
	if c.dirs[dir] {
		return
	}
	c.parents(dir)
	c.dirs[dir] = true
	c.header(dir, modeDir|0o755, 0)
}

func clean(name string) string { return strings.TrimPrefix(path.Clean("/"+name), "/") }

// Dir adds a directory (and its parents).
func (c *CPIO) Dir(name string, perm os.FileMode) {
	name = clean(name)
	if c.dirs[name] {
		return
	}
	c.parents(name)
	c.dirs[name] = true
	c.header(name, modeDir|uint32(perm.Perm()), 0)
}

// File adds a regular file with data.
func (c *CPIO) File(name string, perm os.FileMode, data []byte) {
	name = clean(name)
	c.parents(name)
	c.header(name, modeReg|uint32(perm.Perm()), int64(len(data)))
	c.write(data)
	c.pad()
}

// CopyFile adds the host file src as name, keeping its permission bits.
func (c *CPIO) CopyFile(name, src string) {
	if c.err != nil {
		return
	}
	f, err := os.Open(src)
	if err != nil {
		c.err = fmt.Errorf("cpio: %w", err)
		return
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		c.err = fmt.Errorf("cpio: %w", err)
		return
	}
	name = clean(name)
	c.parents(name)
	c.header(name, modeReg|uint32(st.Mode().Perm()), st.Size())
	if c.err != nil {
		return
	}
	n, err := io.Copy(c.w, f)
	c.off += n
	if err == nil && n != st.Size() {
		err = fmt.Errorf("%s changed size while being archived", src)
	}
	if err != nil {
		c.err = fmt.Errorf("cpio: copy %s: %w", src, err)
	}
	c.pad()
}

// Symlink adds name pointing at target.
func (c *CPIO) Symlink(name, target string) {
	name = clean(name)
	c.parents(name)
	c.header(name, modeLink|0o777, int64(len(target)))
	c.write([]byte(target))
	c.pad()
}

// Close writes the trailer; the archive is then complete. It returns the
// first error any call met.
func (c *CPIO) Close() error {
	c.header("TRAILER!!!", 0, 0)
	if r := c.off % 512; r != 0 && c.err == nil {
		c.write(make([]byte, 512-r))
	}
	return c.err
}
