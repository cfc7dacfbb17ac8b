// Package server is vfnet-binding's side of KubeVirt's hook sidecar
// protocol: the Info and v1alpha3 Callbacks gRPC services on a unix socket.
// The domain mutation itself lives in package domain; this package decodes
// the launcher's requests, applies vfnet's policy (migration targets, error
// codes) and runs the gRPC server.
package server

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"

	"github.com/vfnet-io/vfnet/pkg/contract/vmiview"
	"github.com/vfnet-io/vfnet/sidecar/domain"
	"github.com/vfnet-io/vfnet/sidecar/hooksapi/info"
	"github.com/vfnet-io/vfnet/sidecar/hooksapi/v1alpha3"
)

// Hook point names and the callbacks version virt-launcher knows.
const (
	HookPointOnDefineDomain  = "OnDefineDomain"
	HookPointPreCloudInitIso = "PreCloudInitIso"
	HookPointShutdown        = "Shutdown"
	CallbacksVersion         = "v1alpha3"
)

// Callbacks implements the v1alpha3 Callbacks service.
type Callbacks struct {
	v1alpha3.UnimplementedCallbacksServer
	// BindingName is the binding's name in the KubeVirt CR.
	BindingName string
	// Reader finds the device behind each binding interface.
	Reader domain.MetadataReader
	// Hostdevs, if set, keeps the XML of hostdevs across calls.
	Hostdevs *domain.HostdevCache
	// OnShutdown is called (once per Shutdown RPC, without blocking the
	// reply) to stop the server.
	OnShutdown func()
}

var _ v1alpha3.CallbacksServer = (*Callbacks)(nil)

// OnDefineDomain adds the hostdevs of the VMI's vfnet interfaces to the
// domain. Errors carry codes.InvalidArgument for malformed input and
// codes.FailedPrecondition for everything the cluster must fix.
func (c *Callbacks) OnDefineDomain(ctx context.Context, p *v1alpha3.OnDefineDomainParams) (*v1alpha3.OnDefineDomainResult, error) {
	logger := klog.FromContext(ctx)
	vmi, err := decodeVMI(p.GetVmi())
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	logger = klog.LoggerWithValues(logger, "vmi", klog.KRef(vmi.Metadata.Namespace, vmi.Metadata.Name))
	ctx = klog.NewContext(ctx, logger)
	target := vmi.MigrationTarget()
	ifaces, err := vmi.BindingInterfaces(c.BindingName)
	var out []byte
	if err == nil {
		logMigratability(logger, ifaces, target)
		out, err = domain.Apply(ctx, p.GetDomainXML(), ifaces, c.Reader, c.Hostdevs)
	}
	if err != nil {
		if target {
			// virt-launcher discards a target's result (the domain arrives as
			// the source's migratable XML) but aborts the target on an
			// error. vfnet-driver attaches the target's VF after the
			// migration, so there is nothing to gain from failing here.
			logger.Error(err, "OnDefineDomain on a migration target failed; returning the domain unchanged, vfnet-driver attaches the VF after the migration")
			return &v1alpha3.OnDefineDomainResult{DomainXML: p.GetDomainXML()}, nil
		}
		var invalid *domain.InvalidInputError
		if errors.As(err, &invalid) {
			return nil, status.Error(codes.InvalidArgument, err.Error())
		}
		return nil, status.Error(codes.FailedPrecondition, err.Error())
	}
	return &v1alpha3.OnDefineDomainResult{DomainXML: out}, nil
}

// decodeVMI reads the fields vfnet needs from the VMI JSON virt-launcher
// sends (the whole VMI; the rest is skipped, not built).
func decodeVMI(b []byte) (*vmiview.VMI, error) {
	if len(b) == 0 {
		return nil, errors.New("OnDefineDomain request has no VMI; virt-launcher always sends one, so the caller is not KubeVirt")
	}
	vmi, err := vmiview.Decode(b)
	if err != nil {
		return nil, fmt.Errorf("OnDefineDomain request: %w", err)
	}
	return vmi, nil
}

func logMigratability(logger klog.Logger, ifaces []vmiview.ClaimInterface, target bool) {
	for _, ci := range ifaces {
		if ci.ResourceClaimName != nil {
			logger.Info("interface uses a directly named ResourceClaim; its VF is pinned to this node, so the VM cannot live-migrate. Use a resourceClaimTemplate to make it migratable",
				"interface", ci.Interface.Name, "resourceClaim", *ci.ResourceClaimName, "migrationTarget", target)
		}
	}
}

// PreCloudInitIso returns its input unchanged: vfnet does not touch
// cloud-init, but virt-launcher may call every registered sidecar.
func (c *Callbacks) PreCloudInitIso(_ context.Context, p *v1alpha3.PreCloudInitIsoParams) (*v1alpha3.PreCloudInitIsoResult, error) {
	return &v1alpha3.PreCloudInitIsoResult{
		CloudInitNoCloudSource: p.GetCloudInitNoCloudSource(),
		CloudInitData:          p.GetCloudInitData(),
	}, nil
}

// Shutdown asks the server to stop; the reply goes out first.
func (c *Callbacks) Shutdown(ctx context.Context, _ *v1alpha3.ShutdownParams) (*v1alpha3.ShutdownResult, error) {
	klog.FromContext(ctx).Info("Shutdown requested by virt-launcher")
	if c.OnShutdown != nil {
		c.OnShutdown()
	}
	return &v1alpha3.ShutdownResult{}, nil
}

// Info implements the Info service.
type Info struct {
	info.UnimplementedInfoServer
	Name string
}

// Info announces the hook points vfnet serves. PreCloudInitIso is served
// but not subscribed: vfnet has nothing to add to cloud-init.
func (i *Info) Info(context.Context, *info.InfoParams) (*info.InfoResult, error) {
	return &info.InfoResult{
		Name:     i.Name,
		Versions: []string{CallbacksVersion},
		HookPoints: []*info.HookPoint{
			{Name: HookPointOnDefineDomain, Priority: 0},
			{Name: HookPointShutdown, Priority: 0},
		},
	}, nil
}
