// Package prepare implements NodePrepareResources and NodeUnprepareResources
// for vfnet: per allocated VF it applies the claim's VFConfig through the PF,
// binds the VF to vfio-pci, writes the CDI spec, reports metadata and the
// claim's device status, and undoes all of it exactly.
//
// It also holds the two pieces only it uses: writing, checking and removing
// the per-claim CDI spec that hands the VM's container the VFIO nodes
// (CDIWriter, cdi.go), and parsing the claim's VFConfig, merged from the
// DeviceClass's and the claim's opaque configs in Kubernetes' precedence
// (vfconfig.go).
//
// Crash safety: every host change is preceded by a checkpoint write that
// says what is about to change and what the original state was (see
// driver/checkpoint). Each host operation is idempotent, so a restarted
// driver converges: a repeated prepare continues an interrupted one, an
// unprepare undoes whatever was done.
package prepare

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/record"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/vfnet-io/vfnet/driver/checkpoint"
	"github.com/vfnet-io/vfnet/driver/discovery"
	"github.com/vfnet-io/vfnet/driver/kernel/pcibind"
	"github.com/vfnet-io/vfnet/driver/kernel/sysfs"
	"github.com/vfnet-io/vfnet/driver/kernel/vflink"
	"github.com/vfnet-io/vfnet/driver/maclookup"
	"github.com/vfnet-io/vfnet/driver/nodelock"
	"github.com/vfnet-io/vfnet/pkg/api/v1alpha1"
	"github.com/vfnet-io/vfnet/pkg/contract/pciaddr"
)

// MACFinder finds the VMI interface a claim's request backs and the MAC it
// expects (maclookup.Lookup in production). found is false when no VMI
// uses the claim; Result.MAC is nil when the interface sets no macAddress.
type MACFinder interface {
	Find(ctx context.Context, claim *resourceapi.ResourceClaim, request string) (maclookup.Result, bool, error)
}

// ReasonMACNotMigratable is the reason of the Warning Event recorded on a
// VMI whose template-claim vfnet interface has neither macAddress nor
// VFConfig.mac: the VF keeps its own MAC, so after a live migration the
// guest would see the target VF's different MAC.
const ReasonMACNotMigratable = "VFNetMACNotMigratable"

// maxWarned bounds the in-memory deduplication of MAC warnings; past it the
// set starts over (a repeated Event is harmless, the recorder aggregates).
const maxWarned = 4096

// Options are the dependencies of a State.
type Options struct {
	// DriverName defaults to discovery.DriverName.
	DriverName string
	// NodeName is the node and the pool name of our devices.
	NodeName string
	Sysfs    *sysfs.Host
	Writer   sysfs.Writer
	Links    vflink.Links
	// DevRoot holds vfio/ ("/dev").
	DevRoot string
	// CheckpointPath is the checkpoint file (in the plugin data directory).
	CheckpointPath string
	// CDIRoot is the CDI spec directory (--cdi-root).
	CDIRoot string
	// Kube updates claim status; nil skips status updates.
	Kube kubernetes.Interface
	// MACs finds VM interface MACs; nil keeps the VF's MAC unless the
	// config sets one.
	MACs MACFinder
	// Events records Warning Events on VMIs (ReasonMACNotMigratable); nil
	// records none. RBAC: events create/patch.
	Events record.EventRecorder
	// Published returns the devices currently published, so metadata
	// carries the same attributes as the ResourceSlice (nil: attributes are
	// derived from sysfs without the network name).
	Published func() []discovery.Device
	// CheckVF is called for every VF just before it is bound to vfio-pci
	// and fails when the VF cannot be passed through (shared or missing
	// IOMMU group, group node held open by another process). Nil checks
	// with discovery.CheckVF and the safe defaults (no noiommu opt-in, no
	// holder check).
	CheckVF func(bdf string) error
	// VFIOTimeout bounds the wait for /dev/vfio/<group> (default 30s).
	VFIOTimeout time.Duration
	// LinkRetryTimeout bounds how long one VF setting is retried while the
	// PF answers that the VF is in reset (default
	// vflink.DefaultRetryTimeout, about 2s).
	LinkRetryTimeout time.Duration
	// Clock times those retries (nil: the real clock).
	Clock clock.Clock
	// StaleTempAge is how old a temporary file of ours (checkpoint, CDI
	// spec, the helper's metadata) must be for New to remove it as a
	// crash's leftover (default 5 minutes: a younger one may be another
	// driver instance's write in progress).
	StaleTempAge time.Duration
	// LockPath is the node lock every call takes (default: LockFileName
	// next to the checkpoint). Every driver instance on the node must use
	// the same file.
	LockPath string
	// Hook, if set, is called after each checkpoint write and host change,
	// and inside the CDI spec write (StepCDITempWritten), with the step's
	// name. Crash tests stop the process there.
	Hook func(step string)
	// Observer, if set, sees every claim's prepare and unprepare
	// (driver/metrics).
	Observer Observer
	// AfterUnprepare, if set, is called after each Unprepare call (a VF
	// count change may have waited for it); it must not block.
	AfterUnprepare func()
	// StandbyBridge, if set, returns the node bridge the failover standby
	// of a VF of PF pfAddress (netdev pfNetDev) connects to, or why there
	// is none usable (no standby.bridge for the PF, the bridge missing, the
	// runtime's NRI not connected), which refuses the claim. nil: vfnet
	// plumbs no standby (--standby-nri=false, or a simulated driver
	// without --standby-netns) and records none.
	StandbyBridge func(ctx context.Context, pfAddress, pfNetDev string) (string, error)
}

