// Package plugin is vfnet-driver's kubelet plugin: it implements the four
// kubeletplugin.DRAPlugin methods and starts the kubeletplugin helper with
// explicit options (registration, plugin socket, rolling updates, KEP-5304
// device metadata).
package plugin

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	metadatav1alpha1 "k8s.io/dynamic-resource-allocation/api/metadata/v1alpha1"
	metadatav1beta1 "k8s.io/dynamic-resource-allocation/api/metadata/v1beta1"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"

	"github.com/vfnet-io/vfnet/driver/discovery"
	"github.com/vfnet-io/vfnet/driver/health"
)

// ClaimPreparer prepares and unprepares the claims of this driver (the
// prepare path implements it). Results follow DRAPlugin's conventions: one
// entry per claim.
type ClaimPreparer interface {
	Prepare(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error)
	Unprepare(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error)
}

// ErrNotSupported is each claim's error while no ClaimPreparer is configured.
var ErrNotSupported = errors.New("preparing vfnet claims is not supported yet by this vfnet-driver build")

// RequestObserver sees every DRA call: the method
// (PrepareResourceClaims, UnprepareResourceClaims), its duration, and
// whether the call or any of its claims failed (driver/metrics).
type RequestObserver func(method string, d time.Duration, failed bool)

// Driver implements kubeletplugin.DRAPlugin.
type Driver struct {
	preparer  ClaimPreparer
	health    *health.Monitor
	onFatal   func(error)
	onRequest RequestObserver
}

var _ kubeletplugin.DRAPlugin = (*Driver)(nil)

// NewDriver returns the DRAPlugin implementation. preparer may be nil (claims
// then fail with ErrNotSupported); monitor may be nil (health reporting is
// then declined); onFatal is called for errors retrying cannot fix.
func NewDriver(preparer ClaimPreparer, monitor *health.Monitor, onFatal func(error)) *Driver {
	return &Driver{preparer: preparer, health: monitor, onFatal: onFatal}
}

// PrepareResourceClaims implements kubeletplugin.DRAPlugin.
func (d *Driver) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	if d.preparer != nil {
		start := time.Now()
		res, err := d.preparer.Prepare(ctx, claims)
		if d.onRequest != nil {
			failed := err != nil
			for _, r := range res {
				failed = failed || r.Err != nil
			}
			d.onRequest("PrepareResourceClaims", time.Since(start), failed)
		}
		return res, err
	}
	out := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	for _, c := range claims {
		out[c.UID] = kubeletplugin.PrepareResult{Err: fmt.Errorf("claim %s/%s: %w", c.Namespace, c.Name, ErrNotSupported)}
	}
	return out, nil
}

// UnprepareResourceClaims implements kubeletplugin.DRAPlugin.
func (d *Driver) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	if d.preparer != nil {
		start := time.Now()
		res, err := d.preparer.Unprepare(ctx, claims)
		if d.onRequest != nil {
			failed := err != nil
			for _, e := range res {
				failed = failed || e != nil
			}
			d.onRequest("UnprepareResourceClaims", time.Since(start), failed)
		}
		return res, err
	}
	out := make(map[types.UID]error, len(claims))
	for _, c := range claims {
		out[c.UID] = fmt.Errorf("claim %s: %w", c.NamespacedName, ErrNotSupported)
	}
	return out, nil
}

// HandleError implements kubeletplugin.DRAPlugin: recoverable errors (all
// ResourceSlice publishing errors are) are logged; others are fatal.
func (d *Driver) HandleError(ctx context.Context, err error, msg string) {
	logger := klog.FromContext(ctx)
	if errors.Is(err, kubeletplugin.ErrRecoverable) {
		logger.Error(err, msg)
		return
	}
	logger.Error(err, msg, "fatal", true)
	if d.onFatal != nil {
		d.onFatal(fmt.Errorf("%s: %w", msg, err))
	}
}

// WatchHealthStatus implements kubeletplugin.DRAPlugin.
func (d *Driver) WatchHealthStatus(ctx context.Context, reports chan<- kubeletplugin.DeviceHealthReport) error {
	if d.health == nil {
		return kubeletplugin.ErrHealthNotSupported
	}
	return d.health.Watch(ctx, reports)
}

// Options are every dependency of a running plugin.
type Options struct {
	// DriverName defaults to discovery.DriverName.
	DriverName string
	NodeName   string
	KubeClient kubernetes.Interface
	// RegistrarDir is the kubelet's plugin registration directory.
	RegistrarDir string
	// PluginDir holds the DRA socket and the device metadata files.
	PluginDir string
	// CDIDir receives the metadata CDI specs the helper writes.
	CDIDir string
	// PodUID enables rolling updates (two driver pods side by side) when set.
	PodUID   string
	Preparer ClaimPreparer
	Health   *health.Monitor
	OnFatal  func(error)
	// OnRequest, if set, sees every prepare and unprepare call.
	OnRequest RequestObserver
	// Extra are appended to the helper options (tests: listeners, etc.).
	Extra []kubeletplugin.Option
}

