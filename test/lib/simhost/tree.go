package simhost

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/vfnet-io/vfnet/pkg/contract/pciaddr"
)

// tree writes and reads a sysfs-shaped directory. All rel paths are
// slash-separated and relative to the sysfs root; links are created with
// relative targets, as the kernel shows them.
type tree struct {
	root string
	// crash, when set, counts down mutating steps and panics with
	// errCrashed at zero: the crash-consistency test uses it to stop an
	// operation between any two of its effects.
	crash *int
}

type crashed struct{}

func (t tree) step() {
	if t.crash == nil {
		return
	}
	*t.crash--
	if *t.crash == 0 {
		panic(crashed{})
	}
}

func (t tree) abs(rel string) string { return filepath.Join(t.root, filepath.FromSlash(rel)) }

func (t tree) mkdir(rel string) error {
	t.step()
	err := os.Mkdir(t.abs(rel), 0o755)
	if err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	return nil
}

func (t tree) mkdirAll(rel string) error {
	t.step()
	return os.MkdirAll(t.abs(rel), 0o755)
}

// write creates or replaces a small attribute file. Raw syscalls keep
// building 1024 VFs well under a second.
func (t tree) write(rel, content string, mode uint32) error {
	t.step()
	p := t.abs(rel)
	fd, err := syscall.Open(p, syscall.O_WRONLY|syscall.O_CREAT|syscall.O_TRUNC|syscall.O_CLOEXEC, mode)
	if err != nil {
		return &fs.PathError{Op: "open", Path: p, Err: err}
	}
	_, err = syscall.Write(fd, []byte(content))
	syscall.Close(fd)
	if err != nil {
		return &fs.PathError{Op: "write", Path: p, Err: err}
	}
	return nil
}

func (t tree) read(rel string) (string, error) {
	b, err := os.ReadFile(t.abs(rel))
	return strings.TrimSpace(string(b)), err
}

// link creates linkRel -> target, where target is given relative to the root
// and stored relative to linkRel's directory.
// An existing link is replaced, so an interrupted operation can be re-run.
func (t tree) link(linkRel, targetRel string) error {
	t.step()
	target, p := kernfsTarget(linkRel, targetRel), t.abs(linkRel)
	err := os.Symlink(target, p)
	if errors.Is(err, fs.ErrExist) {
		if old, rerr := os.Readlink(p); rerr == nil && old == target {
			return nil
		}
		if err := os.Remove(p); err != nil {
			return err
		}
		return os.Symlink(target, p)
	}
	return err
}

// kernfsTarget is the relative target sysfs shows for a link: it climbs
// from the link's directory to the closest common ancestor with the
// target's parent (kernfs_get_target_path), so a netdev's device link reads
// ../../../0000:3b:02.1 rather than ../..
func kernfsTarget(linkRel, targetRel string) string {
	lp := strings.Split(path.Dir(linkRel), "/")
	tp := strings.Split(path.Dir(targetRel), "/")
	if path.Dir(linkRel) == "." {
		lp = nil
	}
	if path.Dir(targetRel) == "." {
		tp = nil
	}
	c := 0
	for c < len(lp) && c < len(tp) && lp[c] == tp[c] {
		c++
	}
	var b strings.Builder
	for i := c; i < len(lp); i++ {
		b.WriteString("../")
	}
	b.WriteString(strings.Join(strings.Split(targetRel, "/")[c:], "/"))
	return b.String()
}

// readlink resolves linkRel to a root-relative path ("" if absent).
func (t tree) readlink(linkRel string) (string, error) {
	target, err := os.Readlink(t.abs(linkRel))
	if err != nil {
		return "", err
	}
	return path.Join(path.Dir(linkRel), target), nil
}

func (t tree) exists(rel string) bool {
	_, err := os.Lstat(t.abs(rel))
	return err == nil
}

func (t tree) remove(rel string) error {
	t.step()
	err := os.Remove(t.abs(rel))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	return err
}

func (t tree) removeAll(rel string) error {
	t.step()
	return os.RemoveAll(t.abs(rel))
}

// Layout helpers.

const (
	pciDevices = "bus/pci/devices"
	pciDrivers = "bus/pci/drivers"
	iommuDir   = "kernel/iommu_groups"
	classNet   = "class/net"
	stateDir   = ".simhost"
)

func busLink(bdf string) string { return pciDevices + "/" + bdf }

// rootComplex is the devices/ directory of a root port's host bridge
// (pci0000:3a), in the port's domain and on its bus.
func rootComplex(rootPort string) string {
	a, _ := pciaddr.ParseKernelName(rootPort)
	return fmt.Sprintf("pci%04x:%02x", a.Domain, a.Bus)
}

// parseBDF returns the 16-bit routing ID (bus<<8 | dev<<3 | fn) and domain
// of a function the simulated kernel names: any domain the kernel has,
// including those beyond ffff behind Intel VMD.
func parseBDF(bdf string) (domain uint, rid int, err error) {
	a, err := pciaddr.ParseKernelName(bdf)
	if err != nil {
		return 0, 0, fmt.Errorf("PCI address %q: %w", bdf, err)
	}
	return a.Domain, int(a.Bus)<<8 | int(a.Slot)<<3 | int(a.Function), nil
}

func formatBDF(domain uint, rid int) string {
	return pciaddr.Address{Domain: domain, Bus: uint(rid >> 8), Slot: uint(rid>>3) & 0x1f, Function: uint(rid) & 7}.String()
}

// vfAddress is where the SR-IOV capability puts VF i.
func vfAddress(pfBDF string, offset, stride, i int) (string, error) {
	dom, rid, err := parseBDF(pfBDF)
	if err != nil {
		return "", err
	}
	vr := rid + offset + stride*i
	if vr > 0xffff {
		return "", fmt.Errorf("VF %d of %s: routing ID beyond bus ff", i, pfBDF)
	}
	return formatBDF(dom, vr), nil
}

// pathName is the predictable netdev name systemd gives a PCI function:
// en/ib + p<bus>s<slot>f<function>, all decimal.
func pathName(bdf, linkType string) string {
	prefix := "en"
	if linkType == "infiniband" {
		prefix = "ib"
	}
	_, rid, err := parseBDF(bdf)
	if err != nil {
		return prefix + "unknown"
	}
	return fmt.Sprintf("%sp%ds%df%d", prefix, rid>>8, (rid>>3)&0x1f, rid&7)
}

// vfNetDev names VF i's netdev after its PF, the way systemd's "v" naming
// (net naming scheme v247+) does: enp59s0f0 -> enp59s0f0v3.
func vfNetDev(pfNetDev string, i int) string { return pfNetDev + "v" + strconv.Itoa(i) }

// derivedMAC is a stable locally administered MAC for a function.
func derivedMAC(bdf string, salt byte) string {
	dom, rid, _ := parseBDF(bdf)
	return fmt.Sprintf("02:%02x:%02x:%02x:%02x:%02x", salt, byte(dom), rid>>8, (rid>>3)&0x1f, rid&7)
}

func arphrd(linkType string) string {
	if linkType == "infiniband" {
		return "32"
	}
	return "1"
}
