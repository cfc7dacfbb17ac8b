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

	"github.com/vfnet-io/vfnet/driver/kernel/sysfs"
	"github.com/vfnet-io/vfnet/pkg/contract/pciaddr"
)

// Kernel is the simulated kernel's sysfs attribute handling. It implements
// sysfs.Writer: a write has the effect the kernel's attribute store
// function would have on the tree, or fails with the errno it would return,
// as an *os.PathError (Op "write", or "open" for a missing file).
type Kernel struct {
	h     *Host
	fails []failRule
	hook  func(rel string, data []byte) error
	log   []Write
}

var _ sysfs.Writer = (*Kernel)(nil)

// Write is one attribute write the kernel received.
type Write struct {
	Rel  string
	Data string
	Err  error
}

type failRule struct {
	op     string // path suffix for the kernel, operation name for links
	errno  syscall.Errno
	remain int // < 0: forever
}

// FailWrite makes the next count writes to attributes whose path ends with
// relSuffix fail with errno before any effect (count < 0: every write).
// E.g. FailWrite("drivers/vfio-pci/bind", syscall.EIO, 1).
func (k *Kernel) FailWrite(relSuffix string, errno syscall.Errno, count int) {
	unlock := k.h.lock()
	defer unlock()
	k.fails = append(k.fails, failRule{op: relSuffix, errno: errno, remain: count})
}

// SetWriteHook installs fn, called before every write is applied (nil
// removes it). A non-nil result fails the write with that error, wrapped in
// an *os.PathError; fn runs under the kernel lock and must not call back
// into this Host.
func (k *Kernel) SetWriteHook(fn func(rel string, data []byte) error) {
	unlock := k.h.lock()
	defer unlock()
	k.hook = fn
}

// maxWriteLog bounds the write log; the oldest half goes when it is full.
const maxWriteLog = 4096

// Writes returns the writes received so far, in order (at most the last
// few thousand).
func (k *Kernel) Writes() []Write {
	unlock := k.h.lock()
	defer unlock()
	return append([]Write(nil), k.log...)
}

func takeFail(rules []failRule, match func(string) bool) (syscall.Errno, bool) {
	for i := range rules {
		r := &rules[i]
		if r.remain != 0 && match(r.op) {
			if r.remain > 0 {
				r.remain--
			}
			return r.errno, true
		}
	}
	return 0, false
}

// WriteFile implements sysfs.Writer.
func (k *Kernel) WriteFile(rel string, data []byte) error {
	unlock := k.h.lock()
	defer unlock()
	rel = path.Clean(strings.TrimPrefix(filepath.ToSlash(rel), "/"))
	err := k.write(rel, data)
	if len(k.log) >= maxWriteLog {
		// A long --simulate run must not grow without bound.
		k.log = append(k.log[:0], k.log[len(k.log)-maxWriteLog/2:]...)
	}
	k.log = append(k.log, Write{Rel: rel, Data: string(data), Err: err})
	return err
}

