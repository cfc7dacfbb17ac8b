package sysfs

// Function is one PCI function as sysfs shows it.
type Function struct {
	// Address is the lower-case PCI bus ID (BDF), e.g. "0000:3b:02.1".
	Address string
	// VendorID and DeviceID are four lower-case hex digits without "0x", e.g. "8086".
	VendorID string
	DeviceID string
	// NUMANode is the function's NUMA node, -1 when the kernel reports none
	// or has no numa_node file (a kernel built without CONFIG_NUMA).
	NUMANode int
	// PCIeRoot is the root complex the function hangs off, e.g. "pci0000:3a".
	PCIeRoot string
	// IOMMUGroup is the group number ("42"), "" when the function has no group.
	IOMMUGroup string
	// IOMMUGroupName is kernel/iommu_groups/<N>/name when present:
	// NoIOMMUGroupName for a fake group vfio allocated in noiommu mode.
	IOMMUGroupName string
	// IOMMUPeers are the other devices in the function's IOMMU group
	// (sorted by address); empty when the function is alone in its group,
	// as it must be for passthrough to one VM.
	IOMMUPeers []GroupPeer
	// Driver is the bound kernel driver ("iavf", "vfio-pci"), "" when unbound.
	Driver string
	// NetDevs are the netdev names under the function's net/ directory, sorted.
	NetDevs []string
	// DriverOverride is the content of driver_override, "" when unset
	// (the kernel shows "(null)").
	DriverOverride string
}

// PF is a physical function that supports SR-IOV (sriov_totalvfs > 0).
type PF struct {
	Function
	TotalVFs int
	NumVFs   int
	// NetDev is the PF's uplink netdev, "" without one. A PF in switchdev
	// mode also lists its representors under net/; those are in
	// Representors, not here (see UplinkOf).
	NetDev string
	// Representors are the e-switch port representor netdevs under the PF
	// (phys_port_name pf0vf3, pf0sf1, pf0, c1pf0vf2), sorted.
	Representors []string
	// Switchdev is true when the PF shows VF representors (phys_port_name
	// pf<N>vf<M>): its e-switch runs in switchdev mode, where VF traffic
	// is steered through the representors and the legacy per-VF knobs
	// (VLAN, spoof check, trust) do not apply.
	Switchdev bool
	// LinkType is "ethernet", "infiniband" or "arphrd <n>" (from
	// class/net/<if>/type of the uplink), "" without a netdev.
	LinkType string
	// OperState is the PF netdev's operstate ("up", "down", ...), "" without a netdev.
	OperState string
	// VFs are sorted by Index.
	VFs []VF
}

// VF is a virtual function, found through its PF's virtfnN link.
type VF struct {
	Function
	// Index is N of the PF's virtfnN link.
	Index int
	// PFAddress is the BDF of the parent PF.
	PFAddress string
}

// GroupPeer is another device in a function's IOMMU group.
type GroupPeer struct {
	Address string
	// Driver bound to it, "" when none.
	Driver string
}

// Uplink is the PF's uplink netdev: NetDev, or for a PF built by hand
// without it (tests), its only kind of netdev, the first of NetDevs.
func (pf *PF) Uplink() string {
	if pf.NetDev != "" || len(pf.Representors) > 0 || len(pf.NetDevs) == 0 {
		return pf.NetDev
	}
	return pf.NetDevs[0]
}
