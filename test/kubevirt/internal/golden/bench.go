package golden

import (
	"fmt"

	v1 "kubevirt.io/api/core/v1"
)

// PasstBindingName is the binding name KubeVirt's passt sidecar defaults to.
const PasstBindingName = "passt"

// BenchCase is the VMI the binding benchmark sends to both sidecars: eight
// vfnet interfaces, each on its own template claim, plus the primary pod
// network on KubeVirt's passt binding plugin (the only interface the passt
// sidecar acts on; it requires the pod interface name in the VMI status).
// Both sidecars get the same domain XML and VMI JSON.
func BenchCase() Case {
	opts := []option{withBinding("default", PasstBindingName), withPodNetwork("default")}
	var vfs []VF
	for i := 0; i < 8; i++ {
		name := fmt.Sprintf("net%d", i)
		claim := fmt.Sprintf("claim%d", i)
		mac := fmt.Sprintf("02:00:00:00:01:%02x", i)
		opts = append(opts,
			withVfnet(name, mac, "", nil),
			withTemplateClaim(claim, "vf-template"),
			withDRANetwork(name, claim, "vf"))
		vfs = append(vfs, VF{Interface: name, PCIBusID: fmt.Sprintf("0000:3b:%02x.%d", 2+i/8, i%8), MAC: mac})
	}
	vmi := newVMI("bench-8vf", opts...)
	vmi.Status.Interfaces = []v1.VirtualMachineInstanceNetworkInterface{{Name: "default", PodInterfaceName: "eth0"}}
	return Case{Name: "bench-8vf", VMI: vmi, VFs: vfs}
}
