// Package driver is vfnet-driver: one object that owns the parts of a node's
// DRA driver and wires them to each other. The parts live in the packages
// below this one: discovery and the publish loop (slices), the kubelet plugin
// (plugin), prepare and its checkpoint (prepare), VF counts (vfcount), PF
// health (health), metrics, and the live-migration re-attach (migration).
//
// What one part needs of another is a method of Driver, so that every edge
// between the parts shows here: prepare asks for the published devices, an
// unprepare and a PF change ask for a republish, the VF count reconciler
// borrows the prepare lock, metrics read the published and prepared devices.
// cmd/vfnet-driver parses flags, opens the host and runs a Driver.
package driver

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/record"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/vfnet-io/vfnet/driver/checkpoint"
	"github.com/vfnet-io/vfnet/driver/discovery"
	"github.com/vfnet-io/vfnet/driver/health"
	"github.com/vfnet-io/vfnet/driver/kernel/hostevents"
	"github.com/vfnet-io/vfnet/driver/kernel/sysfs"
	"github.com/vfnet-io/vfnet/driver/kernel/vfioholders"
	"github.com/vfnet-io/vfnet/driver/kernel/vflink"
	"github.com/vfnet-io/vfnet/driver/maclookup"
	"github.com/vfnet-io/vfnet/driver/metrics"
	"github.com/vfnet-io/vfnet/driver/migration"
	"github.com/vfnet-io/vfnet/driver/nodelock"
	"github.com/vfnet-io/vfnet/driver/plugin"
	"github.com/vfnet-io/vfnet/driver/prepare"
	"github.com/vfnet-io/vfnet/driver/publish"
	"github.com/vfnet-io/vfnet/driver/standby"
	"github.com/vfnet-io/vfnet/driver/vfcount"
	"github.com/vfnet-io/vfnet/pkg/api/nodeconfig"
)

// MigrationLockFileName is the lead lock (in the plugin directory) of the
// live-migration watcher: one instance per node runs it.
const MigrationLockFileName = "vfnet-migration.lock"

// Host is the kernel side the driver acts on: the real one, or a
// simulator's. Close releases it.
type Host struct {
	Sysfs   *sysfs.Host
	Writer  sysfs.Writer
	Links   vflink.Links
	DevRoot string
	// Events returns the sources of the host's change notifications
	// (kobject uevents, link notifications); link events are wanted only
	// for the netdevs watchLink accepts. nil: the driver only resyncs.
	Events func(watchLink func(netdev string) bool) []hostevents.Source
	Close  func()
}

// HostEvents is Host.Events of the real kernel: kobject uevents and
// rtnetlink link notifications, from sockets opened in the network
// namespace of the file netns (the host's, where the PFs are).
func HostEvents(netns string) func(func(string) bool) []hostevents.Source {
	return func(watchLink func(string) bool) []hostevents.Source {
		return []hostevents.Source{hostevents.UeventSource{Netns: netns}, hostevents.LinkSource{Netns: netns, Watch: watchLink}}
	}
}

// Config is what a Driver needs: the node, the host it acts on, the API
// server, the kubelet's directories and the intervals. cmd/vfnet-driver
// fills it from flags.
type Config struct {
	NodeName string
	Host     *Host
	Kube     kubernetes.Interface
	Dynamic  dynamic.Interface
	// ConfigPath is the node configuration file (NodeConfig), re-read on
	// every scan; empty: nothing is offered.
	ConfigPath string
	// ResyncInterval and HealthInterval are how often the publish loop and
	// the PF health monitor reread the host without being told to: the
	// safety net for a missed event (the host's events and the node
	// configuration file's changes trigger them at once).
	// VFCountRetryInterval paces a pending VF count change.
	ResyncInterval, HealthInterval, VFCountRetryInterval time.Duration
	// ClaimsListTimeout bounds one list of ResourceClaims for a VF count
	// change (vfcount.APIAllocated).
	ClaimsListTimeout time.Duration
	// RegistrarDir, PluginDir and CDIRoot are the kubelet's plugin
	// registration directory, the driver's data directory (socket,
	// checkpoint, metadata, locks) and the CDI spec directory.
	RegistrarDir, PluginDir, CDIRoot string
	// PodUID is the driver pod's UID (seamless rolling updates; may be empty).
	PodUID string
	// KubeletPodsDir and ProcRoot are the kubelet's pods directory and the
	// host's /proc (launcher sockets and QEMU for the migration re-attach;
	// who holds /dev/vfio group nodes open).
	KubeletPodsDir, ProcRoot string
	// BindingName is the binding plugin's name in the KubeVirt CR.
	BindingName string
	// Simulated: Host is a simulator's (no QEMU behind a launcher).
	Simulated bool
	// Standby is the failover standby plumbing (standby.go).
	Standby StandbyConfig
}