// Observer sees the outcome of every claim's prepare and unprepare: how
// long it took and, on failure, the step (ErrStep...) and the error.
type Observer interface {
	PrepareDone(d time.Duration, step string, err error)
	UnprepareDone(d time.Duration, step string, err error)
}

// LockFileName is the node lock's file in the plugin data directory. It is
// not the kubeletplugin helper's serialize.lock: the helper holds that one
// around our calls when rolling updates are on, and a second flock on it
// from the same process would wait for itself.
const LockFileName = "vfnet-prepare.lock"

// State prepares and unprepares claims. It is safe for concurrent use, and
// several States (in one process or in two driver instances during a
// rolling update) may share one checkpoint: the checkpoint file is the only
// state that lasts across calls. Every Prepare and Unprepare call holds the
// node lock, reads the checkpoint at its start and writes every change
// before it returns, so a claim prepared through one instance is known to
// the other.
type State struct {
	opts   Options
	store  checkpoint.Store
	lock   *nodelock.Lock
	cdi    CDIWriter
	binder pcibind.Binder

	mu sync.Mutex
	// cp is the checkpoint as read at the start of the current call and
	// written since; guarded by mu, and only meaningful while the node lock
	// is held (outside a call another instance may have changed the file).
	cp *checkpoint.File
	// warned holds "<VMI UID>/<interface>" MAC warnings already recorded;
	// guarded by mu.
	warned map[string]bool

	// owned caches the VFs the checkpoint file holds, keyed by the file's
	// identity, for Owned (called per VF on every rescan).
	ownedMu  sync.Mutex
	ownedKey fileKey
	owned    map[string]bool
}

// New loads the checkpoint. A corrupt checkpoint is an error: the driver
// must not start and guess what it changed on the host.
func New(opts Options) (*State, error) {
	if opts.DriverName == "" {
		opts.DriverName = discovery.DriverName
	}
	if opts.NodeName == "" || opts.Sysfs == nil || opts.Writer == nil || opts.Links == nil || opts.CheckpointPath == "" || opts.CDIRoot == "" {
		return nil, errors.New("prepare: NodeName, Sysfs, Writer, Links, CheckpointPath and CDIRoot are required")
	}
	if opts.DevRoot == "" {
		opts.DevRoot = "/dev"
	}
	if opts.VFIOTimeout <= 0 {
		opts.VFIOTimeout = 30 * time.Second
	}
	// Every PF-side set rides out VF resets and is verified by reading it
	// back (vflink.Retrying).
	opts.Links = vflink.Retrying{Links: opts.Links, Clock: opts.Clock, Timeout: opts.LinkRetryTimeout}
	if opts.CheckVF == nil {
		h := opts.Sysfs
		opts.CheckVF = func(bdf string) error { return discovery.CheckVF(h, bdf, discovery.Policy{}, nil) }
	}
	if err := os.MkdirAll(filepath.Dir(opts.CheckpointPath), 0o750); err != nil {
		return nil, fmt.Errorf("create the checkpoint directory: %w", err)
	}
	if opts.LockPath == "" {
		opts.LockPath = filepath.Join(filepath.Dir(opts.CheckpointPath), LockFileName)
	}
	if opts.StaleTempAge <= 0 {
		opts.StaleTempAge = DefaultStaleTempAge
	}
	store := checkpoint.Store{Path: opts.CheckpointPath}
	removeStaleTemps(opts)
	// Read once at start-up so a corrupt checkpoint stops the driver
	// instead of failing every call.
	cp, err := store.Load()
	if err != nil {
		return nil, err
	}
	s := &State{
		opts:  opts,
		store: store,
		lock:  nodelock.New(opts.LockPath),
		cdi:   CDIWriter{Root: opts.CDIRoot, DevRoot: opts.DevRoot, Hook: opts.Hook},
		binder: pcibind.Binder{Sysfs: opts.Sysfs, Writer: opts.Writer, DevRoot: opts.DevRoot, NodeName: opts.NodeName,
			Hook: opts.Hook},
		cp:     cp,
		warned: map[string]bool{},
	}
	return s, nil
}

