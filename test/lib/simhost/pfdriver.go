package simhost

import (
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"github.com/vfnet-io/vfnet/driver/kernel/vflink"
)

// Drivers and PCI IDs of the PFs modelled besides E810, ConnectX-6 Dx and I350.
const (
	Device82576      = "10c9" // igb; the NIC QEMU's -device igb emulates
	Device82576VF    = "10ca" // igbvf
	DeviceX710       = "1572" // X710 for 10GbE SFP+, i40e
	DeviceX710VF     = "154c" // iavf
	VendorBroadcom   = "14e4"
	DeviceBCM57414   = "16d7" // NetXtreme-E 10/25G, bnxt_en
	DeviceBCM57414VF = "16dc" // bnxt_en
	DriverI40E       = "i40e"
	DriverBNXT       = "bnxt_en"
)

// pfModel is the simulated PF driver behind `ip link set <pf> vf <n> ...`:
// what its ndo_set_vf_* functions refuse, with the errnos of the Linux
// sources (igb_main.c, i40e_virtchnl_pf.c, ice_sriov.c, mlx5 en_main.c,
// bnxt_sriov.c). Checks rtnetlink itself makes for every driver (ranges,
// min rate above max) stay in Links. Any other driver accepts everything.
type pfModel struct {
	driver, device string
	// carrier: the PF netdev's operstate is "up".
	carrier bool
	// speed is the link speed in Mbps while the PF has carrier.
	speed int
	spec  *PFSpec
}

// model returns the PF driver model of the PF at pfDir whose netdev is
// named pf (caller holds the lock).
func (l *Links) model(pfDir, pf string) pfModel {
	t := l.h.t
	m := pfModel{spec: l.h.pfs[filepath.Base(pfDir)]}
	if drv, err := t.readlink(pfDir + "/driver"); err == nil {
		m.driver = filepath.Base(drv)
	}
	if dev, err := t.read(pfDir + "/device"); err == nil {
		m.device = strings.TrimPrefix(dev, "0x")
	}
	state, _ := t.read(classNet + "/" + pf + "/operstate")
	m.carrier = state == "up"
	m.speed = defaultSpeed(m.driver, m.device)
	if m.spec != nil && m.spec.LinkSpeedMbps > 0 {
		m.speed = m.spec.LinkSpeedMbps
	}
	return m
}

// defaultSpeed is the link speed a PF of this kind negotiates in the
// simulation (the fastest its ports run at).
func defaultSpeed(driver, device string) int {
	switch driver {
	case DriverIGB:
		return 1000
	case DriverI40E:
		return 10000
	case DriverIce, DriverBNXT:
		return 25000
	case DriverMLX5:
		return 100000
	}
	return 10000
}

// linkSpeed is what the driver takes as the current speed: 0 without
// carrier (i40e and igb read the speed from the PHY's link status).
func (m pfModel) linkSpeed() int {
	if !m.carrier {
		return 0
	}
	return m.speed
}

func (m pfModel) is82576() bool {
	return slices.Contains([]string{"10c9", "10e6", "10e7", "10e8", "150a", "150d", "1518", "1526"}, m.device)
}

// vlan: the protocol check of each driver's ndo_set_vf_vlan.
func (m pfModel) vlan(proto string) error {
	if proto != vflink.VLANProto8021AD {
		return nil
	}
	switch m.driver {
	case DriverIGB, DriverI40E, DriverMLX5:
		return syscall.EPROTONOSUPPORT
	case DriverBNXT:
		// The default-VLAN TPID needs a firmware capability the modelled
		// firmware lacks.
		return syscall.EPROTONOSUPPORT
	case DriverIce:
		if m.spec != nil && m.spec.SingleVLANMode {
			return syscall.EPROTONOSUPPORT
		}
	}
	return nil
}

// linkState: igb has no ndo_set_vf_link_state, so rtnetlink answers
// EOPNOTSUPP.
func (m pfModel) linkState() error {
	if m.driver == DriverIGB {
		return syscall.EOPNOTSUPP
	}
	return nil
}

