// Package metrics holds vfnet-driver's Prometheus metrics, built with
// k8s.io/component-base/metrics on a registry of their own (no package
// globals), and served on the driver's health server at /metrics.
//
// Names are under vfnet_driver_. Where dranet (kubernetes-sigs/dranet) has
// a metric for the same thing, the rest of the name is dranet's, so
// dashboards carry over: dra_plugin_requests_total,
// dra_plugin_requests_latency_seconds, published_devices_total,
// last_published_time_seconds.
//
// Device counts and PF health are read from the driver's state at scrape
// time (a collector, not gauges kept in sync), so they are never stale: the
// claim counts are the checkpoint file as it is at that moment.
package metrics

import (
	"cmp"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus/collectors"
	k8smetrics "k8s.io/component-base/metrics"

	"github.com/vfnet-io/vfnet/driver/checkpoint"
	"github.com/vfnet-io/vfnet/driver/discovery"
	"github.com/vfnet-io/vfnet/driver/health"
)

const (
	namespace = "vfnet"
	subsystem = "driver"
)

// Results: the result label of duration histograms.
const (
	ResultSuccess = "success"
	ResultError   = "error"
)

// DRA plugin methods (the method label of the request metrics).
const (
	MethodPrepare   = "PrepareResourceClaims"
	MethodUnprepare = "UnprepareResourceClaims"
)

// ClaimDevice is one VF held by a claim in the checkpoint.
type ClaimDevice struct {
	// Device is the DRA device name; PFAddress the parent PF's BDF.
	Device, PFAddress string
	// Phase is the claim's: only PhasePrepared counts as prepared; the
	// others are a prepare or unprepare under way, or one interrupted
	// (the kubelet retries it, or a rollback failed).
	Phase checkpoint.Phase
}

// ClaimDevices lists every device of the checkpoint's claims with its
// claim's phase.
func ClaimDevices(cp *checkpoint.File) []ClaimDevice {
	var out []ClaimDevice
	for _, c := range cp.Claims {
		for _, d := range c.Devices {
			out = append(out, ClaimDevice{Device: d.Device, PFAddress: d.PFAddress, Phase: c.Phase})
		}
	}
	return out
}

// State gives the collector the driver's current state; each function may
// be nil.
type State struct {
	// Published returns the devices in the ResourceSlices.
	Published func() []discovery.Device
	// Claimed returns the devices of the claims in the checkpoint, in any
	// phase.
	Claimed func() []ClaimDevice
	// PFs returns the health of the PFs whose VFs are offered.
	PFs func() []health.PFHealth
	// Tainted returns the number of published devices carrying the
	// vfnet.io/pf-unhealthy taint, by PF address.
	Tainted func() map[string]int
}

// Metrics is the driver's metrics registry. A nil *Metrics records nothing.
type Metrics struct {
	registry k8smetrics.KubeRegistry

	prepareDuration   *k8smetrics.HistogramVec
	unprepareDuration *k8smetrics.HistogramVec
	prepareErrors     *k8smetrics.CounterVec
	unprepareErrors   *k8smetrics.CounterVec
	requests          *k8smetrics.CounterVec
	requestLatency    *k8smetrics.HistogramVec
	lastPublished     *k8smetrics.Gauge
	publishes         *k8smetrics.Counter
	attachDuration    *k8smetrics.HistogramVec
}