// DefaultStaleTempAge is Options.StaleTempAge's default. A write takes
// milliseconds; minutes leave a wide margin for a stalled disk.
const DefaultStaleTempAge = 5 * time.Minute

// MetadataDirName is where the kubeletplugin helper writes device metadata
// in the plugin data directory (the checkpoint's directory).
const MetadataDirName = "dra-device-metadata"

// removeStaleTemps removes what a crash inside a file write left: our
// checkpoint and CDI temporaries, and the kubeletplugin helper's metadata
// ones (its metadata files and their CDI specs). Only our own names, only
// old ones.
func removeStaleTemps(opts Options) {
	plugin := checkpoint.GlobEscape(filepath.Dir(opts.CheckpointPath))
	globs := []string{
		filepath.Join(plugin, checkpoint.TempGlob(filepath.Base(opts.CheckpointPath))),
		filepath.Join(plugin, MetadataDirName, "*", "*", checkpoint.TempGlob("metadata.json")),
		filepath.Join(checkpoint.GlobEscape(opts.CDIRoot), checkpoint.TempGlob(opts.DriverName+"_metadata_*.json")),
	}
	globs = append(globs, CDIWriter{Root: opts.CDIRoot}.tempGlobs()...)
	removed, err := checkpoint.RemoveStaleTemps(globs, opts.StaleTempAge)
	logger := klog.Background()
	for _, f := range removed {
		logger.Info("Removed a temporary file an interrupted write left behind", "file", f)
	}
	if err != nil {
		logger.Error(err, "Could not remove every stale temporary file; they are harmless, remove them by hand")
	}
}

// begin takes the node lock and reads the checkpoint another instance may
// have changed since this one last looked. The caller calls the returned
// function when the call is done.
func (s *State) begin(ctx context.Context) (func(), error) {
	held, err := s.lock.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	cp, err := s.store.Load()
	if err != nil {
		held.Release()
		return nil, err
	}
	s.mu.Lock()
	s.cp = cp
	s.mu.Unlock()
	return held.Release, nil
}

// Exclusive runs fn under the node lock with the checkpoint as it is now:
// no prepare or unprepare of this or the other driver instance runs until
// it returns, so what fn checks stays true while it acts (driver/vfcount
// changes a PF's VF count there).
func (s *State) Exclusive(ctx context.Context, fn func(cp *checkpoint.File) error) error {
	release, err := s.begin(ctx)
	if err != nil {
		return err
	}
	defer release()
	s.mu.Lock()
	cp := s.cp.Clone()
	s.mu.Unlock()
	return fn(cp)
}

// PreparedVFs maps the VFs the checkpoint holds to their claims
// ("namespace/name"), read without the lock (it may be stale).
func PreparedVFs(cp *checkpoint.File) map[string]string {
	out := map[string]string{}
	for _, c := range cp.Claims {
		for _, d := range c.Devices {
			out[d.BDF] = c.Namespace + "/" + c.Name
		}
	}
	return out
}

func (s *State) hook(step string) {
	if s.opts.Hook != nil {
		s.opts.Hook(step)
	}
}

// Owned reports whether vfnet holds the VF at bdf for some claim (it may
// have bound it to vfio-pci itself), according to the checkpoint file: the
// other driver instance of a rolling update may have prepared it.
func (s *State) Owned(bdf string) bool {
	return s.ownedSet()[bdf]
}

