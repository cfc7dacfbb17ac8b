// Package sharedlibs finds the shared libraries a dynamically linked
// program needs, to copy them into a root it runs in (the real-kernel
// tier's guest, KubeVirt's node images).
package sharedlibs

import (
	"debug/elf"
	"fmt"
	"os"
	"path/filepath"
)

// GuestLibDir is where the root's loader finds shared libraries (a default
// path of the dynamic loader).
const GuestLibDir = "/lib/x86_64-linux-gnu"

// Resolve lists what the dynamically linked program bin needs in the
// root: its loader (at the path the program names) and every library it
// needs, directly or not, found in dirs (first match wins). The result maps
// paths in the root to host files.
func Resolve(bin string, dirs []string) (map[string]string, error) {
	out := map[string]string{}
	f, err := elf.Open(bin)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", bin, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type != elf.PT_INTERP {
			continue
		}
		data := make([]byte, p.Filesz)
		if _, err := p.ReadAt(data, 0); err != nil {
			return nil, fmt.Errorf("read the loader path of %s: %w", bin, err)
		}
		interp := string(data[:len(data)-1]) // NUL-terminated
		host, err := Find(filepath.Base(interp), dirs)
		if err != nil {
			return nil, fmt.Errorf("loader of %s: %w", bin, err)
		}
		out[interp] = host
	}
	seen := map[string]bool{}
	var walk func(file string) error
	walk = func(file string) error {
		ef, err := elf.Open(file)
		if err != nil {
			return fmt.Errorf("read %s: %w", file, err)
		}
		needed, err := ef.ImportedLibraries()
		ef.Close()
		if err != nil {
			return fmt.Errorf("read the libraries %s needs: %w", file, err)
		}
		for _, lib := range needed {
			if seen[lib] {
				continue
			}
			seen[lib] = true
			host, err := Find(lib, dirs)
			if err != nil {
				return fmt.Errorf("%s (needed by %s): %w", lib, filepath.Base(file), err)
			}
			out[GuestLibDir+"/"+lib] = host
			if err := walk(host); err != nil {
				return err
			}
		}
		return nil
	}
	if err := walk(bin); err != nil {
		return nil, err
	}
	return out, nil
}

// Find is the first regular file name in dirs, with its symlinks
// resolved.
func Find(name string, dirs []string) (string, error) {
	for _, d := range dirs {
		p := filepath.Join(d, name)
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() {
			return filepath.EvalSymlinks(p)
		}
	}
	return "", fmt.Errorf("shared library %s not found in %v", name, dirs)
}
