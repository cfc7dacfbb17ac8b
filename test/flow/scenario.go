package flow

import (
	"github.com/vfnet-io/vfnet/pkg/simhost"
)

// DemoHost is the simulated machine of the flow: one dual-port E810 whose
// first port (enp59s0f0, cabled to physnet-a in manifests/node-config.yaml)
// has 2 VFs and whose second port (enp59s0f1, physnet-b) has 1, so a second
// VM on physnet-b cannot fit.
func DemoHost() simhost.Spec {
	s := simhost.E810Host()
	s.PFs[0].NumVFs = 2
	s.PFs[1].NumVFs = 1
	return s
}

// DemoDomainXML is a domain as KubeVirt v1.9.0's converter renders it for a
// VMI whose only interface uses a binding plugin without a domain attachment:
// no <interface> for it, nothing vfnet has added yet. The end-to-end test
// prefers KubeVirt-generated golden files (test/kubevirt/testdata) when they
// exist; see DomainXMLFor.
const DemoDomainXML = `<domain type="kvm">
  <name>default_vm-a</name>
  <memory unit="b">1073741824</memory>
  <os>
    <type arch="x86_64" machine="q35">hvm</type>
  </os>
  <devices>
    <controller type="pci" index="0" model="pcie-root"></controller>
    <emulator>/usr/libexec/qemu-kvm</emulator>
  </devices>
</domain>`
