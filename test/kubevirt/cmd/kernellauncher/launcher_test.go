package main

import (
	"os/exec"
	"slices"
	"strings"
	"testing"

	v1 "kubevirt.io/api/core/v1"

	"kubevirt.io/kubevirt/pkg/virt-launcher/virtwrap/api"
)

func TestSetHotplugOff(t *testing.T) {
	in := `<domain><devices>` +
		`<controller type="pci" index="1" model="pcie-root-port"><target></target></controller>` +
		`<controller type="pci" index="2" model="pcie-root-port"><model name="pcie-root-port"/><target chassis="2" port="0x11"/><address type="pci" bus="0x00"/></controller>` +
		`<controller type="pci" index="3" model="pcie-root-port"></controller>` +
		`<controller type="pci" index="4" model="pcie-root-port"><target/></controller>` +
		`</devices></domain>`
	out, err := setHotplugOff(in, []int{1, 2, 3})
	if err != nil {
		t.Fatal(err)
	}
	want := `<domain><devices>` +
		`<controller type="pci" index="1" model="pcie-root-port"><target hotplug="off"></target></controller>` +
		`<controller type="pci" index="2" model="pcie-root-port"><model name="pcie-root-port"/><target hotplug="off" chassis="2" port="0x11"/><address type="pci" bus="0x00"/></controller>` +
		`<controller type="pci" index="3" model="pcie-root-port"><target hotplug="off"/></controller>` +
		`<controller type="pci" index="4" model="pcie-root-port"><target/></controller>` +
		`</devices></domain>`
	if out != want {
		t.Errorf("got\n%s\nwant\n%s", out, want)
	}
	if _, err := setHotplugOff(in, []int{9}); err == nil || !strings.Contains(err.Error(), "lacks") {
		t.Errorf("missing port: err %v", err)
	}
}

func TestOccupiedRootPorts(t *testing.T) {
	u := func(v uint32) *uint32 { return &v }
	pci := func(bus string) *api.Address {
		return &api.Address{Type: "pci", Domain: "0x0000", Bus: bus, Slot: "0x00", Function: "0x0"}
	}
	spec := &api.DomainSpec{Devices: api.Devices{
		Controllers: []api.Controller{
			{Type: "pci", Index: "0", Model: "pcie-root"},
			{Type: "pci", Index: "1", Model: "pcie-root-port", Target: &api.ControllerTarget{BusNr: u(1)}},
			{Type: "pci", Index: "2", Model: "pcie-root-port", Target: &api.ControllerTarget{BusNr: u(2)}},
			{Type: "pci", Index: "3", Model: "pcie-root-port", Target: &api.ControllerTarget{BusNr: u(3)}},
			{Type: "pci", Index: "4", Model: "pcie-root-port"}, // as libvirt 11.3 reads back: no busNr
			{Type: "virtio-serial", Index: "0", Address: pci("0x03")},
		},
		Interfaces:  []api.Interface{{Address: pci("0x02")}},
		HostDevices: []api.HostDevice{{Type: "pci", Address: pci("0x01")}, {Type: "pci", Address: pci("0x04")}},
	}}
	off, withBusNr, ports := occupiedRootPorts(spec, busFromBusNr)
	if !slices.Equal(off, []int{1, 3}) || withBusNr != 3 || ports != 4 {
		t.Errorf("busNr key: got off=%v withBusNr=%d ports=%d, want [1 3] 3 4 (NIC port 2 stays hotpluggable, port 4 has no busNr)", off, withBusNr, ports)
	}
	// Keyed on the index, port 4 (a hostdev behind it, no busNr) goes off
	// too: what a real libvirt domain looks like, where no root port has a
	// busNr.
	off, withBusNr, ports = occupiedRootPorts(spec, busFromIndex)
	if !slices.Equal(off, []int{1, 3, 4}) || withBusNr != 3 || ports != 4 {
		t.Errorf("index key: got off=%v withBusNr=%d ports=%d, want [1 3 4] 3 4", off, withBusNr, ports)
	}
}

