package domain

import (
	"bytes"
	"encoding/xml"
	"testing"

	vfhostdev "github.com/vfnet-io/vfnet/pkg/hostdev"
	"github.com/vfnet-io/vfnet/pkg/pciaddr"
)

// One encoder for all hostdevs of a call writes what a separate
// xml.MarshalIndent / xml.Marshal per hostdev wrote.
func TestMarshallerMatchesMarshalIndent(t *testing.T) {
	t.Parallel()
	var hs []hostdev
	for i, bdf := range []string{"0000:3b:02.0", "0000:3b:02.1", "0000:af:1f.7"} {
		src, err := pciaddr.Parse(bdf)
		if err != nil {
			t.Fatal(err)
		}
		spec := vfhostdev.Spec{Interface: "n", Source: src}
		if i == 1 {
			spec.BootOrder = new(uint(2))
			spec.Guest = &src
		}
		el := spec.Element()
		hs = append(hs, hostdev{alias: el.Alias.Name, el: el})
	}
	for _, unit := range []string{"\t", "  "} {
		for _, pretty := range []bool{false, true} {
			m := newMarshaller(unit, pretty)
			for _, prefix := range []string{"", "    ", "\t\t"} {
				for _, h := range hs {
					got, err := m.marshal(h, prefix)
					if err != nil {
						t.Fatal(err)
					}
					var want []byte
					if pretty {
						want, err = xml.MarshalIndent(h.el, prefix, unit)
					} else {
						want, err = xml.Marshal(h.el)
					}
					if err != nil {
						t.Fatal(err)
					}
					if !bytes.Equal(got, want) {
						t.Errorf("unit %q pretty %v prefix %q:\n%s\nwant\n%s", unit, pretty, prefix, got, want)
					}
				}
			}
		}
	}
}
