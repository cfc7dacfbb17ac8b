package server

import (
	"encoding/json"
	"reflect"
	"testing"

	k8sv1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/vfnet-io/vfnet/test/lib/kubevirtvmi"
)

// richVMI sets every field vfnet reads (and many it does not), so that a
// wrong JSON path in vmiFields leaves a difference to the full decode.
func richVMI() *kubevirtv1.VirtualMachineInstance {
	now := metav1.Now()
	return &kubevirtv1.VirtualMachineInstance{
		TypeMeta:   metav1.TypeMeta{Kind: "VirtualMachineInstance", APIVersion: "kubevirt.io/v1"},
		ObjectMeta: metav1.ObjectMeta{Name: "vm-a", Namespace: "vms", UID: "u-1", Labels: map[string]string{"a": "b"}},
		Spec: kubevirtv1.VirtualMachineInstanceSpec{
			Domain: kubevirtv1.DomainSpec{
				Resources: kubevirtv1.ResourceRequirements{Requests: k8sv1.ResourceList{k8sv1.ResourceMemory: resource.MustParse("1Gi")}},
				Devices: kubevirtv1.Devices{
					Disks: []kubevirtv1.Disk{{Name: "root"}},
					Interfaces: []kubevirtv1.Interface{
						{Name: "default", InterfaceBindingMethod: kubevirtv1.InterfaceBindingMethod{Masquerade: &kubevirtv1.InterfaceMasquerade{}},
							Ports: []kubevirtv1.Port{{Port: 80}}},
						{Name: "net-a", Binding: &kubevirtv1.PluginBinding{Name: "vfnet"}, MacAddress: "02:00:00:00:00:01",
							PciAddress: "0000:07:00.0", BootOrder: ptr.To[uint](2), Tag: "t", ACPIIndex: 3,
							DHCPOptions: &kubevirtv1.DHCPOptions{BootFileName: "x"}},
					},
				},
			},
			Volumes: []kubevirtv1.Volume{{Name: "root", VolumeSource: kubevirtv1.VolumeSource{ContainerDisk: &kubevirtv1.ContainerDiskSource{Image: "img"}}}},
			Networks: []kubevirtv1.Network{
				{Name: "default", NetworkSource: kubevirtv1.NetworkSource{Pod: &kubevirtv1.PodNetwork{}}},
				{Name: "net-a", NetworkSource: kubevirtv1.NetworkSource{ResourceClaim: &kubevirtv1.ClaimRequest{ClaimName: "c", RequestName: "vf"}}},
			},
			ResourceClaims: []kubevirtv1.VirtualMachineInstanceResourceClaim{
				{Name: "c", ResourceClaimTemplateName: ptr.To("tmpl")},
				{Name: "d", ResourceClaimName: ptr.To("rc")},
			},
		},
		Status: kubevirtv1.VirtualMachineInstanceStatus{
			Phase:      kubevirtv1.Running,
			Interfaces: []kubevirtv1.VirtualMachineInstanceNetworkInterface{{Name: "default", IP: "10.0.0.1"}},
			MigrationState: &kubevirtv1.VirtualMachineInstanceMigrationState{
				StartTimestamp: &now, TargetPod: "virt-launcher-vm-a-xyz", TargetNode: "n2",
				TargetState: &kubevirtv1.VirtualMachineInstanceMigrationTargetState{VirtualMachineInstanceCommonMigrationState: kubevirtv1.VirtualMachineInstanceCommonMigrationState{Pod: "virt-launcher-vm-a-xyz"}},
			},
		},
	}
}

// decodeVMI keeps exactly the fields vfnet reads, equal to what a full
// decode into kubevirt.io/api's type gives (through kubevirtvmi.View).
func TestDecodeVMIMatchesFullDecode(t *testing.T) {
	t.Parallel()
	b, err := json.Marshal(richVMI())
	if err != nil {
		t.Fatal(err)
	}
	var full kubevirtv1.VirtualMachineInstance
	if err := json.Unmarshal(b, &full); err != nil {
		t.Fatal(err)
	}
	got, err := decodeVMI(b)
	if err != nil {
		t.Fatal(err)
	}
	want := kubevirtvmi.View(&full)
	if !reflect.DeepEqual(got, want) {
		t.Errorf("decodeVMI =\n%+v\nwant\n%+v", got, want)
	}
	for name, v := range map[string]any{"name": got.Metadata.Name, "interfaces": got.Spec.Domain.Devices.Interfaces, "networks": got.Spec.Networks,
		"resourceClaims": got.Spec.ResourceClaims, "migrationState": got.Status.MigrationState} {
		if reflect.ValueOf(v).IsZero() {
			t.Errorf("%s not decoded", name)
		}
	}
	if !got.MigrationTarget() {
		t.Error("migration state lost")
	}
}

func TestDecodeVMIRejectsMalformedJSON(t *testing.T) {
	t.Parallel()
	for _, in := range []string{"", "{", `{"spec":{"networks":{}}}`, `{"spec":{"domain":{"devices":{"interfaces":[{"name":5}]}}}}`, `[]`, `{"status": 1}`} {
		if _, err := decodeVMI([]byte(in)); err == nil {
			t.Errorf("decodeVMI(%q) succeeded", in)
		}
	}
}
