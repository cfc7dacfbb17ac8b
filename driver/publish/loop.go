package publish

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"

	"github.com/vfnet-io/vfnet/driver/discovery"
	"github.com/vfnet-io/vfnet/driver/health"
	"github.com/vfnet-io/vfnet/driver/kernel/sysfs"
	"github.com/vfnet-io/vfnet/driver/vfcount"
	"github.com/vfnet-io/vfnet/pkg/api/nodeconfig"
	"github.com/vfnet-io/vfnet/pkg/contract/pciaddr"
)

// Discoverer reads the host's SR-IOV model (sysfs.New(root) in production).
type Discoverer interface {
	Discover(ctx context.Context) ([]sysfs.PF, error)
}

// PFDiscoverer is a Discoverer that can also re-read one PF, so a host
// event that names a PF or one of its VFs costs a read of that PF only
// (sysfs.Host in production). PFOf maps a PCI function to its PF.
type PFDiscoverer interface {
	DiscoverPF(ctx context.Context, bdf string) (pf sysfs.PF, ok bool, err error)
}

// Publisher publishes ResourceSlices (kubeletplugin.Helper in production).
type Publisher interface {
	PublishResources(ctx context.Context, resources resourceslice.DriverResources) error
}

// LoopOptions are the dependencies of a Loop.
type LoopOptions struct {
	NodeName   string
	Discoverer Discoverer
	// LoadConfig reads the node configuration; nil means no configuration.
	// It is called on every scan, so an edited ConfigMap takes effect at the
	// next rescan without a restart.
	LoadConfig func() (*nodeconfig.Config, error)
	// Owned reports VFs vfnet bound to vfio-pci itself (see discovery.Options).
	Owned func(vfAddress string) bool
	// NoIOMMUMode and Holders feed discovery.Options (nil: off / unknown).
	NoIOMMUMode func() bool
	Holders     func(nodes []string) (map[string][]string, error)
	// Resolve feeds discovery.Options: PF netdevs the VF link layer cannot
	// find are not offered (nil: not checked).
	Resolve   func(netdev string) error
	Publisher Publisher
	// OnScan, if set, sees every successful scan (the health monitor).
	OnScan func(pfs []sysfs.PF, res discovery.Result)
	// OnPublish, if set, sees every successful publication (metrics).
	OnPublish func(t time.Time)
	// VFCount, if set, applies the configured VF counts (numVFs): every
	// scan plans, publishes the taints of due changes, then applies them.
	VFCount VFCounter
	// PendingInterval is how often to rescan while a VF count change is
	// due or blocked (0: the normal interval), so it is applied soon after
	// the claims in its way are gone.
	PendingInterval time.Duration
	// PublishedSlices reads this node's ResourceSlices of the driver back
	// from the API server (plugin.Plugin.PublishedSlices). Publishing only
	// hands the slices to the asynchronous ResourceSlice controller, so a
	// VF count change of a PF with VFs is made only once the slices read
	// back show every published VF of the PF with its count taint: until
	// then the scheduler may still place a claim on a VF about to go. nil:
	// such changes wait forever (nothing is ever written unconfirmed).
	PublishedSlices func(ctx context.Context) ([]resourceapi.ResourceSlice, error)
	// ReadBackTimeout bounds one PublishedSlices call (0:
	// DefaultReadBackTimeout): an API server that accepts the request and
	// never answers must not stop the rescan loop.
	ReadBackTimeout time.Duration
}

// DefaultReadBackTimeout is LoopOptions.ReadBackTimeout's default.
const DefaultReadBackTimeout = 10 * time.Second

// VFCounter is the part of vfcount.Reconciler the loop drives.
type VFCounter interface {
	Plan(ctx context.Context, cfg *nodeconfig.Config, pfs []sysfs.PF) []vfcount.Plan
	Apply(ctx context.Context, plans []vfcount.Plan) bool
	Waiting() bool
}

