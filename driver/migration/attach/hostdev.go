// Package attach puts a prepared VFIO VF back into a running KubeVirt domain
// after live migration: it reaches the launcher pod's libvirt session daemon
// from the node, raises QEMU's locked-memory limit and hot-plugs the VF as the
// same <hostdev> the vfnet binding writes at VM start.
package attach

import (
	"encoding/xml"
	"fmt"
	"strconv"
	"strings"

	"github.com/vfnet-io/vfnet/pkg/hostdev"
	"github.com/vfnet-io/vfnet/pkg/pciaddr"
)

// AliasPrefix is the alias prefix KubeVirt uses for SR-IOV hostdevs; the
// source launcher detaches every hostdev with it before migrating.
const AliasPrefix = hostdev.AliasPrefix

// Alias returns the libvirt alias of the hostdev for a VMI interface.
func Alias(iface string) string { return hostdev.Alias(iface) }

// PCIAddress is a PCI domain:bus:slot.function.
type PCIAddress = pciaddr.Address

// ParsePCIAddress parses "0000:3b:02.1" (the form of VMI pciAddress and of
// resource.kubernetes.io/pciBusID).
func ParsePCIAddress(s string) (PCIAddress, error) {
	a, err := pciaddr.Parse(s)
	if err != nil {
		return PCIAddress{}, fmt.Errorf("PCI address %q: %w", s, err)
	}
	return a, nil
}

// Hostdev is one VF to attach for one VMI interface; its XML is the same
// <hostdev> the vfnet binding writes at VM start.
type Hostdev = hostdev.Spec

// liveDomain is what the attach logic needs from a domain's live XML.
type liveDomain struct {
	aliases map[string]bool
	sources map[PCIAddress]string // host PCI source -> alias
	// memoryBytes is the most guest memory the domain can have (maxMemory
	// if hotplug is configured, else memory).
	memoryBytes uint64
}

// liveXML is the part of a libvirt domain parseLiveDomain reads (a few
// fields instead of libvirtxml's whole domain model, see pkg/hostdev).
type liveXML struct {
	Memory    *memoryXML   `xml:"memory"`
	MaxMemory *memoryXML   `xml:"maxMemory"`
	Hostdevs  []hostdevXML `xml:"devices>hostdev"`
}

type memoryXML struct {
	Unit  string `xml:"unit,attr"`
	Value string `xml:",chardata"`
}

type hostdevXML struct {
	Mode   string `xml:"mode,attr"`
	Type   string `xml:"type,attr"`
	Source *struct {
		Address *pciXML `xml:"address"`
	} `xml:"source"`
	Alias *struct {
		Name string `xml:"name,attr"`
	} `xml:"alias"`
}

type pciXML struct {
	Domain   *string `xml:"domain,attr"`
	Bus      *string `xml:"bus,attr"`
	Slot     *string `xml:"slot,attr"`
	Function *string `xml:"function,attr"`
}

func parseLiveDomain(domXML string) (liveDomain, error) {
	var d liveXML
	if err := xml.Unmarshal([]byte(domXML), &d); err != nil {
		return liveDomain{}, fmt.Errorf("parse live domain XML: %w", err)
	}
	ld := liveDomain{aliases: map[string]bool{}, sources: map[PCIAddress]string{}}
	for _, hd := range d.Hostdevs {
		alias := ""
		if hd.Alias != nil {
			alias = hd.Alias.Name
			ld.aliases[alias] = true
		}
		if hd.Mode != "subsystem" || hd.Type != "pci" || hd.Source == nil || hd.Source.Address == nil {
			continue
		}
		a, err := hd.Source.Address.parse()
		if err != nil {
			return liveDomain{}, fmt.Errorf("parse live domain XML: hostdev %q source address: %w", alias, err)
		}
		if a != nil {
			ld.sources[*a] = alias
		}
	}
	for _, m := range []*memoryXML{d.Memory, d.MaxMemory} {
		if m == nil {
			continue
		}
		v, err := strconv.ParseUint(strings.TrimSpace(m.Value), 10, 64)
		if err != nil {
			return liveDomain{}, fmt.Errorf("parse live domain XML: memory %q: %w", m.Value, err)
		}
		ld.memoryBytes = max(ld.memoryBytes, scaled(uint(v), m.Unit))
	}
	return ld, nil
}

// parse reads libvirt's hex attributes ("0x3b", the 0x optional); nil when
// one is missing.
func (p *pciXML) parse() (*PCIAddress, error) {
	var out [4]uint
	for i, s := range []*string{p.Domain, p.Bus, p.Slot, p.Function} {
		if s == nil {
			return nil, nil
		}
		v, err := strconv.ParseUint(strings.TrimPrefix(*s, "0x"), 16, 64)
		if err != nil {
			return nil, err
		}
		out[i] = uint(v)
	}
	return &PCIAddress{Domain: out[0], Bus: out[1], Slot: out[2], Function: out[3]}, nil
}

// scaled converts a libvirt memory value to bytes; libvirt's default unit is KiB.
func scaled(v uint, unit string) uint64 {
	switch strings.ToLower(unit) {
	case "b", "bytes":
		return uint64(v)
	case "", "k", "kib":
		return uint64(v) << 10
	case "kb":
		return uint64(v) * 1000
	case "m", "mib":
		return uint64(v) << 20
	case "mb":
		return uint64(v) * 1000 * 1000
	case "g", "gib":
		return uint64(v) << 30
	case "gb":
		return uint64(v) * 1000 * 1000 * 1000
	case "t", "tib":
		return uint64(v) << 40
	case "tb":
		return uint64(v) * 1000 * 1000 * 1000 * 1000
	}
	return uint64(v) << 10
}
