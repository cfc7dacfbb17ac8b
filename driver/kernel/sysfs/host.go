package sysfs

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/go-logr/logr"

	"github.com/vfnet-io/vfnet/pkg/contract/pciaddr"
)

// DefaultRoot is where the kernel mounts sysfs.
const DefaultRoot = "/sys"

// Paths relative to the sysfs root.
const (
	PCIDevicesDir = "bus/pci/devices"
	PCIDriversDir = "bus/pci/drivers"
	IOMMUGroupDir = "kernel/iommu_groups"
	ClassNetDir   = "class/net"
	// NoIOMMUParam is vfio's module parameter that enables noiommu groups.
	NoIOMMUParam = "module/vfio/parameters/enable_unsafe_noiommu_mode"
	// NoIOMMUGroupName is what kernel/iommu_groups/<N>/name holds for a
	// group vfio allocated in noiommu mode.
	NoIOMMUGroupName = "vfio-noiommu"
)

// Host reads PCI and SR-IOV state from a sysfs tree. It holds no state
// between calls and is safe for concurrent use.
type Host struct {
	root string
}

// New returns a Host reading the sysfs tree at root ("" means /sys).
func New(root string) *Host {
	if root == "" {
		root = DefaultRoot
	}
	return &Host{root: filepath.Clean(root)}
}

// Root is the sysfs root this Host reads.
func (h *Host) Root() string { return h.root }

// Path joins a slash-separated path relative to the root.
func (h *Host) Path(rel string) string { return filepath.Join(h.root, filepath.FromSlash(rel)) }

// DriverLoaded reports whether the PCI driver name is registered
// (bus/pci/drivers/<name> exists), i.e. its module is loaded.
func (h *Host) DriverLoaded(name string) bool {
	if name == "" || strings.ContainsRune(name, '/') {
		return false
	}
	st, err := os.Stat(filepath.Join(h.root, PCIDriversDir, name))
	return err == nil && st.IsDir()
}

// NoIOMMUMode reports whether vfio runs with enable_unsafe_noiommu_mode.
func (h *Host) NoIOMMUMode() bool {
	v, err := readAttr(filepath.Join(h.root, NoIOMMUParam))
	return err == nil && (v == "Y" || v == "1")
}

// VFIOGroupDevice returns the name of the character device vfio creates for
// IOMMU group under /dev/vfio: "<group>" normally, "noiommu-<group>" for a
// group vfio allocated in noiommu mode.
func (h *Host) VFIOGroupDevice(group string) (string, error) {
	if !isDigits(group) {
		return "", fmt.Errorf("IOMMU group %q: not a group number", group)
	}
	dir := filepath.Join(h.root, IOMMUGroupDir, group)
	if _, err := os.Stat(dir); err != nil {
		return "", fmt.Errorf("IOMMU group %s: %w", group, err)
	}
	name, err := readAttr(filepath.Join(dir, "name"))
	if err == nil && name == NoIOMMUGroupName {
		return "noiommu-" + group, nil
	}
	// Only noiommu groups carry a name file; any other read error means a
	// regular group.
	return group, nil
}

// IOMMUGroupDevices lists the BDFs in an IOMMU group, sorted.
func (h *Host) IOMMUGroupDevices(group string) ([]string, error) {
	if !isDigits(group) {
		return nil, fmt.Errorf("IOMMU group %q: not a group number", group)
	}
	dir := filepath.Join(h.root, IOMMUGroupDir, group, "devices")
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("list IOMMU group %s members: %w", group, err)
	}
	out := make([]string, 0, len(ents))
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out, nil
}

// Function re-reads one PCI function by BDF. Errors wrap fs.ErrNotExist when
// the function is gone.
func (h *Host) Function(bdf string) (Function, error) {
	if _, err := pciaddr.ParseKernelName(bdf); err != nil {
		return Function{}, fmt.Errorf("PCI address %q: %w", bdf, err)
	}
	s := newScanner(h, logr.Discard(), nil)
	real, err := s.resolveDevice(bdf)
	if err != nil {
		return Function{}, err
	}
	fn, err := s.readFunction(bdf, real)
	if err != nil {
		return Function{}, err
	}
	root, err := h.pcieRoot(bdf)
	if err != nil {
		return Function{}, err
	}
	fn.PCIeRoot = root
	return fn, nil
}

// isKernelName reports whether s is a PCI function name as the kernel
// writes it (pciaddr.ParseKernelName: the model lists functions in every
// domain; discovery applies pciaddr's domain rule).
func isKernelName(s string) bool {
	_, err := pciaddr.ParseKernelName(s)
	return err == nil
}

func isHex(s string) bool {
	for _, c := range []byte(s) {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return s != ""
}

func isDigits(s string) bool {
	for _, c := range []byte(s) {
		if c < '0' || c > '9' {
			return false
		}
	}
	return s != ""
}