// Loop rescans the host and republishes only when the offered devices or
// their attributes changed.
type Loop struct {
	opts LoopOptions

	// mu serialises scans. published has its own lock so Published never
	// waits for a scan (the prepare path calls it, and a scan calls back into
	// the prepare path through Owned).
	mu        sync.Mutex
	pubMu     sync.RWMutex
	cfg       *nodeconfig.Config
	haveCfg   bool
	published []discovery.Device
	taints    Taints // of published, guarded by pubMu
	changing  Taints // VF count change taints of published, guarded by pubMu
	didPub    bool
	kick      chan struct{}
	// causes of the rescan Run owes, and its scope: the PFs TriggerPFs
	// named, or all (TriggerFor); guarded by causeMu.
	causeMu sync.Mutex
	causes  []string
	wantPFs map[string]bool
	wantAll bool
	// lastPFs is the host as the last scan read it; only, when not nil,
	// the PFs the scan in progress re-reads (both guarded by mu).
	lastPFs []sysfs.PF
	only    []string
	// emptied: PF -> the devices it had when a scan found it present but
	// without them, and when (guarded by mu). A hot-unplugged PF loses its
	// VFs first, then goes itself; a scan between the two must not make
	// its VFs vanish from the slices instead of staying tainted "gone".
	emptied   map[string]emptiedPF
	lastWhy   string
	lastSkip  []discovery.Skipped
	lastCfgEr string
	// awaitSaid: PF -> the last reason its change waits for the API server
	// that was logged, so it is logged when it changes, not every pass.
	awaitSaid map[string]string
}

// NewLoop returns a Loop; call Scan once at start-up, then Run.
func NewLoop(opts LoopOptions) *Loop {
	return &Loop{opts: opts, kick: make(chan struct{}, 1), awaitSaid: map[string]string{}}
}

// TriggerFor asks Run for a rescan now, for cause (a host event, a PF's
// health changed, an unprepare freed a VF); it never blocks. Triggers that
// arrive before Run gets to them make one rescan, logged with every cause.
func (l *Loop) TriggerFor(cause string) { l.trigger(cause, nil) }

// TriggerPFs asks Run for a rescan of the PFs at the addresses pfs only:
// a host event named them or their VFs. A full rescan asked meanwhile
// wins.
func (l *Loop) TriggerPFs(cause string, pfs []string) {
	if len(pfs) == 0 {
		pfs = []string{} // nothing named: still only the PFs, none of them
	}
	l.trigger(cause, pfs)
}

func (l *Loop) trigger(cause string, pfs []string) {
	l.causeMu.Lock()
	if len(l.causes) < maxCauses {
		l.causes = append(l.causes, cause)
	}
	if pfs == nil {
		l.wantAll = true
	} else {
		if l.wantPFs == nil {
			l.wantPFs = map[string]bool{}
		}
		for _, pf := range pfs {
			l.wantPFs[pf] = true
		}
	}
	l.causeMu.Unlock()
	select {
	case l.kick <- struct{}{}:
	default:
	}
}

// maxCauses bounds the causes one rescan logs.
const maxCauses = 8

// takeCauses returns the causes of the rescan owed and its scope: nil for
// every PF, else the PFs to re-read.
func (l *Loop) takeCauses() ([]string, []string) {
	l.causeMu.Lock()
	defer l.causeMu.Unlock()
	c, all, want := l.causes, l.wantAll, l.wantPFs
	l.causes, l.wantAll, l.wantPFs = nil, false, nil
	if all || want == nil {
		return c, nil
	}
	pfs := make([]string, 0, len(want))
	for pf := range want {
		pfs = append(pfs, pf)
	}
	slices.Sort(pfs)
	return c, pfs
}

// ScanPFs is Scan re-reading only the PFs at the addresses pfs (and
// keeping the rest of the host as the last scan read it). Without an
// earlier scan, or a Discoverer that can read one PF, it is Scan.
func (l *Loop) ScanPFs(ctx context.Context, pfs []string) (bool, error) {
	l.mu.Lock()
	l.only = pfs
	l.mu.Unlock()
	return l.Scan(ctx)
}

