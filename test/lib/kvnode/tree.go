package kvnode

import (
	"bytes"
	"debug/elf"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/vfnet-io/vfnet/hack/ociimage"
	"github.com/vfnet-io/vfnet/test/lib/sharedlibs"
)

// tree collects an image's files by path.
type tree struct {
	files map[string]ociimage.File
	// dlopened are libraries a program loads at run time (not in its
	// DT_NEEDED), added with what they need.
	dlopened []string
}

func newTree() *tree { return &tree{files: map[string]ociimage.File{}} }

// usrMerged is p in a merged-/usr layout (KubeVirt's CentOS images, and
// Debian from trixie): Debian bookworm's packages put bash in /bin and
// sysctl in /sbin, KubeVirt's pods run /usr/bin/cp.
func usrMerged(p string) string {
	for _, d := range []string{"/bin", "/sbin", "/lib", "/lib64"} {
		if p == d || strings.HasPrefix(p, d+"/") {
			return "/usr" + p
		}
	}
	return p
}

func (t *tree) add(f ociimage.File) { t.files[f.Path] = f }

// addHost adds the host file src (symlinks followed) at p.
func (t *tree) addHost(p, src string, mode fs.FileMode) error {
	data, err := os.ReadFile(src)
	if err != nil {
		return fmt.Errorf("read %s for %s: %w", src, p, err)
	}
	t.add(ociimage.File{Path: usrMerged(p), Mode: mode, Data: data})
	return nil
}

// addTree adds root/sub and everything below it at the same paths
// (merged /usr), keeping directories, regular files and symlinks, where
// keep(path relative to root) holds.
func (t *tree) addTree(root, sub string, keep func(rel string) bool) error {
	start := filepath.Join(root, sub)
	return filepath.WalkDir(start, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return fmt.Errorf("walk %s: %w", start, err)
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		if rel == "." {
			return nil
		}
		if !keep(rel) {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		ip := usrMerged("/" + filepath.ToSlash(rel))
		if ip == "/usr" {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case d.Type()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			// Debian's absolute links (/bin/x) stay valid under
			// merged /usr; relative ones name siblings.
			t.add(ociimage.File{Path: ip, Symlink: target})
		case d.IsDir():
			if _, ok := t.files[ip]; !ok {
				t.add(ociimage.File{Path: ip, Mode: fs.ModeDir | info.Mode().Perm()})
			}
		case info.Mode().IsRegular():
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			t.add(ociimage.File{Path: ip, Mode: info.Mode().Perm(), Data: data})
		}
		return nil
	})
}

