package sysfs

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/go-logr/logr"
	"golang.org/x/sys/unix"
	"k8s.io/dynamic-resource-allocation/deviceattribute"
	"k8s.io/klog/v2"

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

// Skip is a function discovery left out: the sysfs path at fault and why.
type Skip struct {
	Path   string
	Reason string
}

// Report is the outcome of DiscoverReport.
type Report struct {
	// PFs as Discover returns them.
	PFs []PF
	// Skipped lists every function left out because its sysfs entries are
	// broken, sorted by path (Discover only logs them).
	Skipped []Skip
}

// Discover returns every SR-IOV PF (sriov_totalvfs > 0) with its VFs, sorted
// by address. Functions whose sysfs entries are broken are skipped and
// logged; only an unreadable bus/pci/devices fails the call.
func (h *Host) Discover(ctx context.Context) ([]PF, error) {
	r, err := h.DiscoverReport(ctx)
	return r.PFs, err
}

// DiscoverReport is Discover that also returns the skipped functions, for
// `vfnet-driver inspect`.
func (h *Host) DiscoverReport(ctx context.Context) (Report, error) {
	logger := klog.FromContext(ctx)
	devDir := filepath.Join(h.root, PCIDevicesDir)
	names, err := readDirNames(devDir)
	if err != nil {
		return Report{}, fmt.Errorf("list PCI functions in %s (check --sysfs-root): %w", devDir, err)
	}
	slices.Sort(names)
	// Phase 1, sequential: find the PFs and their virtfn links. A VF's
	// routing ID is its PF's plus a non-zero offset, so in address order
	// every PF comes before its VFs and those entries need no probing.
	skips := &skipList{}
	s := newScanner(h, logger, skips)
	var jobs []*pfJob
	isVF := map[string]bool{}
	for _, bdf := range names {
		if err := ctx.Err(); err != nil {
			return Report{}, err
		}
		if isVF[bdf] {
			continue
		}
		if !isKernelName(bdf) {
			s.skipWhy(filepath.Join(devDir, bdf), "entry name is not a PCI address", nil)
			continue
		}
		totalPath := filepath.Join(devDir, bdf, "sriov_totalvfs")
		v, err := readAttr(totalPath)
		if errors.Is(err, fs.ErrNotExist) {
			// Not SR-IOV capable, unless the device link itself is dangling.
			if _, serr := os.Stat(filepath.Join(devDir, bdf)); serr != nil {
				s.skipWhy(filepath.Join(devDir, bdf), "broken device link", serr)
			}
			continue
		}
		if err != nil {
			s.skip(totalPath, err)
			continue
		}
		total, err := strconv.Atoi(v)
		if err != nil || total < 0 {
			s.skip(totalPath, fmt.Errorf("want a non-negative integer, got %q", v))
			continue
		}
		if total == 0 {
			continue
		}
		job, err := s.findVFs(bdf, total)
		if err != nil {
			s.skip(filepath.Join(devDir, bdf), err)
			continue
		}
		for _, l := range job.links {
			isVF[l.bdf] = true
		}
		jobs = append(jobs, job)
	}
	// Phase 2: read the PFs and VFs, spread over the CPUs (sysfs reads are
	// syscall-bound and independent).
	workers := min(runtime.GOMAXPROCS(0), len(jobs))
	next := make(chan *pfJob)
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ws := newScanner(h, logger, skips)
			for job := range next {
				job.pf, job.err = ws.readPF(job)
			}
		}()
	}
	for _, job := range jobs {
		next <- job
	}
	close(next)
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return Report{}, err
	}
	pfs := make([]PF, 0, len(jobs))
	for _, job := range jobs {
		if job.err != nil {
			s.skip(filepath.Join(devDir, job.bdf), job.err)
			continue
		}
		pfs = append(pfs, job.pf)
	}
	slices.SortFunc(pfs, func(a, b PF) int { return strings.Compare(a.Address, b.Address) })
	slices.SortFunc(skips.list, func(a, b Skip) int { return strings.Compare(a.Path, b.Path) })
	return Report{PFs: pfs, Skipped: skips.list}, nil
}