// Scan runs one discovery pass and publishes if anything changed. It
// returns whether it published. A configuration error is returned while no
// valid configuration was ever loaded (start-up must fail); later ones are
// logged and the last valid configuration stays in effect.
func (l *Loop) Scan(ctx context.Context) (bool, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	handed := l.changing // the count taints earlier passes handed over
	published, plans, err := l.scan(ctx)
	l.only = nil // a second pass below reads every PF
	if err != nil || l.opts.VFCount == nil {
		return published, err
	}
	// Make the due changes the API server shows tainted, then publish the
	// VFs as they are now.
	l.awaitTaints(ctx, plans, handed)
	if !l.opts.VFCount.Apply(ctx, plans) {
		return published, nil
	}
	again, _, err := l.scan(ctx)
	return published || again, err
}

func (l *Loop) scan(ctx context.Context) (bool, []vfcount.Plan, error) {
	logger := klog.FromContext(ctx)

	if l.opts.LoadConfig != nil {
		cfg, err := l.opts.LoadConfig()
		switch {
		case err != nil && !l.haveCfg:
			return false, nil, err
		case err != nil:
			if msg := err.Error(); msg != l.lastCfgEr {
				logger.Error(err, "Node configuration is invalid, keeping the previous one; fix the file")
				l.lastCfgEr = msg
			}
		default:
			l.cfg, l.haveCfg, l.lastCfgEr = cfg, true, ""
		}
	} else {
		l.haveCfg = true
	}

	dctx := ctx
	if l.didPub {
		// sysfs logs every unusable function on every pass; after the first
		// one that is noise every rescan interval (-v=2 shows it).
		dctx = klog.NewContext(ctx, logger.V(2))
	}
	pfs, err := l.discover(dctx)
	if err != nil {
		return false, nil, fmt.Errorf("discover SR-IOV devices: %w", err)
	}
	l.lastPFs = pfs
	dopts := discovery.Options{Owned: l.opts.Owned, Holders: l.opts.Holders, Resolve: l.opts.Resolve}
	if l.opts.NoIOMMUMode != nil {
		dopts.NoIOMMUMode = l.opts.NoIOMMUMode()
	}
	res, err := discovery.Build(pfs, l.cfg, dopts)
	if err != nil {
		if !l.didPub {
			return false, nil, err
		}
		// The configuration matches some new PF twice: keep what is published.
		logger.Error(err, "Node configuration is ambiguous for this host, keeping the published devices")
		return false, nil, nil
	}
	if l.opts.OnScan != nil {
		l.opts.OnScan(pfs, res)
	}
	var plans []vfcount.Plan
	changing := Taints{}
	if l.opts.VFCount != nil {
		plans = l.opts.VFCount.Plan(ctx, l.cfg, pfs)
		changing = vfcount.Taints(plans)
	}
	devices, taints := l.withUnhealthyPFs(pfs, res.Devices)
	if !slices.Equal(res.Skipped, l.lastSkip) {
		for _, s := range res.Skipped {
			logger.Info("Not offering device", "address", s.Address, "reason", s.Reason)
		}
		l.lastSkip = res.Skipped
	}
	if l.didPub && sameDevices(l.published, devices) && maps.Equal(l.taints, taints) && maps.Equal(l.changing, changing) {
		if v := logger.V(4); v.Enabled() {
			v.Info("Rescan changed nothing", "digest", Digest(DriverResourcesWith(l.opts.NodeName, l.published, l.taints, l.changing)))
		}
		return false, plans, nil
	}
	if res.Why != "" && res.Why != l.lastWhy {
		logger.Info(res.Why)
	}
	l.lastWhy = res.Why
	resources := DriverResourcesWith(l.opts.NodeName, devices, taints, changing)
	if err := l.opts.Publisher.PublishResources(ctx, resources); err != nil {
		return false, nil, fmt.Errorf("publish ResourceSlices: %w", err)
	}
	l.logTaintChanges(logger, devices, taints)
	logger.Info("Published ResourceSlices", "pool", l.opts.NodeName, "devices", len(devices),
		"tainted", len(taints), "countChange", len(changing), "slices", len(resources.Pools[l.opts.NodeName].Slices), "digest", Digest(resources))
	if l.opts.OnPublish != nil {
		l.opts.OnPublish(time.Now())
	}
	l.pubMu.Lock()
	l.published, l.taints, l.changing = devices, taints, changing
	l.pubMu.Unlock()
	l.didPub = true
	return true, plans, nil
}

