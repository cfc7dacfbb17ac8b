package e2e

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/yaml"

	"github.com/vfnet-io/vfnet/test/lib/flow"
	"github.com/vfnet-io/vfnet/test/lib/scrape"
)

// TestMetrics scrapes the real driver's /metrics (the DaemonSet's health
// port) over HTTP with the Prometheus text parser while a VM is prepared,
// its PF's link goes down and comes back, and the VM goes away: the values
// follow the flow.
func TestMetrics(t *testing.T) {
	t.Parallel()
	ctx, env := newEnv(t)
	if err := env.ApplyManifestsWith(ctx, "prometheus-scrape"); err != nil {
		t.Fatal(err)
	}
	if err := env.InstallKubeVirtCRDs(ctx); err != nil {
		t.Fatal(err)
	}
	n, err := env.AddNode(ctx, flow.NodeOptions{Name: "node-a", Spec: flow.DemoHost()})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.StartDriver(ctx); err != nil {
		t.Fatal(err)
	}
	refs, err := env.WaitSlices(ctx, n.Name, 3, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	// The driver pod carries the scrape annotations of the optional
	// component, pointing at the port and path the driver serves.
	checkScrapeAnnotations(t, n.DriverPod)
	checkPodMonitor(ctx, t, env, n.DriverPod)
	get := func() scrape.Families {
		t.Helper()
		f, err := scrape.Get(ctx, http.DefaultClient, n.MetricsURL())
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	// until polls the endpoint until cond holds (the health monitor and
	// the rescan run on their own intervals).
	until := func(what string, cond func(scrape.Families) error) scrape.Families {
		t.Helper()
		var last scrape.Families
		var why error
		err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
			last = get()
			why = cond(last)
			return why == nil, nil
		})
		if err != nil {
			t.Fatalf("%s: %v\n--- driver log ---\n%s", what, why, n.DriverLog(3000))
		}
		return last
	}
	eq := func(f scrape.Families, name string, labels map[string]string, want float64) error {
		if v, ok := f.Value(name, labels); !ok || v != want {
			return fmt.Errorf("%s%v = %v (present %v), want %v", name, labels, v, ok, want)
		}
		return nil
	}

	// Published, nothing prepared yet.
	start := until("published devices", func(f scrape.Families) error {
		if got := f.Sum("vfnet_driver_published_devices_total", nil); got != float64(len(refs)) {
			return fmt.Errorf("published devices %v, want %d", got, len(refs))
		}
		return eq(f, "vfnet_driver_pf_health", map[string]string{"pf": "0000:3b:00.0", "pf_name": "enp59s0f0", "network": "physnet-a", "state": "healthy"}, 1)
	})
	if err := eq(start, "vfnet_driver_published_devices_total", map[string]string{"network": "physnet-a", "pf": "0000:3b:00.0"}, 2); err != nil {
		t.Error(err)
	}
	if v, ok := start.Value("vfnet_driver_last_published_time_seconds", nil); !ok || time.Since(time.Unix(int64(v), 0)) > 5*time.Minute {
		t.Errorf("last_published_time_seconds %v (present %v) is not recent", v, ok)
	}
	if got := start.Sum("vfnet_driver_prepare_duration_seconds", nil); got != 0 {
		t.Errorf("%v prepares before any VM", got)
	}
	if v, ok := start.Value("process_resident_memory_bytes", nil); !ok || v <= 0 {
		t.Errorf("process_resident_memory_bytes %v (present %v)", v, ok)
	}

	// A VM is prepared.
	vm, err := env.CreateVM(ctx, flow.VMSpec{Name: "vm-metrics", DeviceClass: "vfnet-physnet-a", MAC: "02:00:00:00:0d:01", VLAN: 100})
	if err != nil {
		t.Fatal(err)
	}
	sched, err := env.WaitScheduled(ctx, vm, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := n.Kubelet.WaitPrepared(ctx, vm.Pod.UID); err != nil {
		t.Fatal(err)
	}
	// physnet-a is cabled to PF 0000:3b:00.0 (enp59s0f0) only.
	if ref, err := env.Ref(ctx, n.Name, sched.Device.Device); err != nil || ref.PFName != "enp59s0f0" {
		t.Fatalf("allocated %s (%+v, %v), want a VF of enp59s0f0", sched.Device.Device, ref, err)
	}
	prepared := get()
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"vfnet_driver_prepare_duration_seconds_count", map[string]string{"result": "success"}, 1},
		{"vfnet_driver_dra_plugin_requests_total", map[string]string{"method": "PrepareResourceClaims", "status": "success"}, 1},
		{"vfnet_driver_dra_plugin_requests_latency_seconds_count", map[string]string{"method": "PrepareResourceClaims"}, 1},
		{"vfnet_driver_prepared_devices", map[string]string{"network": "physnet-a", "pf": "0000:3b:00.0"}, 1},
	} {
		if err := eq(prepared, c.name, c.labels, c.want); err != nil {
			t.Error(err)
		}
	}
	if v, _ := prepared.Value("vfnet_driver_prepare_duration_seconds_sum", map[string]string{"result": "success"}); v <= 0 {
		t.Errorf("prepare duration sum %v", v)
	}
	t.Logf("measured: prepare of one claim as the driver saw it: %.1f ms", 1000*must(prepared.Value("vfnet_driver_prepare_duration_seconds_sum", map[string]string{"result": "success"})))

	// The PF's cable is pulled, then plugged back.
	if err := n.Host.SetOperState("enp59s0f0", "down"); err != nil {
		t.Fatal(err)
	}
	// The PF's VFs are republished with the NoSchedule taint, the prepared
	// one too (NoSchedule leaves its VM running).
	pfDevices := must(start.Value("vfnet_driver_published_devices_total", map[string]string{"network": "physnet-a", "pf": "0000:3b:00.0"}))
	until("PF link down", func(f scrape.Families) error {
		if err := eq(f, "vfnet_driver_pf_health", map[string]string{"pf": "0000:3b:00.0", "state": "link-down"}, 1); err != nil {
			return err
		}
		return eq(f, "vfnet_driver_tainted_devices", map[string]string{"pf": "0000:3b:00.0"}, pfDevices)
	})
	if err := n.Host.SetOperState("enp59s0f0", "up"); err != nil {
		t.Fatal(err)
	}
	until("PF link back up", func(f scrape.Families) error {
		if err := eq(f, "vfnet_driver_pf_health", map[string]string{"pf": "0000:3b:00.0", "state": "healthy"}, 1); err != nil {
			return err
		}
		if got := f.Sum("vfnet_driver_tainted_devices", nil); got != 0 {
			return fmt.Errorf("%v devices still tainted", got)
		}
		return nil
	})

	// The VM goes away.
	if err := env.DeleteVM(ctx, vm, "", time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := n.Kubelet.WaitUnprepared(ctx, vm.Pod.UID); err != nil {
		t.Fatal(err)
	}
	end := get()
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"vfnet_driver_unprepare_duration_seconds_count", map[string]string{"result": "success"}, 1},
		{"vfnet_driver_dra_plugin_requests_total", map[string]string{"method": "UnprepareResourceClaims", "status": "success"}, 1},
		{"vfnet_driver_prepare_duration_seconds_count", map[string]string{"result": "success"}, 1},
	} {
		if err := eq(end, c.name, c.labels, c.want); err != nil {
			t.Error(err)
		}
	}
	if got := end.Sum("vfnet_driver_prepared_devices", nil); got != 0 {
		t.Errorf("%v devices still prepared after the VM went away", got)
	}
	if got := end.Sum("vfnet_driver_prepare_errors_total", nil) + end.Sum("vfnet_driver_unprepare_errors_total", nil); got != 0 {
		t.Errorf("%v prepare/unprepare errors in a clean flow", got)
	}

	// A claim guarantees more than the E810 port's 25 Gb/s: ice refuses the
	// minimum rate (EINVAL, ice_set_vf_bw), prepare rolls back, and the
	// failure is counted under the step that failed, as the kubelet retries.
	bad, err := env.CreateVM(ctx, flow.VMSpec{Name: "vm-too-fast", DeviceClass: "vfnet-physnet-a", MAC: "02:00:00:00:0d:02", VLAN: 100,
		Settings: map[string]any{"minTxRateMbps": 30000}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := env.WaitScheduled(ctx, bad, time.Minute); err != nil {
		t.Fatal(err)
	}
	// The driver counts the claim's failure inside the call and the call's
	// own outcome once it returns: wait for both.
	failed := until("a counted prepare failure", func(f scrape.Families) error {
		for _, c := range []struct {
			name   string
			labels map[string]string
		}{
			{"vfnet_driver_prepare_errors_total", map[string]string{"step": "link"}},
			{"vfnet_driver_prepare_duration_seconds_count", map[string]string{"result": "error"}},
			{"vfnet_driver_dra_plugin_requests_total", map[string]string{"method": "PrepareResourceClaims", "status": "failed"}},
		} {
			if v, _ := f.Value(c.name, c.labels); v < 1 {
				return fmt.Errorf("%s%v = %v, want >= 1", c.name, c.labels, v)
			}
		}
		return nil
	})
	if got := failed.Sum("vfnet_driver_prepare_errors_total", nil) - failed.Sum("vfnet_driver_prepare_errors_total", map[string]string{"step": "link"}); got != 0 {
		t.Errorf("%v prepare errors under other steps than link", got)
	}
	// The kubelet retries the claim, so a scrape may land inside another
	// attempt (pending_devices{phase=preparing}); its VF is never prepared.
	if got := failed.Sum("vfnet_driver_prepared_devices", nil); got != 0 {
		t.Errorf("%v devices prepared while every prepare of the only claim fails", got)
	}
	if err := env.DeleteVM(ctx, bad, "", time.Minute); err != nil {
		t.Fatal(err)
	}
	// Each attempt rolled back: with the VM gone, no VF stays claimed.
	until("nothing claimed after the refused VM is gone", func(f scrape.Families) error {
		if got := f.Sum("vfnet_driver_prepared_devices", nil) + f.Sum("vfnet_driver_pending_devices", nil); got != 0 {
			return fmt.Errorf("%v devices prepared or pending", got)
		}
		return nil
	})
}

func must(v float64, _ bool) float64 { return v }

func healthPort(pod *corev1.Pod) (corev1.ContainerPort, bool) {
	for _, c := range pod.Spec.Containers {
		for _, p := range c.Ports {
			if p.Name == "health" {
				return p, true
			}
		}
	}
	return corev1.ContainerPort{}, false
}

func checkScrapeAnnotations(t *testing.T, pod *corev1.Pod) {
	t.Helper()
	port, ok := healthPort(pod)
	a := pod.Annotations
	if !ok || a["prometheus.io/scrape"] != "true" || a["prometheus.io/port"] != strconv.Itoa(int(port.ContainerPort)) || a["prometheus.io/path"] != "/metrics" {
		t.Errorf("driver pod annotations %v, health port %v: want prometheus.io/scrape, port and path of /metrics", a, port)
	}
}

// checkPodMonitor renders components/podmonitor (no Prometheus Operator
// here to apply it to) and checks it selects the driver pod and names its
// health port.
func checkPodMonitor(ctx context.Context, t *testing.T, env *flow.Env, pod *corev1.Pod) {
	t.Helper()
	out, err := env.Plane.Kubectl(ctx, nil, "kustomize", filepath.Join(env.Repo, "manifests", "components", "podmonitor"))
	if err != nil {
		t.Fatal(err)
	}
	var pm struct {
		Kind     string
		Metadata metav1.ObjectMeta
		Spec     struct {
			Selector            metav1.LabelSelector
			PodMetricsEndpoints []struct{ Port, Path string } `json:"podMetricsEndpoints"`
		}
	}
	if err := yaml.Unmarshal(out, &pm); err != nil {
		t.Fatalf("PodMonitor: %v\n%s", err, out)
	}
	sel, err := metav1.LabelSelectorAsSelector(&pm.Spec.Selector)
	if err != nil {
		t.Fatal(err)
	}
	port, _ := healthPort(pod)
	if pm.Kind != "PodMonitor" || pm.Metadata.Namespace != pod.Namespace || !sel.Matches(labels.Set(pod.Labels)) ||
		len(pm.Spec.PodMetricsEndpoints) != 1 || pm.Spec.PodMetricsEndpoints[0].Port != port.Name || pm.Spec.PodMetricsEndpoints[0].Path != "/metrics" {
		t.Errorf("PodMonitor does not select the driver pod's health port:\n%s", out)
	}
}
