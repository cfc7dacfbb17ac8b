// Package discovery turns the host's SR-IOV model (driver/kernel/sysfs) and the node
// configuration (pkg/api/nodeconfig) into the list of VFs vfnet-driver offers,
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
//   - PFs whose netdev the VF link layer cannot find (Options.Resolve): sysfs
//     shows the host's netdevs, but netlink looks in the namespace the link
//     layer was opened on; a driver looking in the wrong one (its pod's own,
//     without hostPID) would publish VFs that every prepare fails on.
//   - VFs already bound to vfio-pci that vfnet did not bind itself
//     (Options.Owned) while their group node /dev/vfio/<group> is held open
//     (Options.Holders): someone else (DPDK, a VM outside Kubernetes) is
//     using them. Nobody holding the node is the normal state of a node
//     moving from sriov-network-device-plugin with a vfio-pci policy; the
//     node configuration says vfnet owns the PF, so those VFs are offered
//     (and prepare records vfio-pci as the driver to restore). A VF vfnet
//     prepared is bound to vfio-pci too and stays offered, so allocated
//     devices never vanish from the slices while in use.
//   - VFs that cannot be given to one VM alone (Problem): an IOMMU group
//     shared with other devices (no ACS above the NIC: QEMU fails with
//     "group is not viable", and two VMs would fight over one group node),
//     or no IOMMU group at all, unless vfio runs in noiommu mode and the
//     node configuration sets allowUnsafeNoIOMMU.
//   - VFs of a PF whose e-switch is in switchdev mode, unless its selector
//     sets allowSwitchdev: VF traffic then follows the representors' flows
//     and the legacy per-VF settings vfnet applies do not hold.
//   - VFs of PFs in a PCI domain beyond ffff (behind Intel VMD): QEMU's
//     vfio-pci cannot open them (pkg/contract/pciaddr has the rule and
//     its sources).
//   - VFs of InfiniBand PFs: an IB VF needs node and port GUIDs, which
//     VFConfig cannot set, so it could not be prepared correctly.
package discovery

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/deviceattribute"

	"github.com/vfnet-io/vfnet/driver/kernel/sysfs"
	"github.com/vfnet-io/vfnet/driver/kernel/vflink"
	"github.com/vfnet-io/vfnet/pkg/api/nodeconfig"
	"github.com/vfnet-io/vfnet/pkg/contract/pciaddr"
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
	// AttrPFDriver is the PF's kernel driver ("igb", "ice", "mlx5_core").
	AttrPFDriver resourceapi.QualifiedName = "vfnet.io/pfDriver"
	// The supports* attributes say whether the PF driver applies a VF
	// setting (vflink.Lookup): true when it implements it (perhaps only in
	// some states, e.g. igb 82576 rate limits need link up), false when it
	// refuses it or vfnet does not know the driver. A DeviceClass selects
	// on them, e.g. device.attributes["vfnet.io"].supportsVlan8021ad.
	AttrSupportsVlan8021ad resourceapi.QualifiedName = "vfnet.io/" + vflink.AttrSupportsVlan8021ad
	AttrSupportsLinkState  resourceapi.QualifiedName = "vfnet.io/" + vflink.AttrSupportsLinkState
	AttrSupportsMinTxRate  resourceapi.QualifiedName = "vfnet.io/" + vflink.AttrSupportsMinTxRate
	AttrSupportsMaxTxRate  resourceapi.QualifiedName = "vfnet.io/" + vflink.AttrSupportsMaxTxRate
)

// Supports is what the PF driver applies of the settings published as
// supports* attributes.
type Supports struct {
	Vlan8021ad, LinkState, MinTxRate, MaxTxRate bool
}

// SupportsOf looks the PF driver up in vflink's capability table.
func SupportsOf(driver, deviceID string) Supports {
	c := vflink.Lookup(driver, deviceID)
	return Supports{
		Vlan8021ad: c.Publishes(vflink.SettingVLANProtocol),
		LinkState:  c.Publishes(vflink.SettingLinkState),
		MinTxRate:  c.Publishes(vflink.SettingMinTxRate),
		MaxTxRate:  c.Publishes(vflink.SettingMaxTxRate),
	}
}

// VFIODriver is the kernel driver a VF is bound to for passthrough.
const VFIODriver = "vfio-pci"

// maxAttributes is the most attributes a device carries (see Attributes).
const maxAttributes = 14

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
	NUMANode   int
	PCIeRoot   string
	IOMMUGroup string
	// Driver is the kernel driver bound at discovery time.
	Driver string
	// PFDriver is the PF's kernel driver, PFSupports what it applies.
	PFDriver   string
	PFSupports Supports
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
	// Notes are offered devices worth a remark (e.g. taken over from
	// vfio-pci), in the same shape as Skipped.
	Notes []Skipped
	// Why explains, in one line, why Devices is empty ("" otherwise).
	Why string
}

