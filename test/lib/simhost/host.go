package simhost

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/utils/clock"

	"github.com/vfnet-io/vfnet/driver/kernel/sysfs"
	"github.com/vfnet-io/vfnet/pkg/contract/pciaddr"
)

const stateVersion = 1

// persisted is <root>/.simhost/host.json: everything a second process needs
// to reopen the simulation (the rest is the tree itself).
type persisted struct {
	Version int    `json:"version"`
	Spec    Spec   `json:"spec"`
	DevRoot string `json:"devRoot"`
	// VFIODevDelay delays /dev/vfio/<group> after a vfio-pci bind (udev).
	VFIODevDelay time.Duration `json:"vfioDevDelay,omitempty"`
	// CharDevNodes makes the /dev/vfio nodes character devices (mknod)
	// instead of regular files.
	CharDevNodes bool `json:"charDevNodes,omitempty"`
	// DynIDs are IDs added through new_id, per driver ("8086 1889").
	DynIDs map[string][]string `json:"dynIDs,omitempty"`
	// Boot is the spec as built: what Reboot restores (Spec follows
	// netdev renames, which do not survive a reboot).
	Boot *Spec `json:"boot,omitempty"`
}

// Option changes how a Host is built or opened.
type Option func(*options)

type options struct {
	vfioDelay *time.Duration
	devRoot   string
	clock     clock.PassiveClock
	charDevs  bool
}

// WithVFIODevDelay makes /dev/vfio/<group> appear d after the vfio-pci bind
// instead of at once, as udev creates it asynchronously on a real host.
// The setting is stored in the tree, so a reopened Host keeps it unless
// the option is given again.
func WithVFIODevDelay(d time.Duration) Option {
	return func(o *options) { o.vfioDelay = &d }
}

// WithDevRoot puts the simulated /dev at dir instead of <dir>/dev next to
// the sysfs root (Build), or makes a reopened host use dir (Open; the
// choice is not stored).
func WithDevRoot(dir string) Option { return func(o *options) { o.devRoot = dir } }

// WithCharDevNodes makes the /dev/vfio nodes character devices, as the
// kernel's are (vfio/vfio is 10:196, a group node 240:<group number>, the
// major vfio allocates dynamically on a real host), instead of regular
// files. A container runtime applying a CDI spec that names them needs
// this: it copies the node's type and numbers into the container. Needs
// CAP_MKNOD. Stored in the tree (Build only), so a driver reopening the host
// keeps it.
func WithCharDevNodes() Option { return func(o *options) { o.charDevs = true } }

// VFIO device numbers of the simulated nodes (WithCharDevNodes).
const (
	VFIOContainerMajor = 10
	VFIOContainerMinor = 196
	VFIOGroupMajor     = 240
)

// Host is a built synthetic host: a sysfs tree, a /dev tree, the simulated
// kernel that applies attribute writes to them and the simulated VF link
// layer. Its methods are safe for concurrent use.
type Host struct {
	t       tree
	devRoot string

	mu     sync.Mutex // serialises every change to the trees and the VF state
	lockFD int        // flock on .simhost/lock: one writer across processes
	st     persisted
	pfs    map[string]*PFSpec
	funcs  map[string]*FunctionSpec
	ids    map[string]map[string]bool // driver -> "vvvv:dddd"
	timers map[string]*time.Timer     // group -> pending /dev/vfio node
	kernel *Kernel
	links  *Links
	// ueventSeq numbers the uevents this process sends (SEQNUM).
	ueventSeq atomic.Uint64
	closed    bool
	stamp     fileStamp // of host.json as last read or written
	// delayPinned: this process was opened WithVFIODevDelay, so another
	// process's SetVFIODevDelay does not change its delay.
	delayPinned bool
	// building is set while Build lays out the tree: no delayed nodes.
	building bool
	// clock dates VF resets; resets says how long they last (SetVFResets).
	clock  clock.PassiveClock
	resets VFResets
}

// fileStamp identifies a version of a file replaced by rename.
type fileStamp struct{ ino, size, mtime int64 }

func stampOf(p string) fileStamp {
	st, err := os.Stat(p)
	if err != nil {
		return fileStamp{}
	}
	s := fileStamp{size: st.Size(), mtime: st.ModTime().UnixNano()}
	if sys, ok := st.Sys().(*syscall.Stat_t); ok {
		s.ino = int64(sys.Ino)
	}
	return s
}

func (h *Host) statePath() string { return filepath.Join(h.t.root, stateDir, "host.json") }

// reloadState picks up new_id changes and netdev renames another process
// saved.
func (h *Host) reloadState() {
	if h.stamp == (fileStamp{}) || stampOf(h.statePath()) == h.stamp {
		return
	}
	b, err := os.ReadFile(h.statePath())
	if err != nil {
		return
	}
	var st persisted
	if json.Unmarshal(b, &st) != nil {
		return
	}
	h.st.DynIDs = st.DynIDs
	h.st.Spec.PFs = st.Spec.PFs // netdev renames
	if !h.delayPinned {
		h.st.VFIODevDelay = st.VFIODevDelay
	}
	h.index()
	h.stamp = stampOf(h.statePath())
}

