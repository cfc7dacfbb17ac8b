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

// rootComplex is the devices/ directory of a root port's host bridge.
func rootComplex(rootPort string) string { return "pci" + rootPort[:7] }

// parseBDF returns the 16-bit routing ID (bus<<8 | dev<<3 | fn) and domain.
func parseBDF(bdf string) (domain string, rid int, err error) {
	if len(bdf) != 12 || bdf[4] != ':' || bdf[7] != ':' || bdf[10] != '.' {
		return "", 0, fmt.Errorf("PCI address %q: want dddd:bb:ss.f", bdf)
	}
	bus, err1 := strconv.ParseUint(bdf[5:7], 16, 8)
	slot, err2 := strconv.ParseUint(bdf[8:10], 16, 8)
	fn, err3 := strconv.ParseUint(bdf[11:], 16, 8)
	if err1 != nil || err2 != nil || err3 != nil || slot > 31 || fn > 7 {
		return "", 0, fmt.Errorf("PCI address %q: want dddd:bb:ss.f with slot <= 1f and function <= 7", bdf)
	}
	return bdf[:4], int(bus)<<8 | int(slot)<<3 | int(fn), nil
}

func formatBDF(domain string, rid int) string {
	return fmt.Sprintf("%s:%02x:%02x.%x", domain, rid>>8, (rid>>3)&0x1f, rid&7)
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
	d, _ := strconv.ParseUint(dom, 16, 16)
	return fmt.Sprintf("02:%02x:%02x:%02x:%02x:%02x", salt, byte(d), rid>>8, (rid>>3)&0x1f, rid&7)
}

func arphrd(linkType string) string {
	if linkType == "infiniband" {
		return "32"
	}
	return "1"
}
