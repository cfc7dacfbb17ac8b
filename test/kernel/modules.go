package kernel

import (
	"bufio"
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// Modules indexes the loadable modules of one kernel (lib/modules/<release>).
// Debian's kernel package ships no modules.dep (depmod runs when it is
// installed), so the load order comes from each module's own "depends="
// modinfo field: the same data depmod would write, without running it.
type Modules struct {
	// Paths maps a module name (dashes as underscores) to its .ko file.
	Paths map[string]string
	// Builtin names modules compiled into the kernel: nothing to load.
	Builtin map[string]bool
}

// ModuleName normalises a module name or file name the way the kernel does.
func ModuleName(s string) string {
	s = filepath.Base(s)
	for _, ext := range []string{".xz", ".zst", ".gz"} {
		s = strings.TrimSuffix(s, ext)
	}
	return strings.ReplaceAll(strings.TrimSuffix(s, ".ko"), "-", "_")
}

// LoadModules indexes dir (lib/modules/<release>).
func LoadModules(dir string) (*Modules, error) {
	m := &Modules{Paths: map[string]string{}, Builtin: map[string]bool{}}
	err := filepath.WalkDir(filepath.Join(dir, "kernel"), func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.HasSuffix(p, ".ko") {
			m.Paths[ModuleName(p)] = p
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("index kernel modules under %s: %w", dir, err)
	}
	if len(m.Paths) == 0 {
		return nil, fmt.Errorf("no uncompressed .ko modules under %s/kernel (a compressed module tree is not supported)", dir)
	}
	if data, err := os.ReadFile(filepath.Join(dir, "modules.builtin")); err == nil {
		sc := bufio.NewScanner(bytes.NewReader(data))
		for sc.Scan() {
			if l := strings.TrimSpace(sc.Text()); l != "" {
				m.Builtin[ModuleName(l)] = true
			}
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	return m, nil
}

// Depends reads the module names the .ko file at path needs loaded first.
func Depends(path string) ([]string, error) {
	f, err := elf.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read module %s: %w", path, err)
	}
	defer f.Close()
	sec := f.Section(".modinfo")
	if sec == nil {
		return nil, fmt.Errorf("module %s has no .modinfo section", path)
	}
	data, err := sec.Data()
	if err != nil {
		return nil, fmt.Errorf("read .modinfo of %s: %w", path, err)
	}
	return parseDepends(data), nil
}

// parseDepends takes the "depends=a,b" entry out of a .modinfo section
// (NUL-separated key=value strings).
func parseDepends(modinfo []byte) []string {
	var out []string
	for _, kv := range bytes.Split(modinfo, []byte{0}) {
		v, ok := bytes.CutPrefix(kv, []byte("depends="))
		if !ok {
			continue
		}
		for _, d := range strings.Split(string(v), ",") {
			if d = strings.TrimSpace(d); d != "" {
				out = append(out, ModuleName(d))
			}
		}
	}
	return out
}

// Order returns the .ko files to load, dependencies first, for the wanted
// modules; builtin ones are left out. An unknown module is an error.
func (m *Modules) Order(want []string) ([]string, error) {
	names, err := LoadOrder(want, func(name string) ([]string, bool, error) {
		if m.Builtin[name] {
			return nil, false, nil
		}
		p, ok := m.Paths[name]
		if !ok {
			return nil, false, fmt.Errorf("kernel module %s is neither built in nor under the module tree", name)
		}
		deps, err := Depends(p)
		return deps, true, err
	})
	if err != nil {
		return nil, err
	}
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = m.Paths[n]
	}
	return out, nil
}

// LoadOrder orders want and everything it depends on so that each module
// comes after its dependencies, each once. deps reports a module's
// dependencies and whether it is loadable at all (false: built in).
func LoadOrder(want []string, deps func(name string) (d []string, loadable bool, err error)) ([]string, error) {
	const (
		visiting = 1
		done     = 2
	)
	state := map[string]int{}
	var out []string
	var visit func(name string, chain []string) error
	visit = func(name string, chain []string) error {
		name = ModuleName(name)
		switch state[name] {
		case done:
			return nil
		case visiting:
			return fmt.Errorf("kernel modules depend on each other in a cycle: %s -> %s", strings.Join(chain, " -> "), name)
		}
		state[name] = visiting
		d, loadable, err := deps(name)
		if err != nil {
			return err
		}
		for _, dep := range d {
			if err := visit(dep, append(chain, name)); err != nil {
				return err
			}
		}
		state[name] = done
		if loadable {
			out = append(out, name)
		}
		return nil
	}
	for _, w := range want {
		if err := visit(w, nil); err != nil {
			return nil, err
		}
	}
	return out, nil
}