// skipList collects the skips of one discovery pass from all workers.
type skipList struct {
	mu   sync.Mutex
	list []Skip
}

// pfJob is one PF found in phase 1 of Discover.
type pfJob struct {
	bdf   string
	total int
	real  string // device directory relative to the root
	links []vfLink
	pf    PF
	err   error
}

type vfLink struct {
	name   string // virtfnN
	index  int
	target string // as read, e.g. ../0000:3b:02.1
	bdf    string
	err    error
}

// findVFs resolves the PF's directory and reads its virtfnN links.
func (s *scanner) findVFs(bdf string, total int) (*pfJob, error) {
	real, err := s.resolveDevice(bdf)
	if err != nil {
		return nil, err
	}
	job := &pfJob{bdf: bdf, total: total, real: real}
	dir := filepath.Join(s.h.root, real)
	names, err := readDirNames(dir)
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", dir, err)
	}
	for _, name := range names {
		if !strings.HasPrefix(name, "virtfn") {
			continue
		}
		idx, err := strconv.Atoi(name[len("virtfn"):])
		if err != nil || idx < 0 {
			continue
		}
		l := vfLink{name: name, index: idx}
		p := filepath.Join(dir, name)
		if l.target, err = os.Readlink(p); err != nil {
			l.err = fmt.Errorf("read link %s: %w", p, err)
		} else if l.bdf = filepath.Base(l.target); filepath.IsAbs(l.target) || !isKernelName(l.bdf) {
			l.err = fmt.Errorf("link %s -> %s does not name a PCI function", p, l.target)
		}
		job.links = append(job.links, l)
	}
	return job, nil
}

// scanner carries per-call caches so a discovery pass does not re-resolve
// the same driver directory for every VF.
type scanner struct {
	h      *Host
	log    logr.Logger
	skips  *skipList       // nil: only log
	exists map[string]bool // resolved path -> exists
	groups map[string]bool // kernel/iommu_groups entries, read once
	// noIOMMU caches NoIOMMUMode: 0 unknown, 1 on, 2 off.
	noIOMMU int
	// dirBuf and members are reused to list IOMMU group members.
	dirBuf  []byte
	members []string
}

func newScanner(h *Host, log logr.Logger, skips *skipList) *scanner {
	return &scanner{h: h, log: log, skips: skips, exists: map[string]bool{}}
}

func (s *scanner) skip(path string, err error) {
	s.skipWhy(path, "unusable sysfs entry", err)
}

// skipWhy logs and records a skipped function.
func (s *scanner) skipWhy(path, why string, err error) {
	if err != nil {
		s.log.Info("Skipping PCI function: "+why, "path", path, "err", err)
		why += ": " + err.Error()
	} else {
		s.log.Info("Skipping PCI function: "+why, "path", path)
	}
	if s.skips != nil {
		s.skips.mu.Lock()
		s.skips.list = append(s.skips.list, Skip{Path: path, Reason: why})
		s.skips.mu.Unlock()
	}
}

// resolveDevice returns the function's real directory relative to the root,
// e.g. devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0.
func (s *scanner) resolveDevice(bdf string) (string, error) {
	link := filepath.Join(s.h.root, PCIDevicesDir, bdf)
	target, err := os.Readlink(link)
	if err != nil {
		return "", fmt.Errorf("PCI function %s: %w", bdf, err)
	}
	if filepath.IsAbs(target) {
		return "", fmt.Errorf("PCI function %s: %s links to absolute path %s, want a path relative to the sysfs root", bdf, link, target)
	}
	real := filepath.Join(PCIDevicesDir, target)
	if strings.HasPrefix(real, "..") || filepath.Base(real) != bdf {
		return "", fmt.Errorf("PCI function %s: %s links outside the sysfs root or to another function: %s", bdf, link, target)
	}
	return real, nil
}

