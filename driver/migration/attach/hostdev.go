// Package attach puts a prepared VFIO VF back into a running KubeVirt domain
// after live migration: it reaches the launcher pod's libvirt session daemon
// from the node, raises QEMU's locked-memory limit and hot-plugs the VF as the
// same <hostdev> the vfnet binding writes at VM start.
package attach

import (
	"fmt"
	"strings"

	"libvirt.org/go/libvirtxml"

	"github.com/vfnet-io/vfnet/pkg/contract/hostdev"
	"github.com/vfnet-io/vfnet/pkg/contract/pciaddr"
)

// AliasPrefix is the alias prefix KubeVirt uses for SR-IOV hostdevs; the
// source launcher detaches every hostdev with it before migrating.
const AliasPrefix = hostdev.AliasPrefix

// Alias returns the libvirt alias of the hostdev for a VMI interface.
func Alias(iface string) string { return hostdev.Alias(iface) }

// Hostdev is one VF to attach for one VMI interface; its XML is the same
// <hostdev> the vfnet binding writes at VM start.
type Hostdev = hostdev.Spec

// liveDomain is what the attach logic needs from a domain's live XML.
type liveDomain struct {
	aliases map[string]bool
	sources map[pciaddr.Address]string // host PCI source -> alias
	// memoryBytes is the most guest memory the domain can have (maxMemory
	// if hotplug is configured, else memory).
	memoryBytes uint64
}

func parseLiveDomain(domXML string) (liveDomain, error) {
	var d libvirtxml.Domain
	if err := d.Unmarshal(domXML); err != nil {
		return liveDomain{}, fmt.Errorf("parse live domain XML: %w", err)
	}
	ld := liveDomain{aliases: map[string]bool{}, sources: map[pciaddr.Address]string{}}
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
					ld.sources[pciaddr.Address{Domain: *a.Domain, Bus: *a.Bus, Slot: *a.Slot, Function: *a.Function}] = alias
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