// Options tunes Build.
type Options struct {
	// Owned reports whether vfnet itself bound the VF at this address to
	// vfio-pci (it has prepared it for a claim). Nil means "none".
	Owned func(vfAddress string) bool
	// NoIOMMUMode: vfio runs with enable_unsafe_noiommu_mode
	// (sysfs.Host.NoIOMMUMode).
	NoIOMMUMode bool
	// Holders returns the processes holding each VFIO group node
	// ("17", "noiommu-3") open (vfioholders.Scanner). Nil: unknown, and VFs
	// found on vfio-pci that vfnet did not bind are not offered.
	Holders func(nodes []string) (map[string][]string, error)
	// Resolve looks a PF netdev up through the VF link layer
	// (vflink.Links.Resolve). Nil: not checked.
	Resolve func(netdev string) error
}

// Policy is what the node configuration allows beyond the safe defaults.
type Policy struct {
	AllowUnsafeNoIOMMU bool
}

// GroupNode is the name of fn's VFIO group node under /dev/vfio ("" without
// a group).
func GroupNode(fn sysfs.Function) string {
	switch {
	case fn.IOMMUGroup == "":
		return ""
	case fn.IOMMUGroupName == sysfs.NoIOMMUGroupName:
		return "noiommu-" + fn.IOMMUGroup
	}
	return fn.IOMMUGroup
}

// Problem says why the function cannot be passed through to one VM on its
// own, and what fixes it; "" when it can.
func Problem(fn sysfs.Function, noIOMMUMode bool, pol Policy) string {
	if fn.IOMMUGroup == "" || fn.IOMMUGroupName == sysfs.NoIOMMUGroupName {
		switch {
		case !noIOMMUMode && fn.IOMMUGroup == "":
			return "no IOMMU group: the IOMMU is off; enable it in firmware and on the kernel command line (intel_iommu=on or amd_iommu=on) and reboot"
		case !pol.AllowUnsafeNoIOMMU:
			return "no IOMMU group, and vfio runs in unsafe noiommu mode (enable_unsafe_noiommu_mode=Y): the guest's DMA would not be isolated from host memory; enable the IOMMU, or set allowUnsafeNoIOMMU: true in the node configuration to offer such VFs anyway"
		}
		return ""
	}
	var others []string
	for _, p := range fn.IOMMUPeers {
		// Bridges on pcieport do not stop vfio from using the group
		// (the port driver manages no DMA); everything else does.
		if p.Driver == "pcieport" {
			continue
		}
		d := p.Address
		if p.Driver != "" {
			d += " (" + p.Driver + ")"
		}
		others = append(others, d)
	}
	if len(others) == 0 {
		return ""
	}
	list := strings.Join(others, ", ")
	if len(others) > 3 {
		list = fmt.Sprintf("%s and %d more", strings.Join(others[:3], ", "), len(others)-3)
	}
	return fmt.Sprintf("IOMMU group %s also holds %s: a group is passed to one VM as a whole (QEMU fails with \"group is not viable\" otherwise); enable ACS on the upstream bridge or put the device in its own slot",
		fn.IOMMUGroup, list)
}

