package sysfs_test

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vfnet-io/vfnet/driver/kernel/sysfs"
)

func TestRootWriter(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	attr := filepath.Join(root, "bus/pci/devices/0000:3b:02.1/driver_override")
	if err := os.MkdirAll(filepath.Dir(attr), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(attr, []byte("(null)\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	w := sysfs.RootWriter{Root: root}
	if err := w.WriteFile("bus/pci/devices/0000:3b:02.1/driver_override", []byte("vfio-pci")); err != nil {
		t.Fatal(err)
	}
	// One write at offset 0, as sysfs attributes expect.
	if b, _ := os.ReadFile(attr); string(b) != "vfio-pci" {
		t.Fatalf("attribute = %q", b)
	}
	err := w.WriteFile("bus/pci/drivers/vfio-pci/bind", []byte("0000:3b:02.1"))
	if !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), filepath.Join(root, "bus/pci/drivers/vfio-pci/bind")) {
		t.Fatalf("missing attribute: %v", err)
	}
}
