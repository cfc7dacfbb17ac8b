// Package discovery turns the host's SR-IOV model (pkg/sysfs) and the node
// configuration (pkg/nodeconfig) into the list of VFs vfnet-driver offers,
// with their DRA device names and attributes.
//
// What is not offered, and why:
//   - VFs of PFs the node configuration does not select. The configuration is
//     also the admin's tool to keep vfnet away from PFs another SR-IOV stack
//     manages: a node that also runs k8snetworkplumbingwg/dra-driver-sriov
//     (or the SR-IOV device plugin) must not have the same PFs selected in
//     both, or two drivers would hand out the same VF.
//   - VF indexes outside the selector's vfs list.
//   - PFs without a netdev: VF MAC/VLAN/trust are set through the PF netdev,
//     so such a VF could not be prepared.
//   - VFs already bound to vfio-pci that vfnet did not bind itself
//     (Options.Owned): someone else (DPDK, another device plugin, a VM
//     outside Kubernetes) is using them. A VF vfnet prepared is bound to
//     vfio-pci too and stays offered, so allocated devices never vanish
//     from the slices while in use.
package discovery

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/deviceattribute"

	"github.com/vfnet-io/vfnet/pkg/nodeconfig"
	"github.com/vfnet-io/vfnet/pkg/pciaddr"
	"github.com/vfnet-io/vfnet/pkg/sysfs"
)

// DriverName is the DRA driver name; CDIKind the CDI kind of its devices.
const (
	DriverName = "sriov.vfnet.io"
	CDIKind    = DriverName + "/vf"
)

// Attribute names in the vfnet.io domain (fully qualified: the domain is not
// the driver name, so ResourceSlices carry the domain explicitly and CEL
// reads them as device.attributes["vfnet.io"].network).
const (
	AttrNetwork      resourceapi.QualifiedName = "vfnet.io/network"
	AttrPFName       resourceapi.QualifiedName = "vfnet.io/pfName"
	AttrPFPCIAddress resourceapi.QualifiedName = "vfnet.io/pfPciAddress"
	AttrVFIndex      resourceapi.QualifiedName = "vfnet.io/vfIndex"
	AttrVendorID     resourceapi.QualifiedName = "vfnet.io/vendorID"
	AttrDeviceID     resourceapi.QualifiedName = "vfnet.io/deviceID"
	AttrLinkType     resourceapi.QualifiedName = "vfnet.io/linkType"
)

// VFIODriver is the kernel driver a VF is bound to for passthrough.
const VFIODriver = "vfio-pci"

// Device is one VF offered to the cluster.
type Device struct {
	// Name is the DRA device name, vf-<domain>-<bus>-<slot>-<function>.
	Name string
	// Address is the VF's lower-case BDF.
	Address string
	VFIndex int
	// PFAddress and PFName are the parent PF's BDF and netdev name.
	PFAddress string
	PFName    string
	Network   string
	// VendorID and DeviceID are the VF's own PCI IDs.
	VendorID   string
	DeviceID   string
	LinkType   string
	NUMANode   int
	PCIeRoot   string
	IOMMUGroup string
	// Driver is the kernel driver bound at discovery time.
	Driver string
}

// Skipped is a VF or PF that matched the configuration but is not offered.
type Skipped struct {
	Address string
	Reason  string
}

// Result is the outcome of one discovery pass.
type Result struct {
	// Devices are sorted by PF PCI address, then VF index.
	Devices []Device
	Skipped []Skipped
	// Why explains, in one line, why Devices is empty ("" otherwise).
	Why string
}

// Options tunes Build.
type Options struct {
	// Owned reports whether vfnet itself bound the VF at this address to
	// vfio-pci (it has prepared it for a claim). Nil means "none".
	Owned func(vfAddress string) bool
}