// Build lays out spec under dir: the sysfs tree at dir/sys and /dev at
// dir/dev (or WithDevRoot). dir must be empty or absent.
func Build(dir string, spec Spec, opts ...Option) (*Host, error) {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	root := filepath.Join(dir, "sys")
	devRoot := o.devRoot
	if devRoot == "" {
		devRoot = filepath.Join(dir, "dev")
	}
	// validateSpec fills defaults in place: work on a copy so callers can
	// reuse (or concurrently build) the same Spec.
	spec.PFs = append([]PFSpec(nil), spec.PFs...)
	spec.Functions = append([]FunctionSpec(nil), spec.Functions...)
	spec.ExtraDrivers = append([]string(nil), spec.ExtraDrivers...)
	if err := validateSpec(&spec); err != nil {
		return nil, err
	}
	for _, d := range []string{root, devRoot} {
		if ents, err := os.ReadDir(d); err == nil && len(ents) > 0 {
			return nil, fmt.Errorf("build synthetic host: %s is not empty; use Open to continue an existing host", d)
		}
	}
	boot, err := cloneSpec(spec)
	if err != nil {
		return nil, err
	}
	st := persisted{Version: stateVersion, Spec: spec, DevRoot: devRoot, CharDevNodes: o.charDevs, Boot: &boot}
	if o.vfioDelay != nil {
		st.VFIODevDelay = *o.vfioDelay
	}
	h, err := newHost(root, st)
	if err != nil {
		return nil, err
	}
	if o.clock != nil {
		h.clock = o.clock
	}
	h.building = true
	err = h.build()
	h.building = false
	if err != nil {
		h.Close()
		return nil, fmt.Errorf("build synthetic host in %s: %w", dir, err)
	}
	if err := h.saveState(); err != nil {
		h.Close()
		return nil, err
	}
	return h, nil
}

// Open reopens a host built earlier (possibly by another process) from its
// sysfs root. Only one process should change a host at a time; changes are
// serialised with flock, and all state lives in the tree.
func Open(root string, opts ...Option) (*Host, error) {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	p := filepath.Join(root, stateDir, "host.json")
	b, err := os.ReadFile(p)
	if err != nil {
		return nil, fmt.Errorf("open simulated host at %s (was it built with simhost.Build?): %w", root, err)
	}
	var st persisted
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, fmt.Errorf("open simulated host: %s is corrupt: %w", p, err)
	}
	if st.Version != stateVersion {
		return nil, fmt.Errorf("open simulated host: %s has version %d, want %d", p, st.Version, stateVersion)
	}
	if o.vfioDelay != nil {
		st.VFIODevDelay = *o.vfioDelay
	}
	if o.devRoot != "" && o.devRoot != st.DevRoot {
		// Nodes go where this process is told /dev is; start it like a
		// booted host's (vfio/vfio present).
		st.DevRoot = o.devRoot
		if err := os.MkdirAll(filepath.Join(o.devRoot, "vfio"), 0o755); err != nil {
			return nil, fmt.Errorf("open simulated host: dev root: %w", err)
		}
		if err := makeDevNode(filepath.Join(o.devRoot, "vfio", "vfio"), st.CharDevNodes, VFIOContainerMajor, VFIOContainerMinor, 0o666); err != nil && !errors.Is(err, fs.ErrExist) {
			return nil, fmt.Errorf("open simulated host: dev root: %w", err)
		}
	}
	h, err := newHost(root, st)
	if err != nil {
		return nil, err
	}
	if o.clock != nil {
		h.clock = o.clock
	}
	h.stamp = stampOf(p)
	h.delayPinned = o.vfioDelay != nil
	if err := h.coldplug(); err != nil {
		h.Close()
		return nil, fmt.Errorf("open simulated host: %w", err)
	}
	return h, nil
}

func newHost(root string, st persisted) (*Host, error) {
	h := &Host{t: tree{root: root}, devRoot: st.DevRoot, st: st, lockFD: -1,
		timers: map[string]*time.Timer{}, clock: clock.RealClock{}}
	h.index()
	if err := os.MkdirAll(filepath.Join(root, stateDir), 0o755); err != nil {
		return nil, err
	}
	fd, err := syscall.Open(filepath.Join(root, stateDir, "lock"), syscall.O_RDWR|syscall.O_CREAT|syscall.O_CLOEXEC, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open simulated host lock: %w", err)
	}
	h.lockFD = fd
	h.kernel = &Kernel{h: h}
	h.links = &Links{h: h, netns: h.HostNetns(), nsID: hostNetnsID}
	if err := h.ensureHostNetns(); err != nil {
		return nil, fmt.Errorf("simulated host network namespace: %w", err)
	}
	return h, nil
}

func (h *Host) index() {
	h.pfs = map[string]*PFSpec{}
	h.funcs = map[string]*FunctionSpec{}
	h.ids = map[string]map[string]bool{}
	add := func(drv, vendor, device string) {
		if drv == "" || drv == DriverVFIOPCI {
			return
		}
		if h.ids[drv] == nil {
			h.ids[drv] = map[string]bool{}
		}
		h.ids[drv][vendor+":"+device] = true
	}
	for i := range h.st.Spec.PFs {
		pf := &h.st.Spec.PFs[i]
		h.pfs[pf.Address] = pf
		h.funcs[pf.Address] = &pf.FunctionSpec
		add(pf.Driver, pf.VendorID, pf.DeviceID)
		add(pf.VFDriver, pf.VendorID, pf.VFDeviceID)
	}
	for i := range h.st.Spec.Functions {
		f := &h.st.Spec.Functions[i]
		h.funcs[f.Address] = f
		add(f.Driver, f.VendorID, f.DeviceID)
	}
	for drv, list := range h.st.DynIDs {
		for _, id := range list {
			if h.ids[drv] == nil {
				h.ids[drv] = map[string]bool{}
			}
			h.ids[drv][strings.Replace(id, " ", ":", 1)] = true
		}
	}
}

// Close stops pending /dev/vfio timers and releases the lock file.
func (h *Host) Close() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return nil
	}
	h.closed = true
	for g, t := range h.timers {
		t.Stop()
		delete(h.timers, g)
	}
	if h.lockFD >= 0 {
		syscall.Close(h.lockFD)
		h.lockFD = -1
	}
	return nil
}

