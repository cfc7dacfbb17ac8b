// Package standby names and builds the standby virtio interface of a
// virtio-net failover pair (VFConfig.failover): a libvirt
// <interface type='ethernet'> with the VF's MAC and
// <teaming type='persistent'/>, which libvirt turns into QEMU's
// virtio-net failover=on. The guest's net_failover pairs it with the VF of
// the same MAC and sends over the virtio path while the VF is unplugged
// (docs/migration.md, "Failover (opt-in)").
//
// The tap device the interface names is derived from the VMI interface
// name alone, so the source and the target launcher pods of a live
// migration, whose domain XML is the same, name the same device; the code
// that creates the tap in the launcher pod uses TargetDev too.
package standby

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"

	"libvirt.org/go/libvirtxml"
)

// AliasPrefix is the alias prefix of every standby interface vfnet writes.
// "ua-" marks a user alias; the rest matches no VMI interface alias KubeVirt
// writes for a vfnet interface (ua-<name>) and no SR-IOV hostdev alias
// (ua-sriov-), so KubeVirt's migration source leaves the standby in place.
const AliasPrefix = "ua-vfnet-sb-"

// Alias is the libvirt alias of the standby interface for VMI interface iface.
func Alias(iface string) string { return AliasPrefix + iface }

// TargetDevPrefix starts every standby tap name.
const TargetDevPrefix = "vfsb"

// MaxIfNameLen is the longest Linux interface name (IFNAMSIZ - 1).
const MaxIfNameLen = 15

// TargetDev is the host tap device of the standby interface for VMI
// interface iface: "vfsb" and the first 8 hex digits of the SHA-256 of
// the name, 12 bytes. It depends on nothing but the name, so it is the
// same in every launcher pod of the VM.
func TargetDev(iface string) string {
	sum := sha256.Sum256([]byte(iface))
	return TargetDevPrefix + hex.EncodeToString(sum[:4])
}

// Spec is the standby of one VMI interface.
type Spec struct {
	// Interface is the VMI interface name.
	Interface string
	// MAC is the VF's fixed MAC, which the standby shares.
	MAC net.HardwareAddr
}

// Element returns the standby interface: type ethernet on the
// pre-created tap TargetDev (managed='no': libvirt must not create it),
// the VF's MAC, a virtio model, the user alias, persistent teaming and no
// option ROM (the VF boots, the standby must not add a PXE ROM).
func (s Spec) Element() *libvirtxml.DomainInterface {
	return &libvirtxml.DomainInterface{
		MAC:     &libvirtxml.DomainInterfaceMAC{Address: s.MAC.String()},
		Source:  &libvirtxml.DomainInterfaceSource{Ethernet: &libvirtxml.DomainInterfaceSourceEthernet{}},
		Target:  &libvirtxml.DomainInterfaceTarget{Dev: TargetDev(s.Interface), Managed: "no"},
		Model:   &libvirtxml.DomainInterfaceModel{Type: "virtio"},
		Alias:   &libvirtxml.DomainAlias{Name: Alias(s.Interface)},
		Teaming: &libvirtxml.DomainInterfaceTeaming{Type: "persistent"},
		ROM:     &libvirtxml.DomainROM{Enabled: "no"},
	}
}

// Check refuses a spec the standby cannot be built from: no interface
// name, or a MAC that is not a fixed unicast 48-bit address.
func (s Spec) Check() error {
	if s.Interface == "" {
		return fmt.Errorf("failover standby: interface name is empty")
	}
	if len(s.MAC) != 6 || s.MAC[0]&1 == 1 || allZero(s.MAC) {
		return fmt.Errorf("failover standby for interface %q: MAC %q is not a unicast 48-bit address; failover needs the VF's fixed MAC: set the interface's macAddress or VFConfig.mac", s.Interface, s.MAC.String())
	}
	return nil
}

// XML renders Element as libvirt XML, after Check.
func (s Spec) XML() (string, error) {
	if err := s.Check(); err != nil {
		return "", err
	}
	x, err := s.Element().Marshal()
	if err != nil {
		return "", fmt.Errorf("render failover standby for interface %q: %w", s.Interface, err)
	}
	return x, nil
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}