// Build selects the VFs to offer. A nil cfg offers nothing. The only error
// is a configuration that matches a PF twice (see nodeconfig.Config.Select).
func Build(pfs []sysfs.PF, cfg *nodeconfig.Config, opts Options) (Result, error) {
	var res Result
	if cfg == nil {
		res.Why = "no node configuration given (--config): publishing no devices; select PFs and their networks in a NodeConfig file"
		return res, nil
	}
	selected, err := cfg.Select(pfs)
	if err != nil {
		return res, err
	}
	if len(selected) == 0 {
		res.Why = fmt.Sprintf("node configuration %s selects none of the %d SR-IOV PFs on this node (%s): publishing no devices", cfg.Source, len(pfs), pfSummary(pfs))
		return res, nil
	}
	// Sorting PFs first keeps the comparisons that parse addresses few.
	slices.SortStableFunc(selected, func(a, b nodeconfig.Selected) int { return CompareBDF(a.PF.Address, b.PF.Address) })
	for _, sel := range selected {
		pf := sel.PF
		start := len(res.Devices)
		if len(pf.NetDevs) == 0 {
			res.Skipped = append(res.Skipped, Skipped{pf.Address, fmt.Sprintf("PF has no netdev (driver %q): VF settings are applied through the PF netdev", pf.Driver)})
			continue
		}
		for _, vf := range pf.VFs {
			if !sel.VFs.Contains(vf.Index) {
				continue
			}
			if vf.Driver == VFIODriver && (opts.Owned == nil || !opts.Owned(vf.Address)) {
				res.Skipped = append(res.Skipped, Skipped{vf.Address, "VF is bound to vfio-pci by someone else than vfnet"})
				continue
			}
			name, err := DeviceName(vf.Address)
			if err != nil {
				res.Skipped = append(res.Skipped, Skipped{vf.Address, err.Error()})
				continue
			}
			numa := vf.NUMANode
			if numa < 0 {
				// A VF lives on its PF's device; the kernel normally copies the node.
				numa = pf.NUMANode
			}
			root := vf.PCIeRoot
			if root == "" {
				root = pf.PCIeRoot
			}
			res.Devices = append(res.Devices, Device{
				Name:       name,
				Address:    vf.Address,
				VFIndex:    vf.Index,
				PFAddress:  pf.Address,
				PFName:     pf.NetDevs[0],
				Network:    sel.Network,
				VendorID:   vf.VendorID,
				DeviceID:   vf.DeviceID,
				LinkType:   pf.LinkType,
				NUMANode:   numa,
				PCIeRoot:   root,
				IOMMUGroup: vf.IOMMUGroup,
				Driver:     vf.Driver,
			})
		}
		slices.SortFunc(res.Devices[start:], func(a, b Device) int { return cmp.Compare(a.VFIndex, b.VFIndex) })
	}
	if len(res.Devices) == 0 {
		res.Why = fmt.Sprintf("node configuration %s selects %d PF(s) but none has an offerable VF (sriov_numvfs=0, vfs filter, or all skipped): publishing no devices", cfg.Source, len(selected))
	}
	return res, nil
}

func pfSummary(pfs []sysfs.PF) string {
	if len(pfs) == 0 {
		return "none"
	}
	parts := make([]string, 0, len(pfs))
	for _, pf := range pfs {
		parts = append(parts, fmt.Sprintf("%s %s %s:%s", pf.Address, strings.Join(pf.NetDevs, ","), pf.VendorID, pf.DeviceID))
	}
	return strings.Join(parts, "; ")
}

// Attributes returns the device's ResourceSlice attributes. The same map is
// what prepare hands to KEP-5304 device metadata.
func (d Device) Attributes() map[resourceapi.QualifiedName]resourceapi.DeviceAttribute {
	attrs := make(map[resourceapi.QualifiedName]resourceapi.DeviceAttribute, 10)
	// Same name and value as deviceattribute.GetPCIBusIDAttribute (a test
	// checks), built directly: the helper compiles a regexp on every call,
	// which made it most of a 1024-VF rescan, and d.Address was validated by
	// DeviceName already.
	bdf := d.Address
	attrs[deviceattribute.StandardDeviceAttributePCIBusID] = resourceapi.DeviceAttribute{StringValue: &bdf}
	if d.PCIeRoot != "" {
		root := d.PCIeRoot
		attrs[deviceattribute.StandardDeviceAttributePCIeRoot] = resourceapi.DeviceAttribute{StringValue: &root}
	}
	// numaNode is left out for -1: it would match every other NUMA-less device.
	if a, err := deviceattribute.GetNUMANodeAttribute(d.NUMANode, deviceattribute.ScalarAttribute); err == nil {
		attrs[a.Name] = a.Value
	}
	str := func(name resourceapi.QualifiedName, v string) {
		attrs[name] = resourceapi.DeviceAttribute{StringValue: &v}
	}
	str(AttrNetwork, d.Network)
	str(AttrPFName, d.PFName)
	str(AttrPFPCIAddress, d.PFAddress)
	idx := int64(d.VFIndex)
	attrs[AttrVFIndex] = resourceapi.DeviceAttribute{IntValue: &idx}
	str(AttrVendorID, d.VendorID)
	str(AttrDeviceID, d.DeviceID)
	if d.LinkType != "" {
		str(AttrLinkType, d.LinkType)
	}
	return attrs
}