// Root is the sysfs root (pass it as --sysfs-root or to sysfs.New).
func (h *Host) Root() string { return h.t.root }

// DevRoot is the simulated /dev.
func (h *Host) DevRoot() string { return h.devRoot }

// Kernel is the simulated kernel: a sysfs.Writer over this host.
func (h *Host) Kernel() *Kernel { return h.kernel }

// Links is the simulated VF link layer (vflink.Links) in the host's
// network namespace (LinksAt(HostNetns())).
func (h *Host) Links() *Links { return h.links }

// Sysfs is a reader over this host's tree.
func (h *Host) Sysfs() *sysfs.Host { return sysfs.New(h.t.root) }

// Spec returns the spec the host was built from.
func (h *Host) Spec() Spec { return h.st.Spec }

// lock takes the in-process mutex and the cross-process flock.
func (h *Host) lock() func() {
	h.mu.Lock()
	if h.lockFD >= 0 {
		for syscall.Flock(h.lockFD, syscall.LOCK_EX) == syscall.EINTR {
		}
		h.reloadState()
		// Holding the flock, a journal can only be a dead writer's.
		_ = h.recoverJournal()
	}
	return func() {
		if h.lockFD >= 0 {
			syscall.Flock(h.lockFD, syscall.LOCK_UN)
		}
		h.mu.Unlock()
	}
}

func (h *Host) saveState() error {
	b, err := json.MarshalIndent(h.st, "", "  ")
	if err != nil {
		return err
	}
	if err := writeAtomic(h.statePath(), b); err != nil {
		return err
	}
	h.stamp = stampOf(h.statePath())
	return nil
}

// writeAtomic writes a file through a temp file and rename, so a reader in
// another process never sees half of it and a killed writer leaves the old
// or the new content. It does not fsync: the simulation models process
// crashes, not power loss, and an fsync per VF setting would dominate the
// prepare benchmark.
func writeAtomic(p string, b []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(p), ".tmp-"+filepath.Base(p))
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), p)
}

func validateSpec(s *Spec) error {
	seen := map[string]string{}
	claim := func(bdf, what string) error {
		if _, err := pciaddr.ParseKernelName(bdf); err != nil {
			return fmt.Errorf("spec: %s address %q: %w", what, bdf, err)
		}
		if prev, ok := seen[bdf]; ok {
			return fmt.Errorf("spec: %s address %s already used by %s", what, bdf, prev)
		}
		seen[bdf] = what
		return nil
	}
	checkFn := func(f *FunctionSpec, what string) error {
		if err := claim(f.Address, what); err != nil {
			return err
		}
		if f.RootPort == "" {
			f.RootPort = rootPortFor(f.Address)
		}
		if _, err := pciaddr.ParseKernelName(f.RootPort); err != nil {
			return fmt.Errorf("spec: %s %s: root port %q is not a PCI address", what, f.Address, f.RootPort)
		}
		if len(f.VendorID) != 4 || len(f.DeviceID) != 4 {
			return fmt.Errorf("spec: %s %s: vendor/device IDs must be 4 hex digits", what, f.Address)
		}
		if f.LinkType == "" {
			f.LinkType = sysfs.LinkTypeEthernet
		}
		if f.OperState == "" {
			f.OperState = defaultPFState
		}
		if f.NetDev == "" {
			f.NetDev = pathName(f.Address, f.LinkType)
		}
		if f.MAC == "" {
			f.MAC = derivedMAC(f.Address, 0xfe)
		}
		return nil
	}
	for i := range s.Functions {
		if err := checkFn(&s.Functions[i], "function"); err != nil {
			return err
		}
	}
	for i := range s.PFs {
		pf := &s.PFs[i]
		if err := checkFn(&pf.FunctionSpec, "PF"); err != nil {
			return err
		}
		if pf.TotalVFs <= 0 || pf.NumVFs < 0 || pf.NumVFs > pf.TotalVFs {
			return fmt.Errorf("spec: PF %s: want 0 <= numVFs (%d) <= totalVFs (%d), totalVFs > 0", pf.Address, pf.NumVFs, pf.TotalVFs)
		}
		if pf.VFOffset == 0 {
			pf.VFOffset = defaultOffset
		}
		if pf.VFStride == 0 {
			pf.VFStride = 1
		}
		for i := 0; i < pf.TotalVFs; i++ {
			a, err := vfAddress(pf.Address, pf.VFOffset, pf.VFStride, i)
			if err != nil {
				return fmt.Errorf("spec: %w", err)
			}
			if err := claim(a, "VF "+strconv.Itoa(i)+" of "+pf.Address); err != nil {
				return err
			}
		}
	}
	for _, f := range s.Functions {
		if prev, ok := seen[f.RootPort]; ok {
			return fmt.Errorf("spec: root port %s of %s collides with %s", f.RootPort, f.Address, prev)
		}
	}
	for _, pf := range s.PFs {
		if prev, ok := seen[pf.RootPort]; ok {
			return fmt.Errorf("spec: root port %s of %s collides with %s", pf.RootPort, pf.Address, prev)
		}
	}
	if s.FirstIOMMUGroup == 0 {
		s.FirstIOMMUGroup = defaultGroup0
	}
	return nil
}

// netInfo is what the netdev of a function looks like when a net driver
// binds it.
type netInfo struct {
	name, linkType, operState, mac string
	// assignType is addr_assign_type: "0" (permanent: from the device or
	// given by the PF), "1" (random: a VF driver chose it itself).
	assignType string
	// physPortName and switchID are written when set (devlink port).
	physPortName, switchID string
}

