package maclookup

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"
	kubevirtv1 "kubevirt.io/api/core/v1"
)

func ptr[T any](v T) *T { return &v }

func vmi(ns, name string, uid string, claimSource kubevirtv1.VirtualMachineInstanceResourceClaim, mac string) *kubevirtv1.VirtualMachineInstance {
	return &kubevirtv1.VirtualMachineInstance{
		TypeMeta:   metav1.TypeMeta{APIVersion: "kubevirt.io/v1", Kind: "VirtualMachineInstance"},
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(uid)},
		Spec: kubevirtv1.VirtualMachineInstanceSpec{
			Domain: kubevirtv1.DomainSpec{Devices: kubevirtv1.Devices{Interfaces: []kubevirtv1.Interface{
				{Name: "default", InterfaceBindingMethod: kubevirtv1.InterfaceBindingMethod{Masquerade: &kubevirtv1.InterfaceMasquerade{}}},
				{Name: "other", Binding: &kubevirtv1.PluginBinding{Name: "vfnet"}, MacAddress: "02:00:00:00:00:99"},
				{Name: "dra-net", Binding: &kubevirtv1.PluginBinding{Name: "vfnet"}, MacAddress: mac},
			}}},
			Networks: []kubevirtv1.Network{
				{Name: "default", NetworkSource: kubevirtv1.NetworkSource{Pod: &kubevirtv1.PodNetwork{}}},
				{Name: "other", NetworkSource: kubevirtv1.NetworkSource{ResourceClaim: &kubevirtv1.ClaimRequest{ClaimName: claimSource.Name, RequestName: "second"}}},
				{Name: "dra-net", NetworkSource: kubevirtv1.NetworkSource{ResourceClaim: &kubevirtv1.ClaimRequest{ClaimName: claimSource.Name, RequestName: "vf"}}},
			},
			ResourceClaims: []kubevirtv1.VirtualMachineInstanceResourceClaim{claimSource},
		},
	}
}

func pod(ns, name, uid, vmiName, vmiUID string, claims ...corev1.PodResourceClaim) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(uid), OwnerReferences: []metav1.OwnerReference{
			{APIVersion: "kubevirt.io/v1", Kind: "VirtualMachineInstance", Name: vmiName, UID: types.UID(vmiUID), Controller: ptr(true)},
		}},
		Spec: corev1.PodSpec{ResourceClaims: claims},
	}
}

func claim(ns, name string, annotations map[string]string, podName, podUID string) *resourceapi.ResourceClaim {
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: "claim-uid", Annotations: annotations},
		Status: resourceapi.ResourceClaimStatus{
			ReservedFor: []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: podName, UID: types.UID(podUID)}},
		},
	}
}

func newLookup(t *testing.T, objs []runtime.Object, vmis ...*kubevirtv1.VirtualMachineInstance) Lookup {
	t.Helper()
	var dyn []runtime.Object
	for _, v := range vmis {
		m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(v)
		if err != nil {
			t.Fatal(err)
		}
		dyn = append(dyn, &unstructured.Unstructured{Object: m})
	}
	return Lookup{
		Kube: fake.NewClientset(objs...),
		VMIs: DynamicVMIGetter{Client: dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
			map[schema.GroupVersionResource]string{VMIResource: "VirtualMachineInstanceList"}, dyn...)},
	}
}

func TestTemplateClaim(t *testing.T) {
	t.Parallel()
	v := vmi("ns", "vm1", "vmi-uid", kubevirtv1.VirtualMachineInstanceResourceClaim{Name: "vf-claim", ResourceClaimTemplateName: ptr("vf-template")}, "02:00:00:00:00:01")
	p := pod("ns", "virt-launcher-vm1-abcde", "pod-uid", "vm1", "vmi-uid", corev1.PodResourceClaim{Name: "vf-claim", ResourceClaimTemplateName: ptr("vf-template")})
	c := claim("ns", "virt-launcher-vm1-abcde-vf-claim-xyz", map[string]string{resourceapi.PodResourceClaimAnnotation: "vf-claim"}, p.Name, "pod-uid")
	l := newLookup(t, []runtime.Object{p}, v)
	r, found, err := l.MACFor(context.Background(), c, "vf")
	if err != nil || !found || r.MAC.String() != "02:00:00:00:00:01" || r.Interface != "dra-net" || r.VMI != "ns/vm1" {
		t.Fatalf("MACFor = %+v %v %v", r, found, err)
	}
	// A subrequest finds the network written for its main request.
	r, found, err = l.MACFor(context.Background(), c, "vf/big")
	if err != nil || !found || r.MAC.String() != "02:00:00:00:00:01" {
		t.Fatalf("subrequest: %+v %v %v", r, found, err)
	}
	r, found, err = l.MACFor(context.Background(), c, "second")
	if err != nil || !found || r.MAC.String() != "02:00:00:00:00:99" {
		t.Fatalf("second request: %+v %v %v", r, found, err)
	}
	_, found, err = l.MACFor(context.Background(), c, "unknown")
	if err != nil || found {
		t.Fatalf("unknown request: %v %v", found, err)
	}
}