// Plugin is a started kubelet plugin.
type Plugin struct {
	helper       *kubeletplugin.Helper
	kube         kubernetes.Interface
	driver, node string
}

// Start registers with the kubelet and serves the DRA and health gRPC APIs.
func Start(ctx context.Context, opts Options) (*Plugin, error) {
	if opts.DriverName == "" {
		opts.DriverName = discovery.DriverName
	}
	if opts.KubeClient == nil || opts.NodeName == "" {
		return nil, errors.New("start kubelet plugin: a Kubernetes client and a node name are required")
	}
	kopts := []kubeletplugin.Option{
		kubeletplugin.DriverName(opts.DriverName),
		kubeletplugin.NodeName(opts.NodeName),
		kubeletplugin.KubeClient(opts.KubeClient),
		// KubeVirt's reader decodes only v1alpha1; v1beta1 must come first.
		kubeletplugin.EnableDeviceMetadata(true, []schema.GroupVersion{metadatav1beta1.SchemeGroupVersion, metadatav1alpha1.SchemeGroupVersion}),
	}
	if opts.RegistrarDir != "" {
		kopts = append(kopts, kubeletplugin.RegistrarDirectoryPath(opts.RegistrarDir))
	}
	if opts.PluginDir != "" {
		// The helper listens here but does not create it; a fresh node has
		// only the kubelet's plugins directory.
		if err := os.MkdirAll(opts.PluginDir, 0o750); err != nil {
			return nil, fmt.Errorf("create plugin directory %s: %w", opts.PluginDir, err)
		}
		kopts = append(kopts, kubeletplugin.PluginDataDirectoryPath(opts.PluginDir))
	}
	if opts.CDIDir != "" {
		kopts = append(kopts, kubeletplugin.CDIDirectory(opts.CDIDir))
	}
	if opts.PodUID != "" {
		kopts = append(kopts, kubeletplugin.RollingUpdate(types.UID(opts.PodUID)))
	}
	kopts = append(kopts, opts.Extra...)
	drv := NewDriver(opts.Preparer, opts.Health, opts.OnFatal)
	drv.onRequest = opts.OnRequest
	helper, err := kubeletplugin.Start(ctx, drv, kopts...)
	if err != nil {
		return nil, fmt.Errorf("start kubelet plugin %s: %w", opts.DriverName, err)
	}
	return &Plugin{helper: helper, kube: opts.KubeClient, driver: opts.DriverName, node: opts.NodeName}, nil
}

// PublishResources hands the ResourceSlices to the helper's controller.
func (p *Plugin) PublishResources(ctx context.Context, resources resourceslice.DriverResources) error {
	return p.helper.PublishResources(ctx, resources)
}

// PublishedSlices lists this node's ResourceSlices of the driver from the
// API server itself (a consistent read, not the controller's cache): what the
// scheduler can see, as opposed to what PublishResources handed over.
func (p *Plugin) PublishedSlices(ctx context.Context) ([]resourceapi.ResourceSlice, error) {
	sel := fields.AndSelectors(
		fields.OneTermEqualSelector(resourceapi.ResourceSliceSelectorNodeName, p.node),
		fields.OneTermEqualSelector(resourceapi.ResourceSliceSelectorDriver, p.driver)).String()
	var out []resourceapi.ResourceSlice
	opts := metav1.ListOptions{FieldSelector: sel}
	for {
		list, err := p.kube.ResourceV1().ResourceSlices().List(ctx, opts)
		switch {
		case apierrors.IsForbidden(err):
			return nil, fmt.Errorf("list ResourceSlices (%s): %w: the driver's ServiceAccount needs the verb list on resourceslices (API group resource.k8s.io): restore it in the vfnet-driver ClusterRole (manifests/base/rbac.yaml)", sel, err)
		case err != nil:
			return nil, fmt.Errorf("list ResourceSlices (%s): %w", sel, err)
		}
		out = append(out, list.Items...)
		if list.Continue == "" {
			return out, nil
		}
		opts.Continue = list.Continue
	}
}

// Helper exposes the kubeletplugin helper (registration status, metadata updates).
func (p *Plugin) Helper() *kubeletplugin.Helper { return p.helper }

// Stop stops serving gRPC and the ResourceSlice controller. Published slices
// are left in place: a restarting driver takes them over without churn.
func (p *Plugin) Stop() { p.helper.Stop() }