// addLibs adds the loader and every shared library the tree's ELF files
// and t.dlopened need (sharedlibs.Resolve), found in dirs, under
// /usr/lib/x86_64-linux-gnu (and the loader at /usr/lib64).
func (t *tree) addLibs(dirs []string) error {
	var elfs []string
	for p, f := range t.files {
		if f.Symlink == "" && !f.Mode.IsDir() && isHostELF(p, f.Data) {
			elfs = append(elfs, p)
		}
	}
	sort.Strings(elfs)
	tmp, err := os.MkdirTemp("", "kvnode-elf-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	need := map[string]string{}
	resolve := func(file, name string) error {
		libs, err := sharedlibs.Resolve(file, dirs)
		if err != nil {
			return fmt.Errorf("shared libraries of %s: %w", name, err)
		}
		for g, h := range libs {
			need[usrMerged(g)] = h
		}
		return nil
	}
	for _, p := range elfs {
		// sharedlibs reads files: the image's copy goes to a temporary file.
		file := filepath.Join(tmp, "elf")
		if err := os.WriteFile(file, t.files[p].Data, 0o600); err != nil {
			return err
		}
		if err := resolve(file, p); err != nil {
			return err
		}
	}
	for _, lib := range t.dlopened {
		host, err := sharedlibs.Find(lib, dirs)
		if err != nil {
			return fmt.Errorf("library %s (loaded at run time): %w", lib, err)
		}
		need[usrMerged(sharedlibs.GuestLibDir+"/"+lib)] = host
		if err := resolve(host, lib); err != nil {
			return err
		}
	}
	for g, h := range need {
		if _, ok := t.files[g]; ok {
			continue
		}
		if err := t.addHost(g, h, 0o755); err != nil {
			return err
		}
	}
	return nil
}

// isHostELF reports whether data is an x86-64 program or library at a
// path programs and libraries live at (QEMU's firmware directory holds
// ELF images for other machines).
func isHostELF(p string, data []byte) bool {
	if !bytes.HasPrefix(data, []byte(elf.ELFMAG)) || strings.HasPrefix(p, "/usr/share/") {
		return false
	}
	f, err := elf.NewFile(bytes.NewReader(data))
	if err != nil {
		return false
	}
	defer f.Close()
	return f.Machine == elf.EM_X86_64
}

// list is the files in path order (a directory before what it holds).
func (t *tree) list() []ociimage.File {
	out := make([]ociimage.File, 0, len(t.files))
	for _, f := range t.files {
		out = append(out, f)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out
}

// Unpack writes im's files into root as a container runtime would unpack
// its layer (modes, owners, symlinks); root must exist.
func Unpack(im ociimage.Image, root string) error {
	for _, f := range im.Files {
		p := filepath.Join(root, filepath.FromSlash(f.Path))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return fmt.Errorf("kvnode: unpack %s: %w", im.Ref, err)
		}
		var err error
		switch {
		case f.Symlink != "":
			err = os.Symlink(f.Symlink, p)
		case f.Mode.IsDir():
			if err = os.MkdirAll(p, 0o755); err == nil {
				err = os.Chmod(p, f.Mode.Perm())
			}
		default:
			if err = os.WriteFile(p, f.Data, f.Mode.Perm()); err == nil {
				err = os.Chmod(p, f.Mode.Perm())
			}
		}
		if err == nil && f.Symlink == "" {
			err = os.Lchown(p, f.UID, f.GID)
		}
		for k, v := range f.Xattrs {
			if err == nil {
				err = unix.Lsetxattr(p, k, []byte(v), 0)
			}
		}
		if err != nil {
			return fmt.Errorf("kvnode: unpack %s: %s: %w", im.Ref, f.Path, err)
		}
	}
	return nil
}

// Has reports whether im has a file (not a directory) at p, following
// symlinks inside the image, and what it is after them.
func Has(im ociimage.Image, p string) (ociimage.File, bool) {
	byPath := map[string]ociimage.File{}
	for _, f := range im.Files {
		byPath[f.Path] = f
	}
	return lookup(byPath, p, 0)
}

func lookup(files map[string]ociimage.File, p string, depth int) (ociimage.File, bool) {
	if depth > 16 {
		return ociimage.File{}, false
	}
	// Resolve symlinked parents first (/bin -> usr/bin).
	parts := strings.Split(strings.TrimPrefix(path.Clean(p), "/"), "/")
	cur := "/"
	for i, part := range parts {
		next := path.Join(cur, part)
		f, ok := files[next]
		if ok && f.Symlink != "" {
			target := f.Symlink
			if !path.IsAbs(target) {
				target = path.Join(cur, target)
			}
			rest := path.Join(append([]string{target}, parts[i+1:]...)...)
			return lookup(files, rest, depth+1)
		}
		if i == len(parts)-1 {
			return f, ok && !f.Mode.IsDir()
		}
		cur = next
	}
	return ociimage.File{}, false
}

// InPath finds a command name as a shell would with PATH=Path, returning
// its path in the image.
func InPath(im ociimage.Image, name string) (string, bool) {
	if strings.Contains(name, "/") {
		_, ok := Has(im, name)
		return name, ok
	}
	for _, d := range strings.Split(Path, ":") {
		if f, ok := Has(im, d+"/"+name); ok && f.Mode&0o111 != 0 {
			return d + "/" + name, true
		}
	}
	return "", false
}
