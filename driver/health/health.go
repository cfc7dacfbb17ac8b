// Package health tracks the health of the VFs vfnet-driver offers and
// streams it to the kubelet through kubeletplugin's WatchHealthStatus.
//
// A VF is Unhealthy when its PF is gone from the host, the VF itself is gone
// (sriov_numvfs lowered), the PF's netdev cannot be found by the VF link
// layer (Options.Resolve: its settings could not be changed), or the PF's
// link is down; otherwise Healthy. A
// device once reported stays in the reports (Unhealthy when gone), because
// a pod may still hold it while it has vanished from the ResourceSlices.
package health

import (
	"context"
	"maps"
	"slices"
	"sync"
	"time"

	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"

	"github.com/vfnet-io/vfnet/driver/discovery"
	"github.com/vfnet-io/vfnet/driver/kernel/sysfs"
)

// DefaultResendInterval re-sends an unchanged report before the kubelet's
// 30 s lease expires.
const DefaultResendInterval = 25 * time.Second

// Options configures a Monitor.
type Options struct {
	// PoolName is the pool the devices are published in (the node name).
	PoolName string
	// ResendInterval defaults to DefaultResendInterval.
	ResendInterval time.Duration
	// Now defaults to time.Now.
	Now func() time.Time
	// Resolve looks a PF netdev up through the VF link layer
	// (vflink.Links.Resolve); nil: not checked.
	Resolve func(netdev string) error
	// OnPFChange, if set, is called (outside the monitor's lock) after an
	// Observe in which some PF changed state, with the addresses of those
	// PFs, sorted: the slices loop rereads them and republishes with or
	// without taints.
	OnPFChange func(pfs []string)
}

// PF health states: the state label of vfnet_driver_pf_health and the
// reason a PF's VFs are published with a taint.
const (
	PFHealthy  = "healthy"
	PFLinkDown = "link-down"
	PFGone     = "gone"
)

// PFStates lists the PF health states (a fresh slice each call).
func PFStates() []string { return []string{PFHealthy, PFLinkDown, PFGone} }

// PFState classifies a PF found on the host.
func PFState(pf *sysfs.PF) string {
	if linkDown[pf.OperState] {
		return PFLinkDown
	}
	return PFHealthy
}

// PFHealth is the health of one PF whose VFs were offered.
type PFHealth struct {
	// Address is the PF's BDF, Name its netdev (the last one seen),
	// Network the physical network its VFs are offered on.
	Address, Name, Network string
	State                  string
}

type entry struct {
	pfAddress string
	vfAddress string
	health    kubeletplugin.HealthStatus
	message   string
	updated   time.Time
}

// Monitor holds the latest health of every known device.
type Monitor struct {
	opts Options

	mu      sync.Mutex
	devices map[string]*entry
	pfs     map[string]*PFHealth // by PF address
	changed chan struct{}        // closed and replaced on every change
}