// vfOf returns the PF spec and index of a VF address, or nil.
func (h *Host) vfOf(bdf string) (*PFSpec, int) {
	_, rid, err := parseBDF(bdf)
	if err != nil {
		return nil, -1
	}
	for _, pf := range h.pfs {
		_, prid, _ := parseBDF(pf.Address)
		d := rid - prid - pf.VFOffset
		if d >= 0 && d%pf.VFStride == 0 && d/pf.VFStride < pf.TotalVFs {
			return pf, d / pf.VFStride
		}
	}
	return nil, -1
}

func (h *Host) netInfoFor(bdf string) netInfo {
	if f, ok := h.funcs[bdf]; ok {
		ni := netInfo{name: f.NetDev, linkType: f.LinkType, operState: f.OperState, mac: f.MAC, physPortName: f.PhysPortName}
		if f.PhysPortName != "" {
			ni.switchID = switchID(bdf)
		}
		return ni
	}
	if pf, i := h.vfOf(bdf); pf != nil {
		// Without a MAC from the PF the VF driver picks one itself
		// (eth_hw_addr_random: NET_ADDR_RANDOM).
		mac, assign := derivedMAC(bdf, 0x00), "1"
		if st, ok := h.links.peek(pf.NetDev, i); ok && st.MAC != nil && !isZeroMAC(st.MAC) {
			mac, assign = st.MAC.String(), "0"
		}
		return netInfo{name: vfNetDev(pf.NetDev, i), linkType: pf.LinkType, operState: "down", mac: mac, assignType: assign}
	}
	return netInfo{name: pathName(bdf, sysfs.LinkTypeEthernet), linkType: sysfs.LinkTypeEthernet, operState: "down", mac: derivedMAC(bdf, 0x01)}
}

