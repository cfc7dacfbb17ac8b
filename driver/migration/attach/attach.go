package attach

import (
	"context"
	"errors"
	"fmt"
	"time"

	libvirt "github.com/digitalocean/go-libvirt"
	"k8s.io/klog/v2"
)

// Request asks for VFs to be present in one launcher's running domain.
type Request struct {
	// PodUID is the launcher pod's UID (its kubelet volume directory).
	PodUID string
	// Domain is "<namespace>_<vmi name>".
	Domain   string
	Hostdevs []Hostdev
}

// Result tells what an attach did.
type Result struct {
	// Attached lists the aliases hot-plugged by this call.
	Attached []string
	// Present lists the aliases the live domain already had.
	Present []string
	// Attempts counts connections tried (1 without retries).
	Attempts int
}

// Attacher hot-plugs VFs into launcher domains. It is idempotent: a hostdev
// whose alias the live domain already has is left alone.
type Attacher struct {
	Dialer  Dialer
	Memlock MemlockRaiser
	// PodsDir is the kubelet pods dir (DefaultKubeletPodsDir).
	PodsDir string
	// InitialBackoff, MaxBackoff and Timeout bound the retries of Attach;
	// zero values mean 20ms, 2s and 2m.
	InitialBackoff, MaxBackoff, Timeout time.Duration
	// Recheck is how often WaitRemoved rereads the live domain between
	// libvirt events; zero means 1s.
	Recheck time.Duration
}

// GaveUpError is returned by Attach when the launcher did not become
// reachable or accept the device within Timeout, or failed permanently.
type GaveUpError struct {
	Attempts  int
	Elapsed   time.Duration
	Permanent bool
	Err       error
}

func (e *GaveUpError) Error() string {
	if e.Permanent {
		return fmt.Sprintf("gave up after %d attempt(s): permanent error: %v", e.Attempts, e.Err)
	}
	return fmt.Sprintf("gave up after %d attempt(s) in %s: %v", e.Attempts, e.Elapsed.Round(time.Millisecond), e.Err)
}

func (e *GaveUpError) Unwrap() error { return e.Err }

// Attach retries AttachOnce with exponential backoff while the socket, the
// domain or QEMU is not ready, until Timeout; errors that retrying cannot
// fix (bad XML, no VFIO support, a VF held under another alias) end it early.
func (a *Attacher) Attach(ctx context.Context, req Request) (Result, error) {
	initial, maxB, timeout := a.InitialBackoff, a.MaxBackoff, a.Timeout
	if initial <= 0 {
		initial = 20 * time.Millisecond
	}
	if maxB <= 0 {
		maxB = 2 * time.Second
	}
	if timeout <= 0 {
		timeout = 2 * time.Minute
	}
	logger := klog.FromContext(ctx).WithValues("domain", req.Domain, "podUID", req.PodUID)
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	delay := initial
	var res Result
	var cause error
	for attempt := 1; ; attempt++ {
		r, err := a.AttachOnce(ctx, req)
		r.Attempts = attempt
		res = r
		if err == nil {
			return res, nil
		}
		if permanent(err) {
			return res, &GaveUpError{Attempts: attempt, Elapsed: time.Since(start), Permanent: true, Err: err}
		}
		// An attempt cut short by the deadline only says "interrupted"; the
		// attempt before it names what kept the launcher from being ready.
		if cause == nil || ctx.Err() == nil {
			cause = err
		}
		logger.V(3).Info("Launcher not ready for attach, retrying", "attempt", attempt, "in", delay, "err", err)
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return res, &GaveUpError{Attempts: attempt, Elapsed: time.Since(start), Err: cause}
		case <-t.C:
		}
		delay = min(2*delay, maxB)
	}
}

// AttachOnce connects once, reads the live domain and attaches every
// requested hostdev whose alias it lacks, raising QEMU's RLIMIT_MEMLOCK
// before the first one.
func (a *Attacher) AttachOnce(ctx context.Context, req Request) (Result, error) {
	var res Result
	if req.Domain == "" || req.PodUID == "" {
		return res, permanentErr(fmt.Errorf("attach request needs a domain and a pod UID, got %q and %q", req.Domain, req.PodUID))
	}
	xmls := make([]string, len(req.Hostdevs))
	for i, h := range req.Hostdevs {
		x, err := h.XML()
		if err != nil {
			return res, permanentErr(err)
		}
		xmls[i] = x
	}
	podsDir := a.PodsDir
	if podsDir == "" {
		podsDir = DefaultKubeletPodsDir
	}
	runtimeDir := RuntimeDir(podsDir, req.PodUID)
	s, err := a.Dialer.Dial(ctx, runtimeDir)
	if err != nil {
		return res, err
	}
	defer func() { _ = s.Close() }()
	x, err := s.DomainXML(req.Domain)
	if err != nil {
		return res, err
	}
	live, err := parseLiveDomain(x)
	if err != nil {
		return res, err
	}
	raised := false
	logger := klog.FromContext(ctx)
	for i, h := range req.Hostdevs {
		alias := Alias(h.Interface)
		if live.aliases[alias] {
			res.Present = append(res.Present, alias)
			continue
		}
		if other, ok := live.sources[h.Source]; ok {
			return res, permanentErr(fmt.Errorf("domain %s already has VF %s as hostdev %q, not as %q: refusing to attach it twice", req.Domain, h.Source, other, alias))
		}
		if !raised {
			if live.memoryBytes == 0 {
				return res, permanentErr(fmt.Errorf("domain %s: live XML has no <memory>: cannot size RLIMIT_MEMLOCK for VFIO", req.Domain))
			}
			if err := a.Memlock.EnsureMemlock(ctx, runtimeDir, req.Domain, live.memoryBytes+VFIOMemlockOverhead); err != nil {
				return res, err
			}
			raised = true
		}
		if err := s.AttachDevice(req.Domain, xmls[i]); err != nil {
			return res, fmt.Errorf("hot-plug VF %s as %s: %w", h.Source, alias, err)
		}
		logger.Info("Attached VF to migrated domain", "domain", req.Domain, "alias", alias, "vf", h.Source.String())
		res.Attached = append(res.Attached, alias)
	}
	return res, nil
}

type permanentError struct{ error }

func (e permanentError) Unwrap() error { return e.error }

func permanentErr(err error) error { return permanentError{err} }

// permanent reports errors retrying cannot fix. Everything else (socket
// missing or refused, domain not yet defined or running, QEMU not found) is
// what a launcher that is still starting or finishing a migration returns.
func permanent(err error) bool {
	var p permanentError
	if errors.As(err, &p) {
		return true
	}
	if isNotExist(err) {
		return false
	}
	var le libvirt.Error
	if errors.As(err, &le) {
		switch libvirt.ErrorNumber(le.Code) {
		case libvirt.ErrXMLError, libvirt.ErrConfigUnsupported, libvirt.ErrNoSupport:
			return true
		}
	}
	return false
}