// fileKey identifies one version of the checkpoint file: every write
// renames a new file into place.
type fileKey struct {
	ino, size          uint64
	mtimeNs, ctimeNs   int64
	exists, statFailed bool
}

func statKey(path string) fileKey {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return fileKey{statFailed: !errors.Is(err, fs.ErrNotExist)}
	}
	return fileKey{ino: st.Ino, size: uint64(st.Size), mtimeNs: st.Mtim.Nano(), ctimeNs: st.Ctim.Nano(), exists: true}
}

// ownedSet is the set of VFs in the checkpoint file, reread when the file
// changed. Reads need no lock: the file is replaced atomically. When it
// cannot be read the last known set stays (a transient error must not make
// VFs in use look foreign).
func (s *State) ownedSet() map[string]bool {
	s.ownedMu.Lock()
	defer s.ownedMu.Unlock()
	key := statKey(s.store.Path)
	if s.owned != nil && key == s.ownedKey && !key.statFailed {
		return s.owned
	}
	cp, err := s.store.Load()
	if err != nil {
		klog.Background().Error(err, "Cannot read the checkpoint to tell which VFs vfnet holds; using the last known set")
		if s.owned == nil {
			return map[string]bool{}
		}
		return s.owned
	}
	set := map[string]bool{}
	for _, c := range cp.Claims {
		for _, d := range c.Devices {
			set[d.BDF] = true
		}
	}
	s.owned, s.ownedKey = set, key
	return set
}

// Snapshot returns the checkpoint as the file holds it now (for tests and
// diagnostics).
func (s *State) Snapshot() *checkpoint.File {
	cp, err := s.store.Load()
	if err != nil {
		klog.Background().Error(err, "Read checkpoint")
		return &checkpoint.File{Version: checkpoint.Version, Claims: map[types.UID]*checkpoint.Claim{}}
	}
	return cp
}

func (s *State) holderLocked(bdf string) (types.UID, *checkpoint.Claim, bool) {
	for uid, c := range s.cp.Claims {
		for _, d := range c.Devices {
			if d.BDF == bdf {
				return uid, c, true
			}
		}
	}
	return "", nil, false
}

// update changes the claim's entry (nil removes it) and writes the
// checkpoint; on a write error the in-memory copy is left as it was.
func (s *State) update(uid types.UID, c *checkpoint.Claim) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	next := s.cp.Clone()
	if c == nil {
		delete(next.Claims, uid)
	} else {
		cc := *c
		cc.Devices = slices.Clone(c.Devices)
		next.Claims[uid] = &cc
	}
	if err := s.store.Save(next); err != nil {
		return err
	}
	s.cp = next
	return nil
}

func (s *State) entry(uid types.UID) *checkpoint.Claim {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.cp.Claims[uid]
	if !ok {
		return nil
	}
	cc := *c
	cc.Devices = slices.Clone(c.Devices)
	return &cc
}

// vfsOf lists a checkpoint entry's VFs as "device=bdf" for the log.
func vfsOf(c *checkpoint.Claim) []string {
	if c == nil {
		return nil
	}
	out := make([]string, len(c.Devices))
	for i, d := range c.Devices {
		out[i] = d.Device + "=" + d.BDF
	}
	return out
}

// Prepare implements plugin.ClaimPreparer.
func (s *State) Prepare(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	done, err := s.begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("prepare: %w", err)
	}
	defer done()
	out := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	for _, claim := range claims {
		logger := klog.LoggerWithValues(klog.FromContext(ctx), "claim", klog.KObj(claim), "claimUID", claim.UID)
		cctx := klog.NewContext(ctx, logger)
		start := time.Now()
		devs, err := s.prepareClaim(cctx, claim)
		s.observePrepare(start, err)
		if err != nil {
			logger.Error(err, "Prepare failed")
			out[claim.UID] = kubeletplugin.PrepareResult{Err: err}
			continue
		}
		// One line per claim at the default verbosity: which VFs a VM got
		// and how long the host took, for an admin reading the driver log.
		logger.Info("Prepared claim", "vfs", vfsOf(s.entry(claim.UID)), "duration", time.Since(start))
		out[claim.UID] = kubeletplugin.PrepareResult{Devices: devs}
	}
	return out, nil
}

func (s *State) observePrepare(start time.Time, err error) {
	if s.opts.Observer != nil {
		s.opts.Observer.PrepareDone(time.Since(start), StepOf(err), err)
	}
}