func (s *scanner) pathExists(rel string) bool {
	if dir, base := filepath.Split(rel); dir == IOMMUGroupDir+"/" {
		if s.groups == nil {
			s.groups = map[string]bool{}
			if ents, err := os.ReadDir(filepath.Join(s.h.root, IOMMUGroupDir)); err == nil {
				for _, e := range ents {
					s.groups[e.Name()] = true
				}
			}
		}
		return s.groups[base]
	}
	if ok, seen := s.exists[rel]; seen {
		return ok
	}
	_, err := os.Stat(filepath.Join(s.h.root, rel))
	s.exists[rel] = err == nil
	return err == nil
}

// readFunction fills everything but PCIeRoot for the function whose real
// directory (relative to the root) is realDir. It opens the directory once
// and reads relative to it: discovery is syscall-bound, and short relative
// lookups are markedly cheaper than walking the full path each time.
func (s *scanner) readFunction(bdf, realDir string) (Function, error) {
	dir := filepath.Join(s.h.root, realDir)
	fn := Function{Address: bdf}
	dfd, err := openDir(dir)
	if err != nil {
		return fn, err
	}
	defer unix.Close(dfd)
	at := func(name string) attrAt { return attrAt{dfd: dfd, dir: dir, name: name} }
	if fn.VendorID, err = at("vendor").hexID(); err != nil {
		return fn, err
	}
	if fn.DeviceID, err = at("device").hexID(); err != nil {
		return fn, err
	}
	v, err := at("numa_node").read()
	switch {
	case errors.Is(err, fs.ErrNotExist):
		// CONFIG_NUMA=n kernels have no numa_node attribute at all.
		fn.NUMANode = -1
	case err != nil:
		return fn, err
	default:
		if fn.NUMANode, err = strconv.Atoi(v); err != nil || fn.NUMANode < -1 {
			return fn, fmt.Errorf("%s: want a NUMA node number or -1, got %q", filepath.Join(dir, "numa_node"), v)
		}
	}
	if fn.Driver, err = s.linkBase(at("driver"), realDir); err != nil {
		return fn, err
	}
	if fn.IOMMUGroup, err = s.linkBase(at("iommu_group"), realDir); err != nil {
		return fn, err
	}
	if fn.IOMMUGroup != "" && !isDigits(fn.IOMMUGroup) {
		return fn, fmt.Errorf("%s: IOMMU group %q is not a number", filepath.Join(dir, "iommu_group"), fn.IOMMUGroup)
	}
	if fn.IOMMUGroup != "" {
		if err := s.readGroup(&fn); err != nil {
			return fn, err
		}
	}
	ov, err := at("driver_override").read()
	switch {
	case errors.Is(err, fs.ErrNotExist): // kernels before 3.16
	case err != nil:
		return fn, err
	case ov != "(null)":
		fn.DriverOverride = ov
	}
	names, err := at("net").dirNames()
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fn, fmt.Errorf("list netdevs: %w", err)
	}
	slices.Sort(names)
	fn.NetDevs = names
	return fn, nil
}

// readGroup fills the group's name and the other members with their drivers.
// It runs for every function, so it avoids what it can: the name file exists
// only for noiommu groups, and the member listing reuses one buffer.
func (s *scanner) readGroup(fn *Function) error {
	gdir := filepath.Join(s.h.root, IOMMUGroupDir, fn.IOMMUGroup)
	if s.noIOMMU == 0 {
		s.noIOMMU = 2
		if s.h.NoIOMMUMode() {
			s.noIOMMU = 1
		}
	}
	if s.noIOMMU == 1 {
		if name, err := readAttr(filepath.Join(gdir, "name")); err == nil {
			fn.IOMMUGroupName = name
		}
	}
	ddir := filepath.Join(gdir, "devices")
	fd, err := unix.Open(ddir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("list IOMMU group %s members: %w", fn.IOMMUGroup, &fs.PathError{Op: "open", Path: ddir, Err: err})
	}
	if s.dirBuf == nil {
		s.dirBuf = make([]byte, 2048)
	}
	members := s.members[:0]
	for {
		n, err := unix.ReadDirent(fd, s.dirBuf)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			unix.Close(fd)
			return fmt.Errorf("list IOMMU group %s members: %w", fn.IOMMUGroup, &fs.PathError{Op: "readdirent", Path: ddir, Err: err})
		}
		if n <= 0 {
			break
		}
		_, _, members = unix.ParseDirent(s.dirBuf[:n], -1, members)
	}
	unix.Close(fd)
	s.members = members
	if len(members) == 1 && members[0] == fn.Address {
		return nil // alone in its group: the normal case
	}
	for _, m := range members {
		if m == fn.Address {
			continue
		}
		p := GroupPeer{Address: m}
		// Only on hosts without ACS: a peer's driver decides whether the
		// group can be passed through (a bridge on pcieport can).
		if t, err := os.Readlink(filepath.Join(gdir, "devices", m, "driver")); err == nil {
			p.Driver = filepath.Base(t)
		}
		fn.IOMMUPeers = append(fn.IOMMUPeers, p)
	}
	slices.SortFunc(fn.IOMMUPeers, func(a, b GroupPeer) int { return strings.Compare(a.Address, b.Address) })
	return nil
}

