// Package domain adds the VFIO hostdevs of vfnet binding interfaces to a
// libvirt domain XML, the mutation vfnet-binding performs in KubeVirt's
// OnDefineDomain hook. For an interface whose claim asks for failover
// (metadata.Device.Failover) it also adds the standby virtio interface of
// the failover pair (pkg/contract/standby) next to the hostdev.
//
// libvirtxml models only the elements it knows: a Domain round trip drops
// unknown elements (and unknown children of known ones) and rewrites
// namespace prefixes such as KubeVirt's qemu:commandline. So the domain is
// never re-marshalled as a whole: the document is scanned token by token to
// find <devices> and its <hostdev> and <interface> children, and only our
// elements (built with libvirtxml) are spliced into the original bytes. Everything else in
// the input is copied byte for byte.
package domain

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"sync"

	"k8s.io/klog/v2"

	vfhostdev "github.com/vfnet-io/vfnet/pkg/contract/hostdev"
	"github.com/vfnet-io/vfnet/pkg/contract/metadata"
	"github.com/vfnet-io/vfnet/pkg/contract/pciaddr"
	"github.com/vfnet-io/vfnet/pkg/contract/standby"
	"github.com/vfnet-io/vfnet/pkg/contract/vmiview"
)

// AliasPrefix is the alias prefix of every hostdev vfnet writes.
const AliasPrefix = vfhostdev.AliasPrefix

// Alias is the libvirt alias of the hostdev for VMI interface ifaceName.
func Alias(ifaceName string) string { return vfhostdev.Alias(ifaceName) }

// MetadataReader returns the device that backs a binding interface. Errors
// must name the file they concern.
type MetadataReader interface {
	Read(ci vmiview.ClaimInterface) (*metadata.Device, error)
}

// InvalidInputError marks a failure caused by malformed input (domain XML
// that is not a libvirt domain), as opposed to a missing precondition.
type InvalidInputError struct{ Err error }

func (e *InvalidInputError) Error() string { return e.Err.Error() }
func (e *InvalidInputError) Unwrap() error { return e.Err }

// Apply returns domainXML with one PCI hostdev for each of ifaces (the
// VMI's interfaces of the vfnet binding: vmiview.VMI.BindingInterfaces),
// replacing any hostdev with the same alias that an earlier call wrote,
// and, right after it, the failover standby <interface> of each interface
// whose device metadata asks for failover (replacing the one with its
// alias likewise). Every other part of the document is left as it is.
// cache, if not nil, keeps the XML of earlier calls for reuse. The logger
// comes from ctx.
func Apply(ctx context.Context, domainXML []byte, ifaces []vmiview.ClaimInterface, reader MetadataReader, cache *HostdevCache) ([]byte, error) {
	// Scan even when no interface uses the binding: the document must be a
	// domain either way, and returning garbage unchanged would only move
	// the failure to libvirt.
	doc, err := scan(domainXML)
	if err != nil {
		return nil, &InvalidInputError{err}
	}
	if len(ifaces) == 0 {
		return domainXML, nil
	}
	logger := klog.FromContext(ctx)
	wanted := make([]hostdev, 0, len(ifaces))
	sources := make(map[string]string, len(ifaces))
	taps := map[string]string{}
	for _, ci := range ifaces {
		h, sb, err := buildHostdev(logger, ci, reader)
		if err != nil {
			return nil, err
		}
		if other, dup := sources[h.source]; dup {
			return nil, fmt.Errorf("%s: VF %s already backs interface %q; each vfnet interface needs its own claim request", describe(ci), h.source, other)
		}
		sources[h.source] = ci.Interface.Name
		wanted = append(wanted, h)
		logger.V(2).Info("VF hostdev for interface", "interface", ci.Interface.Name, "claim", ci.PodClaimName, "request", ci.RequestName, "pciBusID", h.source)
		if sb == nil {
			continue
		}
		if other, dup := taps[sb.targetDev]; dup {
			return nil, fmt.Errorf("%s: its failover standby tap name %s equals that of interface %q (a hash collision of the two names); rename one of the interfaces", describe(ci), sb.targetDev, other)
		}
		taps[sb.targetDev] = ci.Interface.Name
		if err := doc.checkStandbyAlias(*sb); err != nil {
			return nil, fmt.Errorf("%s: %w", describe(ci), err)
		}
		wanted = append(wanted, *sb)
		logger.V(2).Info("Failover standby interface for interface", "interface", ci.Interface.Name, "alias", sb.alias, "targetDev", sb.targetDev, "mac", sb.key.mac.String())
	}
	return doc.splice(domainXML, wanted, cache, doc.keepHotpluggable(logger, wanted))
}