// NewMonitor returns a Monitor without devices.
func NewMonitor(opts Options) *Monitor {
	if opts.ResendInterval <= 0 {
		opts.ResendInterval = DefaultResendInterval
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &Monitor{opts: opts, devices: map[string]*entry{}, pfs: map[string]*PFHealth{}, changed: make(chan struct{})}
}

// linkDown lists operstate values (Documentation/networking/operstates.rst)
// that mean the PF cannot carry traffic. "unknown" is not among them: some
// drivers never set operstate.
var linkDown = map[string]bool{"down": true, "lowerlayerdown": true, "notpresent": true}

// Observe updates health from a fresh host model. offered are the devices
// currently offered; devices seen before keep being tracked.
func (m *Monitor) Observe(pfs []sysfs.PF, offered []discovery.Device) {
	if changed := m.observe(pfs, offered); len(changed) > 0 && m.opts.OnPFChange != nil {
		m.opts.OnPFChange(changed)
	}
}

// observe updates health and returns the PFs that changed state, sorted.
func (m *Monitor) observe(pfs []sysfs.PF, offered []discovery.Device) (pfChanged []string) {
	type vfInfo struct {
		pf         *sysfs.PF
		vfs        map[string]bool
		unresolved string // why the link layer cannot use the PF netdev
	}
	byPF := make(map[string]vfInfo, len(pfs))
	for i := range pfs {
		info := vfInfo{pf: &pfs[i], vfs: make(map[string]bool, len(pfs[i].VFs))}
		for _, vf := range pfs[i].VFs {
			info.vfs[vf.Address] = true
		}
		byPF[pfs[i].Address] = info
	}
	now := m.opts.Now()
	if m.opts.Resolve != nil {
		// Once per PF, and before taking the lock: it is a netlink call.
		for addr, info := range byPF {
			if nd := info.pf.Uplink(); nd != "" {
				if err := m.opts.Resolve(nd); err != nil {
					info.unresolved = "PF " + addr + " netdev " + nd + " cannot be used: " + err.Error()
					byPF[addr] = info
				}
			}
		}
	}

	m.mu.Lock()
	defer m.mu.Unlock()
	for _, d := range offered {
		if _, ok := m.devices[d.Name]; !ok {
			m.devices[d.Name] = &entry{pfAddress: d.PFAddress, vfAddress: d.Address}
		}
		p := m.pfs[d.PFAddress]
		if p == nil {
			p = &PFHealth{Address: d.PFAddress}
			m.pfs[d.PFAddress] = p
		}
		p.Network = d.Network
	}
	for addr, p := range m.pfs {
		state := PFGone
		if info, ok := byPF[addr]; ok {
			state = PFState(info.pf)
			if nd := info.pf.Uplink(); nd != "" {
				p.Name = nd
			}
		}
		if p.State != "" && p.State != state {
			pfChanged = append(pfChanged, addr)
		}
		p.State = state
	}
	slices.Sort(pfChanged)

	changed := false
	for _, e := range m.devices {
		status, msg := kubeletplugin.HealthStatusHealthy, ""
		info, ok := byPF[e.pfAddress]
		switch {
		case !ok:
			status, msg = kubeletplugin.HealthStatusUnhealthy, "PF "+e.pfAddress+" is gone"
		case !info.vfs[e.vfAddress]:
			status, msg = kubeletplugin.HealthStatusUnhealthy, "VF "+e.vfAddress+" is gone (sriov_numvfs lowered?)"
		case info.unresolved != "":
			status, msg = kubeletplugin.HealthStatusUnhealthy, info.unresolved
		case linkDown[info.pf.OperState]:
			status, msg = kubeletplugin.HealthStatusUnhealthy, "PF "+e.pfAddress+" link is "+info.pf.OperState
		}
		e.updated = now
		if status != e.health || msg != e.message {
			e.health, e.message = status, msg
			changed = true
		}
	}
	if changed {
		close(m.changed)
		m.changed = make(chan struct{})
	}
	return pfChanged
}

// PFs returns the health of every PF whose VFs were ever offered, sorted by
// address.
func (m *Monitor) PFs() []PFHealth {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]PFHealth, 0, len(m.pfs))
	for _, a := range slices.Sorted(maps.Keys(m.pfs)) {
		out = append(out, *m.pfs[a])
	}
	return out
}

// Report returns the health of every known device, sorted by name.
func (m *Monitor) Report() kubeletplugin.DeviceHealthReport {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.reportLocked()
}

func (m *Monitor) reportLocked() kubeletplugin.DeviceHealthReport {
	names := slices.Sorted(maps.Keys(m.devices))
	report := kubeletplugin.DeviceHealthReport{Devices: make([]kubeletplugin.DeviceHealth, 0, len(names))}
	for _, n := range names {
		e := m.devices[n]
		report.Devices = append(report.Devices, kubeletplugin.DeviceHealth{
			PoolName:    m.opts.PoolName,
			DeviceName:  n,
			Health:      e.health,
			LastUpdated: e.updated,
			Message:     e.message,
		})
	}
	return report
}

// Watch implements DRAPlugin.WatchHealthStatus: a full report at once, then
// one on every change, and the current one again after ResendInterval of
// silence. It returns nil when ctx ends.
func (m *Monitor) Watch(ctx context.Context, reports chan<- kubeletplugin.DeviceHealthReport) error {
	logger := klog.FromContext(ctx)
	timer := time.NewTimer(m.opts.ResendInterval)
	defer timer.Stop()
	for {
		m.mu.Lock()
		report, changed := m.reportLocked(), m.changed
		m.mu.Unlock()
		select {
		case <-ctx.Done():
			return nil
		case reports <- report:
			logger.V(5).Info("Sent device health report", "devices", len(report.Devices))
		}
		timer.Reset(m.opts.ResendInterval)
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		case <-timer.C:
		}
	}
}

// Run re-reads the host every interval with probe and updates health, so a
// link going down is seen sooner than the ResourceSlice rescan. offered
// returns the currently offered devices.
func (m *Monitor) Run(ctx context.Context, interval time.Duration, probe func(context.Context) ([]sysfs.PF, error), offered func() []discovery.Device) {
	logger := klog.FromContext(ctx)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			pfs, err := probe(ctx)
			if err != nil {
				logger.Error(err, "Health probe failed, keeping the last health")
				continue
			}
			m.Observe(pfs, offered())
		}
	}
}