// linkBase reads a symlink and returns the basename of its target after
// checking the target exists. A missing link returns "", nil.
func (s *scanner) linkBase(a attrAt, realDir string) (string, error) {
	target, err := a.readlink()
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	p := filepath.Join(a.dir, a.name)
	if filepath.IsAbs(target) {
		return "", fmt.Errorf("link %s points to absolute path %s", p, target)
	}
	if !s.pathExists(filepath.Join(realDir, target)) {
		return "", fmt.Errorf("dangling link %s -> %s", p, target)
	}
	return filepath.Base(target), nil
}

// attrAt names an entry of an open directory; errors carry the full path.
type attrAt struct {
	dfd       int
	dir, name string
}

func (a attrAt) err(op string, err error) error {
	return &fs.PathError{Op: op, Path: filepath.Join(a.dir, a.name), Err: err}
}

func (a attrAt) read() (string, error) {
	fd, err := unix.Openat(a.dfd, a.name, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", a.err("open", err)
	}
	var buf [128]byte
	n, err := unix.Read(fd, buf[:])
	unix.Close(fd)
	if err != nil {
		return "", a.err("read", err)
	}
	return strings.TrimSpace(string(buf[:max(n, 0)])), nil
}

func (a attrAt) hexID() (string, error) {
	v, err := a.read()
	if err != nil {
		return "", err
	}
	id := strings.ToLower(strings.TrimPrefix(strings.TrimPrefix(v, "0x"), "0X"))
	if len(id) != 4 || !isHex(id) {
		return "", fmt.Errorf("%s: want a 16-bit hex ID like 0x8086, got %q", filepath.Join(a.dir, a.name), v)
	}
	return id, nil
}

func (a attrAt) readlink() (string, error) {
	for size := 256; ; size *= 2 {
		buf := make([]byte, size)
		n, err := unix.Readlinkat(a.dfd, a.name, buf)
		if err != nil {
			return "", a.err("readlink", err)
		}
		if n < size { // a full buffer may be a truncated target
			return string(buf[:n]), nil
		}
	}
}

func (a attrAt) dirNames() ([]string, error) {
	fd, err := unix.Openat(a.dfd, a.name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, a.err("open", err)
	}
	defer unix.Close(fd)
	names, err := direntNames(fd)
	if err != nil {
		return nil, a.err("readdirent", err)
	}
	return names, nil
}

func openDir(dir string) (int, error) {
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, &fs.PathError{Op: "open", Path: dir, Err: err}
	}
	return fd, nil
}

func (h *Host) pcieRoot(bdf string) (string, error) {
	// The Kubernetes helper takes only four-digit domains (its BDF
	// pattern), as pciaddr's domain rule does: a function beyond (behind
	// Intel VMD) is modelled without a root, and discovery refuses it.
	if a, err := pciaddr.ParseKernelName(bdf); err == nil && a.Domain > pciaddr.MaxDomain {
		return "", nil
	}
	attr, err := deviceattribute.GetPCIeRootAttributeByPCIBusID(bdf, deviceattribute.WithFSFromRoot(h.root))
	if err != nil {
		return "", err
	}
	if attr.Value.StringValue == nil {
		return "", fmt.Errorf("PCIe root of %s: empty attribute", bdf)
	}
	return *attr.Value.StringValue, nil
}