// checkStandbyAlias refuses to replace an <interface> that carries the
// standby's alias but not its tap: KubeVirt's own interface for a VMI
// interface named vfnet-sb-<name>, which a standby must not overwrite.
func (d *document) checkStandbyAlias(sb hostdev) error {
	for _, e := range d.interfaces {
		if e.alias == sb.alias && e.targetDev != sb.targetDev {
			return fmt.Errorf("the domain already has an <interface> with alias %s on device %q, which is not the failover standby vfnet writes (device %s); a VMI interface named %q collides with the standby's alias: rename it", sb.alias, e.targetDev, sb.targetDev, sb.alias[len("ua-"):])
		}
	}
	return nil
}

// keepHotpluggable returns the edits that remove hotplug="off" from the
// pcie-root-port of each VF: the bus of the interface's pciAddress, or the
// bus libvirt gave the hostdev this call replaces (a launcher hands back
// what libvirt read back). KubeVirt after v1.9.0 (PR 17605) switches off
// hot-plug on root ports that hold a non-interface device, and the VF is a
// hostdev; but its migration source detaches the VF by alias and the
// target hot-plugs it again, both of which libvirt refuses on such a port
// (and libvirt may place the VF there again when this call drops its
// address). A port that another device shares keeps KubeVirt's setting.
func (d *document) keepHotpluggable(logger klog.Logger, wanted []hostdev) []edit {
	if len(d.offPorts) == 0 {
		return nil
	}
	ours := make(map[string]bool, len(wanted))
	vfBus := map[int]string{}
	for _, h := range wanted {
		ours[h.alias] = true
		if h.key.hasGuest && h.key.guest.Domain == 0 {
			vfBus[int(h.key.guest.Bus)] = h.alias
		}
	}
	for _, e := range d.hostdevs {
		if _, seen := vfBus[e.guestBus]; ours[e.alias] && e.guestBus >= 0 && !seen {
			vfBus[e.guestBus] = e.alias
		}
	}
	shared := map[int]bool{}
	for _, u := range d.pciUsers {
		if !u.hostdev || !ours[u.alias] {
			shared[u.bus] = true
		}
	}
	var edits []edit
	for _, p := range d.offPorts {
		alias, vf := vfBus[p.index]
		if !vf || shared[p.index] {
			continue
		}
		edits = append(edits, edit{start: p.attrStart, end: p.attrEnd})
		logger.Info("Removed hotplug=\"off\" from the VF's pcie-root-port: the migration source detaches the VF by alias, which needs a hot-pluggable port",
			"rootPortIndex", p.index, "hostdev", alias)
	}
	return edits
}

// describe names an interface and its claim request for error messages.
func describe(ci vmiview.ClaimInterface) string {
	return fmt.Sprintf("interface %q (claim %q, request %q)", ci.Interface.Name, ci.PodClaimName, ci.RequestName)
}

// hostdev is one element Apply writes into <devices>: a VF's <hostdev>, or
// (kind elemInterface) the failover standby <interface>.
type hostdev struct {
	kind   string // elemHostdev or elemInterface
	alias  string
	source string // PCI address of the VF; "" for a standby
	// el is *libvirtxml.DomainHostdev or *libvirtxml.DomainInterface.
	el        any
	key       specKey
	targetDev string // the standby's tap
}

// kindName is the element's name; a hostdev built without a kind (tests)
// is a <hostdev>.
func (h hostdev) kindName() string {
	if h.kind == "" {
		return elemHostdev
	}
	return h.kind
}

// The element names Apply writes and replaces.
const (
	elemHostdev   = "hostdev"
	elemInterface = "interface"
)

// specKey is a vfhostdev.Spec, or a standby.Spec (standby set), as a
// comparable value.
type specKey struct {
	iface             string
	source, guest     pciaddr.Address
	hasGuest, hasBoot bool
	boot              uint
	standby           bool
	mac               macKey
}

// macKey is a 48-bit MAC as a comparable value.
type macKey [6]byte

func (m macKey) String() string { return net.HardwareAddr(m[:]).String() }

func keyOf(s vfhostdev.Spec) specKey {
	k := specKey{iface: s.Interface, source: s.Source}
	if s.Guest != nil {
		k.guest, k.hasGuest = *s.Guest, true
	}
	if s.BootOrder != nil {
		k.boot, k.hasBoot = *s.BootOrder, true
	}
	return k
}

// HostdevCache keeps the XML of hostdevs earlier calls wrote, keyed by
// everything that shapes it. virt-launcher calls OnDefineDomain two or three
// times per VM start with the same interfaces, and marshalling through
// libvirtxml's reflection is about a tenth of a call. Safe for concurrent
// use; bounded.
type HostdevCache struct {
	mu sync.Mutex
	m  map[cacheKey][]byte
}

type cacheKey struct {
	spec         specKey
	prefix, unit string
	pretty       bool
}

// maxCachedHostdevs bounds the cache: a VM has a handful of interfaces, and
// one sidecar serves one VM.
const maxCachedHostdevs = 256

// NewHostdevCache returns an empty cache.
func NewHostdevCache() *HostdevCache { return &HostdevCache{m: map[cacheKey][]byte{}} }

