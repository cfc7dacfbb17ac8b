package metadata

import (
	"io/fs"
	"os"
	"syscall"
)

// fileID identifies one version of a file: a replaced file (new inode, as an
// atomic rename makes) and a file rewritten in place (new size, mtime or
// ctime; ctime cannot be set back by the writer) both get a new identity.
type fileID struct {
	dev, ino     uint64
	size         int64
	mtime, ctime syscall.Timespec
	ok           bool
}

func identity(fi fs.FileInfo) fileID {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fileID{}
	}
	return fileID{dev: uint64(st.Dev), ino: st.Ino, size: st.Size, mtime: st.Mtim, ctime: st.Ctim, ok: true} // Dev is uint32 on some architectures
}

func fdIdentity(f *os.File) fileID {
	fi, err := f.Stat()
	if err != nil {
		return fileID{}
	}
	return identity(fi)
}
