package hostdev_test

import (
	"bytes"
	"encoding/xml"
	"strings"
	"testing"

	"libvirt.org/go/libvirtxml"
	"sigs.k8s.io/randfill"

	"github.com/vfnet-io/vfnet/pkg/hostdev"
	"github.com/vfnet-io/vfnet/pkg/pciaddr"
)

func TestXML(t *testing.T) {
	t.Parallel()
	src := pciaddr.Address{Bus: 0x3b, Slot: 2, Function: 1}
	got, err := hostdev.Spec{Interface: "dra-net", Source: src}.XML()
	if err != nil {
		t.Fatal(err)
	}
	want := `<hostdev mode="subsystem" type="pci" managed="no">
  <source>
    <address domain="0x0000" bus="0x3b" slot="0x02" function="0x1"></address>
  </source>
  <alias name="ua-sriov-dra-net"></alias>
</hostdev>`
	if got != want {
		t.Errorf("XML() =\n%s\nwant\n%s", got, want)
	}

	guest := pciaddr.Address{Bus: 7, Slot: 0x1f}
	got, err = hostdev.Spec{Interface: "n", Source: src, Guest: &guest, BootOrder: new(uint(3))}.XML()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{`<boot order="3"></boot>`, `<alias name="ua-sriov-n"></alias>`,
		`<address type="pci" domain="0x0000" bus="0x07" slot="0x1f" function="0x0"></address>`} {
		if !strings.Contains(got, s) {
			t.Errorf("XML() =\n%s\nwant it to contain %s", got, s)
		}
	}

	if _, err := (hostdev.Spec{Source: src}).XML(); err == nil || !strings.Contains(err.Error(), "0000:3b:02.1") {
		t.Errorf("empty interface: err = %v, want an error naming the VF", err)
	}
}

// libvirtxmlElement is the hostdev as libvirt.org/go/libvirtxml models it,
// which vfnet rendered with before Element.
func libvirtxmlElement(s hostdev.Spec) *libvirtxml.DomainHostdev {
	addr := func(a pciaddr.Address) *libvirtxml.DomainAddressPCI {
		return &libvirtxml.DomainAddressPCI{Domain: &a.Domain, Bus: &a.Bus, Slot: &a.Slot, Function: &a.Function}
	}
	h := &libvirtxml.DomainHostdev{
		Managed: "no",
		SubsysPCI: &libvirtxml.DomainHostdevSubsysPCI{
			Source: &libvirtxml.DomainHostdevSubsysPCISource{Address: addr(s.Source)},
		},
		Alias: &libvirtxml.DomainAlias{Name: hostdev.Alias(s.Interface)},
	}
	if s.Guest != nil {
		h.Address = &libvirtxml.DomainAddress{PCI: addr(*s.Guest)}
	}
	if s.BootOrder != nil {
		h.Boot = &libvirtxml.DomainDeviceBoot{Order: *s.BootOrder}
	}
	return h
}

// TestElementMatchesLibvirtxml: Element encodes byte for byte as
// libvirtxml's DomainHostdev, compact and indented, for random specs
// (names with characters XML escapes, addresses beyond the usual widths).
func TestElementMatchesLibvirtxml(t *testing.T) {
	t.Parallel()
	f := randfill.NewWithSeed(7).NilChance(0.4)
	for i := range 2000 {
		var s hostdev.Spec
		f.Fill(&s.Interface)
		f.Fill(&s.BootOrder)
		f.Fill(&s.Guest)
		s.Source = pciaddr.Address{Domain: uint(i % 3 * 0x10001), Bus: uint(i % 300), Slot: uint(i % 33), Function: uint(i % 9)}
		if i%5 == 0 {
			f.Fill(&s.Source)
		}
		if s.Interface == "" {
			s.Interface = "n"
		}
		got, err := s.XML()
		if err != nil {
			t.Fatal(err)
		}
		want, err := libvirtxmlElement(s).Marshal()
		if err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Fatalf("case %d: XML()\n%s\nlibvirtxml\n%s", i, got, want)
		}
		c1, err1 := xml.Marshal(s.Element())
		c2, err2 := xml.Marshal(libvirtxmlElement(s))
		if err1 != nil || err2 != nil || !bytes.Equal(c1, c2) {
			t.Fatalf("case %d: compact\n%s (%v)\nlibvirtxml\n%s (%v)", i, c1, err1, c2, err2)
		}
	}
}