func TestHotplugCounts(t *testing.T) {
	vmi := &v1.VirtualMachineInstance{}
	vmi.Spec.Domain.Devices.Interfaces = []v1.Interface{{Name: "physnet-a"}}
	if n, err := placeholderCount(vmi); err != nil || n != 3 {
		t.Errorf("placeholders with one interface: %d %v, want 3", n, err)
	}
	vmi.Annotations = map[string]string{v1.PciInterfaceSlotCountAnnotation: "6"}
	if n, err := placeholderCount(vmi); err != nil || n != 5 {
		t.Errorf("placeholders with slot total 6: %d %v, want 5", n, err)
	}
	vmi.Annotations = nil
	spec := &api.DomainSpec{Memory: api.Memory{Value: 256 << 20, Unit: "b"}}
	// No PCI devices: max(8-0, 3) - 3 placeholders.
	if n, err := extraControllerCount(vmi, spec, 3); err != nil || n != 5 {
		t.Errorf("extra controllers, small VM: %d %v, want 5", n, err)
	}
	spec.Memory.Value = 4 << 30
	if n, err := extraControllerCount(vmi, spec, 3); err != nil || n != 13 {
		t.Errorf("extra controllers, 4 GiB VM: %d %v, want 13", n, err)
	}
}

// TestNoVirtAPI keeps virt-api out of the launcher: its package
// initializers cost the guest minutes under nested TCG (see the package
// comment). The VMI is rendered on the host by cmd/vmirender instead.
func TestNoVirtAPI(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("find the go command: %v", err)
	}
	out, err := exec.Command(goBin, "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	for _, pkg := range strings.Fields(string(out)) {
		if strings.HasPrefix(pkg, "kubevirt.io/kubevirt/pkg/virt-api") || strings.HasSuffix(pkg, "/internal/launcherpod") || strings.HasSuffix(pkg, "/internal/manifestcheck") {
			t.Errorf("the launcher links %s: render the VMI on the host (cmd/vmirender) instead", pkg)
		}
	}
}

func TestTwinXML(t *testing.T) {
	in := `<domain type='qemu'>
  <name>default_vm</name>
  <uuid>0b5e6a3c-0000-4000-8000-000000000001</uuid>
  <sysinfo type='smbios'>
    <system>
      <entry name='uuid'>0b5e6a3c-0000-4000-8000-000000000001</entry>
    </system>
  </sysinfo>
  <os>
    <type arch='x86_64' machine='pc-q35-10.0'>hvm</type>
    <kernel>/var/run/kubevirt/kernel-boot/vmlinuz</kernel>
    <initrd>/var/run/kubevirt/kernel-boot/initrd.img</initrd>
    <cmdline>console=ttyS0</cmdline>
  </os>
  <devices>
    <controller type='pci' index='5' model='pcie-root-port'>
      <target chassis='5' port='0xc' hotplug='off'/>
    </controller>
    <hostdev mode='subsystem' type='pci' managed='no'>
      <source>
        <address domain='0x0000' bus='0x3b' slot='0x02' function='0x1'/>
      </source>
      <alias name='ua-sriov-physnet-a'/>
      <address type='pci' domain='0x0000' bus='0x06' slot='0x00' function='0x0'/>
    </hostdev>
  </devices>
</domain>
`
	vf, err := findVFHostdev([]byte(in))
	if err != nil {
		t.Fatal(err)
	}
	wantAddr := `<address type='pci' domain='0x0000' bus='0x06' slot='0x00' function='0x0'/>`
	if vf.alias != "ua-sriov-physnet-a" || vf.bus != 6 || vf.address != wantAddr {
		t.Errorf("VF hostdev %+v, want ua-sriov-physnet-a on bus 6 with %s", vf, wantAddr)
	}
	out, err := twinXML([]byte(in), "default_vm-src", "11111111-2222-4333-8444-555555555555", vf, "<interface/>", "/fw/a:/fw/b")
	if err != nil {
		t.Fatal(err)
	}
	want := `<domain type='qemu' xmlns:qemu="http://libvirt.org/schemas/domain/qemu/1.0">
  <name>default_vm-src</name>
  <uuid>11111111-2222-4333-8444-555555555555</uuid>
  <sysinfo type='smbios'>
    <system>
      <entry name='uuid'>11111111-2222-4333-8444-555555555555</entry>
    </system>
  </sysinfo>
  <os>
    <type arch='x86_64' machine='pc-q35-10.0'>hvm</type>
    
    
    
  </os>
  <devices>
    <controller type='pci' index='5' model='pcie-root-port'>
      <target chassis='5' port='0xc' hotplug='off'/>
    </controller>
    <interface/>
  </devices>
<qemu:commandline><qemu:arg value="-L"/><qemu:arg value="/fw/a"/><qemu:arg value="-L"/><qemu:arg value="/fw/b"/></qemu:commandline></domain>
`
	if out != want {
		t.Errorf("twin\n%s\nwant\n%s", out, want)
	}
	if _, err := findVFHostdev([]byte(strings.Replace(in, wantAddr, "", 1))); err == nil {
		t.Errorf("a VF hostdev without a guest address was accepted")
	}
}
