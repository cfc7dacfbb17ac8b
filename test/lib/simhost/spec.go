package simhost

import (
	"fmt"
	"strings"

	"github.com/vfnet-io/vfnet/driver/kernel/sysfs"
	"github.com/vfnet-io/vfnet/pkg/contract/pciaddr"
)

// Spec describes a host to build.
type Spec struct {
	// PFs are SR-IOV capable functions (sriov_totalvfs > 0).
	PFs []PFSpec `json:"pfs,omitempty"`
	// Functions are PCI functions without SR-IOV (plain NICs).
	Functions []FunctionSpec `json:"functions,omitempty"`
	// NUMANodes is the number of devices/system/node/nodeN directories;
	// 0 means one more than the highest numa_node any function uses (at least 1).
	NUMANodes int `json:"numaNodes,omitempty"`
	// NoIOMMU builds a host without IOMMU: no function has a group, and vfio
	// runs with enable_unsafe_noiommu_mode=Y, so binding vfio-pci allocates a
	// "vfio-noiommu" group and /dev/vfio/noiommu-<N>.
	NoIOMMU bool `json:"noIOMMU,omitempty"`
	// NoVFIOPCI leaves the vfio-pci module unloaded (no bus/pci/drivers/vfio-pci).
	NoVFIOPCI bool `json:"noVFIOPCI,omitempty"`
	// ExtraDrivers are PCI drivers to load besides the ones functions use.
	ExtraDrivers []string `json:"extraDrivers,omitempty"`
	// FirstIOMMUGroup is the lowest group number handed out (default 16).
	FirstIOMMUGroup int `json:"firstIOMMUGroup,omitempty"`
}

// FunctionSpec is one PCI function and the netdev its driver creates.
type FunctionSpec struct {
	// Address is the BDF, e.g. "0000:3b:00.0".
	Address string `json:"address"`
	// RootPort is the BDF of the root port above the function, e.g.
	// "0000:3a:00.0"; the root complex is then "pci0000:3a".
	RootPort string `json:"rootPort"`
	// VendorID and DeviceID: four hex digits, e.g. "8086", "1593".
	VendorID string `json:"vendorID"`
	DeviceID string `json:"deviceID"`
	// Driver bound at build time ("" leaves it unbound).
	Driver string `json:"driver,omitempty"`
	// NetDev is the name of the netdev the driver creates; "" derives the
	// predictable path name (enp59s0f0, or ibp59s0f0 for InfiniBand).
	NetDev string `json:"netDev,omitempty"`
	// LinkType is sysfs.LinkTypeEthernet (default) or sysfs.LinkTypeInfiniband.
	LinkType string `json:"linkType,omitempty"`
	// OperState of the netdev (default "up").
	OperState string `json:"operState,omitempty"`
	// MAC of the netdev; "" derives one from the address.
	MAC string `json:"mac,omitempty"`
	// NUMANode written to numa_node (-1: no affinity).
	NUMANode int `json:"numaNode"`
	// NoNUMAFile omits numa_node, as a kernel built without CONFIG_NUMA does.
	NoNUMAFile bool `json:"noNUMAFile,omitempty"`
	// NoACS: the root port above this function has no ACS. The kernel then
	// cannot isolate the devices below it (pci_device_group walks up to the
	// first bridge with ACS), so the root port, every function under it
	// and all their VFs share the root port's IOMMU group.
	NoACS bool `json:"noACS,omitempty"`
	// PhysPortName is the netdev's phys_port_name as a devlink port of
	// flavour physical shows it ("p0"); "" leaves the file out, as for
	// drivers without a devlink port (igb, i40e), where reading it fails.
	PhysPortName string `json:"physPortName,omitempty"`
}