func (k *Kernel) write(rel string, data []byte) error {
	h := k.h
	abs := h.t.abs(rel)
	fail := func(op string, errno error) error { return &os.PathError{Op: op, Path: abs, Err: errno} }
	if rel == "." || strings.HasPrefix(rel, "../") || rel == ".." {
		return fail("open", syscall.ENOENT)
	}
	if h.closed {
		return fail("write", syscall.EIO)
	}
	// Opening the attribute comes first: missing file (module not loaded,
	// device gone) is ENOENT whatever the data.
	st, err := os.Stat(abs)
	if err != nil {
		return fail("open", syscall.ENOENT)
	}
	if st.IsDir() {
		return fail("open", syscall.EISDIR)
	}
	if errno, ok := takeFail(k.fails, func(suffix string) bool { return strings.HasSuffix(rel, suffix) }); ok {
		return fail("write", errno)
	}
	if k.hook != nil {
		if err := k.hook(rel, data); err != nil {
			var errno syscall.Errno
			if errors.As(err, &errno) {
				return fail("write", errno)
			}
			return fail("write", err)
		}
	}
	val := string(data)
	if i := strings.IndexByte(val, '\n'); i >= 0 {
		// sysfs_streq and friends stop at the first newline.
		val = val[:i]
	}
	dir, attr := path.Split(rel)
	dir = strings.TrimSuffix(dir, "/")
	var errno error
	switch {
	case strings.HasPrefix(dir, pciDrivers+"/") && strings.Count(dir, "/") == 3:
		drv := path.Base(dir)
		switch attr {
		case "bind":
			errno = h.bind(drv, val)
		case "unbind":
			errno = h.unbind(drv, val)
		case "new_id":
			errno = h.newID(drv, val)
		case "remove_id":
			errno = h.removeID(drv, val)
		default:
			errno = syscall.EACCES
		}
	case rel == "bus/pci/drivers_probe":
		errno = h.driversProbe(val)
	default:
		bdf := path.Base(dir)
		devDir, err := h.t.readlink(busLink(bdf))
		if err != nil || path.Clean(devDir) != path.Clean(h.resolveRel(dir)) {
			return fail("write", syscall.EACCES)
		}
		switch attr {
		case "driver_override":
			errno = h.setOverride(devDir, string(data))
		case "sriov_numvfs":
			// The store parses the whole buffer, not up to the first newline.
			errno = h.setNumVFs(bdf, devDir, string(data))
		case "sriov_drivers_autoprobe":
			if val != "0" && val != "1" {
				errno = syscall.EINVAL
			} else if err := h.t.write(devDir+"/sriov_drivers_autoprobe", val+"\n", 0o644); err != nil {
				errno = err
			}
		default:
			errno = syscall.EACCES
		}
	}
	if errno != nil {
		var pe *fs.PathError
		if errors.As(errno, &pe) {
			return errno
		}
		return fail("write", errno)
	}
	return nil
}

// resolveRel resolves the symlinks in a root-relative directory path
// (bus/pci/devices/<bdf> -> devices/...).
func (h *Host) resolveRel(dir string) string {
	real, err := filepath.EvalSymlinks(h.t.abs(dir))
	if err != nil {
		return dir
	}
	r, err := filepath.Rel(h.t.root, real)
	if err != nil {
		return dir
	}
	// The root itself may sit behind a symlink (macOS /tmp); compare lexically
	// against the resolved root too.
	if strings.HasPrefix(r, "..") {
		if rr, err := filepath.EvalSymlinks(h.t.root); err == nil {
			if r2, err := filepath.Rel(rr, real); err == nil {
				r = r2
			}
		}
	}
	return filepath.ToSlash(r)
}

// device returns the device directory of bdf, or ENODEV.
func (h *Host) device(bdf string) (string, error) {
	if _, err := pciaddr.ParseKernelName(bdf); err != nil {
		return "", syscall.ENODEV
	}
	dir, err := h.t.readlink(busLink(bdf))
	if err != nil || !h.t.exists(dir) {
		return "", syscall.ENODEV
	}
	return dir, nil
}

func (h *Host) boundDriver(dir string) string {
	d, err := h.t.readlink(dir + "/driver")
	if err != nil {
		return ""
	}
	return path.Base(d)
}

func (h *Host) override(dir string) string {
	v, err := h.t.read(dir + "/driver_override")
	if err != nil || v == "(null)" {
		return ""
	}
	return v
}

// matches is pci_match_device: the override decides alone when set;
// otherwise dynamic and static IDs.
func (h *Host) matches(drv, dir string) bool {
	if ov := h.override(dir); ov != "" {
		return ov == drv
	}
	vendor, _ := h.t.read(dir + "/vendor")
	device, _ := h.t.read(dir + "/device")
	return h.ids[drv][strings.TrimPrefix(vendor, "0x")+":"+strings.TrimPrefix(device, "0x")]
}

// bind is bind_store: ENODEV for an unknown or non-matching device, EBUSY
// when it already has a driver, else the probe's result.
func (h *Host) bind(drv, bdf string) error {
	dir, err := h.device(bdf)
	if err != nil {
		return err
	}
	if !h.matches(drv, dir) {
		return syscall.ENODEV
	}
	if h.boundDriver(dir) != "" {
		return syscall.EBUSY
	}
	if !h.canProbe(dir) {
		return syscall.ENODEV
	}
	return h.run(intent{Op: opProbe, Drv: drv, BDF: bdf, Dir: dir})
}

// canProbe is pci_device_can_probe: a VF of a PF whose
// sriov_drivers_autoprobe is 0 is probed only when its driver_override is
// set. Otherwise pci_device_probe refuses with ENODEV, which an explicit
// bind reports and drivers_probe/new_id swallow.
func (h *Host) canProbe(dir string) bool {
	pfDir, err := h.t.readlink(dir + "/physfn")
	if err != nil {
		return true // not a VF
	}
	if v, err := h.t.read(pfDir + "/sriov_drivers_autoprobe"); err != nil || v != "0" {
		return true
	}
	return h.override(dir) != ""
}

