package scale

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"k8s.io/client-go/rest"
)

// componentArgs is a running component's command line.
func (c *Cluster) componentArgs(component string) ([]string, error) {
	pid, err := c.plane.PID(component)
	if err != nil {
		return nil, err
	}
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return nil, fmt.Errorf("read %s's command line: %w", component, err)
	}
	return strings.Split(strings.TrimRight(string(data), "\x00"), "\x00"), nil
}

// flagValue is the last value of --name=value in args ("" if absent).
func flagValue(args []string, name string) string {
	v := ""
	for _, a := range args {
		if rest, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			v = rest
		}
	}
	return v
}

// componentClient is an HTTP client and base URL for kube-apiserver or
// kube-scheduler, authenticated as the admin (system:masters passes the
// scheduler's delegated authorization of /metrics and /debug/pprof). The
// scheduler's serving certificate is self-signed and not checked.
func (c *Cluster) componentClient(component string) (*http.Client, string, error) {
	if component == "kube-apiserver" {
		cfg := c.plane.AdminRESTConfig()
		hc, err := rest.HTTPClientFor(cfg)
		return hc, c.plane.URL, err
	}
	args, err := c.componentArgs(component)
	if err != nil {
		return nil, "", err
	}
	port := flagValue(args, "secure-port")
	if port == "" {
		return nil, "", fmt.Errorf("%s has no --secure-port", component)
	}
	cfg := &rest.Config{Host: "https://127.0.0.1:" + port, BearerToken: c.plane.AdminToken,
		TLSClientConfig: rest.TLSClientConfig{Insecure: true}}
	hc, err := rest.HTTPClientFor(cfg)
	return hc, cfg.Host, err
}

func (c *Cluster) get(ctx context.Context, component, path string) ([]byte, error) {
	hc, base, err := c.componentClient(component)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+path, nil)
	if err != nil {
		return nil, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("GET %s%s: %w", component, path, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("GET %s%s: %s: %s", component, path, resp.Status, bytes.TrimSpace(body[:min(len(body), 200)]))
	}
	return body, err
}

// schedulerAttempts reads kube-scheduler's scheduler_schedule_attempts_total
// by result, and scheduler_pre_queueing_hint_evaluations_total by result as
// "pre-queueing-hint/<result>" (counted only with SchedulerPreQueueingHints).
func (c *Cluster) schedulerAttempts(ctx context.Context) (map[string]float64, error) {
	body, err := c.get(ctx, "kube-scheduler", "/metrics")
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		prefix := ""
		labels, ok := strings.CutPrefix(line, "scheduler_schedule_attempts_total{")
		if !ok {
			if labels, ok = strings.CutPrefix(line, "scheduler_pre_queueing_hint_evaluations_total{"); !ok {
				continue
			}
			prefix = "pre-queueing-hint/"
		}
		end := strings.LastIndexByte(labels, '}')
		if end < 0 {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(labels[end+1:]), 64)
		if err != nil {
			continue
		}
		for _, l := range strings.Split(labels[:end], ",") {
			if r, ok := strings.CutPrefix(l, `result="`); ok {
				out[prefix+strings.TrimSuffix(r, `"`)] += v
			}
		}
	}
	return out, sc.Err()
}

// startProfiles takes a CPU profile, opts.ProfileSeconds long, of
// kube-scheduler and, if it serves /debug/pprof, of kube-apiserver, into
// opts.ProfileDir/<name>-<component>.pprof. The returned function waits for
// them.
func (c *Cluster) startProfiles(ctx context.Context, name string) func() error {
	if c.opts.ProfileDir == "" {
		return func() error { return nil }
	}
	components := []string{"kube-scheduler"}
	if args, err := c.componentArgs("kube-apiserver"); err == nil && flagValue(args, "profiling") == "true" {
		components = append(components, "kube-apiserver")
	}
	var wg sync.WaitGroup
	errs := make([]error, len(components))
	for i, comp := range components {
		wg.Go(func() {
			body, err := c.get(ctx, comp, fmt.Sprintf("/debug/pprof/profile?seconds=%d", c.opts.ProfileSeconds))
			if err == nil {
				path := filepath.Join(c.opts.ProfileDir, name+"-"+comp+".pprof")
				err = os.WriteFile(path, body, 0o644)
				c.say("  CPU profile of %s: %s", comp, path)
			}
			errs[i] = err
		})
	}
	return func() error {
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				return err
			}
		}
		return nil
	}
}