// PFSpec is an SR-IOV physical function.
type PFSpec struct {
	FunctionSpec
	TotalVFs int `json:"totalVFs"`
	// NumVFs VFs exist at build time (sriov_numvfs).
	NumVFs int `json:"numVFs"`
	// VFOffset and VFStride place VF i at routing ID PF + offset + i*stride,
	// as the SR-IOV capability does (defaults 16 and 1).
	VFOffset int `json:"vfOffset,omitempty"`
	VFStride int `json:"vfStride,omitempty"`
	// VFDeviceID is the VFs' device ID (vendor is the PF's).
	VFDeviceID string `json:"vfDeviceID"`
	// VFDriver is the driver VFs bind to when created (autoprobe).
	VFDriver string `json:"vfDriver"`
	// VFDrivers overrides the build-time driver per VF index; "" leaves the
	// VF unbound, "vfio-pci" binds it to vfio-pci (driver_override set too).
	VFDrivers map[int]string `json:"vfDrivers,omitempty"`
	// Switchdev puts the PF's e-switch in switchdev mode: every VF gets a
	// representor netdev under the PF's own device (mlx5 and ice parent
	// representors to the PF's PCI device), with phys_port_name
	// pf<PCI function>vf<index> and the uplink's phys_switch_id. They are
	// named <PF netdev without its "np<N>" suffix>_<index>, as the udev rule
	// in NVIDIA's switchdev documentation renames them (ens8f0_3), which
	// sorts before the uplink ens8f0np0.
	Switchdev bool `json:"switchdev,omitempty"`
	// LinkSpeedMbps is the PF's link speed while it has carrier; rate
	// limits are checked against it (0: the driver's usual speed, igb 1000,
	// i40e 10000, ice and bnxt_en 25000, mlx5_core 100000).
	LinkSpeedMbps int `json:"linkSpeedMbps,omitempty"`
	// SingleVLANMode: an ice PF without double VLAN mode (DDP package or
	// NVM too old), which refuses 802.1ad port VLANs.
	SingleVLANMode bool `json:"singleVLANMode,omitempty"`
	// DCB is enabled on the PF: ice then refuses VF minimum rates.
	DCB bool `json:"dcb,omitempty"`
}

// The PCI IDs and drivers of the modelled NICs.
const (
	VendorIntel    = "8086"
	VendorMellanox = "15b3"

	DeviceE810     = "1593" // E810-C for SFP, driver ice
	DeviceE810VF   = "1889" // iavf
	DeviceCX6Dx    = "101d" // ConnectX-6 Dx, mlx5_core
	DeviceCX6DxVF  = "101e" // ConnectX family VF, mlx5_core
	DeviceI350     = "1521" // igb
	DeviceI350VF   = "1520" // igbvf
	DeviceI210     = "1533" // igb, no SR-IOV
	DriverVFIOPCI  = "vfio-pci"
	DriverIce      = "ice"
	DriverIAVF     = "iavf"
	DriverMLX5     = "mlx5_core"
	DriverIGB      = "igb"
	DriverIGBVF    = "igbvf"
	defaultOffset  = 16
	defaultGroup0  = 16
	defaultPFState = "up"
)

// E810PF is one port of an Intel E810 (ice) with iavf VFs; numa node 0,
// root port 0000:<bus-1>:00.0.
func E810PF(addr, netdev string, numVFs int) PFSpec {
	return PFSpec{
		FunctionSpec: FunctionSpec{Address: addr, RootPort: rootPortFor(addr), VendorID: VendorIntel, DeviceID: DeviceE810,
			Driver: DriverIce, NetDev: netdev, MAC: "", NUMANode: 0},
		TotalVFs: 128, NumVFs: numVFs, VFDeviceID: DeviceE810VF, VFDriver: DriverIAVF,
	}
}

// ConnectX6DxPF is one port of a Mellanox ConnectX-6 Dx in Ethernet mode;
// mlx5_core drives both the PF and its VFs.
func ConnectX6DxPF(addr, netdev string, numVFs int) PFSpec {
	return PFSpec{
		FunctionSpec: FunctionSpec{Address: addr, RootPort: rootPortFor(addr), VendorID: VendorMellanox, DeviceID: DeviceCX6Dx,
			// mlx5 registers the uplink as a devlink port of flavour
			// physical numbered by PCI function: phys_port_name p<fn>.
			Driver: DriverMLX5, NetDev: netdev, PhysPortName: "p" + addr[len(addr)-1:]},
		TotalVFs: 127, NumVFs: numVFs, VFOffset: 2, VFDeviceID: DeviceCX6DxVF, VFDriver: DriverMLX5,
	}
}

// ConnectX6DxIBPF is a ConnectX-6 Dx port in InfiniBand mode (netdev type 32).
func ConnectX6DxIBPF(addr, netdev string, numVFs int) PFSpec {
	pf := ConnectX6DxPF(addr, netdev, numVFs)
	pf.LinkType = sysfs.LinkTypeInfiniband
	return pf
}

