package kubevirtvmi

import (
	"strings"
	"testing"

	kubevirtv1 "kubevirt.io/api/core/v1"
)

func ptr[T any](v T) *T { return &v }

func vmi(ifaces []kubevirtv1.Interface, nets []kubevirtv1.Network, claims []kubevirtv1.VirtualMachineInstanceResourceClaim) *kubevirtv1.VirtualMachineInstance {
	v := &kubevirtv1.VirtualMachineInstance{}
	v.Spec.Domain.Devices.Interfaces = ifaces
	v.Spec.Networks = nets
	v.Spec.ResourceClaims = claims
	return v
}

func vfnetIface(name string) kubevirtv1.Interface {
	return kubevirtv1.Interface{Name: name, Binding: &kubevirtv1.PluginBinding{Name: DefaultBindingName}}
}

func claimNet(name, claim, request string) kubevirtv1.Network {
	return kubevirtv1.Network{Name: name, NetworkSource: kubevirtv1.NetworkSource{ResourceClaim: &kubevirtv1.ClaimRequest{ClaimName: claim, RequestName: request}}}
}

func TestBindingInterfaces(t *testing.T) {
	t.Parallel()
	v := vmi(
		[]kubevirtv1.Interface{
			{Name: "default", InterfaceBindingMethod: kubevirtv1.InterfaceBindingMethod{Masquerade: &kubevirtv1.InterfaceMasquerade{}}},
			vfnetIface("a"),
			{Name: "other", Binding: &kubevirtv1.PluginBinding{Name: "passt"}},
			vfnetIface("b"),
		},
		[]kubevirtv1.Network{
			{Name: "default", NetworkSource: kubevirtv1.NetworkSource{Pod: &kubevirtv1.PodNetwork{}}},
			claimNet("a", "tmpl", "vf"),
			{Name: "other", NetworkSource: kubevirtv1.NetworkSource{Pod: &kubevirtv1.PodNetwork{}}},
			claimNet("b", "named", "vf"),
		},
		[]kubevirtv1.VirtualMachineInstanceResourceClaim{
			{Name: "tmpl", ResourceClaimTemplateName: ptr("t")},
			{Name: "named", ResourceClaimName: ptr("rc-1")},
		},
	)
	got, err := BindingInterfaces(v, DefaultBindingName)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Interface.Name != "a" || got[1].Interface.Name != "b" {
		t.Fatalf("want interfaces a, b in spec order, got %+v", got)
	}
	if !got[0].FromTemplate() || got[0].PodClaimName != "tmpl" || got[0].RequestName != "vf" || *got[0].ResourceClaimTemplateName != "t" {
		t.Errorf("a: %+v", got[0])
	}
	if got[1].FromTemplate() || *got[1].ResourceClaimName != "rc-1" {
		t.Errorf("b: %+v", got[1])
	}

	ci, ok, err := InterfaceForClaim(v, DefaultBindingName, "named", "vf")
	if err != nil || !ok || ci.Interface.Name != "b" {
		t.Errorf("InterfaceForClaim(named, vf) = %+v, %v, %v", ci, ok, err)
	}
	if _, ok, err := InterfaceForClaim(v, DefaultBindingName, "named", "other-request"); err != nil || ok {
		t.Errorf("InterfaceForClaim(named, other-request) found=%v err=%v, want not found", ok, err)
	}
	// The helper serves DRA bindings: an interface of the asked binding on a
	// pod network is an error, not silently skipped.
	if got, err := BindingInterfaces(v, "passt"); err == nil {
		t.Errorf("binding passt on a pod network must fail (not a resourceClaim network), got %+v", got)
	}
}

func TestBindingInterfacesErrors(t *testing.T) {
	t.Parallel()
	tmpl := []kubevirtv1.VirtualMachineInstanceResourceClaim{{Name: "c", ResourceClaimTemplateName: ptr("t")}}
	for name, tc := range map[string]struct {
		v    *kubevirtv1.VirtualMachineInstance
		want []string
	}{
		"no network": {vmi([]kubevirtv1.Interface{vfnetIface("a")}, nil, tmpl),
			[]string{`interface "a"`, "no network named", "resourceClaim"}},
		"pod network": {vmi([]kubevirtv1.Interface{vfnetIface("a")}, []kubevirtv1.Network{{Name: "a", NetworkSource: kubevirtv1.NetworkSource{Pod: &kubevirtv1.PodNetwork{}}}}, tmpl),
			[]string{`interface "a"`, "not a resourceClaim network"}},
		"empty request": {vmi([]kubevirtv1.Interface{vfnetIface("a")}, []kubevirtv1.Network{claimNet("a", "c", "")}, tmpl),
			[]string{`interface "a"`, "requestName must both be set"}},
		"unknown claim": {vmi([]kubevirtv1.Interface{vfnetIface("a")}, []kubevirtv1.Network{claimNet("a", "missing", "vf")}, tmpl),
			[]string{`interface "a"`, `claim "missing"`, "spec.resourceClaims does not define"}},
		"both claim sources": {vmi([]kubevirtv1.Interface{vfnetIface("a")}, []kubevirtv1.Network{claimNet("a", "c", "vf")},
			[]kubevirtv1.VirtualMachineInstanceResourceClaim{{Name: "c", ResourceClaimName: ptr("x"), ResourceClaimTemplateName: ptr("t")}}),
			[]string{`spec.resourceClaims["c"]`, "exactly one of"}},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			_, err := BindingInterfaces(tc.v, DefaultBindingName)
			if err == nil {
				t.Fatal("want an error")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
}