// New returns the registry with every metric registered; state feeds the
// scrape-time collector.
func New(state State) *Metrics {
	// A prepare takes tens of milliseconds (netlink, a driver bind) up to
	// the 30 s vfio-pci wait; an attach after a migration waits for the
	// launcher for up to minutes.
	prepareBuckets := []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}
	attachBuckets := []float64{.01, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300}
	m := &Metrics{registry: k8smetrics.NewKubeRegistry()}
	m.prepareDuration = k8smetrics.NewHistogramVec(&k8smetrics.HistogramOpts{
		Namespace: namespace, Subsystem: subsystem, Name: "prepare_duration_seconds",
		Help:    "Time to prepare one ResourceClaim (all its VFs), by result.",
		Buckets: prepareBuckets, StabilityLevel: k8smetrics.ALPHA,
	}, []string{"result"})
	m.unprepareDuration = k8smetrics.NewHistogramVec(&k8smetrics.HistogramOpts{
		Namespace: namespace, Subsystem: subsystem, Name: "unprepare_duration_seconds",
		Help:    "Time to unprepare one ResourceClaim (all its VFs), by result.",
		Buckets: prepareBuckets, StabilityLevel: k8smetrics.ALPHA,
	}, []string{"result"})
	m.prepareErrors = k8smetrics.NewCounterVec(&k8smetrics.CounterOpts{
		Namespace: namespace, Subsystem: subsystem, Name: "prepare_errors_total",
		Help:           "Failed claim prepares, by the step that failed (plan, record, check, link, bind, cdi, status, checkpoint, other).",
		StabilityLevel: k8smetrics.ALPHA,
	}, []string{"step"})
	m.unprepareErrors = k8smetrics.NewCounterVec(&k8smetrics.CounterOpts{
		Namespace: namespace, Subsystem: subsystem, Name: "unprepare_errors_total",
		Help:           "Failed claim unprepares, by the step that failed (cdi, restore-link, restore-driver, checkpoint, other).",
		StabilityLevel: k8smetrics.ALPHA,
	}, []string{"step"})
	m.requests = k8smetrics.NewCounterVec(&k8smetrics.CounterOpts{
		Namespace: namespace, Subsystem: subsystem, Name: "dra_plugin_requests_total",
		Help:           "DRA kubelet plugin calls, by method and status (success: every claim of the call succeeded).",
		StabilityLevel: k8smetrics.ALPHA,
	}, []string{"method", "status"})
	m.requestLatency = k8smetrics.NewHistogramVec(&k8smetrics.HistogramOpts{
		Namespace: namespace, Subsystem: subsystem, Name: "dra_plugin_requests_latency_seconds",
		Help:    "DRA kubelet plugin call latency, by method.",
		Buckets: prepareBuckets, StabilityLevel: k8smetrics.ALPHA,
	}, []string{"method"})
	m.lastPublished = k8smetrics.NewGauge(&k8smetrics.GaugeOpts{
		Namespace: namespace, Subsystem: subsystem, Name: "last_published_time_seconds",
		Help:           "Unix time the driver last published a changed set of ResourceSlices (handed to the kubelet plugin helper, which writes them to the API server).",
		StabilityLevel: k8smetrics.ALPHA,
	})
	m.publishes = k8smetrics.NewCounter(&k8smetrics.CounterOpts{
		Namespace: namespace, Subsystem: subsystem, Name: "publishes_total",
		Help:           "ResourceSlice publications (each a changed device set, attribute or taint).",
		StabilityLevel: k8smetrics.ALPHA,
	})
	m.attachDuration = k8smetrics.NewHistogramVec(&k8smetrics.HistogramOpts{
		Namespace: namespace, Subsystem: subsystem, Name: "migration_attach_duration_seconds",
		Help:    "Time from seeing a finished live migration to the VFs being attached to the domain, by side (target: completed, source: failed or aborted) and result.",
		Buckets: attachBuckets, StabilityLevel: k8smetrics.ALPHA,
	}, []string{"side", "result"})
	m.registry.MustRegister(m.prepareDuration, m.unprepareDuration, m.prepareErrors, m.unprepareErrors,
		m.requests, m.requestLatency, m.lastPublished, m.publishes, m.attachDuration)
	m.registry.CustomMustRegister(newStateCollector(state))
	// Process and Go runtime metrics (RSS, heap, goroutines) of the driver.
	m.registry.RawMustRegister(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), collectors.NewGoCollector())
	return m
}

// Handler serves the registry in the Prometheus text format.
func (m *Metrics) Handler() http.Handler {
	return k8smetrics.HandlerFor(m.registry, k8smetrics.HandlerOpts{})
}

// Registry is the underlying registry (tests gather from it).
func (m *Metrics) Registry() k8smetrics.KubeRegistry { return m.registry }

func result(err error) string {
	if err != nil {
		return ResultError
	}
	return ResultSuccess
}

// PrepareDone implements prepare.Observer.
func (m *Metrics) PrepareDone(d time.Duration, step string, err error) {
	if m == nil {
		return
	}
	m.prepareDuration.WithLabelValues(result(err)).Observe(d.Seconds())
	if err != nil {
		m.prepareErrors.WithLabelValues(cmp.Or(step, "other")).Inc()
	}
}

// UnprepareDone implements prepare.Observer.
func (m *Metrics) UnprepareDone(d time.Duration, step string, err error) {
	if m == nil {
		return
	}
	m.unprepareDuration.WithLabelValues(result(err)).Observe(d.Seconds())
	if err != nil {
		m.unprepareErrors.WithLabelValues(cmp.Or(step, "other")).Inc()
	}
}