// CheckVF re-reads the VF at bdf and fails when it cannot be passed through
// (Problem) or, if it is on vfio-pci and holders is set, when a process
// holds its group node open. Prepare calls it just before binding.
func CheckVF(h *sysfs.Host, bdf string, pol Policy, holders func(nodes []string) (map[string][]string, error)) error {
	fn, err := h.Function(bdf)
	if err != nil {
		return err
	}
	if p := Problem(fn, h.NoIOMMUMode(), pol); p != "" {
		return fmt.Errorf("VF %s cannot be passed through: %s", bdf, p)
	}
	if node := GroupNode(fn); holders != nil && fn.Driver == VFIODriver && node != "" {
		got, err := holders([]string{node})
		if err != nil {
			return fmt.Errorf("VF %s is on vfio-pci and whether /dev/vfio/%s is in use cannot be told: %w", bdf, node, err)
		}
		if len(got[node]) > 0 {
			return fmt.Errorf("VF %s is in use: /dev/vfio/%s is held open by %s; stop that user or allocate another VF", bdf, node, strings.Join(got[node], ", "))
		}
	}
	return nil
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
	slices.SortStableFunc(selected, func(a, b nodeconfig.Selected) int { return pciaddr.Compare(a.PF.Address, b.PF.Address) })
	pol := Policy{AllowUnsafeNoIOMMU: cfg.AllowUnsafeNoIOMMU}
	foreign := foreignVFIO(selected, opts.Owned)
	holders, holdErr := vfioHolders(foreign, opts.Holders)
	notFound, nsOf := 0, ""
	for _, sel := range selected {
		pf := sel.PF
		start := len(res.Devices)
		uplink := pf.Uplink()
		_, derr := pciaddr.Parse(pf.Address) // its VFs share its domain
		switch {
		case derr != nil:
			res.Skipped = append(res.Skipped, Skipped{pf.Address, fmt.Sprintf("PF %s: %v; none of its %d VFs is offered: move the NIC out of the VMD domain (disable VMD on its root port in the firmware setup) or leave the PF out of the node configuration", uplink, derr, len(pf.VFs))})
			continue
		case uplink == "":
			res.Skipped = append(res.Skipped, Skipped{pf.Address, fmt.Sprintf("PF has no netdev (driver %q): VF settings are applied through the PF netdev", pf.Driver)})
			continue
		case pf.LinkType == sysfs.LinkTypeInfiniband:
			res.Skipped = append(res.Skipped, Skipped{pf.Address, fmt.Sprintf("PF %s is InfiniBand: its VFs need node and port GUIDs, which VFConfig cannot set; use the PF in Ethernet mode (mlxconfig LINK_TYPE_P1=2) or another driver for IB VFs", uplink)})
			continue
		case pf.LinkType != sysfs.LinkTypeEthernet:
			// Every offered VF is Ethernet, so no device carries a link type.
			res.Skipped = append(res.Skipped, Skipped{pf.Address, fmt.Sprintf("PF %s has link type %q (class/net/%s/type), not Ethernet: vfnet sets Ethernet MACs and VLANs through the PF; use the PF in Ethernet mode or leave it out of the node configuration", uplink, pf.LinkType, uplink)})
			continue
		case pf.Switchdev && !cfg.PFs[sel.Selector].AllowSwitchdev:
			res.Skipped = append(res.Skipped, Skipped{pf.Address, fmt.Sprintf("PF %s runs its e-switch in switchdev mode (VF representors %s): VF traffic follows the representors' flows and the legacy per-VF settings (VLAN, spoof check, trust) do not apply; switch it to legacy (devlink dev eswitch set pci/%s mode legacy) or set allowSwitchdev: true on pfs[%d] in %s",
				uplink, strings.Join(pf.Representors, ","), pf.Address, sel.Selector, cfg.Source)})
			continue
		}
		if reason, nf := unreachable(uplink, opts.Resolve); reason != "" {
			res.Skipped = append(res.Skipped, Skipped{pf.Address, reason})
			if nf != nil {
				notFound, nsOf = notFound+1, nf.Netns
			}
			continue
		}
		supports := SupportsOf(pf.Driver, pf.DeviceID)
		for _, vf := range pf.VFs {
			if !sel.VFs.Contains(vf.Index) {
				continue
			}
			if p := Problem(vf.Function, opts.NoIOMMUMode, pol); p != "" {
				res.Skipped = append(res.Skipped, Skipped{vf.Address, p})
				continue
			}
			if node, ok := foreign[vf.Address]; ok {
				switch {
				case holdErr != nil:
					res.Skipped = append(res.Skipped, Skipped{vf.Address, fmt.Sprintf("VF is bound to vfio-pci and whether /dev/vfio/%s is in use cannot be told: %v", node, holdErr)})
					continue
				case len(holders[node]) > 0:
					res.Skipped = append(res.Skipped, Skipped{vf.Address, fmt.Sprintf("VF is bound to vfio-pci and in use: /dev/vfio/%s is held open by %s", node, strings.Join(holders[node], ", "))})
					continue
				}
				res.Notes = append(res.Notes, Skipped{vf.Address, fmt.Sprintf("already bound to vfio-pci and /dev/vfio/%s is not held open by any process: offered; prepare keeps vfio-pci as its driver to restore", node)})
			}
			name, err := pciaddr.DeviceName(vf.Address)
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
				PFName:     uplink,
				Network:    sel.Network,
				VendorID:   vf.VendorID,
				DeviceID:   vf.DeviceID,
				NUMANode:   numa,
				PCIeRoot:   root,
				IOMMUGroup: vf.IOMMUGroup,
				Driver:     vf.Driver,
				PFDriver:   pf.Driver,
				PFSupports: supports,
			})
		}
		slices.SortFunc(res.Devices[start:], func(a, b Device) int { return cmp.Compare(a.VFIndex, b.VFIndex) })
	}
	switch {
	case len(res.Devices) == 0 && notFound == len(selected):
		res.Why = fmt.Sprintf("none of the %d selected PF netdevs is in network namespace %s, so the driver does not look at the host's network namespace: publishing no devices; run the driver pod with hostPID: true and --host-netns %s (the default)",
			len(selected), nsOf, vflink.DefaultHostNetns)
	case len(res.Devices) == 0:
		res.Why = fmt.Sprintf("node configuration %s selects %d PF(s) but none has an offerable VF (sriov_numvfs=0, vfs filter, or all skipped): publishing no devices", cfg.Source, len(selected))
	}
	return res, nil
}