// discover reads the host: every PF, or with l.only set and a last scan
// to start from, only those (a PF that fails to read makes it read all).
func (l *Loop) discover(ctx context.Context) ([]sysfs.PF, error) {
	one, ok := l.opts.Discoverer.(PFDiscoverer)
	if l.only == nil || l.lastPFs == nil || !ok {
		return l.opts.Discoverer.Discover(ctx)
	}
	fresh := map[string]sysfs.PF{}
	gone := map[string]bool{}
	for _, bdf := range l.only {
		pf, present, err := one.DiscoverPF(ctx, bdf)
		if err != nil {
			klog.FromContext(ctx).Info("Rereading one PF failed, rereading the host", "pf", bdf, "err", err)
			return l.opts.Discoverer.Discover(ctx)
		}
		if present {
			fresh[bdf] = pf
		} else {
			gone[bdf] = true
		}
	}
	out := make([]sysfs.PF, 0, len(l.lastPFs)+len(fresh))
	for _, pf := range l.lastPFs {
		if gone[pf.Address] {
			continue
		}
		if f, ok := fresh[pf.Address]; ok {
			pf = f
			delete(fresh, pf.Address)
		}
		out = append(out, pf)
	}
	for _, pf := range fresh { // a PF that was not there before
		out = append(out, pf)
	}
	slices.SortFunc(out, func(a, b sysfs.PF) int { return strings.Compare(a.Address, b.Address) })
	return out, nil
}

// Run rescans when TriggerFor asks, and every resync interval as the safety
// net for a missed event, until ctx ends. Every rescan logs its cause.
// Errors are logged, never fatal: a transient sysfs or API problem must not
// take offered VFs away.
func (l *Loop) Run(ctx context.Context, resync time.Duration) {
	logger := klog.FromContext(ctx)
	for {
		wait, why := resync, "resync"
		if p := l.opts.PendingInterval; l.opts.VFCount != nil && p > 0 && p < wait && l.opts.VFCount.Waiting() {
			wait, why = p, "VF count change pending"
		}
		t := time.NewTimer(wait)
		var only []string
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		case <-l.kick:
			t.Stop()
			var c []string
			if c, only = l.takeCauses(); len(c) > 0 {
				why = strings.Join(c, "; ")
			}
		}
		slog := logger.WithValues("cause", why)
		var err error
		if only != nil {
			slog.V(2).Info("Rescan", "pfs", only)
			_, err = l.ScanPFs(klog.NewContext(ctx, slog), only)
		} else {
			slog.V(2).Info("Rescan")
			_, err = l.Scan(klog.NewContext(ctx, slog))
		}
		if err != nil && !errors.Is(err, context.Canceled) {
			slog.Error(err, "Rescan failed, will retry", "resync", resync)
		}
	}
}

