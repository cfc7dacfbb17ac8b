// Package hostdev builds the libvirt <hostdev> of a VFIO VF exactly as
// KubeVirt writes an SR-IOV interface (contract §4), so the binding sidecar
// (at VM start) and the migration attacher (after live migration) plug the
// same device.
//
// The element is a small struct of its own rather than libvirt.org/go/libvirtxml's
// DomainHostdev: linking libvirtxml's domain model (a thousand types and
// their XML methods) cost each program ~0.5 MB of binary, most of it
// resident. TestElementMatchesLibvirtxml pins the output to libvirtxml's,
// byte for byte.
package hostdev

import (
	"encoding/xml"
	"fmt"

	"github.com/vfnet-io/vfnet/pkg/pciaddr"
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
	// Source is the host VF, already bound to vfio-pci.
	Source pciaddr.Address
	// Guest is the guest PCI address (VMI interface pciAddress), if set.
	Guest *pciaddr.Address
	// BootOrder is the VMI interface bootOrder, if set.
	BootOrder *uint
}

// Element is a <hostdev mode="subsystem" type="pci"> for encoding/xml, in
// libvirt's element and attribute order.
type Element struct {
	XMLName xml.Name      `xml:"hostdev"`
	Mode    string        `xml:"mode,attr"`
	Type    string        `xml:"type,attr"`
	Managed string        `xml:"managed,attr,omitempty"`
	Source  elementSource `xml:"source"`
	Boot    *elementBoot  `xml:"boot"`
	Alias   elementAlias  `xml:"alias"`
	Address *PCIAddress   `xml:"address"`
}

type elementSource struct {
	Address PCIAddress `xml:"address"`
}

type elementBoot struct {
	Order uint `xml:"order,attr"`
}

type elementAlias struct {
	Name string `xml:"name,attr"`
}

// PCIAddress is a libvirt PCI <address>, numbers in libvirt's hex forms.
type PCIAddress struct {
	Type     string `xml:"type,attr,omitempty"`
	Domain   string `xml:"domain,attr"`
	Bus      string `xml:"bus,attr"`
	Slot     string `xml:"slot,attr"`
	Function string `xml:"function,attr"`
}

// Element returns the hostdev: managed='no' (vfnet-driver bound the VF to
// vfio-pci), source address, alias, optional guest address and boot order.
// It carries no MAC: the driver set it on the PF.
func (s Spec) Element() *Element {
	h := &Element{
		Mode: "subsystem", Type: "pci", Managed: "no",
		Source: elementSource{Address: pciAddress(s.Source, "")},
		Alias:  elementAlias{Name: Alias(s.Interface)},
	}
	if s.Guest != nil {
		a := pciAddress(*s.Guest, "pci")
		h.Address = &a
	}
	if s.BootOrder != nil {
		h.Boot = &elementBoot{Order: *s.BootOrder}
	}
	return h
}

// XML renders Element as libvirt XML, indented by two spaces.
func (s Spec) XML() (string, error) {
	if s.Interface == "" {
		return "", fmt.Errorf("hostdev for VF %s: interface name is empty", s.Source)
	}
	x, err := xml.MarshalIndent(s.Element(), "", "  ")
	if err != nil {
		return "", fmt.Errorf("render hostdev for interface %q (VF %s): %w", s.Interface, s.Source, err)
	}
	return string(x), nil
}

func pciAddress(a pciaddr.Address, typ string) PCIAddress {
	return PCIAddress{Type: typ,
		Domain: fmt.Sprintf("0x%04x", a.Domain), Bus: fmt.Sprintf("0x%02x", a.Bus),
		Slot: fmt.Sprintf("0x%02x", a.Slot), Function: fmt.Sprintf("0x%x", a.Function)}
}