// Validate checks the settings that need neither the host nor the API
// server, and that the node configuration file reads: a broken file must
// stop a rollout, not publish nothing. Errors name the flag to fix.
func (c Config) Validate() error {
	if c.NodeName == "" {
		return errors.New("--node-name (or NODE_NAME) is required")
	}
	if c.ResyncInterval <= 0 || c.HealthInterval <= 0 || c.VFCountRetryInterval <= 0 || c.ClaimsListTimeout <= 0 {
		return errors.New("--resync-interval, --health-interval, --vf-count-retry-interval and --claims-list-timeout must be positive")
	}
	_, err := LoadNodeConfig(c.ConfigPath)
	return err
}

// Driver is one node's vfnet-driver. New checks its configuration; Run
// builds and starts the parts and returns when its context ends or a part
// fails for good. A Driver runs once.
type Driver struct {
	cfg     Config
	holders func([]string) (map[string][]string, error)
	monitor *health.Monitor
	metrics *metrics.Metrics
	state   *prepare.State
	counts  *vfcount.Reconciler
	loop    *publish.Loop
	// plugin is set by Run before the loop's first scan, the only caller
	// of the methods that use it.
	plugin *plugin.Plugin
	// lastScan is when the host was last read successfully (Unix ns).
	lastScan atomic.Int64
	// seen is the host as the last scan saw it, to tell which PF an
	// event is about.
	seen    atomic.Pointer[hostModel]
	started chan struct{}
	// nri and plumber make failover standbys (standby.go); nri is nil
	// when vfnet plumbs none.
	nri     *standby.NRI
	plumber standby.Netlink
}

// New checks cfg (Validate). Nothing runs and nothing is read from the
// host until Run.
func New(cfg Config) (*Driver, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Host == nil || cfg.Kube == nil || cfg.Dynamic == nil {
		return nil, errors.New("driver configuration: Host, Kube and Dynamic are required")
	}
	return &Driver{cfg: cfg, holders: GroupHolders(cfg.ProcRoot, cfg.Host.DevRoot), started: make(chan struct{})}, nil
}

