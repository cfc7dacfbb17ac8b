package sysfs

import (
	"fmt"
	"os"
	"path/filepath"
)

// Writer writes kernel attribute files (driver_override, bind, unbind,
// sriov_numvfs, ...) addressed relative to the sysfs root. Production code
// writes the real files; the simulated host (test/lib/simhost) applies the effect
// the kernel would, so the same binding logic runs against both.
type Writer interface {
	// WriteFile writes data to the attribute at rel, a slash-separated path
	// relative to the sysfs root, e.g. "bus/pci/devices/0000:3b:02.1/driver_override".
	WriteFile(rel string, data []byte) error
}

// RootWriter writes attribute files below Root, as the kernel expects them:
// one write, no truncate-and-create.
type RootWriter struct{ Root string }

// WriteFile implements Writer.
func (w RootWriter) WriteFile(rel string, data []byte) error {
	path := filepath.Join(w.Root, filepath.FromSlash(rel))
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", path, err)
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("write %q to %s: %w", data, path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("close %s: %w", path, err)
	}
	return nil
}