// awaitTaints marks every due change of a PF with VFs AwaitingTaints
// unless the ResourceSlices read back from the API server show each VF of
// the PF this loop published with the count taint. Taints first handed
// over in this pass are not read back: Apply waits a pass for them anyway.
func (l *Loop) awaitTaints(ctx context.Context, plans []vfcount.Plan, handed Taints) {
	logger := klog.FromContext(ctx)
	var (
		read    bool
		shown   []resourceapi.ResourceSlice
		readErr error
	)
	due := map[string]bool{}
	for i := range plans {
		p := &plans[i]
		if p.State != vfcount.Pending || p.Current == 0 {
			continue
		}
		due[p.PF] = true
		want := Taints(vfcount.Taints([]vfcount.Plan{*p}))
		var missing []string
		switch {
		case !handedOver(want, handed):
			p.AwaitingTaints = "its taints were handed to the ResourceSlice controller in this pass"
			continue // not worth a line: the next pass reads them back
		case l.opts.PublishedSlices == nil:
			p.AwaitingTaints = "this driver cannot read its ResourceSlices back (no PublishedSlices configured), so it never knows the taint is published"
		default:
			if !read {
				shown, readErr = l.readBack(ctx)
				read = true
			}
			if readErr != nil {
				p.AwaitingTaints = fmt.Sprintf("the published ResourceSlices cannot be read back from the API server (%v); the change is made once they show its taints", readErr)
			} else if missing = l.notShown(shown, p.PF, want); len(missing) > 0 {
				p.AwaitingTaints = fmt.Sprintf("waiting for the API server to show the taint %s on %d devices of PF %s (%s): the ResourceSlice controller has not written them yet",
					vfcount.TaintKey, len(missing), p.PF, strings.Join(missing, ", "))
			}
		}
		said := p.AwaitingTaints
		if said == "" {
			said = "shown"
		}
		if l.awaitSaid[p.PF] == said {
			continue
		}
		l.awaitSaid[p.PF] = said
		switch {
		case p.AwaitingTaints == "":
			logger.Info("The API server shows the VF count taint on every published VF of the PF; the change may go ahead", "pf", p.PF, "pfName", p.PFName,
				"current", p.Current, "desired", p.Desired)
		case readErr != nil:
			logger.Error(readErr, "VF count change waits: cannot read the published ResourceSlices back", "pf", p.PF, "pfName", p.PFName)
		default:
			logger.Info("VF count change waits for its taints in the API server", "pf", p.PF, "pfName", p.PFName, "notShown", len(missing), "reason", p.AwaitingTaints)
		}
	}
	for pf := range l.awaitSaid {
		if !due[pf] {
			delete(l.awaitSaid, pf)
		}
	}
}

// handedOver reports whether every taint of want was in an earlier
// publication.
func handedOver(want, handed Taints) bool {
	for name, v := range want {
		if hv, ok := handed[name]; !ok || hv != v {
			return false
		}
	}
	return true
}

// readBack calls PublishedSlices with the read-back timeout.
func (l *Loop) readBack(ctx context.Context) ([]resourceapi.ResourceSlice, error) {
	timeout := l.opts.ReadBackTimeout
	if timeout <= 0 {
		timeout = DefaultReadBackTimeout
	}
	rctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	ss, err := l.opts.PublishedSlices(rctx)
	switch {
	case err == nil, ctx.Err() != nil, apierrors.IsForbidden(err): // the last names its fix
		return ss, err
	case errors.Is(err, context.DeadlineExceeded):
		return nil, fmt.Errorf("no answer within %s: %w: check the API server's load and this node's connection to it", timeout, err)
	default:
		return nil, fmt.Errorf("%w: check that the API server is up and reachable from this node", err)
	}
}