func (s *State) observeUnprepare(start time.Time, err error) {
	if s.opts.Observer != nil {
		s.opts.Observer.UnprepareDone(time.Since(start), StepOf(err), err)
	}
}

// Unprepare implements plugin.ClaimPreparer.
func (s *State) Unprepare(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	done, err := s.begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("unprepare: %w", err)
	}
	defer done()
	out := make(map[types.UID]error, len(claims))
	for _, c := range claims {
		logger := klog.LoggerWithValues(klog.FromContext(ctx), "claim", c.NamespacedName, "claimUID", c.UID)
		cctx := klog.NewContext(ctx, logger)
		start := time.Now()
		entry := s.entry(c.UID)
		err := s.unprepareClaim(cctx, c)
		s.observeUnprepare(start, err)
		switch {
		case err != nil:
			logger.Error(err, "Unprepare failed")
		case entry != nil:
			logger.Info("Unprepared claim", "vfs", vfsOf(entry), "duration", time.Since(start))
		default:
			logger.V(2).Info("Unprepare: claim not prepared by this driver, nothing to undo")
		}
		out[c.UID] = err
	}
	if s.opts.AfterUnprepare != nil {
		s.opts.AfterUnprepare()
	}
	return out, nil
}

// plan is what prepare will do for one device, computed before the host is
// touched.
type plan struct {
	result resourceapi.DeviceRequestAllocationResult
	ref    vfRef
	config v1alpha1.VFConfig
	mac    net.HardwareAddr // nil: keep the VF's MAC
	// parkMAC: a failover VF for a migration target pod; it gets its MAC
	// only when it is attached after the migration.
	parkMAC bool
	// standby: a failover VF's standby plumbing (planStandby, standby.go).
	standby *checkpoint.Standby
}

// ourResults are the allocation results this driver must prepare.
func (s *State) ourResults(claim *resourceapi.ResourceClaim) ([]resourceapi.DeviceRequestAllocationResult, error) {
	if claim.Status.Allocation == nil {
		return nil, fmt.Errorf("claim %s/%s is not allocated", claim.Namespace, claim.Name)
	}
	var out []resourceapi.DeviceRequestAllocationResult
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver != s.opts.DriverName {
			continue
		}
		if r.Pool != s.opts.NodeName {
			return nil, fmt.Errorf("claim %s/%s: device %s is allocated from pool %q, but this is node %q", claim.Namespace, claim.Name, r.Device, r.Pool, s.opts.NodeName)
		}
		out = append(out, r)
	}
	return out, nil
}

// makePlans resolves devices, configs and MACs without touching the host.
func (s *State) makePlans(ctx context.Context, claim *resourceapi.ResourceClaim, results []resourceapi.DeviceRequestAllocationResult) ([]plan, error) {
	plans := make([]plan, 0, len(results))
	for _, r := range results {
		ref, err := s.locate(r.Device)
		if err != nil {
			return nil, fmt.Errorf("claim %s/%s request %q: %w", claim.Namespace, claim.Name, r.Request, err)
		}
		if ref.PFName == "" {
			return nil, fmt.Errorf("device %s (VF %s): its PF %s has no netdev, so VF settings cannot be applied; bind the PF to its network driver", r.Device, ref.Address, ref.PFAddress)
		}
		cfg, err := vfConfigForRequest(claim, s.opts.DriverName, r.Request)
		if err != nil {
			return nil, fmt.Errorf("device %s: %w", r.Device, err)
		}
		p := plan{result: r, ref: ref, config: cfg}
		var looked *maclookup.Result // the VMI interface, when read
		if cfg.MAC != nil {
			p.mac, _ = v1alpha1.ParseMAC(*cfg.MAC) // validated by vfConfigForRequest
		} else if s.opts.MACs != nil {
			res, found, err := s.opts.MACs.Find(ctx, claim, r.Request)
			if err != nil {
				return nil, fmt.Errorf("device %s: find the VM interface MAC: %w", r.Device, err)
			}
			if found {
				looked = &res
			}
			switch {
			case found && res.MAC != nil:
				p.mac = res.MAC
				klog.FromContext(ctx).V(4).Info("Using VM interface MAC", "device", r.Device, "vmi", res.VMI, "interface", res.Interface, "mac", res.MAC)
			case found && res.FromTemplate && !cfg.WantsFailover():
				// (A failover request without a MAC is refused below.)
				// Only a template claim can follow a live migration; a
				// named claim gets VFNetNotMigratable from the watcher.
				s.warnMACNotMigratable(ctx, claim, r, res)
			}
		}
		if cfg.WantsFailover() && p.mac == nil {
			return nil, failoverWithoutMAC(claim, r, s.opts.MACs != nil)
		}
		if cfg.WantsFailover() {
			if p.parkMAC, err = s.forMigrationTarget(ctx, claim, r, looked); err != nil {
				return nil, fmt.Errorf("device %s: %w", r.Device, err)
			}
		}
		if cfg.WantsFailover() {
			if p.standby, err = s.planStandby(ctx, claim, r, p.ref, p.mac, looked); err != nil {
				return nil, at(ErrStepPlan, err)
			}
		}
		plans = append(plans, p)
	}
	return plans, nil
}