// assemble builds the parts, each given the methods of d it depends on,
// and reads the prepare checkpoint. The publish loop exists before the
// kubelet plugin serves prepare calls, which ask it for its devices; it
// reaches the plugin (set by Run before its first scan) through publisher.
func (d *Driver) assemble(events record.EventRecorder) error {
	cfg := d.cfg
	d.monitor = health.NewMonitor(health.Options{PoolName: cfg.NodeName, Resolve: LinkResolver(cfg.Host.Links),
		// A PF's link went down or up, or it vanished: republish now with
		// or without the taint instead of at the next rescan.
		OnPFChange: d.republishForHealth})
	d.metrics = metrics.New(metrics.State{
		Published: d.publishedDevices,
		Claimed:   d.claimedDevices,
		PFs:       d.monitor.PFs,
		Tainted:   d.taintedDevices,
	})
	d.counts = vfcount.New(vfcount.Options{
		NodeName: cfg.NodeName, Sysfs: cfg.Host.Sysfs, Writer: cfg.Host.Writer, Events: events, Holders: d.holders,
		Prepared:  d.preparedVFs,
		Exclusive: d.withPrepareLock,
		Allocated: vfcount.APIAllocated(cfg.Kube, discovery.DriverName, cfg.NodeName, cfg.ClaimsListTimeout),
	})
	d.loop = publish.NewLoop(publish.LoopOptions{
		NodeName: cfg.NodeName, Discoverer: cfg.Host.Sysfs, Publisher: publisher{d}, Owned: d.owned,
		NoIOMMUMode: cfg.Host.Sysfs.NoIOMMUMode, Holders: d.holders, Resolve: LinkResolver(cfg.Host.Links),
		LoadConfig: func() (*nodeconfig.Config, error) { return LoadNodeConfig(cfg.ConfigPath) },
		OnScan:     d.scannedHost,
		OnPublish:  d.metrics.Published,
		VFCount:    d.counts, PendingInterval: cfg.VFCountRetryInterval,
		// A count change waits until the API server shows its taints.
		PublishedSlices: d.publishedSlices,
	})
	popts := prepare.Options{
		NodeName: cfg.NodeName, Sysfs: cfg.Host.Sysfs, Writer: cfg.Host.Writer, Links: cfg.Host.Links, DevRoot: cfg.Host.DevRoot,
		CheckpointPath: filepath.Join(cfg.PluginDir, checkpoint.FileName), CDIRoot: cfg.CDIRoot, Kube: cfg.Kube,
		MACs:      maclookup.Lookup{Kube: cfg.Kube, VMIs: maclookup.DynamicVMIGetter{Client: cfg.Dynamic}, BindingName: cfg.BindingName},
		Events:    events,
		CheckVF:   d.checkVF,
		Published: d.publishedDevices,
		Observer:  d.metrics,
		// A VF count change may have waited for this claim.
		AfterUnprepare: d.republishAfterUnprepare,
	}
	d.newStandby()
	if d.nri != nil {
		popts.StandbyBridge = d.standbyBridge
	}
	state, err := prepare.New(popts)
	if err != nil {
		return fmt.Errorf("load prepare state: %w", err)
	}
	d.state = state
	return nil
}

// Run reads the prepare checkpoint, registers with the kubelet, publishes
// the node's VFs, then runs the host's event sources, the publish loop, the
// health monitor and the migration re-attach until ctx ends (nil) or a part
// fails for good (its error).
func (d *Driver) Run(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	cfg := d.cfg
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	// One Event recorder for prepare (VFNetMACNotMigratable), VF counts and
	// migration.
	events, stopEvents := migration.NewRecorder(ctx, cfg.Kube, cfg.NodeName)
	defer stopEvents()
	if err := d.assemble(events); err != nil {
		return err
	}
	// A kill between recording and setting a failover VF's parked MAC is
	// finished here; the prepare calls and the watcher repair it too.
	if err := d.state.Converge(ctx); err != nil {
		logger.Error(err, "Failover VF MACs not as the checkpoint wants; the migration watcher retries")
	}
	// Before the kubelet plugin: a failover claim is refused until NRI
	// is connected.
	waitStandby := d.runStandby(ctx)
	defer func() { cancel(nil); waitStandby() }()
	p, err := plugin.Start(ctx, plugin.Options{
		NodeName: cfg.NodeName, KubeClient: cfg.Kube,
		RegistrarDir: cfg.RegistrarDir, PluginDir: cfg.PluginDir, CDIDir: cfg.CDIRoot, PodUID: cfg.PodUID,
		Preparer: d.state, Health: d.monitor,
		OnFatal:   func(err error) { cancel(err) },
		OnRequest: d.metrics.RequestDone,
	})
	if err != nil {
		return err
	}
	defer p.Stop()
	d.plugin = p
	// The first publish waits for the ResourceSlice informer to sync; a
	// SIGTERM meanwhile is a normal stop, not a failure.
	if _, err := d.loop.Scan(ctx); err != nil {
		if ctx.Err() != nil {
			return shutdownCause(ctx)
		}
		return err
	}
	d.scanned()
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel(nil)
	wg.Go(func() { d.loop.Run(ctx, cfg.ResyncInterval) })
	wg.Go(func() { d.runEvents(ctx) })
	wg.Go(func() { d.monitor.Run(ctx, cfg.HealthInterval, d.probePFs, d.loop.Published) })
	wg.Go(func() { d.runMigration(ctx, events) })
	logger.Info("vfnet-driver running", "node", cfg.NodeName, "config", cfg.ConfigPath, "resyncInterval", cfg.ResyncInterval, "simulated", cfg.Simulated)
	close(d.started)
	<-ctx.Done()
	return shutdownCause(ctx)
}