// notShown returns, sorted, the devices of want (device -> count taint
// value) the slices read back do not show with that taint: offered in any
// slice of this node's pool without it, or published by this loop and in
// no slice. Every slice counts, whatever its pool generation: while the
// controller is still replacing an older one, that one may offer the
// device untainted.
func (l *Loop) notShown(ss []resourceapi.ResourceSlice, pf string, want Taints) []string {
	bad := map[string]bool{}
	for _, d := range l.published {
		if _, ok := want[d.Name]; ok && d.PFAddress == pf {
			bad[d.Name] = true // until a slice shows it
		}
	}
	seenBad := map[string]bool{}
	for i := range ss {
		if ss[i].Spec.Pool.Name != l.opts.NodeName {
			continue
		}
		for _, d := range ss[i].Spec.Devices {
			v, ok := want[d.Name]
			if !ok {
				continue
			}
			if !hasTaint(d, vfcount.TaintKey, v) {
				seenBad[d.Name] = true
			}
			bad[d.Name] = seenBad[d.Name]
		}
	}
	var out []string
	for name, b := range bad {
		if b {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

func hasTaint(d resourceapi.Device, key, value string) bool {
	return slices.ContainsFunc(d.Taints, func(t resourceapi.DeviceTaint) bool {
		return t.Key == key && t.Value == value && t.Effect == resourceapi.DeviceTaintEffectNoSchedule
	})
}

// emptiedPF is what a PF had before a scan found it without devices.
type emptiedPF struct {
	devices []discovery.Device
	at      time.Time
}

// unplugWindow is how long after a PF lost all its devices its vanishing
// still counts as one hot-unplug (the kernel removes the VFs, then the PF,
// within milliseconds; a scan may fall between).
const unplugWindow = 10 * time.Second

// withUnhealthyPFs adds the taints of devices whose PF's link is down and
// keeps publishing, tainted, the devices of PFs that vanished since they
// were published (or since, just before, they lost all their devices).
// The result stays in discovery order.
func (l *Loop) withUnhealthyPFs(pfs []sysfs.PF, found []discovery.Device) ([]discovery.Device, Taints) {
	taints := PFTaints(pfs, found)
	present := make(map[string]bool, len(pfs))
	for i := range pfs {
		present[pfs[i].Address] = true
	}
	has := map[string]bool{}
	for _, d := range found {
		has[d.PFAddress] = true
	}
	now := time.Now()
	byPF := map[string][]discovery.Device{}
	for _, d := range l.published {
		byPF[d.PFAddress] = append(byPF[d.PFAddress], d)
	}
	if l.emptied == nil {
		l.emptied = map[string]emptiedPF{}
	}
	for pf, devs := range byPF {
		if present[pf] && !has[pf] && !slices.ContainsFunc(devs, func(d discovery.Device) bool { return taints[d.Name] == health.PFGone }) {
			l.emptied[pf] = emptiedPF{devices: devs, at: now}
		}
	}
	var gone []discovery.Device
	for _, d := range l.published {
		if !present[d.PFAddress] {
			gone = append(gone, d)
			taints[d.Name] = health.PFGone
		}
	}
	for pf, e := range l.emptied {
		switch {
		case has[pf] || now.Sub(e.at) > unplugWindow:
			delete(l.emptied, pf)
		case !present[pf] && len(byPF[pf]) == 0:
			for _, d := range e.devices {
				gone = append(gone, d)
				taints[d.Name] = health.PFGone
			}
		}
	}
	if len(gone) == 0 {
		return found, taints
	}
	devices := append(slices.Clone(found), gone...)
	slices.SortStableFunc(devices, func(a, b discovery.Device) int {
		return cmp.Or(pciaddr.Compare(a.PFAddress, b.PFAddress), cmp.Compare(a.VFIndex, b.VFIndex))
	})
	return devices, taints
}

// logTaintChanges logs, per PF, when its VFs get or lose the taint.
func (l *Loop) logTaintChanges(logger klog.Logger, devices []discovery.Device, taints Taints) {
	type pfTaint struct{ name, reason string }
	byPF := func(devs []discovery.Device, t Taints) map[string]pfTaint {
		out := map[string]pfTaint{}
		for _, d := range devs {
			if r, ok := t[d.Name]; ok {
				out[d.PFAddress] = pfTaint{d.PFName, r}
			}
		}
		return out
	}
	before, after := byPF(l.published, l.taints), byPF(devices, taints)
	for pf, t := range after {
		if before[pf] != t {
			logger.Info("PF unhealthy: publishing its VFs with a NoSchedule taint; new claims get them only with a toleration",
				"pf", pf, "pfName", t.name, "taint", TaintKey+"="+t.reason+":NoSchedule")
		}
	}
	for pf, t := range before {
		if _, ok := after[pf]; !ok {
			logger.Info("PF healthy again: taint removed from its VFs", "pf", pf, "pfName", t.name)
		}
	}
}

// Tainted returns the number of published devices with the taint, by PF
// address.
func (l *Loop) Tainted() map[string]int {
	l.pubMu.RLock()
	defer l.pubMu.RUnlock()
	out := map[string]int{}
	for _, d := range l.published {
		if _, ok := l.taints[d.Name]; ok {
			out[d.PFAddress]++
		}
	}
	return out
}

// Published returns the devices last published.
func (l *Loop) Published() []discovery.Device {
	l.pubMu.RLock()
	defer l.pubMu.RUnlock()
	return slices.Clone(l.published)
}

// sameDevices compares what ends up in the slices; the bound driver is not
// published, so a VF moving to vfio-pci during prepare causes no churn.
func sameDevices(a, b []discovery.Device) bool {
	return slices.EqualFunc(a, b, func(x, y discovery.Device) bool {
		x.Driver, y.Driver = "", ""
		x.IOMMUGroup, y.IOMMUGroup = "", ""
		return x == y
	})
}
