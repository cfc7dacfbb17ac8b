package metrics_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/vfnet-io/vfnet/driver/checkpoint"
	"github.com/vfnet-io/vfnet/driver/discovery"
	"github.com/vfnet-io/vfnet/driver/health"
	"github.com/vfnet-io/vfnet/driver/metrics"
	"github.com/vfnet-io/vfnet/test/lib/scrape"
)

func TestServedMetrics(t *testing.T) {
	t.Parallel()
	published := []discovery.Device{
		{Name: "vf-0000-3b-02-0", PFAddress: "0000:3b:00.0", Network: "physnet-a"},
		{Name: "vf-0000-3b-02-1", PFAddress: "0000:3b:00.0", Network: "physnet-a"},
		{Name: "vf-0000-5e-02-0", PFAddress: "0000:5e:00.0", Network: "physnet-b"},
	}
	m := metrics.New(metrics.State{
		Published: func() []discovery.Device { return published },
		// One claim prepared, one being prepared, one being unprepared:
		// only the first counts as prepared.
		Claimed: func() []metrics.ClaimDevice {
			return []metrics.ClaimDevice{
				{Device: "vf-0000-3b-02-1", PFAddress: "0000:3b:00.0", Phase: checkpoint.PhasePrepared},
				{Device: "vf-0000-3b-02-0", PFAddress: "0000:3b:00.0", Phase: checkpoint.PhasePreparing},
				{Device: "vf-0000-5e-02-0", PFAddress: "0000:5e:00.0", Phase: checkpoint.PhaseUnpreparing},
			}
		},
		PFs: func() []health.PFHealth {
			return []health.PFHealth{
				{Address: "0000:3b:00.0", Name: "enp59s0f0", Network: "physnet-a", State: health.PFHealthy},
				{Address: "0000:5e:00.0", Name: "enp94s0f0", Network: "physnet-b", State: health.PFLinkDown},
			}
		},
		Tainted: func() map[string]int { return map[string]int{"0000:5e:00.0": 1} },
	})
	m.PrepareDone(20*time.Millisecond, "", nil)
	m.PrepareDone(3*time.Millisecond, "link", errors.New("EOPNOTSUPP"))
	m.UnprepareDone(15*time.Millisecond, "", nil)
	m.UnprepareDone(time.Millisecond, "", errors.New("untagged"))
	m.RequestDone(metrics.MethodPrepare, 25*time.Millisecond, true)
	m.RequestDone(metrics.MethodUnprepare, 16*time.Millisecond, false)
	at := time.Unix(1_800_000_000, 0)
	m.Published(at)
	m.AttachDone("target", 2*time.Second, nil)
	var nilMetrics *metrics.Metrics
	nilMetrics.PrepareDone(time.Second, "", nil) // a nil *Metrics records nothing

	srv := httptest.NewServer(m.Handler())
	defer srv.Close()
	got, err := scrape.Get(t.Context(), http.DefaultClient, srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"vfnet_driver_prepare_duration_seconds_count", map[string]string{"result": "success"}, 1},
		{"vfnet_driver_prepare_duration_seconds_count", map[string]string{"result": "error"}, 1},
		{"vfnet_driver_prepare_errors_total", map[string]string{"step": "link"}, 1},
		{"vfnet_driver_unprepare_duration_seconds_count", map[string]string{"result": "success"}, 1},
		{"vfnet_driver_unprepare_errors_total", map[string]string{"step": "other"}, 1},
		{"vfnet_driver_dra_plugin_requests_total", map[string]string{"method": "PrepareResourceClaims", "status": "failed"}, 1},
		{"vfnet_driver_dra_plugin_requests_total", map[string]string{"method": "UnprepareResourceClaims", "status": "success"}, 1},
		{"vfnet_driver_dra_plugin_requests_latency_seconds_count", map[string]string{"method": "PrepareResourceClaims"}, 1},
		{"vfnet_driver_last_published_time_seconds", nil, 1_800_000_000},
		{"vfnet_driver_publishes_total", nil, 1},
		{"vfnet_driver_migration_attach_duration_seconds_count", map[string]string{"side": "target", "result": "success"}, 1},
		{"vfnet_driver_migration_attach_duration_seconds_sum", map[string]string{"side": "target", "result": "success"}, 2},
		{"vfnet_driver_published_devices_total", map[string]string{"network": "physnet-a", "pf": "0000:3b:00.0"}, 2},
		{"vfnet_driver_published_devices_total", map[string]string{"network": "physnet-b", "pf": "0000:5e:00.0"}, 1},
		{"vfnet_driver_prepared_devices", map[string]string{"network": "physnet-a", "pf": "0000:3b:00.0"}, 1},
		{"vfnet_driver_pending_devices", map[string]string{"network": "physnet-a", "pf": "0000:3b:00.0", "phase": "preparing"}, 1},
		{"vfnet_driver_pending_devices", map[string]string{"network": "physnet-b", "pf": "0000:5e:00.0", "phase": "unpreparing"}, 1},
		{"vfnet_driver_pf_health", map[string]string{"pf": "0000:5e:00.0", "state": "link-down", "pf_name": "enp94s0f0"}, 1},
		{"vfnet_driver_pf_health", map[string]string{"pf": "0000:5e:00.0", "state": "healthy"}, 0},
		{"vfnet_driver_pf_health", map[string]string{"pf": "0000:3b:00.0", "state": "healthy"}, 1},
		{"vfnet_driver_tainted_devices", map[string]string{"pf": "0000:5e:00.0"}, 1},
	} {
		v, ok := got.Value(c.name, c.labels)
		if !ok || v != c.want {
			t.Errorf("%s%v = %v (found %v), want %v", c.name, c.labels, v, ok, c.want)
		}
	}
	if v, ok := got.Value("vfnet_driver_prepare_duration_seconds_sum", map[string]string{"result": "success"}); !ok || v != 0.02 {
		t.Errorf("prepare duration sum %v, want 0.02", v)
	}
	if v := got.Sum("vfnet_driver_prepared_devices", nil); v != 1 {
		t.Errorf("prepared_devices sums to %v, want 1: only a claim whose prepare finished counts", v)
	}
	if v := got.Sum("vfnet_driver_pending_devices", nil); v != 2 {
		t.Errorf("pending_devices sums to %v, want 2", v)
	}
	if v, ok := got.Value("process_resident_memory_bytes", nil); !ok || v <= 0 {
		t.Errorf("process_resident_memory_bytes %v (found %v)", v, ok)
	}
}
