package domain

import (
	"bytes"
	"encoding/xml"
	"strings"
	"testing"

	vfhostdev "github.com/vfnet-io/vfnet/pkg/contract/hostdev"
	"github.com/vfnet-io/vfnet/pkg/contract/pciaddr"
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

// A cached hostdev is byte for byte what marshalling writes, for every
// layout it is cached under, on the first call and on repeated ones; specs
// that differ in any field do not share an entry.
func TestHostdevCacheMatchesMarshal(t *testing.T) {
	t.Parallel()
	var hs []hostdev
	for i, bdf := range []string{"0000:3b:02.0", "0000:3b:02.1", "0000:3b:02.1"} {
		src, err := pciaddr.Parse(bdf)
		if err != nil {
			t.Fatal(err)
		}
		spec := vfhostdev.Spec{Interface: "n" + bdf[len(bdf)-1:], Source: src}
		if i == 2 { // same interface and VF as [1], plus boot order
			spec.BootOrder = new(uint(3))
		}
		el := spec.Element()
		hs = append(hs, hostdev{alias: el.Alias.Name, el: el, key: keyOf(spec)})
	}
	docs := []string{
		"<domain>\n  <devices>\n    <disk/>\n  </devices>\n</domain>",
		"<domain><devices><disk/></devices></domain>",
		"<domain>\n\t<devices>\n\t\t<disk/>\n\t</devices>\n</domain>",
	}
	cache := NewHostdevCache()
	for _, d := range docs {
		for _, want := range [][]hostdev{hs[:2], {hs[0], hs[2]}} {
			doc, err := scan([]byte(d))
			if err != nil {
				t.Fatal(err)
			}
			plain, err := doc.splice([]byte(d), want, nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			for call := range 2 {
				got, err := doc.splice([]byte(d), want, cache, nil)
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(got, plain) {
					t.Fatalf("call %d with cache:\n%s\nwithout:\n%s", call, got, plain)
				}
			}
		}
	}
	// 3 specs x 3 layouts (two pretty indents, one compact).
	if n := len(cache.m); n != 9 {
		t.Errorf("%d cache entries, want 9", n)
	}
	for i := range maxCachedHostdevs + 10 {
		cache.put(cacheKey{prefix: strings.Repeat(" ", i)}, []byte("x"))
	}
	if n := len(cache.m); n > maxCachedHostdevs {
		t.Errorf("cache holds %d entries, bound is %d", n, maxCachedHostdevs)
	}
}