// rate: each driver's ndo_set_vf_rate. others sums the minimum rates of
// the PF's other VFs (ice refuses oversubscription). It returns the
// maximum rate the driver stores (i40e rounds small limits up).
func (m pfModel) rate(minMbps, maxMbps, others int) (int, error) {
	switch m.driver {
	case DriverIGB:
		// igb_ndo_set_vf_bw: only the 82576 rate-limits; no minimum; the
		// limit needs link up and at most the link speed.
		if !m.is82576() {
			return 0, syscall.EOPNOTSUPP
		}
		if minMbps != 0 || !m.carrier || maxMbps > m.linkSpeed() {
			return 0, syscall.EINVAL
		}
	case DriverI40E:
		// i40e_ndo_set_vf_bw: no minimum; at most the current link speed
		// (0 while down); under 50 Mbps is raised to one 50 Mbps credit.
		if minMbps != 0 || maxMbps > m.linkSpeed() {
			return 0, syscall.EINVAL
		}
		if maxMbps > 0 && maxMbps < 50 {
			maxMbps = 50
		}
	case DriverIce:
		// ice_set_vf_bw: no minimum with DCB; the minimums of all VFs may
		// not exceed the link speed.
		if minMbps != 0 && m.spec != nil && m.spec.DCB {
			return 0, syscall.EOPNOTSUPP
		}
		if others+minMbps > m.speed {
			return 0, syscall.EINVAL
		}
	case DriverBNXT:
		if maxMbps > m.speed || minMbps > m.speed {
			return 0, syscall.EINVAL
		}
	}
	return maxMbps, nil
}

// minRateOthers sums the minimum rates of pf's VFs other than vf.
func minRateOthers(m map[string]vflink.VFState, pf string, vf int) int {
	sum := 0
	for k, st := range m {
		if strings.HasPrefix(k, pf+"/") && k != key(pf, vf) {
			sum += st.MinTxRateMbps
		}
	}
	return sum
}

// I82576PF is an Intel 82576 port (igb) with igbvf VFs, as QEMU's
// -device igb emulates it: at most 7 VFs.
func I82576PF(addr, netdev string, numVFs int) PFSpec {
	return PFSpec{
		FunctionSpec: FunctionSpec{Address: addr, RootPort: rootPortFor(addr), VendorID: VendorIntel, DeviceID: Device82576,
			Driver: DriverIGB, NetDev: netdev},
		TotalVFs: 7, NumVFs: numVFs, VFOffset: 128, VFStride: 2, VFDeviceID: Device82576VF, VFDriver: DriverIGBVF,
	}
}

// X710PF is one port of an Intel X710 (i40e) with iavf VFs.
func X710PF(addr, netdev string, numVFs int) PFSpec {
	return PFSpec{
		FunctionSpec: FunctionSpec{Address: addr, RootPort: rootPortFor(addr), VendorID: VendorIntel, DeviceID: DeviceX710,
			Driver: DriverI40E, NetDev: netdev},
		TotalVFs: 64, NumVFs: numVFs, VFOffset: 16, VFDeviceID: DeviceX710VF, VFDriver: DriverIAVF,
	}
}

// BCM57414PF is one port of a Broadcom BCM57414 (bnxt_en drives PF and VFs).
func BCM57414PF(addr, netdev string, numVFs int) PFSpec {
	return PFSpec{
		FunctionSpec: FunctionSpec{Address: addr, RootPort: rootPortFor(addr), VendorID: VendorBroadcom, DeviceID: DeviceBCM57414,
			Driver: DriverBNXT, NetDev: netdev},
		TotalVFs: 64, NumVFs: numVFs, VFOffset: 8, VFDeviceID: DeviceBCM57414VF, VFDriver: DriverBNXT,
	}
}

// I82576Host is one 82576 port (0000:01:00.0 ens3, igb) with 7 igbvf VFs:
// the machine real-kernel.md runs under QEMU.
func I82576Host() Spec {
	return Spec{PFs: []PFSpec{I82576PF("0000:01:00.0", "ens3", 7)}}
}

// PFDriverHost has one PF of each modelled driver family (4 VFs each):
// 0000:01:00.0 ens3 igb 82576, 0000:02:00.0 enp2s0f0 igb I350,
// 0000:3b:00.0 enp59s0f0 ice, 0000:5e:00.0 enp94s0f0 i40e,
// 0000:af:00.0 ens1f0np0 bnxt_en, 0000:d8:00.0 ens8f0np0 mlx5_core.
func PFDriverHost() Spec {
	return Spec{PFs: []PFSpec{
		I82576PF("0000:01:00.0", "ens3", 4),
		I350PF("0000:02:00.0", "enp2s0f0", 4),
		E810PF("0000:3b:00.0", "enp59s0f0", 4),
		X710PF("0000:5e:00.0", "enp94s0f0", 4),
		BCM57414PF("0000:af:00.0", "ens1f0np0", 4),
		ConnectX6DxPF("0000:d8:00.0", "ens8f0np0", 4),
	}}
}
