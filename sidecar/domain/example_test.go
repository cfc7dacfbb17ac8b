package domain_test

import (
	"context"
	"fmt"
	"os"

	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/vfnet-io/vfnet/pkg/contract/metadata"
	"github.com/vfnet-io/vfnet/sidecar/domain"
	"github.com/vfnet-io/vfnet/test/lib/kubevirtvmi"
)

// fixedReader stands in for metadata.FileReader, which reads the files the
// kubelet mounts.
type fixedReader struct{}

func (fixedReader) Read(ci kubevirtvmi.ClaimInterface) (*metadata.Device, error) {
	return &metadata.Device{Request: ci.RequestName, PCIBusID: "0000:3b:02.1"}, nil
}

func ExampleApply() {
	tmpl := "vf-template"
	vmi := &kubevirtv1.VirtualMachineInstance{Spec: kubevirtv1.VirtualMachineInstanceSpec{
		Domain: kubevirtv1.DomainSpec{Devices: kubevirtv1.Devices{Interfaces: []kubevirtv1.Interface{
			{Name: "dra-net", Binding: &kubevirtv1.PluginBinding{Name: "vfnet"}},
		}}},
		Networks: []kubevirtv1.Network{{Name: "dra-net", NetworkSource: kubevirtv1.NetworkSource{
			ResourceClaim: &kubevirtv1.ClaimRequest{ClaimName: "net", RequestName: "vf"},
		}}},
		ResourceClaims: []kubevirtv1.VirtualMachineInstanceResourceClaim{{Name: "net", ResourceClaimTemplateName: &tmpl}},
	}}
	in := []byte("<domain type=\"kvm\">\n\t<name>vms_vm-a</name>\n\t<devices>\n\t\t<emulator>/usr/libexec/qemu-kvm</emulator>\n\t</devices>\n</domain>\n")
	ifaces, err := kubevirtvmi.View(vmi).BindingInterfaces("vfnet")
	if err != nil {
		fmt.Println(err)
		return
	}
	out, err := domain.Apply(context.Background(), in, ifaces, fixedReader{}, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	os.Stdout.Write(out)
	// Output:
	// <domain type="kvm">
	// 	<name>vms_vm-a</name>
	// 	<devices>
	// 		<emulator>/usr/libexec/qemu-kvm</emulator>
	// 		<hostdev mode="subsystem" type="pci" managed="no">
	// 			<source>
	// 				<address domain="0x0000" bus="0x3b" slot="0x02" function="0x1"></address>
	// 			</source>
	// 			<alias name="ua-sriov-dra-net"></alias>
	// 		</hostdev>
	// 	</devices>
	// </domain>
}
