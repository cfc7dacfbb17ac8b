// Package server is vfnet-binding's side of KubeVirt's hook sidecar
// protocol: the Info and v1alpha3 Callbacks gRPC services on a unix socket.
// The domain mutation itself lives in package domain; this package decodes
// the launcher's requests, applies vfnet's policy (migration targets, error
// codes) and runs the gRPC server.
package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"
	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/vfnet-io/vfnet/pkg/kubevirtvmi"
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
	logger = klog.LoggerWithValues(logger, "vmi", klog.KRef(vmi.Namespace, vmi.Name))
	ctx = klog.NewContext(ctx, logger)
	target := IsMigrationTarget(vmi)
	ifaces, err := kubevirtvmi.BindingInterfaces(vmi, c.BindingName)
	var out []byte
	if err == nil {
		logMigratability(logger, ifaces, target)
		out, err = domain.ApplyInterfaces(ctx, p.GetDomainXML(), ifaces, c.Reader)
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

// vmiFields is the part of a VMI that vfnet reads, at the JSON paths of
// kubevirt.io/api's VirtualMachineInstance and with its types for each part.
// virt-launcher sends the whole VMI (domain spec, volumes, status);
// decoding only these fields skips the rest instead of building it.
type vmiFields struct {
	Metadata struct {
		Name      string `json:"name"`
		Namespace string `json:"namespace"`
	} `json:"metadata"`
	Spec struct {
		Domain struct {
			Devices struct {
				Interfaces []kubevirtv1.Interface `json:"interfaces"`
			} `json:"devices"`
		} `json:"domain"`
		Networks       []kubevirtv1.Network                             `json:"networks"`
		ResourceClaims []kubevirtv1.VirtualMachineInstanceResourceClaim `json:"resourceClaims"`
	} `json:"spec"`
	Status struct {
		MigrationState *kubevirtv1.VirtualMachineInstanceMigrationState `json:"migrationState"`
	} `json:"status"`
}

// decodeVMI returns a VMI with the fields vfnet reads set from the JSON b
// (see vmiFields); every other field is left empty.
func decodeVMI(b []byte) (*kubevirtv1.VirtualMachineInstance, error) {
	if len(b) == 0 {
		return nil, errors.New("OnDefineDomain request has no VMI; virt-launcher always sends one, so the caller is not KubeVirt")
	}
	var f vmiFields
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, fmt.Errorf("decode the VMI JSON of the OnDefineDomain request: %w", err)
	}
	vmi := &kubevirtv1.VirtualMachineInstance{}
	vmi.Name, vmi.Namespace = f.Metadata.Name, f.Metadata.Namespace
	vmi.Spec.Domain.Devices.Interfaces = f.Spec.Domain.Devices.Interfaces
	vmi.Spec.Networks = f.Spec.Networks
	vmi.Spec.ResourceClaims = f.Spec.ResourceClaims
	vmi.Status.MigrationState = f.Status.MigrationState
	return vmi, nil
}

// IsMigrationTarget reports whether vmi, as virt-launcher passes it to a
// hook, describes a live migration in progress. The hook's input does not say
// which pod is asking, but during a migration only the target launcher calls
// OnDefineDomain: the source defined its domain when the VM started and
// migrates the running domain's XML.
func IsMigrationTarget(vmi *kubevirtv1.VirtualMachineInstance) bool {
	ms := vmi.Status.MigrationState
	if ms == nil || ms.Completed || ms.Failed {
		return false
	}
	return ms.TargetPod != "" || (ms.TargetState != nil && ms.TargetState.Pod != "")
}

func logMigratability(logger klog.Logger, ifaces []kubevirtvmi.ClaimInterface, target bool) {
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