func (c *HostdevCache) get(k cacheKey) ([]byte, bool) {
	if c == nil {
		return nil, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	b, ok := c.m[k]
	return b, ok
}

func (c *HostdevCache) put(k cacheKey, b []byte) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.m) >= maxCachedHostdevs {
		clear(c.m)
	}
	c.m[k] = bytes.Clone(b)
}

// buildHostdev builds the interface's hostdev and, when its device asks
// for failover, its standby interface (nil otherwise).
func buildHostdev(logger klog.Logger, ci vmiview.ClaimInterface, reader MetadataReader) (hostdev, *hostdev, error) {
	iface := ci.Interface
	if !validAliasName(iface.Name) {
		return hostdev{}, nil, fmt.Errorf("%s: the name cannot form a libvirt user alias (%s<name> allows only letters, digits, '-' and '_'); rename the interface", describe(ci), AliasPrefix)
	}
	dev, err := reader.Read(ci)
	if err != nil {
		return hostdev{}, nil, fmt.Errorf("%s: %w", describe(ci), err)
	}
	spec := vfhostdev.Spec{Interface: iface.Name, BootOrder: iface.BootOrder}
	if spec.Source, err = pciaddr.Parse(dev.PCIBusID); err != nil {
		return hostdev{}, nil, fmt.Errorf("%s: metadata attribute %s %q: %w; the metadata file is damaged", describe(ci), metadata.PCIBusIDAttribute, dev.PCIBusID, err)
	}
	// The VF's MAC: the one the driver reports having set, which equals
	// the interface's macAddress whenever both are known.
	var mac net.HardwareAddr
	if hw := dev.HardwareAddress(); hw != "" {
		if mac, err = net.ParseMAC(hw); err != nil && dev.Failover {
			return hostdev{}, nil, fmt.Errorf("%s: metadata networkData.hardwareAddress %q: %w; the metadata file is damaged", describe(ci), hw, err)
		}
	}
	if iface.MacAddress != "" {
		want, err := net.ParseMAC(iface.MacAddress)
		if err != nil {
			return hostdev{}, nil, fmt.Errorf("%s: macAddress %q: %w; fix spec.domain.devices.interfaces[].macAddress", describe(ci), iface.MacAddress, err)
		}
		hw := dev.HardwareAddress()
		if hw == "" {
			logger.Info("metadata has no networkData.hardwareAddress; cannot verify that the VF carries the interface's macAddress",
				"interface", iface.Name, "macAddress", iface.MacAddress, "pciBusID", dev.PCIBusID)
			mac = want
		} else {
			got, err := net.ParseMAC(hw)
			if err != nil || !bytes.Equal(got, want) {
				return hostdev{}, nil, fmt.Errorf("%s: VF %s carries MAC %q but the interface asks for %s; vfnet-driver sets the VMI's macAddress unless the claim's VFConfig sets another mac: make them agree, then restart the VM", describe(ci), dev.PCIBusID, hw, iface.MacAddress)
			}
		}
	}
	if iface.PciAddress != "" {
		guest, err := pciaddr.ParseLoose(iface.PciAddress)
		if err != nil {
			return hostdev{}, nil, fmt.Errorf("%s: pciAddress %q: %w; fix spec.domain.devices.interfaces[].pciAddress", describe(ci), iface.PciAddress, err)
		}
		spec.Guest = &guest
	}
	h := hostdev{kind: elemHostdev, alias: Alias(iface.Name), source: dev.PCIBusID, el: spec.Element(), key: keyOf(spec)}
	if !dev.Failover {
		return h, nil, nil
	}
	sb := standby.Spec{Interface: iface.Name, MAC: mac}
	if len(mac) == 0 {
		return hostdev{}, nil, fmt.Errorf("%s: the claim asks for failover (metadata attribute %s) but the VF's MAC is unknown: the metadata has no networkData.hardwareAddress and the interface no macAddress; the standby must carry the VF's fixed MAC: set spec.domain.devices.interfaces[].macAddress or VFConfig.mac, then restart the VM", describe(ci), metadata.FailoverAttribute)
	}
	if err := sb.Check(); err != nil {
		return hostdev{}, nil, fmt.Errorf("%s: %w", describe(ci), err)
	}
	k := specKey{iface: iface.Name, standby: true}
	copy(k.mac[:], mac)
	return h, &hostdev{kind: elemInterface, alias: standby.Alias(iface.Name), el: sb.Element(), key: k, targetDev: standby.TargetDev(iface.Name)}, nil
}

// validAliasName reports whether libvirt accepts ua-sriov-<name> (and the
// standby's ua-vfnet-sb-<name>) as a user alias; it also keeps the alias free of characters XML would escape, which
// the by-alias replacement relies on.
func validAliasName(name string) bool {
	if name == "" {
		return false
	}
	for _, r := range name {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
			return false
		}
	}
	return true
}
