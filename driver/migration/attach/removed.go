package attach

import (
	"context"
	"errors"
	"fmt"
	"time"

	libvirt "github.com/digitalocean/go-libvirt"
	"k8s.io/klog/v2"
)

// Removal asks to be told when hostdevs leave a running domain: the source
// launcher of a live migration detaches every SR-IOV hostdev before it
// migrates, and a failover VF's MAC must be parked right after.
type Removal struct {
	PodUID string
	Domain string
	// Aliases are the hostdev aliases to wait for.
	Aliases []string
	// Gone is called once per alias, as soon as the live domain lacks it.
	// An error ends the wait with that error.
	Gone func(ctx context.Context, alias string) error
}

// WaitRemoved calls req.Gone for each alias as soon as the live domain
// lacks it, and returns when all are gone or ctx ends. It subscribes to
// libvirt's device-removed events and then reads the live XML: on every
// event, and every Recheck (a connection dropped, an event the daemon sent
// before the subscription, a daemon that does not send them). A launcher
// that is not reachable yet is retried with backoff. A domain that no
// longer exists counts as having none of them: its VFs are out of any guest.
func (a *Attacher) WaitRemoved(ctx context.Context, req Removal) error {
	if req.Domain == "" || req.PodUID == "" || req.Gone == nil {
		return fmt.Errorf("removal watch needs a domain, a pod UID and a callback, got %q and %q", req.Domain, req.PodUID)
	}
	recheck := a.Recheck
	if recheck <= 0 {
		recheck = time.Second
	}
	podsDir := a.PodsDir
	if podsDir == "" {
		podsDir = DefaultKubeletPodsDir
	}
	logger := klog.FromContext(ctx).WithValues("domain", req.Domain, "podUID", req.PodUID)
	pending := map[string]bool{}
	for _, al := range req.Aliases {
		pending[al] = true
	}
	delay := a.InitialBackoff
	if delay <= 0 {
		delay = 20 * time.Millisecond
	}
	for len(pending) > 0 {
		err := a.watchOnce(ctx, RuntimeDir(podsDir, req.PodUID), req, pending, recheck)
		if err == nil || ctx.Err() != nil {
			return ctx.Err()
		}
		var g goneError
		if errors.As(err, &g) {
			return g.error
		}
		logger.V(3).Info("Launcher not reachable to watch for detached VFs, retrying", "in", delay, "err", err)
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		delay = min(2*delay, max(a.MaxBackoff, 2*time.Second))
	}
	return nil
}

// goneError wraps an error of the Gone callback: it ends the wait.
type goneError struct{ error }

// watchOnce holds one connection: subscribe, then check the live XML on
// each event and tick, until nothing is pending (nil) or the connection
// fails (its error).
func (a *Attacher) watchOnce(ctx context.Context, runtimeDir string, req Removal, pending map[string]bool, recheck time.Duration) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s, err := a.Dialer.Dial(ctx, runtimeDir)
	if err != nil {
		return err
	}
	defer func() { _ = s.Close() }()
	events, err := s.DeviceRemoved(ctx)
	if err != nil {
		// Polling still works; say why it is slower.
		klog.FromContext(ctx).V(2).Info("No device-removed events from the launcher, checking every "+recheck.String(), "err", err)
		events = nil
	}
	tick := time.NewTicker(recheck)
	defer tick.Stop()
	for {
		if err := a.checkRemoved(ctx, s, req, pending); err != nil {
			return err
		}
		if len(pending) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case _, ok := <-events:
			if !ok {
				return errors.New("launcher connection closed")
			}
		case <-tick.C:
		}
	}
}

func (a *Attacher) checkRemoved(ctx context.Context, s Session, req Removal, pending map[string]bool) error {
	x, err := s.DomainXML(req.Domain)
	var live liveDomain
	switch {
	case err != nil && isNoDomain(err):
		// Gone: the guest holds none of them any more.
	case err != nil:
		return err
	default:
		if live, err = parseLiveDomain(x); err != nil {
			return err
		}
	}
	for al := range pending {
		if live.aliases[al] {
			continue
		}
		if err := req.Gone(ctx, al); err != nil {
			return goneError{err}
		}
		delete(pending, al)
	}
	return nil
}

// isNoDomain reports libvirt's "domain not found".
func isNoDomain(err error) bool {
	var le libvirt.Error
	return errors.As(err, &le) && libvirt.ErrorNumber(le.Code) == libvirt.ErrNoDomain
}