func (s *scanner) readPF(job *pfJob) (PF, error) {
	fn, err := s.readFunction(job.bdf, job.real)
	if err != nil {
		return PF{}, err
	}
	if fn.PCIeRoot, err = s.h.pcieRoot(job.bdf); err != nil {
		return PF{}, err
	}
	pf := PF{Function: fn, TotalVFs: job.total}
	dir := filepath.Join(s.h.root, job.real)
	numPath := filepath.Join(dir, "sriov_numvfs")
	v, err := readAttr(numPath)
	if err != nil {
		return PF{}, err
	}
	if pf.NumVFs, err = strconv.Atoi(v); err != nil || pf.NumVFs < 0 || pf.NumVFs > job.total {
		return PF{}, fmt.Errorf("%s: want 0..%d, got %q", numPath, job.total, v)
	}
	pf.NetDev, pf.Representors, pf.Switchdev = classifyNetDevs(dir, fn.NetDevs)
	if pf.NetDev != "" {
		if pf.LinkType, pf.OperState, err = s.netInfo(pf.NetDev); err != nil {
			return PF{}, err
		}
	}
	pf.VFs = make([]VF, 0, len(job.links))
	for _, l := range job.links {
		if l.err != nil {
			s.skip(filepath.Join(dir, l.name), l.err)
			continue
		}
		vf, err := s.readVF(pf, job.real, l)
		if err != nil {
			s.skip(filepath.Join(dir, l.name), err)
			continue
		}
		pf.VFs = append(pf.VFs, vf)
	}
	slices.SortFunc(pf.VFs, func(a, b VF) int { return a.Index - b.Index })
	return pf, nil
}

func (s *scanner) readVF(pf PF, pfReal string, l vfLink) (VF, error) {
	real := filepath.Join(pfReal, l.target)
	if strings.HasPrefix(real, "..") {
		return VF{}, fmt.Errorf("link -> %s leaves the sysfs root", l.target)
	}
	fn, err := s.readFunction(l.bdf, real)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return VF{}, fmt.Errorf("dangling link -> %s: %w", l.target, err)
		}
		return VF{}, err
	}
	if filepath.Dir(real) == filepath.Dir(pfReal) {
		// Sibling of the PF: same parent bridge, same root complex.
		fn.PCIeRoot = pf.PCIeRoot
	} else if fn.PCIeRoot, err = s.h.pcieRoot(l.bdf); err != nil {
		return VF{}, err
	}
	return VF{Function: fn, Index: l.index, PFAddress: pf.Address}, nil
}

// representorRE matches the phys_port_name of e-switch representors as
// devlink names them (net/devlink/port.c): PCI PF "pf0" (or "c1pf0" on an
// external controller), PCI VF "pf0vf3", PCI SF "pf0sf7". An uplink
// (flavour physical) shows "p0" (split ports "p0s1"); netdevs of drivers
// without a devlink port (igb, i40e, ...) have no readable phys_port_name.
var representorRE = regexp.MustCompile(`^(c[0-9]+)?pf[0-9]+((vf|sf)[0-9]+)?$`)

// vfRepresentorRE matches VF representors only: they exist only in
// switchdev mode (mlx5 and ice create them on the switch to switchdev).
var vfRepresentorRE = regexp.MustCompile(`^(c[0-9]+)?pf[0-9]+vf[0-9]+$`)

// physicalPortRE matches the phys_port_name of an uplink port.
var physicalPortRE = regexp.MustCompile(`^p[0-9]+(s[0-9]+)?$`)

// classifyNetDevs splits the netdevs under a PF's device directory into the
// uplink and representors by phys_port_name. Representors of mlx5 and ice
// hang off the PF's PCI device too, so the PF's net/ lists them, and any of
// them can sort before the uplink.
func classifyNetDevs(devDir string, names []string) (uplink string, reps []string, switchdev bool) {
	var plain []string
	for _, n := range names {
		ppn, _ := readAttr(filepath.Join(devDir, "net", n, "phys_port_name"))
		switch {
		case representorRE.MatchString(ppn):
			reps = append(reps, n)
			if vfRepresentorRE.MatchString(ppn) {
				switchdev = true
			}
		case physicalPortRE.MatchString(ppn) && uplink == "":
			uplink = n
		default:
			plain = append(plain, n)
		}
	}
	if uplink == "" && len(plain) > 0 {
		uplink = plain[0]
	}
	return uplink, reps, switchdev
}

