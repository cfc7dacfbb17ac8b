// Package hostdev builds the libvirt <hostdev> of a VFIO VF exactly as
// KubeVirt writes an SR-IOV interface (kubevirt.io/kubevirt v1.9.0
// pkg/virt-launcher/virtwrap/device/hostdevice/sriov/hostdev.go), so the binding sidecar
// (at VM start) and the migration attacher (after live migration) plug the
// same device.
package hostdev

import (
	"fmt"

	"libvirt.org/go/libvirtxml"

	"github.com/vfnet-io/vfnet/pkg/contract/pciaddr"
)

// AliasPrefix is the alias prefix of every hostdev vfnet writes. It is the
// one KubeVirt uses for its own SR-IOV hostdevs ("ua-" marks a user alias,
// "sriov-" makes KubeVirt's source launcher detach the device before a live
// migration).
const AliasPrefix = "ua-sriov-"

// Alias is the libvirt alias of the hostdev for VMI interface iface.
func Alias(iface string) string { return AliasPrefix + iface }

// Spec is one VF for one VMI interface.
type Spec struct {
	// Interface is the VMI interface name; the alias is ua-sriov-<Interface>.
	Interface string
	// Source is the host VF, already bound to vfio-pci. It must pass
	// pciaddr's rule (Address.Check): QEMU opens no host device beyond
	// domain ffff.
	Source pciaddr.Address
	// Guest is the guest PCI address (VMI interface pciAddress), if set.
	Guest *pciaddr.Address
	// BootOrder is the VMI interface bootOrder, if set.
	BootOrder *uint
}

// Element returns the hostdev: managed='no' (vfnet-driver bound the VF to
// vfio-pci), source address, alias, optional guest address and boot order.
// It carries no MAC: the driver set it on the PF.
func (s Spec) Element() *libvirtxml.DomainHostdev {
	h := &libvirtxml.DomainHostdev{
		Managed: "no",
		SubsysPCI: &libvirtxml.DomainHostdevSubsysPCI{
			Source: &libvirtxml.DomainHostdevSubsysPCISource{Address: pciAddress(s.Source)},
		},
		Alias: &libvirtxml.DomainAlias{Name: Alias(s.Interface)},
	}
	if s.Guest != nil {
		h.Address = &libvirtxml.DomainAddress{PCI: pciAddress(*s.Guest)}
	}
	if s.BootOrder != nil {
		h.Boot = &libvirtxml.DomainDeviceBoot{Order: *s.BootOrder}
	}
	return h
}

// XML renders Element as libvirt XML, after checking the addresses.
func (s Spec) XML() (string, error) {
	if s.Interface == "" {
		return "", fmt.Errorf("hostdev for VF %s: interface name is empty", s.Source)
	}
	if err := s.Source.Check(); err != nil {
		return "", fmt.Errorf("hostdev for interface %q: source VF %s: %w", s.Interface, s.Source, err)
	}
	if s.Guest != nil {
		if err := s.Guest.Check(); err != nil {
			return "", fmt.Errorf("hostdev for interface %q: guest address %s: %w; fix the interface's pciAddress", s.Interface, s.Guest, err)
		}
	}
	x, err := s.Element().Marshal()
	if err != nil {
		return "", fmt.Errorf("render hostdev for interface %q (VF %s): %w", s.Interface, s.Source, err)
	}
	return x, nil
}

func pciAddress(a pciaddr.Address) *libvirtxml.DomainAddressPCI {
	return &libvirtxml.DomainAddressPCI{Domain: &a.Domain, Bus: &a.Bus, Slot: &a.Slot, Function: &a.Function}
}
