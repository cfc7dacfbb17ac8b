package standby

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/containerd/nri/pkg/stub"
	"k8s.io/klog/v2"
)

// DefaultSocket is the NRI socket containerd 2.x and CRI-O listen on.
const DefaultSocket = "/var/run/nri/nri.sock"

// PluginName and PluginIndex register vfnet with the runtime's NRI
// ("50-vfnet"). The index orders plugins; vfnet changes no container, so
// any is fine.
const (
	PluginName  = "vfnet"
	PluginIndex = "50"
)

// Reconnect pacing while the runtime's NRI is not reachable (NRI off, the
// runtime restarting): the first retry is quick, later ones back off.
const (
	retryMin = 1 * time.Second
	retryMax = 30 * time.Second
)

// NRI runs Handler as an NRI plugin of the container runtime, and connects
// again whenever the runtime restarts.
type NRI struct {
	Socket  string
	Handler *Handler
	// connected is true from the runtime's first Synchronize until the
	// connection drops; syncs counts Synchronize calls.
	connected atomic.Bool
	syncs     atomic.Int64
}

// Connected reports whether the runtime sends this plugin pod events now.
func (n *NRI) Connected() bool { return n.connected.Load() }

// ErrNotConnected explains a failover claim refused because NRI is not
// reachable.
func (n *NRI) ErrNotConnected() error {
	return fmt.Errorf("vfnet-driver is not connected to the container runtime's NRI socket %s, which creates failover standbys: "+
		"enable NRI in the runtime (containerd: [plugins.'io.containerd.nri.v1.nri'] disable = false, socket_path = %q in /etc/containerd/config.toml; "+
		"CRI-O: [crio.nri] enable_nri = true) and mount the socket's directory into the driver pod (the shipped DaemonSet does), or remove VFConfig.failover from the claim",
		n.Socket, n.Socket)
}

// Run connects and serves until ctx ends, reconnecting after every drop.
func (n *NRI) Run(ctx context.Context) {
	logger := klog.FromContext(ctx).WithValues("nriSocket", n.Socket)
	h := *n.Handler
	onSync := h.OnSync
	h.OnSync = func() {
		n.syncs.Add(1)
		if !n.connected.Swap(true) {
			logger.Info("Connected to the container runtime's NRI: failover standbys are plumbed at pod start")
		}
		if onSync != nil {
			onSync()
		}
	}
	delay := retryMin
	failures := 0
	for ctx.Err() == nil {
		synced := n.syncs.Load()
		err := n.runOnce(ctx, &h, logger)
		n.connected.Store(false)
		if ctx.Err() != nil {
			return
		}
		if n.syncs.Load() != synced {
			// It was connected: a runtime restart, reconnect quickly.
			delay, failures = retryMin, 0
		}
		failures++
		if failures == 1 {
			logger.Info("NRI connection unavailable; claims with VFConfig.failover are refused until it is back", "err", err, "retryIn", delay)
		} else {
			logger.V(2).Info("NRI connection still unavailable", "err", err, "retryIn", delay, "attempts", failures)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(delay):
		}
		delay = min(2*delay, retryMax)
	}
}

func (n *NRI) runOnce(ctx context.Context, h *Handler, logger klog.Logger) error {
	closed := make(chan struct{})
	s, err := stub.New(h, stub.WithPluginName(PluginName), stub.WithPluginIdx(PluginIndex), stub.WithSocketPath(n.Socket),
		stub.WithLogger(nriLogger{logger.WithName("nri")}),
		stub.WithOnClose(func() {
			n.connected.Store(false)
			close(closed)
		}))
	if err != nil {
		return fmt.Errorf("create NRI plugin: %w", err)
	}
	runErr := make(chan error, 1)
	go func() { runErr <- s.Run(ctx) }()
	select {
	case err := <-runErr:
		if err == nil {
			err = errors.New("NRI connection closed")
		}
		return err
	case <-closed:
		s.Stop()
		<-runErr
		return errors.New("the runtime closed the NRI connection")
	}
}

// nriLogger routes the NRI stub's messages to klog (its default is a
// process-wide logrus logger).
type nriLogger struct{ l klog.Logger }

func (g nriLogger) Debugf(_ context.Context, f string, a ...any) {
	g.l.V(4).Info(fmt.Sprintf(f, a...))
}
func (g nriLogger) Infof(_ context.Context, f string, a ...any) { g.l.V(2).Info(fmt.Sprintf(f, a...)) }
func (g nriLogger) Warnf(_ context.Context, f string, a ...any) { g.l.Info(fmt.Sprintf(f, a...)) }
func (g nriLogger) Errorf(_ context.Context, f string, a ...any) {
	g.l.Error(nil, fmt.Sprintf(f, a...))
}
