package sysfs

// Function is one PCI function as sysfs shows it.
type Function struct {
	// Address is the lower-case PCI bus ID (BDF), e.g. "0000:3b:02.1".
	Address string
	// VendorID and DeviceID are four lower-case hex digits without "0x", e.g. "8086".
	VendorID string
	DeviceID string
	// NUMANode is the function's NUMA node, -1 when the kernel reports none.
	NUMANode int
	// PCIeRoot is the root complex the function hangs off, e.g. "pci0000:3a".
	PCIeRoot string
	// IOMMUGroup is the group number ("42"), "" when the function has no group.
	IOMMUGroup string
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
	// LinkType is "ethernet" or "infiniband" (from class/net/<if>/type), "" without a netdev.
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
