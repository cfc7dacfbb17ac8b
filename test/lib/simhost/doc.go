// Package simhost builds synthetic hosts with SR-IOV NICs and simulates the
// kernel behind them. It is used by unit tests, the crash and end-to-end
// tests and `vfnet-driver --simulate`, so it is product code, not test code.
//
// Build lays out a sysfs tree (dir/sys) the way Linux does, and a /dev
// (dir/dev) with vfio/vfio:
//
//	devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0/       PF directory (vendor, device, class,
//	    numa_node, driver_override, sriov_totalvfs, sriov_numvfs, sriov_offset, sriov_stride,
//	    sriov_vf_device, sriov_drivers_autoprobe, enable)
//	    driver -> ../../../../bus/pci/drivers/ice
//	    iommu_group -> ../../../../kernel/iommu_groups/17
//	    virtfn3 -> ../0000:3b:02.3                     (VFs are siblings of the PF)
//	    net/enp59s0f0/{address,type,operstate,device}
//	devices/pci0000:3a/0000:3a:00.0/0000:3b:02.3/physfn -> ../0000:3b:00.0
//	bus/pci/devices/<bdf> -> ../../../devices/pci0000:3a/0000:3a:00.0/<bdf>
//	bus/pci/drivers/<drv>/{bind,unbind,new_id,remove_id,<bdf> -> device}
//	bus/pci/drivers_probe, bus/pci/drivers_autoprobe
//	kernel/iommu_groups/<N>/{devices/<bdf> -> device, type[, name]}
//	class/net/<if> -> ../../devices/.../<bdf>/net/<if>
//	devices/system/node/node<N>/{distance,cpulist}
//	module/vfio/parameters/enable_unsafe_noiommu_mode   (NoIOMMU hosts only)
//
// Modelled layouts besides the defaults: NoACS (the root port above has no
// ACS: root port, PFs and VFs share its group, VFs created later join it),
// PhysPortName/phys_switch_id on mlx5 uplinks, Switchdev (a VF representor
// per VF under the PF's own device, named as NVIDIA's udev rule does, so one
// sorts before the uplink; removed with the VFs), NoNUMAFile (CONFIG_NUMA=n).
// Root ports are bound to pcieport. RenameNetdev renames like `ip link set
// name` (EBUSY while up; a PF's VF settings follow it). ProcRoot is an empty
// synthetic /proc; HoldVFIOGroup adds a process holding /dev/vfio/<group>
// open (<proc>/<pid>/fd/<n> -> the node, <pid>/comm). Reboot restarts the
// kernel from the host as built (boot drivers, VFs, names and groups; no
// overrides, new_id entries, VF settings, /dev/vfio group nodes or group
// holders); files outside the simulation, such as a checkpoint, survive.
//
// Fixtures: E810PF, ConnectX6DxPF, ConnectX6DxIBPF, I350PF, PlainNIC build
// PFSpecs; E810Host, ConnectX6DxHost, I350Host, MixedHost (every case on
// one two-socket host: vfio-bound VF, sriov_numvfs=0, numa_node -1, a NIC
// without SR-IOV), InfinibandHost, NoIOMMUHost and LargeHost (4 PFs x 256
// VFs, builds in about 0.2 s of CPU on tmpfs) are whole hosts, also by name
// through Fixture("e810"|"cx6dx"|"i350"|"mixed"|"infiniband"|"noiommu"|"large"|
// "noacs"|"switchdev"|"nonuma"): NoACSHost, SwitchdevHost, NoNUMAHost.
// TempDir(t) gives tests a tmpfs directory when /dev/shm is one. VFs sit at PF routing ID + offset +
// i*stride as the SR-IOV capability places them (E810 VF i of 0000:3b:00.0
// is 0000:3b:02.i). Netdevs use systemd's predictable path names: PF
// enp<bus>s<slot>f<fn> (ib... for InfiniBand) unless the spec names it, VF
// <pf netdev>v<index> (naming scheme v247+), so a VF gets its old name back
// after a rebind. IOMMU groups: one per function, numbered from 16 in
// address order; new VFs take the lowest free numbers, as the kernel's IDA.
//
// Kernel (a sysfs.Writer) applies writes the way the kernel's store
// functions do and fails with the same errno, as *os.PathError:
//   - driver_override: set, or clear with "" / "\n";
//   - bus/pci/drivers/<drv>/bind: ENOENT if the driver is not loaded,
//     ENODEV if the device is unknown or does not match (override names
//     another driver, or no override and the ID is not in the driver's
//     table or new_id list), or the device is a VF of a PF whose
//     sriov_drivers_autoprobe is 0 and has no override (pci_device_can_probe;
//     drivers_probe and new_id then bind nothing), EBUSY if bound; net drivers create the netdev,
//     vfio-pci creates /dev/vfio/<group> (after WithVFIODevDelay if set),
//     or on NoIOMMU hosts allocates a "vfio-noiommu" group and
//     /dev/vfio/noiommu-<N>; without a group and noiommu it is EINVAL;
//   - unbind: ENODEV unless bound to that driver; removes the links, the
//     netdevs (and class/net links), the /dev/vfio node when no other group
//     member stays on vfio-pci, a noiommu group; a PF driver disables SR-IOV;
//   - drivers_probe, new_id (EEXIST if it already matches), remove_id;
//   - sriov_numvfs: ERANGE above total, ENOENT without a PF driver, EBUSY
//     for N -> M without 0 first; 0 -> N creates VFs (autoprobe binds them),
//     N -> 0 removes them and forgets their link settings.
//
// PF drivers (pfdriver.go): Links answers VF settings the way the PF's
// Linux driver does, chosen by the PF's bound driver and device ID: igb
// refuses 802.1ad (EPROTONOSUPPORT) and any link state (EOPNOTSUPP, it has
// no ndo_set_vf_link_state); only an 82576 rate-limits, without a minimum
// (EINVAL), while the PF has carrier and up to 1000 Mbps (EINVAL), an I350
// refuses every rate call (EOPNOTSUPP); i40e refuses 802.1ad and minimums,
// bounds the maximum by the current speed and raises it to 50 Mbps; ice
// accepts 802.1ad unless SingleVLANMode, refuses minimums with DCB
// (EOPNOTSUPP) or when all VFs' minimums exceed the speed (EINVAL);
// mlx5_core refuses 802.1ad; bnxt_en refuses 802.1ad (firmware without the
// TPID capability) and rates above the speed. Fixtures I82576PF, X710PF,
// BCM57414PF; I82576Host ("igb82576") and PFDriverHost ("pfdrivers", one
// PF of each) are whole hosts.
//
// Links (the VF settings through the PF) models the PF's view of a VF's MAC:
// a VF nobody set a MAC for reads 00:00:00:00:00:00; a VF driver bound
// later (bind, drivers_probe, new_id) reports the MAC it chose for itself,
// which the PF then shows until the driver lets go or an administrator sets
// one (Host.VFState shows only the administrative settings). SetVFResets
// (with WithClock) adds VF reset windows: MAC, VLAN and trust changes and VF
// driver changes reset the VF, and settings meanwhile fail EBUSY (EAGAIN on
// i40e), as Intel's PF drivers answer.
//
// Network namespaces: every netdev is in the host's, named by the file
// HostNetns() (<proc root>/1/ns/net); AddNetns makes others (only lo).
// Links() is the VF link layer in the host's namespace, LinksAt(file) the
// one vflink.Open(file) would give: a netdev outside its namespace is a
// *vflink.LinkNotFoundError. VF reads run vflink.Reader over a simulated
// rtnetlink socket (Links.Conn) whose RTM_NEWLINK replies have the
// kernel's layout and sizes: IFLA_EXT_MASK selects the VF list and per-VF
// statistics (296 bytes per VF with them, 196 without), nest lengths are
// 16 bits and wrap above 65535 bytes, and a reply is one datagram that a
// short receive buffer cuts (MSG_TRUNC semantics).
//
// FailWrite and SetWriteHook inject failures; Links.Fail does so for the
// VF link layer. All injection is per Host, and every method is safe for
// concurrent use. State lives in the tree (.simhost/host.json,
// .simhost/vflinks.json and .simhost/vfruntime.json), so Open(root) in another process continues the
// same simulation; calls from several processes are serialised with flock
// on .simhost/lock, and each call re-reads what another process changed.
//
// Crashes: the kernel finishes a bind, unbind or SR-IOV change even when
// the writer dies. The simulation runs in the driver's process, so each
// such operation is written to .simhost/journal.json first, and the next
// call from any process completes an interrupted one (its effects are
// idempotent; TestInterruptedOperationsComplete stops every operation after
// each of its effects and compares with an uninterrupted run). Not modelled:
// power loss (no fsync), a VF netdev address update racing a crash. A
// /dev/vfio node whose delay timer died with its process appears after the
// next Open (which, like udev, creates missing nodes of vfio-bound groups).
// The /dev/vfio nodes are regular files, or with WithCharDevNodes character
// devices with the kernel's numbers (for a container runtime applying CDI).
package simhost