// Started is closed once Run has published and started every part.
func (d *Driver) Started() <-chan struct{} { return d.started }

// LastScan is when the host was last read successfully (zero before Run
// published once): /healthz reports a driver whose reads keep failing.
func (d *Driver) LastScan() time.Time {
	if n := d.lastScan.Load(); n != 0 {
		return time.Unix(0, n)
	}
	return time.Time{}
}

// MetricsHandler serves the driver's Prometheus metrics.
func (d *Driver) MetricsHandler() http.Handler { return d.metrics.Handler() }

func (d *Driver) scanned() { d.lastScan.Store(time.Now().UnixNano()) }

// probePFs is the health monitor's read of the host.
func (d *Driver) probePFs(ctx context.Context) ([]sysfs.PF, error) {
	// Quiet: the publish loop already reported unusable functions.
	pfs, err := d.cfg.Host.Sysfs.Discover(klog.NewContext(ctx, klog.FromContext(ctx).V(4)))
	if err == nil {
		d.scanned()
	}
	return pfs, err
}

// Event coalescing: a burst (one sriov_numvfs write brings hundreds of
// uevents over a second or more) makes one rescan once it has been quiet
// for eventQuiet, or eventMaxDelay after its first event at the latest, so
// the published slices follow a change well within a second. A source that
// fails is restarted after sourceRetry; the resync covers the gap.
const (
	eventQuiet    = 100 * time.Millisecond
	eventMaxDelay = 500 * time.Millisecond
	sourceRetry   = 30 * time.Second
)

// runEvents runs the host's event sources and the node configuration file's
// watch, and turns each burst of events into one rescan.
func (d *Driver) runEvents(ctx context.Context) {
	var sources []hostevents.Source
	if d.cfg.Host.Events != nil {
		sources = d.cfg.Host.Events(d.watchLink)
	}
	if d.cfg.ConfigPath != "" {
		sources = append(sources, hostevents.FileSource{Path: d.cfg.ConfigPath})
	}
	logger := klog.FromContext(ctx)
	if len(sources) == 0 {
		logger.Info("No host event sources: the host is reread only every resync interval", "resyncInterval", d.cfg.ResyncInterval)
		return
	}
	events := make(chan hostevents.Event, 256)
	var wg sync.WaitGroup
	defer wg.Wait()
	for _, src := range sources {
		wg.Go(func() { runSource(ctx, src, events, d.cfg.ResyncInterval) })
	}
	hostevents.Coalesce(ctx, events, eventQuiet, eventMaxDelay, func(batch []hostevents.Event) { d.rescanFor(ctx, batch) })
}

// runSource runs src until ctx ends, restarting it after a failure.
func runSource(ctx context.Context, src hostevents.Source, out chan<- hostevents.Event, resync time.Duration) {
	logger := klog.FromContext(ctx).WithValues("source", src.Name())
	logger.V(2).Info("Listening for host events")
	for {
		err := src.Run(ctx, out)
		if ctx.Err() != nil {
			return
		}
		logger.Error(err, "Host event source failed; changes it would report are seen at the next resync until it is back", "retryIn", sourceRetry, "resyncInterval", resync)
		select {
		case <-ctx.Done():
			return
		case <-time.After(sourceRetry):
		}
	}
}