// unreachable says why the PF netdev cannot be used through the link
// layer ("" when it can), and returns the not-found error if that is why.
func unreachable(netdev string, resolve func(string) error) (string, *vflink.LinkNotFoundError) {
	if resolve == nil {
		return "", nil
	}
	err := resolve(netdev)
	if err == nil {
		return "", nil
	}
	var nf *vflink.LinkNotFoundError
	if errors.As(err, &nf) {
		return fmt.Sprintf("PF netdev %s not found in network namespace %s: VF settings are applied through the PF netdev, so no VF of it could be prepared; sysfs shows the host's netdevs, so the driver is looking in another namespace than the host's: run its pod with hostPID: true and --host-netns %s (the default)",
			netdev, nf.Netns, vflink.DefaultHostNetns), nf
	}
	return fmt.Sprintf("PF netdev %s cannot be looked up through netlink: %v", netdev, err), nil
}

// foreignVFIO maps the selected VFs on vfio-pci that vfnet did not bind to
// their group node names.
func foreignVFIO(selected []nodeconfig.Selected, owned func(string) bool) map[string]string {
	out := map[string]string{}
	for _, sel := range selected {
		for _, vf := range sel.PF.VFs {
			if vf.Driver == VFIODriver && sel.VFs.Contains(vf.Index) && (owned == nil || !owned(vf.Address)) {
				out[vf.Address] = GroupNode(vf.Function)
			}
		}
	}
	return out
}

// vfioHolders asks once per pass who holds the group nodes of foreign VFs.
func vfioHolders(foreign map[string]string, holders func([]string) (map[string][]string, error)) (map[string][]string, error) {
	var nodes []string
	for _, n := range foreign {
		if n != "" && !slices.Contains(nodes, n) {
			nodes = append(nodes, n)
		}
	}
	if len(nodes) == 0 {
		return nil, nil
	}
	if holders == nil {
		return nil, errors.New("no check configured")
	}
	slices.Sort(nodes)
	return holders(nodes)
}

func pfSummary(pfs []sysfs.PF) string {
	if len(pfs) == 0 {
		return "none"
	}
	parts := make([]string, 0, len(pfs))
	for _, pf := range pfs {
		parts = append(parts, fmt.Sprintf("%s %s %s:%s", pf.Address, pf.Uplink(), pf.VendorID, pf.DeviceID))
	}
	return strings.Join(parts, "; ")
}

// Attributes returns the device's ResourceSlice attributes. The same map is
// what prepare hands to KEP-5304 device metadata.
func (d Device) Attributes() map[resourceapi.QualifiedName]resourceapi.DeviceAttribute {
	// At most 14 attributes: a Go map holds 14 entries in 16 slots and
	// doubles to 32 for the 15th, which costs the driver memory for each
	// copy of the devices (the resourceslice controller keeps two) and the
	// API server CPU per attribute (BENCHMARKS.md: driver-attributes). TestBuildMixedHost checks a
	// device with every optional attribute against maxAttributes.
	attrs := make(map[resourceapi.QualifiedName]resourceapi.DeviceAttribute, maxAttributes)
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
	if d.PFDriver != "" {
		str(AttrPFDriver, d.PFDriver)
	}
	// One allocation for the four flags (a rescan builds these for every VF).
	sup := &[4]bool{d.PFSupports.Vlan8021ad, d.PFSupports.LinkState, d.PFSupports.MinTxRate, d.PFSupports.MaxTxRate}
	attrs[AttrSupportsVlan8021ad] = resourceapi.DeviceAttribute{BoolValue: &sup[0]}
	attrs[AttrSupportsLinkState] = resourceapi.DeviceAttribute{BoolValue: &sup[1]}
	attrs[AttrSupportsMinTxRate] = resourceapi.DeviceAttribute{BoolValue: &sup[2]}
	attrs[AttrSupportsMaxTxRate] = resourceapi.DeviceAttribute{BoolValue: &sup[3]}
	return attrs
}

// ResourceDevice returns the device as a ResourceSlice entry.
func (d Device) ResourceDevice() resourceapi.Device {
	return resourceapi.Device{Name: d.Name, Attributes: d.Attributes()}
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
	a, err := pciaddr.ParseDeviceName(name)
	if err != nil {
		return VFRef{}, err
	}
	bdf := a.String()
	for _, pf := range pfs {
		for _, vf := range pf.VFs {
			if vf.Address == bdf {
				return VFRef{Address: bdf, PFAddress: pf.Address, PFName: pf.Uplink(), VFIndex: vf.Index, VF: vf, PF: pf}, nil
			}
		}
	}
	return VFRef{}, fmt.Errorf("device %s: no VF at %s on this node (PF removed or sriov_numvfs lowered?)", name, bdf)
}
