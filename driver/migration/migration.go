// Package migration wires vfnet's live-migration support into the driver:
// a VirtualMachineInstance watcher (package watch) that hot-plugs VFs into
// launcher domains over libvirt RPC (package attach). cmd/vfnet-driver calls
// Run in a goroutine when --migration is on (the default).
package migration

import (
	"context"
	"errors"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"

	"github.com/vfnet-io/vfnet/driver/migration/attach"
	"github.com/vfnet-io/vfnet/driver/migration/vmiwatch"
)

// Options configure Run.
type Options struct {
	NodeName string
	// KubeletPodsDir is the kubelet's pods dir (attach.DefaultKubeletPodsDir
	// if empty): launcher sockets live below it.
	KubeletPodsDir string
	// Simulate skips the RLIMIT_MEMLOCK raise: no QEMU runs behind a
	// simulated launcher.
	Simulate bool
	// ProcRoot is the host's /proc (needs hostPID: true); "/proc" if empty.
	ProcRoot string
	// BindingName is the binding's name in the KubeVirt CR ("vfnet").
	BindingName string
	// Timeout bounds waiting for a launcher (socket, domain, QEMU) and for
	// its pod's claims; zero means 2 minutes.
	Timeout time.Duration
	Kube    kubernetes.Interface
	Dynamic dynamic.Interface
	// Recorder records Events on VMIs; nil: Run makes its own
	// (NewRecorder).
	Recorder record.EventRecorder
	// OnAttach, if set, sees every finished attach (vmiwatch.Config.OnAttach).
	OnAttach func(side string, d time.Duration, err error)
	// Failover parks failover VFs' MACs around a migration
	// (vmiwatch.Config.Failover); nil leaves MACs alone.
	Failover vmiwatch.FailoverMACs
}

// NewRecorder returns an EventRecorder that writes core/v1 Events as
// "vfnet-driver" on node (RBAC: events create, patch), and the function that
// flushes and stops it. The driver shares one between prepare (the MAC
// warning) and the migration watcher.
func NewRecorder(ctx context.Context, kube kubernetes.Interface, node string) (record.EventRecorder, func()) {
	broadcaster := record.NewBroadcaster(record.WithContext(ctx))
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: kube.CoreV1().Events("")})
	return broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "vfnet-driver", Host: node}), broadcaster.Shutdown
}

// Run watches VMIs and attaches VFs after migrations until ctx ends.
// Events go to the core/v1 Events API (RBAC: events create, patch).
func Run(ctx context.Context, o Options) error {
	if o.Kube == nil || o.Dynamic == nil || o.NodeName == "" {
		return errors.New("migration: NodeName, Kube and Dynamic are required")
	}
	if o.ProcRoot == "" {
		o.ProcRoot = "/proc"
	}
	var ml attach.MemlockRaiser = attach.ProcMemlock{ProcRoot: o.ProcRoot, Limits: attach.Prlimit{}}
	if o.Simulate {
		ml = attach.NoMemlock{}
	}
	recorder := o.Recorder
	if recorder == nil {
		var stop func()
		recorder, stop = NewRecorder(ctx, o.Kube, o.NodeName)
		defer stop()
	}
	w, err := vmiwatch.New(vmiwatch.Config{
		NodeName:    o.NodeName,
		BindingName: o.BindingName,
		Kube:        o.Kube,
		Dynamic:     o.Dynamic,
		Attacher: &attach.Attacher{
			Dialer:  attach.SessionDialer{},
			Memlock: ml,
			PodsDir: o.KubeletPodsDir,
			Timeout: o.Timeout,
		},
		Recorder:       recorder,
		Failover:       o.Failover,
		ResolveTimeout: o.Timeout,
		OnAttach:       o.OnAttach,
	})
	if err != nil {
		return err
	}
	return w.Run(ctx)
}