// I350PF is one port of an Intel I350 (igb) with igbvf VFs (at most 7).
func I350PF(addr, netdev string, numVFs int) PFSpec {
	return PFSpec{
		FunctionSpec: FunctionSpec{Address: addr, RootPort: rootPortFor(addr), VendorID: VendorIntel, DeviceID: DeviceI350,
			Driver: DriverIGB, NetDev: netdev},
		TotalVFs: 7, NumVFs: numVFs, VFOffset: 128, VFStride: 4, VFDeviceID: DeviceI350VF, VFDriver: DriverIGBVF,
	}
}

// PlainNIC is an Intel I210 (igb) without SR-IOV.
func PlainNIC(addr, netdev string) FunctionSpec {
	return FunctionSpec{Address: addr, RootPort: rootPortFor(addr), VendorID: VendorIntel, DeviceID: DeviceI210,
		Driver: DriverIGB, NetDev: netdev}
}

// rootPortFor puts a device on bus B under root port 0000:<B-1>:00.0, which
// matches the common Intel server layout (root port 3a:00.0 above bus 3b);
// buses below 0x10 hang off root ports 00:<B>.0 of the first root complex.
func rootPortFor(addr string) string {
	a, err := pciaddr.ParseKernelName(addr)
	port := pciaddr.Address{Domain: a.Domain, Slot: 0x1c}
	switch {
	case err != nil || a.Bus == 0:
	case a.Bus < 0x10:
		port.Slot = a.Bus
	default:
		port.Bus, port.Slot = a.Bus-1, 0
	}
	return port.String()
}

// E810Host is one dual-port E810 (0000:3b:00.0 enp59s0f0 and 0000:3b:00.1
// enp59s0f1) with 4 VFs per port on NUMA node 0.
func E810Host() Spec {
	pf1 := E810PF("0000:3b:00.1", "enp59s0f1", 4)
	pf1.VFOffset = 16 + 128 - 1 // after PF0's 128 possible VFs
	return Spec{PFs: []PFSpec{E810PF("0000:3b:00.0", "enp59s0f0", 4), pf1}}
}

// MixedHost has every modelled case on one two-socket host:
//   - 0000:3b:00.0 E810 enp59s0f0, NUMA 0, 4 iavf VFs, VF 2 bound to vfio-pci (no netdev)
//   - 0000:3b:00.1 E810 enp59s0f1, NUMA 0, sriov_numvfs=0
//   - 0000:d8:00.0 ConnectX-6 Dx ens8f0np0 (mlx5_core), NUMA 1, 4 VFs
//   - 0000:01:00.0 I350 enp1s0f0 (igb), numa_node -1, 2 igbvf VFs
//   - 0000:02:00.0 I210 enp2s0 (igb), no SR-IOV
func MixedHost() Spec {
	e0 := E810PF("0000:3b:00.0", "enp59s0f0", 4)
	e0.VFDrivers = map[int]string{2: DriverVFIOPCI}
	e1 := E810PF("0000:3b:00.1", "enp59s0f1", 0)
	e1.VFOffset = 16 + 128 - 1
	cx := ConnectX6DxPF("0000:d8:00.0", "ens8f0np0", 4)
	cx.NUMANode = 1
	igb := I350PF("0000:01:00.0", "enp1s0f0", 2)
	igb.NUMANode = -1
	plain := PlainNIC("0000:02:00.0", "enp2s0")
	plain.NUMANode = -1
	return Spec{PFs: []PFSpec{e0, e1, cx, igb}, Functions: []FunctionSpec{plain}, NUMANodes: 2}
}

// VMDHost is E810Host's port 0 (0000:3b:00.0 enp59s0f0, 4 VFs) plus an
// E810 PF behind an Intel VMD controller, in PCI domain 10000 as the kernel
// numbers VMD domains: 10000:e1:00.0 ens10f0 with 4 VFs (10000:e1:02.0 up).
// vfnet offers no VF beyond domain ffff (pkg/contract/pciaddr).
func VMDHost() Spec {
	return Spec{PFs: []PFSpec{E810PF("0000:3b:00.0", "enp59s0f0", 4), E810PF(VMDPFAddress, "ens10f0", 4)}}
}

// VMDPFAddress is VMDHost's PF in a VMD domain.
const VMDPFAddress = "10000:e1:00.0"