// runMigration runs the live-migration re-attach while this instance holds
// the node's lead lock: during a rolling update two instances run, and two
// watchers would attach every migrated VF twice; the other waits and takes
// over when the holder stops or dies.
func (d *Driver) runMigration(ctx context.Context, events record.EventRecorder) {
	cfg := d.cfg
	err := nodelock.Lead(ctx, filepath.Join(cfg.PluginDir, MigrationLockFileName), "live-migration re-attach", func(ctx context.Context) error {
		return migration.Run(ctx, migration.Options{
			NodeName: cfg.NodeName, KubeletPodsDir: cfg.KubeletPodsDir, Simulate: cfg.Simulated, ProcRoot: cfg.ProcRoot,
			BindingName: cfg.BindingName, Kube: cfg.Kube, Dynamic: cfg.Dynamic, Recorder: events, OnAttach: d.metrics.AttachDone,
			Failover: d.failover(),
		})
	})
	if err != nil && ctx.Err() == nil {
		// Prepare and publishing do not depend on it: keep serving.
		klog.FromContext(ctx).Error(err, "Live-migration re-attach stopped; VMs migrating to this node will lack their VF until the driver restarts")
	}
}

// republishForHealth asks the publish loop to reread the PFs whose link
// went down or up, or which vanished, now: their VFs' taint changes.
func (d *Driver) republishForHealth(pfs []string) { d.loop.TriggerPFs("PF health changed", pfs) }

// republishAfterUnprepare asks for a scan now: a VF count change may have
// waited for the claim just unprepared.
func (d *Driver) republishAfterUnprepare() { d.loop.TriggerFor("claim unprepared") }

// hostModel maps what host events name to the PF they concern.
type hostModel struct {
	fnPF     map[string]string // PF or VF address -> PF address
	netdevPF map[string]string // PF uplink netdev -> PF address
}

// scannedHost sees every successful scan of the publish loop.
func (d *Driver) scannedHost(pfs []sysfs.PF, res discovery.Result) {
	m := &hostModel{fnPF: map[string]string{}, netdevPF: map[string]string{}}
	for _, pf := range pfs {
		m.fnPF[pf.Address] = pf.Address
		for _, vf := range pf.VFs {
			m.fnPF[vf.Address] = pf.Address
		}
		if up := pf.Uplink(); up != "" {
			m.netdevPF[up] = pf.Address
		}
	}
	d.seen.Store(m)
	d.monitor.Observe(pfs, res.Devices)
}

// watchLink says whether a netdev's link notifications matter: it is a PF
// the last scan saw.
func (d *Driver) watchLink(netdev string) bool {
	if m := d.seen.Load(); m != nil {
		_, ok := m.netdevPF[netdev]
		return ok
	}
	return false
}

// rescanFor asks the publish loop to reread what a burst of host events
// concerns: the PFs they name (a PF, one of its VFs, a netdev of either),
// or the whole host for what cannot be placed (the configuration file, a
// lost event, a function that is gone and was never seen). Events about
// virtual netdevs and about PCI devices that are not SR-IOV cost nothing.
func (d *Driver) rescanFor(ctx context.Context, batch []hostevents.Event) {
	cause := "host events: " + hostevents.Summary(batch)
	m := d.seen.Load()
	if m == nil {
		d.loop.TriggerFor(cause)
		return
	}
	pfs := map[string]bool{}
	for _, e := range batch {
		var pf string
		var place bool
		switch {
		case e.Kind == hostevents.Uevent && e.Subsystem == "pci":
			pf, place = d.pfOfFunction(m, e.Device)
		case e.Kind == hostevents.Uevent && e.Subsystem == "net":
			if e.Function == "" {
				continue // a virtual netdev: no PF
			}
			pf, place = d.pfOfFunction(m, e.Function)
		case e.Kind == hostevents.Link:
			pf, place = m.netdevPF[e.Device]
		}
		if !place {
			d.loop.TriggerFor(cause)
			return
		}
		if pf != "" {
			pfs[pf] = true
		}
	}
	if len(pfs) == 0 {
		klog.FromContext(ctx).V(4).Info("Host events about no SR-IOV function", "events", hostevents.Summary(batch))
		return
	}
	addrs := make([]string, 0, len(pfs))
	for pf := range pfs {
		addrs = append(addrs, pf)
	}
	d.loop.TriggerPFs(cause, addrs)
}