// UplinkOf returns the uplink netdev of the PF at pfBDF as the kernel shows
// it now (it may have been renamed since discovery), "" when it has none.
func (h *Host) UplinkOf(pfBDF string) (string, error) {
	if _, err := pciaddr.ParseKernelName(pfBDF); err != nil {
		return "", fmt.Errorf("PCI address %q: %w", pfBDF, err)
	}
	dir := filepath.Join(h.root, PCIDevicesDir, pfBDF)
	names, err := readDirNames(filepath.Join(dir, "net"))
	if errors.Is(err, fs.ErrNotExist) {
		if _, serr := os.Stat(dir); serr != nil {
			return "", fmt.Errorf("PF %s: %w", pfBDF, serr)
		}
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("PF %s: list netdevs: %w", pfBDF, err)
	}
	slices.Sort(names)
	uplink, _, _ := classifyNetDevs(dir, names)
	return uplink, nil
}

// netInfo reads class/net/<ifname>/{type,operstate}.
func (s *scanner) netInfo(ifname string) (linkType, operState string, err error) {
	dir := filepath.Join(s.h.root, ClassNetDir, ifname)
	tp := filepath.Join(dir, "type")
	v, err := readAttr(tp)
	if err != nil {
		return "", "", err
	}
	arphrd, err := strconv.Atoi(v)
	if err != nil {
		return "", "", fmt.Errorf("%s: want an ARPHRD number, got %q", tp, v)
	}
	linkType = LinkTypeFromARPHRD(arphrd)
	if operState, err = readAttr(filepath.Join(dir, "operstate")); err != nil {
		return "", "", err
	}
	return linkType, operState, nil
}

// Link types reported in PF.LinkType.
const (
	LinkTypeEthernet   = "ethernet"
	LinkTypeInfiniband = "infiniband"
)

// LinkTypeFromARPHRD maps a netdev's type (ARPHRD_*) to a link type name:
// "ethernet" (1), "infiniband" (32), else "arphrd <n>" so that a refusal can
// name what the kernel reported.
func LinkTypeFromARPHRD(t int) string {
	switch t {
	case 1:
		return LinkTypeEthernet
	case 32:
		return LinkTypeInfiniband
	}
	return "arphrd " + strconv.Itoa(t)
}

// readAttr reads a small sysfs attribute and trims the trailing newline.
// It uses raw syscalls: os.Open registers every file with the poller, which
// dominates the cost of reading thousands of 5-byte files.
func readAttr(path string) (string, error) {
	fd, err := syscall.Open(path, syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return "", &fs.PathError{Op: "open", Path: path, Err: err}
	}
	var buf [128]byte
	n, err := syscall.Read(fd, buf[:])
	syscall.Close(fd)
	if err != nil {
		return "", &fs.PathError{Op: "read", Path: path, Err: err}
	}
	if n < 0 {
		n = 0
	}
	return strings.TrimSpace(string(buf[:n])), nil
}

// readDirNames lists a directory with raw syscalls (open, getdents, close);
// os.ReadDir costs several more calls per directory.
func readDirNames(dir string) ([]string, error) {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: dir, Err: err}
	}
	defer unix.Close(fd)
	names, err := direntNames(fd)
	if err != nil {
		return nil, &fs.PathError{Op: "readdirent", Path: dir, Err: err}
	}
	return names, nil
}

func direntNames(fd int) ([]string, error) {
	var names []string
	buf := make([]byte, 2048)
	for {
		n, err := unix.ReadDirent(fd, buf)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, err
		}
		if n <= 0 {
			return names, nil
		}
		_, _, names = unix.ParseDirent(buf[:n], -1, names)
	}
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
