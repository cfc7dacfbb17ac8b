// Discovery: one pass over the PCI functions, each PF with its VFs, and
// what it skipped and why.

package sysfs

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/go-logr/logr"
	"golang.org/x/sys/unix"
	"k8s.io/dynamic-resource-allocation/deviceattribute"
	"k8s.io/klog/v2"

	"github.com/vfnet-io/vfnet/pkg/contract/pciaddr"
)

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

// DiscoverPF re-reads one PF with its VFs, as Discover would return it, for
// a rescan of what a host event named. ok is false when bdf is no longer an
// SR-IOV PF (removed, or sriov_totalvfs gone); a PF whose entries are
// broken is an error naming the path, which the caller answers with a full
// Discover.
func (h *Host) DiscoverPF(ctx context.Context, bdf string) (pf PF, ok bool, err error) {
	s := newScanner(h, klog.FromContext(ctx), &skipList{})
	devDir := filepath.Join(h.root, PCIDevicesDir)
	totalPath := filepath.Join(devDir, bdf, "sriov_totalvfs")
	v, err := readAttr(totalPath)
	if errors.Is(err, fs.ErrNotExist) {
		return PF{}, false, nil
	}
	if err != nil {
		return PF{}, false, err
	}
	total, err := strconv.Atoi(v)
	if err != nil || total < 0 {
		return PF{}, false, fmt.Errorf("%s: want a non-negative integer, got %q", totalPath, v)
	}
	if total == 0 {
		return PF{}, false, nil
	}
	job, err := s.findVFs(bdf, total)
	if err != nil {
		return PF{}, false, fmt.Errorf("%s: %w", filepath.Join(devDir, bdf), err)
	}
	pf, err = s.readPF(job)
	if err != nil {
		return PF{}, false, fmt.Errorf("%s: %w", filepath.Join(devDir, bdf), err)
	}
	return pf, true, nil
}

// PFOf is the PF of the function bdf: bdf itself when it is an SR-IOV PF,
// the target of its physfn link when it is a VF; ok is false for anything
// else (another device, or one already gone).
func (h *Host) PFOf(bdf string) (pf string, ok bool) {
	dev := filepath.Join(h.root, PCIDevicesDir, bdf)
	if t, err := os.Readlink(filepath.Join(dev, "physfn")); err == nil {
		return filepath.Base(t), true
	}
	if _, err := os.Stat(filepath.Join(dev, "sriov_totalvfs")); err == nil {
		return bdf, true
	}
	return "", false
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