// unbind is unbind_store: ENODEV unless the device is bound to drv.
func (h *Host) unbind(drv, bdf string) error {
	dir, err := h.device(bdf)
	if err != nil {
		return err
	}
	if h.boundDriver(dir) != drv {
		return syscall.ENODEV
	}
	return h.run(intent{Op: opRelease, Drv: drv, BDF: bdf, Dir: dir})
}

// release is what a driver's remove does, then the driver core unlinks.
func (h *Host) release(drv, bdf, dir string) error {
	// PF drivers disable SR-IOV when they let go of the PF.
	if pf := h.pfs[bdf]; pf != nil && drv != DriverVFIOPCI {
		if n, _ := h.t.read(dir + "/sriov_numvfs"); n != "" && n != "0" {
			if err := h.disableVFs(pf, dir); err != nil {
				return err
			}
		}
	}
	if isNetDriver(drv) {
		ents, _ := os.ReadDir(h.t.abs(dir + "/net"))
		for _, e := range ents {
			if err := h.t.remove(classNet + "/" + e.Name()); err != nil {
				return err
			}
		}
		if err := h.t.removeAll(dir + "/net"); err != nil {
			return err
		}
	}
	if drv == DriverVFIOPCI {
		if err := h.vfioRelease(bdf, dir); err != nil {
			return err
		}
	}
	// The device's driver link goes last: until then a re-run after an
	// interruption still sees the device as bound.
	if err := h.t.remove(pciDrivers + "/" + drv + "/" + bdf); err != nil {
		return err
	}
	return h.t.remove(dir + "/driver")
}