// ResourceDevice returns the device as a ResourceSlice entry.
func (d Device) ResourceDevice() resourceapi.Device {
	return resourceapi.Device{Name: d.Name, Attributes: d.Attributes()}
}

// DeviceName returns the DRA device name of the VF at bdf: "0000:3b:02.1"
// becomes "vf-0000-3b-02-1", a DNS label that maps back one to one.
func DeviceName(bdf string) (string, error) {
	if !pciaddr.Valid(bdf) {
		return "", fmt.Errorf("PCI address %q is not a lower-case domain:bus:slot.function", bdf)
	}
	n := len(bdf)
	return "vf-" + bdf[:n-8] + "-" + bdf[n-7:n-5] + "-" + bdf[n-4:n-2] + "-" + bdf[n-1:], nil
}

// ParseDeviceName returns the VF BDF a device name stands for.
func ParseDeviceName(name string) (string, error) {
	s, ok := strings.CutPrefix(name, "vf-")
	if n := len(s); ok && n >= 12 && s[n-8] == '-' && s[n-5] == '-' && s[n-2] == '-' {
		if bdf := s[:n-8] + ":" + s[n-7:n-5] + ":" + s[n-4:n-2] + "." + s[n-1:]; pciaddr.Valid(bdf) {
			return bdf, nil
		}
	}
	return "", fmt.Errorf("device name %q is not a vfnet VF name (vf-<domain>-<bus>-<slot>-<function>)", name)
}

// VFRef locates a VF on the host.
type VFRef struct {
	Address   string
	PFAddress string
	PFName    string
	VFIndex   int
	// VF is the sysfs model of the VF, PF its parent.
	VF sysfs.VF
	PF sysfs.PF
}

// Find locates the VF a device name stands for in a fresh sysfs model,
// independently of the node configuration (prepare and migration need the PF
// and index of an allocated device even if the configuration changed since).
func Find(pfs []sysfs.PF, name string) (VFRef, error) {
	bdf, err := ParseDeviceName(name)
	if err != nil {
		return VFRef{}, err
	}
	for _, pf := range pfs {
		for _, vf := range pf.VFs {
			if vf.Address == bdf {
				ref := VFRef{Address: bdf, PFAddress: pf.Address, VFIndex: vf.Index, VF: vf, PF: pf}
				if len(pf.NetDevs) > 0 {
					ref.PFName = pf.NetDevs[0]
				}
				return ref, nil
			}
		}
	}
	return VFRef{}, fmt.Errorf("device %s: no VF at %s on this node (PF removed or sriov_numvfs lowered?)", name, bdf)
}

// CompareBDF orders PCI addresses numerically by domain, bus, slot, function.
// Malformed addresses sort after well-formed ones, by text.
func CompareBDF(a, b string) int {
	pa, oka := parseBDF(a)
	pb, okb := parseBDF(b)
	switch {
	case oka && okb:
		for i := range pa {
			if c := cmp.Compare(pa[i], pb[i]); c != 0 {
				return c
			}
		}
		return 0
	case oka:
		return -1
	case okb:
		return 1
	}
	return strings.Compare(a, b)
}

func parseBDF(s string) ([4]uint64, bool) {
	var out [4]uint64
	if !pciaddr.Valid(s) {
		return out, false
	}
	n := len(s)
	for i, f := range []string{s[:n-8], s[n-7 : n-5], s[n-4 : n-2], s[n-1:]} {
		// Valid guarantees at most 8 hex digits.
		out[i], _ = strconv.ParseUint(f, 16, 32)
	}
	return out, true
}
