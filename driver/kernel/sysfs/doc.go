// Package sysfs models PCI functions and SR-IOV from a sysfs tree rooted at a
// configurable directory (default /sys), so the driver, tests and the demo
// read real and synthetic hosts (test/lib/simhost) through the same code.
//
// Read side:
//
//	h := sysfs.New(root)
//	pfs, err := h.Discover(ctx)   // PFs (sriov_totalvfs > 0) with their VFs, sorted by address
//	rep, err := h.DiscoverReport(ctx) // the same, plus every skipped function (path, reason)
//	h.UplinkOf(pfBDF)              // the PF's uplink netdev now (follows renames)
//	fn, err := h.Function(bdf)     // re-read one function (driver, group, netdevs, override)
//	h.DriverLoaded("vfio-pci")     // bus/pci/drivers/<name> exists
//	h.VFIOGroupDevice(group)       // "42" or "noiommu-42": the name of the node under /dev/vfio
//	h.IOMMUGroupDevices(group)     // BDFs in the group
//	h.NoIOMMUMode()                // vfio's enable_unsafe_noiommu_mode is Y
//
// What is read, per function (the layout the kernel exposes):
//
//	bus/pci/devices/<bdf>                -> ../../../devices/pci0000:3a/0000:3a:00.0/<bdf>
//	<dev>/vendor, <dev>/device           "0x8086\n" (0x stripped, lower-cased)
//	<dev>/numa_node                      "-1\n" allowed; missing (CONFIG_NUMA=n) reads as -1
//	<dev>/driver                         -> .../bus/pci/drivers/iavf (basename = driver)
//	<dev>/iommu_group                    -> .../kernel/iommu_groups/42 (basename = group)
//	kernel/iommu_groups/42/devices/*     the other members (IOMMUPeers) and their drivers
//	kernel/iommu_groups/42/name          "vfio-noiommu" for a noiommu group
//	<dev>/driver_override                "(null)\n" when unset
//	<dev>/net/<ifname>/                  one directory per netdev
//	<pf>/sriov_totalvfs, sriov_numvfs    PF when sriov_totalvfs > 0
//	<pf>/virtfnN                         -> ../<vf bdf> (VF index N)
//	<pf>/net/<if>/phys_port_name         uplink "p0" (or unreadable: no devlink port);
//	                                     representors "pf0vf3", "pf0sf1", "pf0", "c1pf0vf2"
//	class/net/<if>/type, operstate       PF link type (1 ethernet, 32 infiniband) and state
//
// Switchdev: mlx5 and ice parent their VF representors to the PF's PCI
// device, so the PF's net/ lists them next to the uplink, and a representor
// can sort first (ens8f0_0 < ens8f0np0). The uplink is the netdev whose
// phys_port_name is a physical port ("p0"), else the first one that is not
// a representor; VF representors present means switchdev mode (sysfs shows
// no eswitch mode directly, and phys_switch_id is readable in both modes).
//
// The PCIe root comes from k8s.io/dynamic-resource-allocation/deviceattribute
// for each PF; a VF whose virtfn link points to a sibling directory of its PF
// (always the case on Linux: VFs hang off the PF's parent bridge) shares the
// PF's root, so it is not resolved again.
//
// vfio-noiommu: with vfio's enable_unsafe_noiommu_mode, binding a device
// without an IOMMU group to vfio-pci makes vfio allocate a fake group whose
// kernel/iommu_groups/<N>/name reads "vfio-noiommu"; its character device is
// /dev/vfio/noiommu-<N> instead of /dev/vfio/<N>. VFIOGroupDevice reports that.
//
// Discover first lists bus/pci/devices and the PFs' virtfn links (in
// address order a PF precedes its VFs, so VF entries are not probed), then
// reads the PFs and VFs on GOMAXPROCS goroutines, each function through one
// O_PATH directory descriptor (BenchmarkDiscoverLargeHost; BENCHMARKS.md:
// sysfs-discover).
//
// Bad or partial sysfs (dangling links, unreadable or garbage files) skips
// only the affected function with a log line naming the path, and
// DiscoverReport returns it: a bad VF drops that VF, a bad PF drops the PF.
// Discovery as a whole fails only when bus/pci/devices itself cannot be
// listed.
//
// Write side: Writer (RootWriter for a real host, simhost.Kernel for the
// simulation) writes kernel attributes such as driver_override, bind and
// unbind relative to the root.
package sysfs