// RequestDone records one DRA plugin call; failed is whether any claim of
// the call (or the call itself) failed.
func (m *Metrics) RequestDone(method string, d time.Duration, failed bool) {
	if m == nil {
		return
	}
	status := "success"
	if failed {
		status = "failed"
	}
	m.requests.WithLabelValues(method, status).Inc()
	m.requestLatency.WithLabelValues(method).Observe(d.Seconds())
}

// Published records a successful ResourceSlice publication at t.
func (m *Metrics) Published(t time.Time) {
	if m == nil {
		return
	}
	m.lastPublished.Set(float64(t.UnixNano()) / 1e9)
	m.publishes.Inc()
}

// AttachDone records one post-migration attach (side "target" or "source").
func (m *Metrics) AttachDone(side string, d time.Duration, err error) {
	if m == nil {
		return
	}
	m.attachDuration.WithLabelValues(side, result(err)).Observe(d.Seconds())
}

// stateCollector reports device counts and PF health at scrape time.
type stateCollector struct {
	k8smetrics.BaseStableCollector
	state State

	published, prepared, pending, pfHealth, tainted *k8smetrics.Desc
}

func newStateCollector(state State) *stateCollector {
	desc := func(name, help string, labels ...string) *k8smetrics.Desc {
		return k8smetrics.NewDesc(k8smetrics.BuildFQName(namespace, subsystem, name), help, labels, nil, k8smetrics.ALPHA, "")
	}
	return &stateCollector{
		state:     state,
		published: desc("published_devices_total", "VFs in the driver's ResourceSlices, by network and PF (PCI address).", "network", "pf"),
		prepared:  desc("prepared_devices", "VFs prepared for claims (the claim's prepare finished), by network and PF (PCI address).", "network", "pf"),
		pending:   desc("pending_devices", "VFs of claims whose prepare or unprepare is under way or was interrupted, by network, PF (PCI address) and phase (preparing, unpreparing); one that stays is a claim the kubelet keeps retrying or a rollback that failed (see the driver log).", "network", "pf", "phase"),
		pfHealth:  desc("pf_health", "1 for the current health state of each PF whose VFs are offered (healthy, link-down, gone), 0 for the others.", "pf", "pf_name", "network", "state"),
		tainted:   desc("tainted_devices", "Published VFs carrying the vfnet.io/pf-unhealthy NoSchedule taint, by PF (PCI address).", "pf"),
	}
}

func (c *stateCollector) DescribeWithStability(ch chan<- *k8smetrics.Desc) {
	ch <- c.published
	ch <- c.prepared
	ch <- c.pending
	ch <- c.pfHealth
	ch <- c.tainted
}

type netPF struct{ network, pf string }

type netPhase struct {
	netPF
	phase string
}

func (c *stateCollector) CollectWithStability(ch chan<- k8smetrics.Metric) {
	var published []discovery.Device
	if c.state.Published != nil {
		published = c.state.Published()
	}
	network := make(map[string]string, len(published))
	counts := map[netPF]int{}
	for _, d := range published {
		network[d.Name] = d.Network
		counts[netPF{d.Network, d.PFAddress}]++
	}
	for k, n := range counts {
		ch <- k8smetrics.NewLazyConstMetric(c.published, k8smetrics.GaugeValue, float64(n), k.network, k.pf)
	}
	if c.state.Claimed != nil {
		prepared := map[netPF]int{}
		pending := map[netPhase]int{}
		for _, d := range c.state.Claimed() {
			k := netPF{network[d.Device], d.PFAddress}
			if d.Phase == checkpoint.PhasePrepared {
				prepared[k]++
			} else {
				pending[netPhase{k, strings.ToLower(string(d.Phase))}]++
			}
		}
		for k, n := range prepared {
			ch <- k8smetrics.NewLazyConstMetric(c.prepared, k8smetrics.GaugeValue, float64(n), k.network, k.pf)
		}
		for k, n := range pending {
			ch <- k8smetrics.NewLazyConstMetric(c.pending, k8smetrics.GaugeValue, float64(n), k.network, k.pf, k.phase)
		}
	}
	if c.state.PFs != nil {
		for _, p := range c.state.PFs() {
			for _, s := range health.PFStates() {
				v := 0.0
				if s == p.State {
					v = 1
				}
				ch <- k8smetrics.NewLazyConstMetric(c.pfHealth, k8smetrics.GaugeValue, v, p.Address, p.Name, p.Network, s)
			}
		}
	}
	if c.state.Tainted != nil {
		for pf, n := range c.state.Tainted() {
			ch <- k8smetrics.NewLazyConstMetric(c.tainted, k8smetrics.GaugeValue, float64(n), pf)
		}
	}
}