// pfOfFunction is the PF of the PCI function bdf: from the last scan, or
// from sysfs for a function that came since. place is false when that
// cannot tell (the function is gone and was never seen); pf is "" for a
// function that is not SR-IOV.
func (d *Driver) pfOfFunction(m *hostModel, bdf string) (pf string, place bool) {
	if pf, ok := m.fnPF[bdf]; ok {
		return pf, true
	}
	if pf, ok := d.cfg.Host.Sysfs.PFOf(bdf); ok {
		return pf, true
	}
	if _, err := os.Stat(d.cfg.Host.Sysfs.Path(sysfs.PCIDevicesDir + "/" + bdf)); err == nil {
		return "", true // there, and neither a PF nor a VF
	}
	return "", false
}

// publishedDevices is what the last publish offered (nil before it): the
// attributes prepare writes into the device metadata, and metrics.
func (d *Driver) publishedDevices() []discovery.Device { return d.loop.Published() }

// taintedDevices counts the published devices with a VF count taint per PF.
func (d *Driver) taintedDevices() map[string]int { return d.loop.Tainted() }

// preparedVFs maps each VF prepare holds to its claim.
func (d *Driver) preparedVFs() map[string]string { return prepare.PreparedVFs(d.state.Snapshot()) }

// owned reports a VF that vfnet itself bound to vfio-pci.
func (d *Driver) owned(vf string) bool { return d.state.Owned(vf) }

// claimedDevices is the prepared devices for metrics.
func (d *Driver) claimedDevices() []metrics.ClaimDevice {
	return metrics.ClaimDevices(d.state.Snapshot())
}

// withPrepareLock runs fn with the VFs prepare holds while no prepare or
// unprepare runs, so that a VF count change cannot race a prepare.
func (d *Driver) withPrepareLock(ctx context.Context, fn func(prepared map[string]string) error) error {
	return d.state.Exclusive(ctx, func(cp *checkpoint.File) error { return fn(prepare.PreparedVFs(cp)) })
}

// checkVF is prepare's last check of a VF before it changes anything.
func (d *Driver) checkVF(bdf string) error {
	pol := discovery.Policy{}
	// The publish loop reports a broken file; a VF is then checked with
	// the safe defaults.
	if cfg, err := LoadNodeConfig(d.cfg.ConfigPath); err == nil && cfg != nil {
		pol.AllowUnsafeNoIOMMU = cfg.AllowUnsafeNoIOMMU
	}
	return discovery.CheckVF(d.cfg.Host.Sysfs, bdf, pol, d.holders)
}

// publishedSlices reads this node's ResourceSlices back from the API server.
func (d *Driver) publishedSlices(ctx context.Context) ([]resourceapi.ResourceSlice, error) {
	return d.plugin.PublishedSlices(ctx)
}

// publisher hands the publish loop's slices to the kubelet plugin.
type publisher struct{ d *Driver }

func (p publisher) PublishResources(ctx context.Context, res resourceslice.DriverResources) error {
	return p.d.plugin.PublishResources(ctx, res)
}

// LoadNodeConfig reads the node configuration file; no file (empty path)
// is no configuration, under which nothing is offered.
func LoadNodeConfig(path string) (*nodeconfig.Config, error) {
	if path == "" {
		return nil, nil
	}
	return nodeconfig.Load(path)
}

// shutdownCause is nil for a stop (the parent context was canceled) and the
// fatal error that canceled ctx otherwise.
func shutdownCause(ctx context.Context) error {
	if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) {
		return cause
	}
	klog.FromContext(ctx).Info("Shutting down")
	return nil
}

// LinkResolver is discovery's Resolve over links: a PF netdev the VF link
// layer cannot find is not offered.
func LinkResolver(links vflink.Links) func(string) error {
	return func(netdev string) error {
		_, err := links.Resolve(netdev)
		return err
	}
}

// GroupHolders is discovery.Options.Holders over the host's /proc.
func GroupHolders(procRoot, devRoot string) func([]string) (map[string][]string, error) {
	sc := vfioholders.Scanner{ProcRoot: procRoot, DevRoot: devRoot}
	return func(nodes []string) (map[string][]string, error) {
		got, err := sc.Holders(nodes)
		out := make(map[string][]string, len(got))
		for n, hs := range got {
			for _, h := range hs {
				out[n] = append(out[n], h.String())
			}
		}
		return out, err
	}
}