// failoverWithoutMAC is the refusal of a failover request whose VF would
// keep its own MAC: the guest pairs the standby with the VF by MAC, so the
// MAC must be the same on the source and the target of a migration.
func failoverWithoutMAC(claim *resourceapi.ResourceClaim, r resourceapi.DeviceRequestAllocationResult, lookedUp bool) error {
	where := "no VM interface MAC lookup is configured"
	if lookedUp {
		where = "the VMI interface that uses the claim sets no spec.domain.devices.interfaces[].macAddress (or no VMI uses the claim yet)"
	}
	return fmt.Errorf("device %s: claim %s/%s request %q: VFConfig.failover is true but the VF has no fixed MAC: VFConfig.mac is unset and %s; set VFConfig.mac in the claim's (or class's) opaque config or the interface's macAddress, or remove failover: true",
		r.Device, claim.Namespace, claim.Name, r.Request, where)
}

// warnMACNotMigratable records, once per VMI and interface in this
// process, that the interface keeps no fixed MAC across a live migration.
// Prepare goes on: the VM works, only its migration would change the MAC.
func (s *State) warnMACNotMigratable(ctx context.Context, claim *resourceapi.ResourceClaim, r resourceapi.DeviceRequestAllocationResult, res maclookup.Result) {
	klog.FromContext(ctx).Info("vfnet interface has no fixed MAC and is not safely migratable", "vmi", res.VMI, "interface", res.Interface, "device", r.Device)
	if s.opts.Events == nil || res.Ref == nil {
		return
	}
	key := string(res.Ref.UID) + "/" + res.Interface
	s.mu.Lock()
	dup := s.warned[key]
	if !dup {
		if len(s.warned) >= maxWarned {
			clear(s.warned)
		}
		s.warned[key] = true
	}
	s.mu.Unlock()
	if dup {
		return
	}
	s.opts.Events.Eventf(res.Ref, corev1.EventTypeWarning, ReasonMACNotMigratable,
		"vfnet interface %q is not safely migratable: neither its macAddress nor VFConfig.mac in ResourceClaim %s/%s (request %q) is set, so VF %s keeps its own MAC and after a live migration the guest would see a different MAC; set spec.domain.devices.interfaces[].macAddress or VFConfig.mac so the VM keeps its MAC across live migration",
		res.Interface, claim.Namespace, claim.Name, r.Request, r.Device)
}

// vfRef locates one VF on the host.
type vfRef struct {
	Address   string
	PFAddress string
	PFName    string // the PF's netdev
	VFIndex   int
	Driver    string // bound now, "" when none
}

// pfNetDev is the PF's netdev as the kernel names it now: the PF may have
// been renamed since the device was recorded, and the VF settings go
// through the name. The recorded name is the fallback when the PF's PCI
// address no longer resolves to a netdev.
func (s *State) pfNetDev(ctx context.Context, d checkpoint.Device) string {
	if d.PFAddress == "" {
		return d.PFNetDev
	}
	name, err := s.opts.Sysfs.UplinkOf(d.PFAddress)
	if err != nil || name == "" {
		return d.PFNetDev
	}
	if name != d.PFNetDev {
		klog.FromContext(ctx).Info("PF netdev was renamed since prepare", "pf", d.PFAddress, "recorded", d.PFNetDev, "now", name)
	}
	return name
}

