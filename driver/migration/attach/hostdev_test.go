package attach

import (
	"fmt"
	"reflect"
	"testing"

	"libvirt.org/go/libvirtxml"
)

// libvirtxmlLiveDomain is parseLiveDomain as it was written with
// libvirtxml's domain model, the reference for the small parser.
func libvirtxmlLiveDomain(t *testing.T, domXML string) liveDomain {
	t.Helper()
	var d libvirtxml.Domain
	if err := d.Unmarshal(domXML); err != nil {
		t.Fatal(err)
	}
	ld := liveDomain{aliases: map[string]bool{}, sources: map[PCIAddress]string{}}
	if d.Devices != nil {
		for _, hd := range d.Devices.Hostdevs {
			alias := ""
			if hd.Alias != nil {
				alias = hd.Alias.Name
				ld.aliases[alias] = true
			}
			if hd.SubsysPCI != nil && hd.SubsysPCI.Source != nil && hd.SubsysPCI.Source.Address != nil {
				a := hd.SubsysPCI.Source.Address
				if a.Domain != nil && a.Bus != nil && a.Slot != nil && a.Function != nil {
					ld.sources[PCIAddress{Domain: *a.Domain, Bus: *a.Bus, Slot: *a.Slot, Function: *a.Function}] = alias
				}
			}
		}
	}
	if d.Memory != nil {
		ld.memoryBytes = scaled(d.Memory.Value, d.Memory.Unit)
	}
	if d.MaximumMemory != nil {
		ld.memoryBytes = max(ld.memoryBytes, scaled(d.MaximumMemory.Value, d.MaximumMemory.Unit))
	}
	return ld
}

// TestParseLiveDomainMatchesLibvirtxml: the small parser reads the same
// hostdev aliases, PCI sources and memory size as libvirtxml's domain model,
// for domains libvirtxml writes (PCI, USB and mdev hostdevs, hostdevs
// without alias, memory in every unit, with and without maxMemory) and for
// KubeVirt-style documents with namespaced extra elements.
func TestParseLiveDomainMatchesLibvirtxml(t *testing.T) {
	t.Parallel()
	units := []string{"", "b", "KiB", "k", "KB", "MiB", "MB", "GiB", "G", "GB", "TiB", "TB"}
	for i := range 300 {
		u := func(v uint) *uint { return &v }
		d := libvirtxml.Domain{Type: "kvm", Name: fmt.Sprintf("ns_vm%d", i),
			Memory:  &libvirtxml.DomainMemory{Value: uint(1+i) * 1024, Unit: units[i%len(units)]},
			Devices: &libvirtxml.DomainDeviceList{}}
		if i%3 == 0 {
			d.MaximumMemory = &libvirtxml.DomainMaxMemory{Value: uint(7+i) * 4096, Unit: units[(i/3)%len(units)], Slots: 16}
		}
		for j := range i % 5 {
			hd := libvirtxml.DomainHostdev{Managed: "no"}
			switch (i + j) % 4 {
			case 0, 1:
				hd.SubsysPCI = &libvirtxml.DomainHostdevSubsysPCI{Source: &libvirtxml.DomainHostdevSubsysPCISource{
					Address: &libvirtxml.DomainAddressPCI{Domain: u(uint(i % 2)), Bus: u(uint(0x3b + j)), Slot: u(uint(i % 32)), Function: u(uint(j % 8))}}}
			case 2:
				hd.SubsysUSB = &libvirtxml.DomainHostdevSubsysUSB{Source: &libvirtxml.DomainHostdevSubsysUSBSource{
					Address: &libvirtxml.DomainAddressUSB{Bus: u(1), Device: u(uint(j))}}}
			case 3:
				hd.SubsysMDev = &libvirtxml.DomainHostdevSubsysMDev{Model: "vfio-pci", Source: &libvirtxml.DomainHostdevSubsysMDevSource{
					Address: &libvirtxml.DomainAddressMDev{UUID: "c2177883-f1bb-47f0-914d-32a22e3a8804"}}}
			}
			if (i+j)%3 != 0 {
				hd.Alias = &libvirtxml.DomainAlias{Name: fmt.Sprintf("ua-sriov-net%d", j)}
			}
			d.Devices.Hostdevs = append(d.Devices.Hostdevs, hd)
		}
		x, err := d.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		got, err := parseLiveDomain(x)
		if err != nil {
			t.Fatalf("case %d: %v\n%s", i, err, x)
		}
		if want := libvirtxmlLiveDomain(t, x); !reflect.DeepEqual(got, want) {
			t.Fatalf("case %d: got %+v, libvirtxml %+v\n%s", i, got, want, x)
		}
	}
	kubevirt := `<domain type="kvm" xmlns:qemu="http://libvirt.org/schemas/domain/qemu/1.0">
  <name>default_vm1</name>
  <memory unit="KiB">2097152</memory>
  <devices>
    <interface type="ethernet"><alias name="ua-default"/></interface>
    <hostdev mode="subsystem" type="pci" managed="no">
      <source><address domain="0x0000" bus="0x3b" slot="0x02" function="0x1"/></source>
      <alias name="ua-sriov-net1"/>
      <address type="pci" domain="0x0000" bus="0x07" slot="0x00" function="0x0"/>
    </hostdev>
  </devices>
  <qemu:commandline><qemu:arg value="-x"/></qemu:commandline>
</domain>`
	got, err := parseLiveDomain(kubevirt)
	if err != nil {
		t.Fatal(err)
	}
	if want := libvirtxmlLiveDomain(t, kubevirt); !reflect.DeepEqual(got, want) || got.memoryBytes != 2<<30 || got.sources[PCIAddress{Bus: 0x3b, Slot: 2, Function: 1}] != "ua-sriov-net1" {
		t.Fatalf("got %+v, libvirtxml %+v", got, want)
	}
	if _, err := parseLiveDomain(`<domain><devices><hostdev mode="subsystem" type="pci"><source><address domain="0x0000" bus="zz" slot="0x02" function="0x1"/></source></hostdev></devices></domain>`); err == nil {
		t.Error("a malformed source address parsed")
	}
}