func TestDirectClaim(t *testing.T) {
	t.Parallel()
	v := vmi("ns", "vm1", "vmi-uid", kubevirtv1.VirtualMachineInstanceResourceClaim{Name: "net", ResourceClaimName: ptr("shared-vf")}, "02:00:00:00:00:02")
	p := pod("ns", "launcher", "pod-uid", "vm1", "vmi-uid", corev1.PodResourceClaim{Name: "net", ResourceClaimName: ptr("shared-vf")})
	c := claim("ns", "shared-vf", nil, "launcher", "pod-uid")
	r, found, err := newLookup(t, []runtime.Object{p}, v).MACFor(context.Background(), c, "vf")
	if err != nil || !found || r.MAC.String() != "02:00:00:00:00:02" {
		t.Fatalf("MACFor = %+v %v %v", r, found, err)
	}
}

func TestNotFound(t *testing.T) {
	t.Parallel()
	v := vmi("ns", "vm1", "vmi-uid", kubevirtv1.VirtualMachineInstanceResourceClaim{Name: "vf-claim", ResourceClaimTemplateName: ptr("t")}, "")
	p := pod("ns", "launcher", "pod-uid", "vm1", "vmi-uid", corev1.PodResourceClaim{Name: "vf-claim", ResourceClaimTemplateName: ptr("t")})
	annotated := map[string]string{resourceapi.PodResourceClaimAnnotation: "vf-claim"}
	for name, tc := range map[string]struct {
		l Lookup
		c *resourceapi.ResourceClaim
	}{
		"interface without mac": {newLookup(t, []runtime.Object{p}, v), claim("ns", "c", annotated, "launcher", "pod-uid")},
		"pod gone":              {newLookup(t, nil, v), claim("ns", "c", annotated, "launcher", "pod-uid")},
		"pod replaced":          {newLookup(t, []runtime.Object{p}, v), claim("ns", "c", annotated, "launcher", "other-uid")},
		"vmi gone":              {newLookup(t, []runtime.Object{p}), claim("ns", "c", annotated, "launcher", "pod-uid")},
		"plain pod":             {newLookup(t, []runtime.Object{&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "launcher", UID: "pod-uid"}}}, v), claim("ns", "c", annotated, "launcher", "pod-uid")},
		"no reservation":        {newLookup(t, []runtime.Object{p}, v), &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "c"}}},
	} {
		t.Run(name, func(t *testing.T) {
			r, found, err := tc.l.MACFor(context.Background(), tc.c, "vf")
			if err != nil || found {
				t.Fatalf("MACFor = %+v %v %v; want not found", r, found, err)
			}
		})
	}
}

func TestBadVMIMAC(t *testing.T) {
	t.Parallel()
	v := vmi("ns", "vm1", "vmi-uid", kubevirtv1.VirtualMachineInstanceResourceClaim{Name: "vf-claim", ResourceClaimTemplateName: ptr("t")}, "not-a-mac")
	p := pod("ns", "launcher", "pod-uid", "vm1", "vmi-uid")
	c := claim("ns", "c", map[string]string{resourceapi.PodResourceClaimAnnotation: "vf-claim"}, "launcher", "pod-uid")
	_, _, err := newLookup(t, []runtime.Object{p}, v).MACFor(context.Background(), c, "vf")
	if err == nil || !strings.Contains(err.Error(), `interface "dra-net"`) || !strings.Contains(err.Error(), "not-a-mac") {
		t.Fatalf("err = %v", err)
	}
}

func TestFindInterfaceWithoutMAC(t *testing.T) {
	t.Parallel()
	v := vmi("ns", "vm1", "vmi-uid", kubevirtv1.VirtualMachineInstanceResourceClaim{Name: "vf-claim", ResourceClaimTemplateName: ptr("t")}, "")
	p := pod("ns", "launcher", "pod-uid", "vm1", "vmi-uid", corev1.PodResourceClaim{Name: "vf-claim", ResourceClaimTemplateName: ptr("t")})
	c := claim("ns", "c", map[string]string{resourceapi.PodResourceClaimAnnotation: "vf-claim"}, "launcher", "pod-uid")
	r, found, err := newLookup(t, []runtime.Object{p}, v).Find(context.Background(), c, "vf")
	if err != nil || !found || r.MAC != nil || r.Interface != "dra-net" || !r.FromTemplate {
		t.Fatalf("Find = %+v %v %v; want dra-net without MAC from a template", r, found, err)
	}
	if r.Ref == nil || r.Ref.Kind != "VirtualMachineInstance" || r.Ref.APIVersion != "kubevirt.io/v1" || r.Ref.UID != "vmi-uid" || r.Ref.Name != "vm1" || r.Ref.Namespace != "ns" {
		t.Fatalf("Ref = %+v", r.Ref)
	}
	// The other interface on the same claim has a MAC.
	if r, found, err := newLookup(t, []runtime.Object{p}, v).Find(context.Background(), c, "second"); err != nil || !found || r.MAC.String() != "02:00:00:00:00:99" {
		t.Fatalf("second: %+v %v %v", r, found, err)
	}

	d := vmi("ns", "vm1", "vmi-uid", kubevirtv1.VirtualMachineInstanceResourceClaim{Name: "net", ResourceClaimName: ptr("shared-vf")}, "")
	dp := pod("ns", "launcher", "pod-uid", "vm1", "vmi-uid", corev1.PodResourceClaim{Name: "net", ResourceClaimName: ptr("shared-vf")})
	r, found, err = newLookup(t, []runtime.Object{dp}, d).Find(context.Background(), claim("ns", "shared-vf", nil, "launcher", "pod-uid"), "vf")
	if err != nil || !found || r.MAC != nil || r.FromTemplate {
		t.Fatalf("named claim: %+v %v %v; want found, no MAC, not from a template", r, found, err)
	}
}