// locate finds the VF a device name stands for by reading just that VF and
// its PF: a full discovery pass reads every function of the host
// (BENCHMARKS.md: sysfs-discover), once per prepare.
func (s *State) locate(device string) (vfRef, error) {
	a, err := pciaddr.ParseDeviceName(device)
	if err != nil {
		return vfRef{}, err
	}
	bdf := a.String()
	gone := func(err error) error {
		return fmt.Errorf("device %s: no VF at %s on this node (PF removed or sriov_numvfs lowered?): %w", device, bdf, err)
	}
	vf, err := s.opts.Sysfs.Function(bdf)
	if err != nil {
		return vfRef{}, gone(err)
	}
	physfn, err := os.Readlink(s.opts.Sysfs.Path(sysfs.PCIDevicesDir + "/" + bdf + "/physfn"))
	if err != nil {
		return vfRef{}, fmt.Errorf("device %s: %s is not an SR-IOV VF (no physfn link): %w", device, bdf, err)
	}
	ref := vfRef{Address: bdf, PFAddress: filepath.Base(physfn), Driver: vf.Driver, VFIndex: -1}
	if ref.PFName, err = s.opts.Sysfs.UplinkOf(ref.PFAddress); err != nil {
		return vfRef{}, gone(err)
	}
	pfDir := s.opts.Sysfs.Path(sysfs.PCIDevicesDir + "/" + ref.PFAddress)
	ents, err := os.ReadDir(pfDir)
	if err != nil {
		return vfRef{}, gone(err)
	}
	for _, e := range ents {
		idx, ok := strings.CutPrefix(e.Name(), "virtfn")
		if !ok {
			continue
		}
		target, err := os.Readlink(filepath.Join(pfDir, e.Name()))
		if err != nil || filepath.Base(target) != bdf {
			continue
		}
		if ref.VFIndex, err = strconv.Atoi(idx); err != nil {
			return vfRef{}, fmt.Errorf("device %s: PF %s link %s: %w", device, ref.PFAddress, e.Name(), err)
		}
		return ref, nil
	}
	return vfRef{}, gone(fmt.Errorf("PF %s has no virtfn link to it", ref.PFAddress))
}

func describe(d checkpoint.Device) string {
	return fmt.Sprintf("VF %s (%s, %s vf %d)", d.BDF, d.Device, d.PFNetDev, d.VFIndex)
}

// Error steps: the "step" label of the prepare and unprepare error counters
// (driver/metrics), from StepOf. A small fixed set: labels stay bounded.
const (
	ErrStepPlan          = "plan"           // allocation, VF lookup, VFConfig, VM MAC
	ErrStepRecord        = "record"         // reading the VF's original state, VF held by another claim
	ErrStepCheck         = "check"          // vfio-pci missing, VF not passable (IOMMU group, holders)
	ErrStepLink          = "link"           // VF settings through the PF
	ErrStepBind          = "bind"           // binding to vfio-pci
	ErrStepCDI           = "cdi"            // writing or removing the CDI spec
	ErrStepStatus        = "status"         // claim status.devices
	ErrStepCheckpoint    = "checkpoint"     // writing the checkpoint
	ErrStepRestoreLink   = "restore-link"   // unprepare: original VF settings
	ErrStepRestoreDriver = "restore-driver" // unprepare: original driver
	ErrStepOther         = "other"
)

// stepFailure tags an error with its step; the message is the error's own.
type stepFailure struct {
	step string
	err  error
}

func (f *stepFailure) Error() string { return f.err.Error() }
func (f *stepFailure) Unwrap() error { return f.err }

// at tags err with step (StepOf finds the outermost tag).
func at(step string, err error) error {
	if err == nil {
		return nil
	}
	return &stepFailure{step: step, err: err}
}

// StepOf returns the step a prepare or unprepare error happened at
// (ErrStep...), ErrStepOther when it is untagged, "" for nil.
func StepOf(err error) string {
	if err == nil {
		return ""
	}
	var f *stepFailure
	if errors.As(err, &f) {
		return f.step
	}
	return ErrStepOther
}

// stepError names the VF, the step and the cause.
func stepError(d checkpoint.Device, step string, err error) error {
	return fmt.Errorf("%s: %s: %w", describe(d), step, err)
}

func joinErrs(errs []error) string {
	parts := make([]string, len(errs))
	for i, e := range errs {
		parts[i] = e.Error()
	}
	return strings.Join(parts, "; ")
}