// InfinibandHost is one ConnectX-6 Dx in InfiniBand mode (ibp216s0f0, 4 VFs).
func InfinibandHost() Spec {
	return Spec{PFs: []PFSpec{ConnectX6DxIBPF("0000:d8:00.0", "ibp216s0f0", 4)}}
}

// LargeHost is two dual-port E810 cards, 4 PFs with 256 VFs each (1024 VFs),
// for benchmarks: 0000:3b:00.{0,1} on NUMA 0 and 0000:86:00.{0,1} on NUMA 1.
func LargeHost() Spec {
	var pfs []PFSpec
	for i, a := range []string{"0000:3b:00.0", "0000:3b:00.1", "0000:86:00.0", "0000:86:00.1"} {
		pf := E810PF(a, "", 256)
		pf.TotalVFs = 256
		if i%2 == 1 {
			// PF1 routing ID is PF0+1; start its VFs after PF0's 256.
			pf.VFOffset = defaultOffset + 256 - 1
		}
		if i >= 2 {
			pf.NUMANode = 1
		}
		pfs = append(pfs, pf)
	}
	return Spec{PFs: pfs, NUMANodes: 2}
}

// NoACSHost is E810Host behind a root port without ACS (0000:3a:00.0): the
// root port, both PFs and all their VFs share one IOMMU group, so no VF can
// be given to a VM on its own.
func NoACSHost() Spec {
	s := E810Host()
	for i := range s.PFs {
		s.PFs[i].NoACS = true
	}
	return s
}

// SwitchdevHost is a dual-port ConnectX-6 Dx (as ConnectX6DxHost) whose
// port 0 (ens8f0np0) runs its e-switch in switchdev mode: VF representors
// ens8f0_0..3 sit next to the uplink under the PF. Port 1 stays legacy.
func SwitchdevHost() Spec {
	s := ConnectX6DxHost()
	s.PFs[0].Switchdev = true
	return s
}

// NoNUMAHost is E810Host on a kernel built without CONFIG_NUMA: no
// function has a numa_node file.
func NoNUMAHost() Spec {
	s := E810Host()
	for i := range s.PFs {
		s.PFs[i].NoNUMAFile = true
	}
	return s
}

// NoIOMMUHost is E810Host on a machine without IOMMU (vfio noiommu mode).
func NoIOMMUHost() Spec {
	s := E810Host()
	s.NoIOMMU = true
	return s
}

// ConnectX6DxHost is one dual-port ConnectX-6 Dx in Ethernet mode on NUMA
// node 1 (0000:d8:00.0 ens8f0np0 and 0000:d8:00.1 ens8f1np1), 4 VFs each.
func ConnectX6DxHost() Spec {
	p0 := ConnectX6DxPF("0000:d8:00.0", "ens8f0np0", 4)
	p1 := ConnectX6DxPF("0000:d8:00.1", "ens8f1np1", 4)
	p1.VFOffset = 2 + 127 - 1 // after port 0's 127 possible VFs
	p0.NUMANode, p1.NUMANode = 1, 1
	return Spec{PFs: []PFSpec{p0, p1}, NUMANodes: 2}
}

// I350Host is one I350 port (0000:01:00.0 enp1s0f0, igb) with 7 igbvf VFs,
// the most igb allows.
func I350Host() Spec {
	return Spec{PFs: []PFSpec{I350PF("0000:01:00.0", "enp1s0f0", 7)}}
}

// fixtures maps the names `vfnet-driver --simulate` and tests accept to the
// host fixtures.
var fixtures = map[string]func() Spec{
	"e810":       E810Host,
	"cx6dx":      ConnectX6DxHost,
	"i350":       I350Host,
	"igb82576":   I82576Host,
	"pfdrivers":  PFDriverHost,
	"mixed":      MixedHost,
	"infiniband": InfinibandHost,
	"noiommu":    NoIOMMUHost,
	"noacs":      NoACSHost,
	"switchdev":  SwitchdevHost,
	"nonuma":     NoNUMAHost,
	"large":      LargeHost,
}

// Fixture returns the host fixture called name (see FixtureNames).
func Fixture(name string) (Spec, error) {
	f, ok := fixtures[name]
	if !ok {
		return Spec{}, fmt.Errorf("unknown simulated host %q: want one of %s", name, strings.Join(FixtureNames(), ", "))
	}
	return f(), nil
}

// FixtureNames lists the fixture names, sorted.
func FixtureNames() []string {
	return sortedKeys(fixtures)
}
