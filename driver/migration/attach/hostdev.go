// Package attach puts a prepared VFIO VF back into a running KubeVirt domain
// after live migration: it reaches the launcher pod's libvirt session daemon
// from the node, raises QEMU's locked-memory limit and hot-plugs the VF as the
// same <hostdev> the vfnet binding writes at VM start.
package attach

import (
	"fmt"
	"strings"

	"libvirt.org/go/libvirtxml"

	"github.com/vfnet-io/vfnet/pkg/pciaddr"
)

// AliasPrefix is the alias prefix KubeVirt uses for SR-IOV hostdevs; the
// source launcher detaches every hostdev with it before migrating.
const AliasPrefix = "ua-sriov-"

// Alias returns the libvirt alias of the hostdev for a VMI interface.
func Alias(iface string) string { return AliasPrefix + iface }

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

// Hostdev is one VF to attach for one VMI interface.
type Hostdev struct {
	// Interface is the VMI interface name; the alias is ua-sriov-<Interface>.
	Interface string
	// Source is the host VF, already bound to vfio-pci.
	Source PCIAddress
	// Guest is the guest PCI address (VMI interface pciAddress), if set.
	Guest *PCIAddress
	// BootOrder is the VMI interface bootOrder, if set.
	BootOrder *uint
}

// XML renders the hostdev exactly as KubeVirt writes an SR-IOV VF
// (contract §4): managed='no', source address, alias, optional guest address
// and boot order. A hostdev carries no MAC: the driver set it on the PF.
func (h Hostdev) XML() (string, error) {
	if h.Interface == "" {
		return "", fmt.Errorf("hostdev for VF %s: interface name is empty", h.Source)
	}
	u := func(v uint) *uint { return &v }
	hd := libvirtxml.DomainHostdev{
		Managed: "no",
		SubsysPCI: &libvirtxml.DomainHostdevSubsysPCI{
			Source: &libvirtxml.DomainHostdevSubsysPCISource{
				Address: &libvirtxml.DomainAddressPCI{
					Domain: u(h.Source.Domain), Bus: u(h.Source.Bus),
					Slot: u(h.Source.Slot), Function: u(h.Source.Function),
				},
			},
		},
		Alias: &libvirtxml.DomainAlias{Name: Alias(h.Interface)},
	}
	if h.Guest != nil {
		hd.Address = &libvirtxml.DomainAddress{PCI: &libvirtxml.DomainAddressPCI{
			Domain: u(h.Guest.Domain), Bus: u(h.Guest.Bus),
			Slot: u(h.Guest.Slot), Function: u(h.Guest.Function),
		}}
	}
	if h.BootOrder != nil {
		hd.Boot = &libvirtxml.DomainDeviceBoot{Order: *h.BootOrder}
	}
	s, err := hd.Marshal()
	if err != nil {
		return "", fmt.Errorf("render hostdev for interface %q (VF %s): %w", h.Interface, h.Source, err)
	}
	return s, nil
}

// liveDomain is what the attach logic needs from a domain's live XML.
type liveDomain struct {
	aliases map[string]bool
	sources map[PCIAddress]string // host PCI source -> alias
	// memoryBytes is the most guest memory the domain can have (maxMemory
	// if hotplug is configured, else memory).
	memoryBytes uint64
}

func parseLiveDomain(domXML string) (liveDomain, error) {
	var d libvirtxml.Domain
	if err := d.Unmarshal(domXML); err != nil {
		return liveDomain{}, fmt.Errorf("parse live domain XML: %w", err)
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
		if m := scaled(d.MaximumMemory.Value, d.MaximumMemory.Unit); m > ld.memoryBytes {
			ld.memoryBytes = m
		}
	}
	return ld, nil
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