// build lays out the whole tree from the spec.
func (h *Host) build() error {
	t := h.t
	s := &h.st.Spec
	for _, d := range []string{"", "devices", "devices/system", "devices/system/node", "bus", "bus/pci", pciDevices, pciDrivers,
		"kernel", iommuDir, "class", classNet, "module", stateDir} {
		if err := t.mkdir(d); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(filepath.Join(h.devRoot, "vfio"), 0o755); err != nil {
		return err
	}
	if err := makeDevNode(filepath.Join(h.devRoot, "vfio", "vfio"), h.st.CharDevNodes, VFIOContainerMajor, VFIOContainerMinor, 0o666); err != nil {
		return err
	}
	// An empty /proc: no process holds anything open until HoldVFIOGroup.
	if err := os.MkdirAll(h.ProcRoot(), 0o755); err != nil {
		return err
	}
	for _, f := range []struct{ name, content string }{{"drivers_probe", ""}, {"drivers_autoprobe", "1\n"}, {"rescan", ""}} {
		if err := t.write("bus/pci/"+f.name, f.content, 0o644); err != nil {
			return err
		}
	}
	if s.NoIOMMU {
		if err := t.mkdirAll("module/vfio/parameters"); err != nil {
			return err
		}
		if err := t.write(sysfs.NoIOMMUParam, "Y\n", 0o644); err != nil {
			return err
		}
	}
	// Drivers: everything a function is bound to or a VF autoprobes, plus vfio-pci.
	drivers := map[string]bool{}
	for drv := range h.ids {
		drivers[drv] = true
	}
	for _, d := range s.ExtraDrivers {
		drivers[d] = true
	}
	if !s.NoVFIOPCI {
		drivers[DriverVFIOPCI] = true
	}
	drivers[driverPCIePort] = true
	for d := range drivers {
		if err := h.createDriver(d); err != nil {
			return err
		}
	}
	// NUMA nodes.
	nodes := s.NUMANodes
	if nodes == 0 {
		nodes = 1
		for _, f := range h.funcs {
			if f.NUMANode+1 > nodes {
				nodes = f.NUMANode + 1
			}
		}
	}
	for n := 0; n < nodes; n++ {
		var dist []string
		for m := 0; m < nodes; m++ {
			if m == n {
				dist = append(dist, "10")
			} else {
				dist = append(dist, "21")
			}
		}
		dir := "devices/system/node/node" + strconv.Itoa(n)
		if err := t.mkdir(dir); err != nil {
			return err
		}
		if err := t.write(dir+"/distance", strings.Join(dist, " ")+"\n", 0o444); err != nil {
			return err
		}
		if err := t.write(dir+"/cpulist", fmt.Sprintf("%d-%d\n", n*16, n*16+15), 0o444); err != nil {
			return err
		}
	}
	if err := t.write("devices/system/node/online", fmt.Sprintf("0-%d\n", nodes-1), 0o444); err != nil {
		return err
	}

	nextGroup := s.FirstIOMMUGroup
	group := func() int {
		if s.NoIOMMU {
			return -1
		}
		g := nextGroup
		nextGroup++
		return g
	}
	// Root ports, in address order so group numbers are stable.
	ports := map[string]int{}
	noACS := map[string]bool{}
	for _, f := range h.funcs {
		if _, ok := ports[f.RootPort]; !ok || f.NUMANode > ports[f.RootPort] {
			ports[f.RootPort] = f.NUMANode
		}
		if f.NoACS {
			noACS[f.RootPort] = true
		}
	}
	portGroup := map[string]int{}
	for _, rp := range sortedKeys(ports) {
		rc := "devices/" + rootComplex(rp)
		if err := t.mkdir(rc); err != nil {
			return err
		}
		fr := fnRec{bdf: rp, dir: rc + "/" + rp, vendor: "8086", device: "2030", class: "0x060400", numa: ports[rp], group: group()}
		portGroup[rp] = fr.group
		if err := h.createFunction(fr); err != nil {
			return err
		}
		// A root port is bound to pcieport, which vfio tolerates in a group.
		if err := h.t.link(fr.dir+"/driver", pciDrivers+"/"+driverPCIePort); err != nil {
			return err
		}
		if err := h.t.link(pciDrivers+"/"+driverPCIePort+"/"+rp, fr.dir); err != nil {
			return err
		}
	}
	// Plain functions and PFs, in address order.
	var vfJobs []vfJob
	all := sortedKeys(h.funcs)
	for _, bdf := range all {
		f := h.funcs[bdf]
		fr := fnRec{bdf: bdf, dir: "devices/" + rootComplex(f.RootPort) + "/" + f.RootPort + "/" + bdf,
			vendor: f.VendorID, device: f.DeviceID, class: "0x020000", numa: f.NUMANode, noNUMA: f.NoNUMAFile}
		if g, ok := portGroup[f.RootPort]; ok && noACS[f.RootPort] && g >= 0 {
			fr.group, fr.shared = g, true
		} else {
			fr.group = group()
		}
		if f.LinkType == sysfs.LinkTypeInfiniband {
			fr.class = "0x020700"
		}
		if err := h.createFunction(fr); err != nil {
			return err
		}
		if pf := h.pfs[bdf]; pf != nil {
			for _, a := range []struct{ name, content string }{
				{"sriov_totalvfs", strconv.Itoa(pf.TotalVFs)}, {"sriov_numvfs", "0"},
				{"sriov_offset", strconv.Itoa(pf.VFOffset)}, {"sriov_stride", strconv.Itoa(pf.VFStride)},
				{"sriov_vf_device", strings.TrimLeft(pf.VFDeviceID, "0")}, {"sriov_drivers_autoprobe", "1"},
			} {
				if err := t.write(fr.dir+"/"+a.name, a.content+"\n", 0o644); err != nil {
					return err
				}
			}
		}
		if f.Driver != "" {
			if err := h.probe(f.Driver, bdf, fr.dir); err != nil {
				return fmt.Errorf("bind %s to %s: %w", bdf, f.Driver, err)
			}
		}
		if pf := h.pfs[bdf]; pf != nil && pf.NumVFs > 0 {
			base := nextGroup
			if !s.NoIOMMU && !pf.NoACS {
				nextGroup += pf.NumVFs
			}
			vfJobs = append(vfJobs, vfJob{pf, fr.dir, base})
		}
	}
	// VFs of different PFs touch disjoint parts of the tree: create them in
	// parallel (the group numbers were reserved above, so they stay stable).
	errs := make([]error, len(vfJobs))
	var wg sync.WaitGroup
	sem := make(chan struct{}, runtime.GOMAXPROCS(0))
	for i, j := range vfJobs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			next := j.base
			errs[i] = h.enableVFs(j.pf, j.dir, j.pf.NumVFs, func() int {
				if s.NoIOMMU {
					return -1
				}
				next++
				return next - 1
			}, true)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

type vfJob struct {
	pf   *PFSpec
	dir  string
	base int
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func (h *Host) createDriver(drv string) error {
	dir := pciDrivers + "/" + drv
	if err := h.t.mkdir(dir); err != nil {
		return err
	}
	for _, f := range []string{"bind", "unbind", "new_id", "remove_id", "uevent"} {
		if err := h.t.write(dir+"/"+f, "", 0o200); err != nil {
			return err
		}
	}
	return nil
}

// fnRec is one function to create.
type fnRec struct {
	bdf, dir              string
	vendor, device, class string
	numa                  int
	noNUMA                bool
	group                 int // -1: none
	shared                bool
	physfn                string
}

// createFunction makes the device directory, its attributes, the
// bus/pci/devices link and its IOMMU group membership.
func (h *Host) createFunction(f fnRec) error {
	t := h.t
	if err := t.mkdir(f.dir); err != nil {
		return err
	}
	attrs := []struct{ name, content string }{
		{"vendor", "0x" + f.vendor}, {"device", "0x" + f.device}, {"class", f.class},
		{"driver_override", "(null)"},
	}
	if !f.noNUMA {
		attrs = append(attrs, struct{ name, content string }{"numa_node", strconv.Itoa(f.numa)})
	}
	for _, a := range attrs {
		if err := t.write(f.dir+"/"+a.name, a.content+"\n", 0o644); err != nil {
			return err
		}
	}
	if err := t.link(busLink(f.bdf), f.dir); err != nil {
		return err
	}
	if f.physfn != "" {
		if err := t.link(f.dir+"/physfn", f.physfn); err != nil {
			return err
		}
	}
	if f.group >= 0 {
		if err := h.joinGroup(f.group, f.bdf, f.dir, false, !f.shared); err != nil {
			return err
		}
	}
	return nil
}

// joinGroup adds a device to an IOMMU group, creating the group unless it
// may exist already (fresh: the caller knows it is new). Only noiommu groups
// get attribute files (name, type): nothing reads the others, and a 1024-VF
// host would pay thousands of file creations for them.
func (h *Host) joinGroup(group int, bdf, dir string, noiommu, fresh bool) error {
	g := iommuDir + "/" + strconv.Itoa(group)
	if fresh || !h.t.exists(g) {
		if err := h.t.mkdir(g); err != nil {
			return err
		}
		if err := h.t.mkdir(g + "/devices"); err != nil {
			return err
		}
		if noiommu {
			if err := h.t.write(g+"/name", sysfs.NoIOMMUGroupName+"\n", 0o444); err != nil {
				return err
			}
			if err := h.t.write(g+"/type", "identity\n", 0o444); err != nil {
				return err
			}
		}
	}
	// The device's link first: a re-run after an interruption finds the
	// group number through it (see vfioProbe).
	if err := h.t.link(dir+"/iommu_group", g); err != nil {
		return err
	}
	return h.t.link(g+"/devices/"+bdf, dir)
}

// enableVFs creates VFs 0..n-1 of pf (SR-IOV enable), probing drivers when
// autoprobe is on. atBuild applies the spec's per-VF drivers.
func (h *Host) enableVFs(pf *PFSpec, pfDir string, n int, nextGroup func() int, atBuild bool) error {
	parent := pfDir[:strings.LastIndexByte(pfDir, '/')]
	autoprobe := true
	if v, err := h.t.read(pfDir + "/sriov_drivers_autoprobe"); err == nil && v == "0" {
		autoprobe = false
	}
	// Without ACS above the PF, VFs join the group of the PF (and its root
	// port) instead of getting their own.
	shared := -1
	if pf.NoACS && !h.st.Spec.NoIOMMU {
		if g, err := h.t.readlink(pfDir + "/iommu_group"); err == nil {
			shared, _ = strconv.Atoi(path.Base(g))
		}
	}
	for i := 0; i < n; i++ {
		bdf, err := vfAddress(pf.Address, pf.VFOffset, pf.VFStride, i)
		if err != nil {
			return err
		}
		fr := fnRec{bdf: bdf, dir: parent + "/" + bdf, vendor: pf.VendorID, device: pf.VFDeviceID, class: "0x020000",
			numa: pf.NUMANode, noNUMA: pf.NoNUMAFile, physfn: pfDir}
		if shared >= 0 {
			fr.group, fr.shared = shared, true
		} else {
			fr.group = nextGroup()
		}
		if err := h.createFunction(fr); err != nil {
			return err
		}
		if err := h.t.link(pfDir+"/virtfn"+strconv.Itoa(i), fr.dir); err != nil {
			return err
		}
		drv := ""
		if autoprobe {
			drv = h.matchID(pf.VendorID + ":" + pf.VFDeviceID)
		}
		if atBuild {
			if d, ok := pf.VFDrivers[i]; ok {
				drv = d
				if d == DriverVFIOPCI {
					if err := h.t.write(fr.dir+"/driver_override", d+"\n", 0o644); err != nil {
						return err
					}
				}
			}
		}
		if drv != "" {
			if err := h.probe(drv, bdf, fr.dir); err != nil && atBuild {
				return fmt.Errorf("bind VF %s to %s: %w", bdf, drv, err)
			}
		}
		if err := h.createRepresentor(pf, pfDir, i); err != nil {
			return err
		}
	}
	return h.t.write(pfDir+"/sriov_numvfs", strconv.Itoa(n)+"\n", 0o644)
}

// driverPCIePort is the port service driver bridges are bound to.
const driverPCIePort = "pcieport"

// switchID is the phys_switch_id a NIC's ports share (mlx5: the system
// image GUID), derived here from the PF's slot.
func switchID(bdf string) string {
	dom, rid, _ := parseBDF(bdf)
	return fmt.Sprintf("%04x%04x%08x", dom, rid>>3, 0xc0ffee)
}

// representorName is what NVIDIA's udev rule names VF i's representor:
// the uplink's name without its np<N> suffix, then _<i>.
func representorName(pfNetDev string, i int) string {
	base := pfNetDev
	if k := strings.LastIndex(base, "np"); k > 0 && isDigits(base[k+2:]) {
		base = base[:k]
	}
	return base + "_" + strconv.Itoa(i)
}

func isDigits(s string) bool {
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
	}
	return s != ""
}

// createRepresentor adds VF i's representor under a switchdev PF, as the
// PF driver does when a VF is created in switchdev mode (nothing for a
// legacy PF or a PF without its driver).
func (h *Host) createRepresentor(pf *PFSpec, pfDir string, i int) error {
	if !pf.Switchdev || !h.t.exists(pfDir+"/driver") {
		return nil
	}
	ni := netInfo{name: representorName(pf.NetDev, i), linkType: sysfs.LinkTypeEthernet, operState: "up",
		mac: derivedMAC(pf.Address, byte(0x80+i)), physPortName: fmt.Sprintf("pf%svf%d", pf.Address[len(pf.Address)-1:], i),
		switchID: switchID(pf.Address)}
	return h.createNetdev(pfDir, ni)
}

// removeRepresentors drops the VF representors of a PF (SR-IOV disable).
func (h *Host) removeRepresentors(pf *PFSpec, pfDir string) error {
	if !pf.Switchdev {
		return nil
	}
	for i := 0; i < pf.TotalVFs; i++ {
		name := representorName(pf.NetDev, i)
		if !h.t.exists(pfDir + "/net/" + name) {
			continue
		}
		if err := h.t.remove(classNet + "/" + name); err != nil {
			return err
		}
		if err := h.t.removeAll(pfDir + "/net/" + name); err != nil {
			return err
		}
	}
	return nil
}

// matchDriver returns the loaded driver the kernel would pick for a device:
// the driver_override if set (and loaded), else the first driver (by name)
// whose ID table (static or new_id) has the device's vendor:device.
func (h *Host) matchDriver(bdf, dir, override string) string {
	if override != "" {
		if h.t.exists(pciDrivers + "/" + override) {
			return override
		}
		return ""
	}
	vendor, _ := h.t.read(dir + "/vendor")
	device, _ := h.t.read(dir + "/device")
	return h.matchID(strings.TrimPrefix(vendor, "0x") + ":" + strings.TrimPrefix(device, "0x"))
}

// matchID returns the first loaded driver (by name) whose ID table has id.
func (h *Host) matchID(id string) string {
	for _, drv := range sortedKeys(h.ids) {
		if h.ids[drv][id] && h.t.exists(pciDrivers+"/"+drv) {
			return drv
		}
	}
	return ""
}

// probe binds drv to the device: the driver links plus what the driver
// creates (a netdev, or the vfio group node). The caller checked matching.
func (h *Host) probe(drv, bdf, dir string) error {
	if drv == DriverVFIOPCI {
		if err := h.vfioProbe(bdf, dir); err != nil {
			return err
		}
	}
	if err := h.t.link(dir+"/driver", pciDrivers+"/"+drv); err != nil {
		return err
	}
	if err := h.t.link(pciDrivers+"/"+drv+"/"+bdf, dir); err != nil {
		return err
	}
	if isNetDriver(drv) {
		ni := h.netInfoFor(bdf)
		if err := h.createNetdev(dir, ni); err != nil {
			return err
		}
	}
	return nil
}

func isNetDriver(drv string) bool { return drv != DriverVFIOPCI && drv != "pci-stub" }

func (h *Host) createNetdev(dir string, ni netInfo) error {
	t := h.t
	if err := t.mkdir(dir + "/net"); err != nil {
		return err
	}
	nd := dir + "/net/" + ni.name
	if err := t.mkdir(nd); err != nil {
		return err
	}
	if ni.assignType == "" {
		ni.assignType = "0"
	}
	attrs := []struct{ name, content string }{
		{"address", ni.mac}, {"addr_assign_type", ni.assignType}, {"type", arphrd(ni.linkType)}, {"operstate", ni.operState},
	}
	if ni.physPortName != "" {
		attrs = append(attrs, struct{ name, content string }{"phys_port_name", ni.physPortName})
	}
	if ni.switchID != "" {
		attrs = append(attrs, struct{ name, content string }{"phys_switch_id", ni.switchID})
	}
	for _, a := range attrs {
		if err := t.write(nd+"/"+a.name, a.content+"\n", 0o444); err != nil {
			return err
		}
	}
	if err := t.link(nd+"/device", dir); err != nil {
		return err
	}
	return t.link(classNet+"/"+ni.name, nd)
}

// vfioProbe is what vfio-pci's probe does for the group: allocate a
// noiommu group if the device has none (or fail like the kernel without
// enable_unsafe_noiommu_mode), then create /dev/vfio/<group>.
func (h *Host) vfioProbe(bdf, dir string) error {
	g, err := h.t.readlink(dir + "/iommu_group")
	noiommu := false
	if err == nil && h.st.Spec.NoIOMMU && !h.t.exists(g+"/devices/"+bdf) {
		// An interrupted noiommu allocation: finish joining that group.
		n, _ := strconv.Atoi(path.Base(g))
		if err := h.joinGroup(n, bdf, dir, true, true); err != nil {
			return err
		}
	}
	if err != nil {
		if !h.st.Spec.NoIOMMU {
			// vfio_group_find_or_alloc: no group and noiommu off -> -EINVAL.
			return syscall.EINVAL
		}
		n, err := h.freeGroup()
		if err != nil {
			return err
		}
		if err := h.joinGroup(n, bdf, dir, true, true); err != nil {
			return err
		}
		g = iommuDir + "/" + strconv.Itoa(n)
		noiommu = true
	} else if name, err := h.t.read(g + "/name"); err == nil && name == sysfs.NoIOMMUGroupName {
		noiommu = true
	}
	num := g[strings.LastIndexByte(g, '/')+1:]
	node := num
	if noiommu {
		node = "noiommu-" + num
	}
	return h.scheduleDevNode(num, node)
}

// scheduleDevNode creates /dev/vfio/<node> now, or after the configured
// delay, re-checking then that a group member is still bound to vfio-pci.
func (h *Host) scheduleDevNode(group, node string) error {
	p := filepath.Join(h.devRoot, "vfio", node)
	if _, err := os.Stat(p); err == nil {
		return nil
	}
	// At build time udev has long run: the node is there at once.
	if h.st.VFIODevDelay <= 0 || h.building {
		h.t.step()
		return h.makeGroupNode(p, group)
	}
	if _, pending := h.timers[group]; pending {
		return nil
	}
	h.timers[group] = time.AfterFunc(h.st.VFIODevDelay, func() {
		unlock := h.lock()
		defer unlock()
		if h.closed {
			return
		}
		delete(h.timers, group)
		if h.groupHasVFIO(group, "") {
			_ = h.makeGroupNode(p, group)
		}
	})
	return nil
}

// makeGroupNode creates /dev/vfio/<node> for IOMMU group number group,
// owned by root and 0600 as udev leaves it.
func (h *Host) makeGroupNode(p, group string) error {
	n, err := strconv.Atoi(group)
	if err != nil {
		return fmt.Errorf("vfio group node %s: group %q is not a number", p, group)
	}
	if err := makeDevNode(p, h.st.CharDevNodes, VFIOGroupMajor, uint32(n), 0o600); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	return nil
}

// makeDevNode creates a character device (charDev) or an empty regular file
// at p; an existing node is fs.ErrExist.
func makeDevNode(p string, charDev bool, major, minor uint32, perm uint32) error {
	if !charDev {
		f, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY, os.FileMode(perm))
		if err != nil {
			return err
		}
		return f.Close()
	}
	if err := unix.Mknod(p, unix.S_IFCHR|perm, int(unix.Mkdev(major, minor))); err != nil {
		if errors.Is(err, unix.EEXIST) {
			return &os.PathError{Op: "mknod", Path: p, Err: fs.ErrExist}
		}
		return fmt.Errorf("mknod %s (simulated vfio node, needs CAP_MKNOD): %w", p, err)
	}
	// mknod applies the umask.
	return unix.Chmod(p, perm)
}

// coldplug creates the /dev/vfio node of every group with a member on
// vfio-pci that has none (after the configured delay), as udev does for
// events it has not handled yet: a process that died with a node pending
// (a driver killed while it waited for it) does not leave it missing for
// good.
func (h *Host) coldplug() error {
	unlock := h.lock()
	defer unlock()
	ents, err := os.ReadDir(h.t.abs(iommuDir))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	for _, e := range ents {
		g := e.Name()
		if _, err := strconv.Atoi(g); err != nil || !h.groupHasVFIO(g, "") {
			continue
		}
		node := g
		if name, err := h.t.read(iommuDir + "/" + g + "/name"); err == nil && name == sysfs.NoIOMMUGroupName {
			node = "noiommu-" + g
		}
		if err := h.scheduleDevNode(g, node); err != nil {
			return err
		}
	}
	return nil
}

// SetVFIODevDelay changes the delay of /dev/vfio nodes for every process
// using this host (stored in the tree; processes opened WithVFIODevDelay
// keep theirs). Nodes already pending keep their timers.
func (h *Host) SetVFIODevDelay(d time.Duration) error {
	unlock := h.lock()
	defer unlock()
	h.st.VFIODevDelay = d
	return h.saveState()
}

// groupHasVFIO reports whether a member of group other than except is bound
// to vfio-pci.
func (h *Host) groupHasVFIO(group, except string) bool {
	ents, err := os.ReadDir(h.t.abs(iommuDir + "/" + group + "/devices"))
	if err != nil {
		return false
	}
	for _, e := range ents {
		if e.Name() == except {
			continue
		}
		d, err := h.t.readlink(iommuDir + "/" + group + "/devices/" + e.Name() + "/driver")
		if err == nil && strings.HasSuffix(d, "/"+DriverVFIOPCI) {
			return true
		}
	}
	return false
}

// freeGroup returns the lowest unused group number >= FirstIOMMUGroup, the
// way the kernel's IDA hands them out.
func (h *Host) freeGroup() (int, error) {
	used, err := h.usedGroups()
	if err != nil {
		return 0, err
	}
	for n := h.st.Spec.FirstIOMMUGroup; ; n++ {
		if !used[n] {
			return n, nil
		}
	}
}

func (h *Host) usedGroups() (map[int]bool, error) {
	ents, err := os.ReadDir(h.t.abs(iommuDir))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	used := map[int]bool{}
	for _, e := range ents {
		if n, err := strconv.Atoi(e.Name()); err == nil {
			used[n] = true
		}
	}
	return used, nil
}

// RenameNetdev renames a netdev the way `ip link set <old> name <new>`
// does: the kernel refuses while the interface is up (dev_change_name:
// EBUSY), the device keeps everything else, and a PF keeps its VFs'
// settings (they live in the PF driver, not under the name).
func (h *Host) RenameNetdev(old, new string) error {
	unlock := h.lock()
	defer unlock()
	fail := func(err error) error { return fmt.Errorf("rename netdev %s to %s: %w", old, new, err) }
	if new == "" || len(new) > 15 || strings.ContainsAny(new, "/: ") {
		return fail(syscall.EINVAL)
	}
	nd, err := h.t.readlink(classNet + "/" + old)
	if err != nil || !h.t.exists(nd) {
		return fail(syscall.ENODEV)
	}
	if h.t.exists(classNet + "/" + new) {
		return fail(syscall.EEXIST)
	}
	if st, _ := h.t.read(nd + "/operstate"); st == "up" {
		return fail(syscall.EBUSY)
	}
	devDir := nd[:strings.LastIndex(nd, "/net/")]
	newND := devDir + "/net/" + new
	if err := os.Rename(h.t.abs(nd), h.t.abs(newND)); err != nil {
		return fail(err)
	}
	if err := h.t.remove(classNet + "/" + old); err != nil {
		return fail(err)
	}
	if err := h.t.link(classNet+"/"+new, newND); err != nil {
		return fail(err)
	}
	for _, pf := range h.pfs {
		if pf.NetDev != old {
			continue
		}
		// The simulated VF settings are keyed by PF name: move them along.
		m, err := h.links.load()
		if err != nil {
			return fail(err)
		}
		for k, v := range m {
			if strings.HasPrefix(k, old+"/") {
				delete(m, k)
				m[new+k[len(old):]] = v
			}
		}
		if err := h.links.save(m); err != nil {
			return fail(err)
		}
		pf.NetDev = new
		if err := h.saveState(); err != nil {
			return fail(err)
		}
	}
	h.uevent("move", newND, "SUBSYSTEM=net", "INTERFACE="+new, "DEVPATH_OLD=/"+nd)
	h.linkChanged(new, false)
	return nil
}

// ProcRoot is the simulated /proc next to the sysfs root: HoldVFIOGroup
// puts the processes there that hold /dev/vfio nodes open. Pass it as
// --proc-root.
func (h *Host) ProcRoot() string { return filepath.Join(filepath.Dir(h.t.root), "proc") }

// HoldVFIOGroup makes process pid (named comm) hold the VFIO group node
// /dev/vfio/<node> open, as QEMU, a DPDK application or another device
// plugin's consumer does: <proc root>/<pid>/fd/<n> links to the node, as
// /proc shows an open file. release closes it.
func (h *Host) HoldVFIOGroup(node string, pid int, comm string) (release func() error, err error) {
	devNode := filepath.Join(h.devRoot, "vfio", node)
	if _, err := os.Stat(devNode); err != nil {
		return nil, fmt.Errorf("hold VFIO group node: %w", err)
	}
	dir := filepath.Join(h.ProcRoot(), strconv.Itoa(pid))
	if err := os.MkdirAll(filepath.Join(dir, "fd"), 0o755); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "comm"), []byte(comm+"\n"), 0o444); err != nil {
		return nil, err
	}
	ents, _ := os.ReadDir(filepath.Join(dir, "fd"))
	fd := filepath.Join(dir, "fd", strconv.Itoa(len(ents)+3))
	if err := os.Symlink(devNode, fd); err != nil {
		return nil, err
	}
	return func() error { return os.Remove(fd) }, nil
}