// vfioRelease drops /dev/vfio/<group> when the last vfio-pci member of the
// group goes, and frees a noiommu group (vfio allocated it for this device).
func (h *Host) vfioRelease(bdf, dir string) error {
	g, err := h.t.readlink(dir + "/iommu_group")
	if err != nil {
		return nil
	}
	num := path.Base(g)
	if h.groupHasVFIO(num, bdf) {
		return nil
	}
	if t, ok := h.timers[num]; ok {
		t.Stop()
		delete(h.timers, num)
	}
	// On a noiommu host every group vfio-pci sees is one vfio allocated
	// (functions have none of their own); the name file says so too.
	noiommu := h.st.Spec.NoIOMMU
	if name, err := h.t.read(g + "/name"); err == nil && name == sysfs.NoIOMMUGroupName {
		noiommu = true
	}
	node := num
	if noiommu {
		node = "noiommu-" + num
	}
	h.t.step()
	if err := os.Remove(filepath.Join(h.devRoot, "vfio", node)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if noiommu {
		if err := h.leaveGroup(bdf, dir); err != nil {
			return err
		}
	}
	return nil
}

// leaveGroup removes the device from its group and the group when empty.
// The device's own iommu_group link goes last: a re-run after an
// interruption still finds the group through it.
func (h *Host) leaveGroup(bdf, dir string) error {
	g, err := h.t.readlink(dir + "/iommu_group")
	if err != nil {
		return nil
	}
	if err := h.t.remove(g + "/devices/" + bdf); err != nil {
		return err
	}
	if ents, err := os.ReadDir(h.t.abs(g + "/devices")); err == nil && len(ents) == 0 {
		if err := h.t.removeAll(g); err != nil {
			return err
		}
	}
	return h.t.remove(dir + "/iommu_group")
}

// setOverride is driver_override's store: empty or "\n" clears, the value
// is cut at the first newline, longer than a page is EINVAL.
func (h *Host) setOverride(dir, data string) error {
	if len(data) >= 4096 {
		return syscall.EINVAL
	}
	if i := strings.IndexByte(data, '\n'); i >= 0 {
		data = data[:i]
	}
	if data == "" {
		data = "(null)"
	}
	return h.t.write(dir+"/driver_override", data+"\n", 0o644)
}

// driversProbe is drivers_probe: attach a driver to an unbound device if
// one matches; no match and probe failures are not errors.
func (h *Host) driversProbe(bdf string) error {
	dir, err := h.device(bdf)
	if err != nil {
		return err
	}
	if h.boundDriver(dir) != "" || !h.canProbe(dir) {
		return nil
	}
	if drv := h.matchDriver(bdf, dir, h.override(dir)); drv != "" {
		_ = h.run(intent{Op: opProbe, Drv: drv, BDF: bdf, Dir: dir})
	}
	return nil
}

func parseID(val string) (string, error) {
	f := strings.Fields(val)
	if len(f) < 2 {
		return "", syscall.EINVAL
	}
	var ids [2]string
	for i := 0; i < 2; i++ {
		n, err := strconv.ParseUint(strings.TrimPrefix(strings.ToLower(f[i]), "0x"), 16, 16)
		if err != nil {
			return "", syscall.EINVAL
		}
		ids[i] = fmt.Sprintf("%04x", n)
	}
	return ids[0] + ":" + ids[1], nil
}

// newID is new_id: add a dynamic ID (EEXIST if it already matches), then
// bind every unbound device it matches, as driver_attach does.
func (h *Host) newID(drv, val string) error {
	id, err := parseID(val)
	if err != nil {
		return err
	}
	if h.ids[drv][id] {
		return syscall.EEXIST
	}
	if h.ids[drv] == nil {
		h.ids[drv] = map[string]bool{}
	}
	h.ids[drv][id] = true
	if h.st.DynIDs == nil {
		h.st.DynIDs = map[string][]string{}
	}
	h.st.DynIDs[drv] = append(h.st.DynIDs[drv], strings.Replace(id, ":", " ", 1))
	if err := h.saveState(); err != nil {
		return err
	}
	ents, _ := os.ReadDir(h.t.abs(pciDevices))
	for _, e := range ents {
		dir, err := h.device(e.Name())
		if err != nil || h.boundDriver(dir) != "" || !h.matches(drv, dir) || !h.canProbe(dir) {
			continue
		}
		_ = h.run(intent{Op: opProbe, Drv: drv, BDF: e.Name(), Dir: dir})
	}
	return nil
}

// removeID is remove_id: ENODEV unless the dynamic ID exists.
func (h *Host) removeID(drv, val string) error {
	id, err := parseID(val)
	if err != nil {
		return err
	}
	want := strings.Replace(id, ":", " ", 1)
	list := h.st.DynIDs[drv]
	for i, x := range list {
		if x == want {
			h.st.DynIDs[drv] = append(list[:i:i], list[i+1:]...)
			delete(h.ids[drv], id)
			h.index()
			return h.saveState()
		}
	}
	return syscall.ENODEV
}

// setNumVFs is sriov_numvfs_store (drivers/pci/iov.c), check for check in
// the kernel's order: the value (kstrtou16), the bound (ERANGE above
// sriov_totalvfs), no change, no PF driver or one without sriov_configure
// (ENOENT), disable, then EBUSY for a non-zero count over another.
func (h *Host) setNumVFs(bdf, dir, raw string) error {
	pf := h.pfs[bdf]
	n, ok := kstrtou16(raw)
	if !ok || pf == nil {
		return syscall.EINVAL
	}
	if n > pf.TotalVFs {
		return syscall.ERANGE
	}
	cur, _ := strconv.Atoi(mustRead(h.t, dir+"/sriov_numvfs"))
	if n == cur {
		return nil
	}
	if drv := h.boundDriver(dir); drv == "" || !hasSRIOVConfigure(drv) {
		// "no driver bound to device; cannot configure SR-IOV" and
		// "driver does not support SR-IOV configuration via sysfs"
		return syscall.ENOENT
	}
	if n != 0 && cur != 0 {
		// "%d VFs already enabled. Disable before enabling %d VFs"
		return syscall.EBUSY
	}
	return h.run(intent{Op: opNumVFs, BDF: bdf, Dir: dir, N: n})
}

// kstrtou16 parses like the kernel's kstrtou16(buf, 0, ...): an optional
// "+", a base prefix (0x hex, 0 octal), digits, at most one trailing
// newline; anything else (spaces, "_", "-") is EINVAL, as is overflow.
func kstrtou16(s string) (int, bool) {
	s = strings.TrimSuffix(s, "\n")
	s = strings.TrimPrefix(s, "+")
	base := 10
	switch {
	case len(s) > 2 && (s[:2] == "0x" || s[:2] == "0X"):
		base, s = 16, s[2:]
	case len(s) > 1 && s[0] == '0':
		base, s = 8, s[1:]
	}
	// An explicit base: ParseUint then refuses signs and "_" as the kernel does.
	v, err := strconv.ParseUint(s, base, 16)
	return int(v), err == nil
}

// hasSRIOVConfigure reports whether a PCI driver implements
// sriov_configure, which sriov_numvfs needs: the PF drivers the simulation
// knows and vfio-pci (vfio_pci_sriov_configure) do; pci-stub and the VF
// drivers do not.
func hasSRIOVConfigure(drv string) bool {
	switch drv {
	case DriverIce, DriverMLX5, DriverIGB, DriverI40E, DriverBNXT, DriverVFIOPCI:
		return true
	}
	return false
}

func mustRead(t tree, rel string) string {
	v, _ := t.read(rel)
	return v
}

// disableVFs removes every VF of pf: drivers are released, devices, links
// and groups go, and the PF driver forgets the VF settings. It visits every
// possible VF address, not only the virtfn links, so it also cleans up
// after an enable that was interrupted before linking a VF.
func (h *Host) disableVFs(pf *PFSpec, pfDir string) error {
	parent := pfDir[:strings.LastIndexByte(pfDir, '/')]
	for i := 0; i < pf.TotalVFs; i++ {
		bdf, err := vfAddress(pf.Address, pf.VFOffset, pf.VFStride, i)
		if err != nil {
			return err
		}
		vfDir := parent + "/" + bdf
		if h.t.exists(vfDir) || h.t.exists(busLink(bdf)) {
			if err := h.removeFunction(bdf, vfDir); err != nil {
				return err
			}
		}
		if err := h.forgetRuntime(bdf); err != nil {
			return err
		}
		if err := h.t.remove(pfDir + "/virtfn" + strconv.Itoa(i)); err != nil {
			return err
		}
	}
	if err := h.removeRepresentors(pf, pfDir); err != nil {
		return err
	}
	if err := h.links.forgetPF(pf.NetDev); err != nil {
		return err
	}
	return h.t.write(pfDir+"/sriov_numvfs", "0\n", 0o644)
}

// removeFunction is device removal: unbind, leave the group, drop the
// directory and the bus link.
func (h *Host) removeFunction(bdf, dir string) error {
	if drv := h.boundDriver(dir); drv != "" {
		if err := h.release(drv, bdf, dir); err != nil {
			return err
		}
	}
	if err := h.leaveGroup(bdf, dir); err != nil {
		return err
	}
	if err := h.t.remove(busLink(bdf)); err != nil {
		return err
	}
	return h.t.removeAll(dir)
}

// RemovePF hot-unplugs a PF: its VFs go first, then the PF itself.
func (h *Host) RemovePF(bdf string) error {
	unlock := h.lock()
	defer unlock()
	dir, err := h.device(bdf)
	if err != nil {
		return fmt.Errorf("remove PF %s: no such device", bdf)
	}
	if err := h.run(intent{Op: opRemovePF, BDF: bdf, Dir: dir}); err != nil {
		return fmt.Errorf("remove PF %s: %w", bdf, err)
	}
	return nil
}

// SetOperState sets a netdev's operstate (e.g. "down" when the cable is
// pulled).
func (h *Host) SetOperState(ifname, state string) error {
	unlock := h.lock()
	defer unlock()
	p := classNet + "/" + ifname
	if !h.t.exists(p) {
		return fmt.Errorf("set operstate of %s: no such netdev", ifname)
	}
	if err := h.t.write(p+"/operstate", state+"\n", 0o444); err != nil {
		return err
	}
	h.linkChanged(ifname, false)
	return nil
}

// SetNumVFs changes a PF's VF count the way an admin does: through 0 when
// VFs exist (echo 0 > sriov_numvfs; echo n > sriov_numvfs).
func (h *Host) SetNumVFs(bdf string, n int) error {
	rel := pciDevices + "/" + bdf + "/sriov_numvfs"
	cur, err := h.t.read(rel)
	if err != nil {
		return fmt.Errorf("set VF count of %s: %w", bdf, err)
	}
	if cur != "0" && cur != strconv.Itoa(n) {
		if err := h.kernel.WriteFile(rel, []byte("0\n")); err != nil {
			return fmt.Errorf("set VF count of %s to 0: %w", bdf, err)
		}
	}
	if err := h.kernel.WriteFile(rel, []byte(strconv.Itoa(n)+"\n")); err != nil {
		return fmt.Errorf("set VF count of %s to %d: %w", bdf, n, err)
	}
	return nil
}
