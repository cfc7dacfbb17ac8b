package compat

import (
	"encoding/xml"
	"fmt"
	"sort"
	"strconv"
	"strings"

	v1 "kubevirt.io/api/core/v1"

	drautil "kubevirt.io/kubevirt/pkg/dra"
	"kubevirt.io/kubevirt/pkg/network/deviceinfo"
	"kubevirt.io/kubevirt/pkg/network/vmispec"
	"kubevirt.io/kubevirt/pkg/virt-launcher/virtwrap/api"
	"kubevirt.io/kubevirt/pkg/virt-launcher/virtwrap/device"
)

// kubeVirtSRIOVHostDevices is the reference: the hostdevs KubeVirt v1.9.0's
// virt-launcher builds for DRA-backed SR-IOV interfaces (binding
// `sriov: {}`) reading the same metadata. It follows
// pkg/virt-launcher/virtwrap/device/hostdevice/sriov CreateDRAHostDevices
// step by step with KubeVirt's own pieces (pkg/dra's metadata reader, its
// PCI address parser, alias constructor and alias prefix). That function
// itself cannot be called here: its package links libvirt through cgo
// (libvirt.org/go/libvirt), which this module must build without.
func kubeVirtSRIOVHostDevices(vmi *v1.VirtualMachineInstance, bindingName, metadataRoot string) ([]api.HostDevice, error) {
	networks := vmispec.IndexNetworkSpecByName(vmi.Spec.Networks)
	var devs []api.HostDevice
	for _, iface := range vmi.Spec.Domain.Devices.Interfaces {
		if iface.Binding == nil || iface.Binding.Name != bindingName {
			continue
		}
		net, ok := networks[iface.Name]
		if !ok || !vmispec.IsDRANetwork(net) {
			return nil, fmt.Errorf("interface %s has no DRA network", iface.Name)
		}
		claim, request := net.ResourceClaim.ClaimName, net.ResourceClaim.RequestName
		bdf, err := drautil.GetPCIAddressForClaim(metadataRoot, vmi.Spec.ResourceClaims, claim, request)
		if err != nil {
			return nil, fmt.Errorf("KubeVirt's pkg/dra reader, interface %s: %w", iface.Name, err)
		}
		hostAddr, err := device.NewPciAddressField(bdf)
		if err != nil {
			return nil, fmt.Errorf("interface %s host address %s: %w", iface.Name, bdf, err)
		}
		hd := api.HostDevice{
			Alias:   api.NewUserDefinedAlias(deviceinfo.SRIOVAliasPrefix + iface.Name),
			Source:  api.HostDeviceSource{Address: hostAddr},
			Type:    api.HostDevicePCI,
			Managed: "no",
		}
		if iface.PciAddress != "" {
			if hd.Address, err = device.NewPciAddressField(iface.PciAddress); err != nil {
				return nil, fmt.Errorf("interface %s guest address: %w", iface.Name, err)
			}
		}
		if iface.BootOrder != nil {
			hd.BootOrder = &api.BootOrder{Order: *iface.BootOrder}
		}
		devs = append(devs, hd)
	}
	return devs, nil
}

// sriovHostDevices parses domain XML the way virt-launcher does after the
// hooks ran (xml.Unmarshal into api.DomainSpec) and returns the hostdevs
// whose alias carries KubeVirt's SR-IOV prefix.
func sriovHostDevices(domainXML []byte) ([]api.HostDevice, error) {
	var spec api.DomainSpec
	if err := xml.Unmarshal(domainXML, &spec); err != nil {
		return nil, fmt.Errorf("virt-launcher cannot unmarshal the domain into api.DomainSpec: %w", err)
	}
	var out []api.HostDevice
	for _, hd := range spec.Devices.HostDevices {
		if hd.Alias != nil && strings.HasPrefix(hd.Alias.GetName(), deviceinfo.SRIOVAliasPrefix) {
			out = append(out, hd)
		}
	}
	return out, nil
}

// normalizeHostDevices makes two hostdev lists comparable: sorted by alias,
// XMLName cleared (set only by unmarshal), PCI address numbers in one
// spelling, and two spellings libvirt reads identically made one:
//   - mode "subsystem": libvirt's default for a PCI hostdev; vfnet writes it,
//     KubeVirt omits it;
//   - type "pci" on the host-side <source><address>: KubeVirt writes it,
//     libvirtxml (which the product must use) never does, and libvirt's
//     parser and schema take a PCI hostdev's source address as PCI without
//     it (libvirt's own documentation example has none).
//
// The guest-side <address> is compared as written.
func normalizeHostDevices(devs []api.HostDevice) []api.HostDevice {
	out := make([]api.HostDevice, len(devs))
	for i, d := range devs {
		d = *d.DeepCopy()
		d.XMLName = xml.Name{}
		if d.Mode == "" {
			d.Mode = "subsystem"
		}
		d.Source.Address = normalizeAddress(d.Source.Address)
		if d.Source.Address != nil && d.Source.Address.Type == "" {
			d.Source.Address.Type = "pci"
		}
		d.Address = normalizeAddress(d.Address)
		out[i] = d
	}
	sort.Slice(out, func(i, j int) bool { return aliasName(out[i]) < aliasName(out[j]) })
	return out
}

func aliasName(d api.HostDevice) string {
	if d.Alias == nil {
		return ""
	}
	return d.Alias.GetName()
}

func normalizeAddress(a *api.Address) *api.Address {
	if a == nil {
		return nil
	}
	c := *a
	for _, f := range []*string{&c.Domain, &c.Bus, &c.Slot, &c.Function} {
		if n, err := strconv.ParseUint(*f, 0, 32); err == nil {
			*f = "0x" + strconv.FormatUint(n, 16)
		}
	}
	return &c
}

func describe(devs []api.HostDevice) string {
	var b strings.Builder
	for _, d := range devs {
		x, _ := xml.Marshal(d)
		b.Write(x)
		b.WriteString("\n")
	}
	return b.String()
}

// bdfAddress turns "0000:3b:02.1" into a PCI address field.
func bdfAddress(t interface{ Fatalf(string, ...any) }, bdf string) *api.Address {
	addr, err := device.NewPciAddressField(bdf)
	if err != nil {
		t.Fatalf("parse %s: %v", bdf, err)
	}
	return addr
}
