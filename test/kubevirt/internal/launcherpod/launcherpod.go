// Package launcherpod renders the virt-launcher pod KubeVirt v1.9.0's
// virt-controller would create for a VMI, with virt-controller's own
// TemplateService wired as in production (hook sidecars from annotations
// and from network binding plugins, the network memory calculator), under a
// cluster configuration taken from a KubeVirt CR. Tests use it to check what
// the product's KubeVirt CR patch does to the pod; the e2e harness can use
// the result as the launcher pod it creates.
package launcherpod

import (
	"fmt"

	"go.uber.org/mock/gomock"
	k8sv1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	v1 "kubevirt.io/api/core/v1"
	"kubevirt.io/client-go/kubecli"

	"kubevirt.io/kubevirt/pkg/hooks"
	"kubevirt.io/kubevirt/pkg/network/netbinding"
	netannotations "kubevirt.io/kubevirt/pkg/network/pod/annotations"
	netresources "kubevirt.io/kubevirt/pkg/network/resources"
	storageannotations "kubevirt.io/kubevirt/pkg/storage/pod/annotations"
	"kubevirt.io/kubevirt/pkg/testutils"
	"kubevirt.io/kubevirt/pkg/virt-api/webhooks/mutating-webhook/mutators"
	"kubevirt.io/kubevirt/pkg/virt-controller/services"
)

// LauncherImage is a placeholder image for the compute container.
const LauncherImage = "quay.io/kubevirt/virt-launcher:v1.9.0"

// failReporter turns an unexpected API call into an error instead of a
// test failure: rendering a pod for these VMIs must not need the API.
type failReporter struct{ err error }

func (r *failReporter) Errorf(format string, args ...any) {
	if r.err == nil {
		r.err = fmt.Errorf(format, args...)
	}
}
func (r *failReporter) Fatalf(format string, args ...any) {
	r.Errorf(format, args...)
	panic(r.err)
}

// Render returns the launcher pod for vmi under cfg.
func Render(vmi *v1.VirtualMachineInstance, cfg *v1.KubeVirtConfiguration) (pod *k8sv1.Pod, err error) {
	clusterConfig, _, _ := testutils.NewFakeClusterConfigUsingKVConfig(cfg)
	reporter := &failReporter{}
	ctrl := gomock.NewController(reporter)
	// No EXPECT: any call on the client is an error.
	client := kubecli.NewMockKubevirtClient(ctrl)
	defer func() {
		if r := recover(); r != nil {
			pod, err = nil, fmt.Errorf("render launcher pod for %s/%s: unexpected: %v", vmi.Namespace, vmi.Name, r)
		}
		if err == nil && reporter.err != nil {
			pod, err = nil, fmt.Errorf("render launcher pod for %s/%s: %w", vmi.Namespace, vmi.Name, reporter.err)
		}
	}()
	store := func() cache.Store { return cache.NewStore(cache.MetaNamespaceKeyFunc) }
	netAnnotations := netannotations.NewGenerator(clusterConfig)
	svc := services.NewTemplateService(LauncherImage,
		240,
		"/var/run/kubevirt",
		"/var/run/kubevirt-ephemeral-disks",
		"/var/run/kubevirt/container-disks",
		v1.HotplugDiskDir,
		"",
		store(),
		client,
		clusterConfig,
		107,
		"quay.io/kubevirt/virt-exportserver:v1.9.0",
		store(),
		store(),
		services.WithSidecarCreator(
			func(vmi *v1.VirtualMachineInstance, _ *v1.KubeVirtConfiguration) (hooks.HookSidecarList, error) {
				return hooks.UnmarshalHookSidecarList(vmi)
			}),
		services.WithSidecarCreator(netbinding.NetBindingPluginSidecarList),
		services.WithNetMemoryCalculator(netresources.MemoryCalculator{}),
		services.WithAnnotationsGenerators(netAnnotations, storageannotations.Generator{}),
		services.WithNetTargetAnnotationsGenerator(netAnnotations),
	)
	pod, err = svc.RenderLaunchManifest(vmi)
	if err != nil {
		return nil, fmt.Errorf("render launcher pod for %s/%s: %w", vmi.Namespace, vmi.Name, err)
	}
	return pod, nil
}

// VMIFromVM makes the VMI virt-controller creates from a VM (name,
// namespace and template), with KubeVirt's API object defaults.
func VMIFromVM(vm *v1.VirtualMachine, uid string) *v1.VirtualMachineInstance {
	vmi := &v1.VirtualMachineInstance{}
	vmi.TypeMeta.Kind, vmi.TypeMeta.APIVersion = "VirtualMachineInstance", v1.SchemeGroupVersion.String()
	vmi.Name, vmi.Namespace = vm.Name, vm.Namespace
	vmi.UID = types.UID(uid)
	if vm.Spec.Template != nil {
		vmi.Labels = vm.Spec.Template.ObjectMeta.Labels
		vmi.Annotations = vm.Spec.Template.ObjectMeta.Annotations
		vmi.Spec = *vm.Spec.Template.Spec.DeepCopy()
	}
	v1.SetObjectDefaults_VirtualMachineInstance(vmi)
	return vmi
}

// MutateAsVirtAPI applies what virt-api's VMI mutating webhook does to a new
// VMI under cfg (defaults and, unless the Root gate is on, the non-root
// runtime user 107, which makes the launcher's containers run as 107).
func MutateAsVirtAPI(vmi *v1.VirtualMachineInstance, cfg *v1.KubeVirtConfiguration) error {
	clusterConfig, _, _ := testutils.NewFakeClusterConfigUsingKVConfig(cfg)
	if err := mutators.ApplyNewVMIMutations(vmi, clusterConfig); err != nil {
		return fmt.Errorf("virt-api mutations of VMI %s/%s: %w", vmi.Namespace, vmi.Name, err)
	}
	return nil
}

// AddBindingSidecarClaims gives each network binding plugin's sidecar
// container the claims of the DRA networks whose interface uses that
// binding, as KubeVirt renders the pod from v1.10 (kubevirt PR 18741):
// v1.9.0 gives them to the compute container only, so a binding sidecar
// cannot read the claims' device metadata. The sidecar is found by its
// NETWORK_BINDING_PLUGIN_NAME environment variable.
func AddBindingSidecarClaims(pod *k8sv1.Pod, vmi *v1.VirtualMachineInstance) error {
	claims := map[string][]k8sv1.ResourceClaim{} // binding name -> claims
	for _, iface := range vmi.Spec.Domain.Devices.Interfaces {
		if iface.Binding == nil {
			continue
		}
		for _, n := range vmi.Spec.Networks {
			if n.Name == iface.Name && n.ResourceClaim != nil {
				claims[iface.Binding.Name] = append(claims[iface.Binding.Name],
					k8sv1.ResourceClaim{Name: n.ResourceClaim.ClaimName, Request: n.ResourceClaim.RequestName})
			}
		}
	}
	found := map[string]bool{}
	for i := range pod.Spec.Containers {
		c := &pod.Spec.Containers[i]
		for _, e := range c.Env {
			if e.Name == "NETWORK_BINDING_PLUGIN_NAME" && claims[e.Value] != nil {
				c.Resources.Claims = append(c.Resources.Claims, claims[e.Value]...)
				found[e.Value] = true
			}
		}
	}
	for b := range claims {
		if !found[b] {
			return fmt.Errorf("launcher pod of %s/%s has no sidecar for binding %q", vmi.Namespace, vmi.Name, b)
		}
	}
	return nil
}
