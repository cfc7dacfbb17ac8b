package hostdev_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/vfnet-io/vfnet/pkg/contract/hostdev"
	"github.com/vfnet-io/vfnet/pkg/contract/pciaddr"
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

// The hostdev the sidecar and the migration attacher write is never one QEMU
// refuses: a source beyond PCI domain ffff (Intel VMD) fails pciaddr's rule.
func TestXMLRefusesVMDDomain(t *testing.T) {
	t.Parallel()
	src := pciaddr.Address{Domain: 0x10000, Bus: 0x3b, Slot: 2, Function: 1}
	_, err := hostdev.Spec{Interface: "dra-net", Source: src}.XML()
	if !errors.Is(err, pciaddr.ErrDomain) || !strings.Contains(err.Error(), `interface "dra-net": source VF 10000:3b:02.1`) {
		t.Errorf("err = %v, want pciaddr.ErrDomain naming the interface and the VF", err)
	}
	bad := pciaddr.Address{Slot: 0x20}
	if _, err := (hostdev.Spec{Interface: "n", Source: pciaddr.Address{Bus: 1}, Guest: &bad}).XML(); err == nil || !strings.Contains(err.Error(), "pciAddress") {
		t.Errorf("guest slot 20: err = %v, want one naming the field to fix", err)
	}
}
