// Package domain adds the VFIO hostdevs of vfnet binding interfaces to a
// libvirt domain XML, the mutation vfnet-binding performs in KubeVirt's
// OnDefineDomain hook.
//
// libvirtxml models only the elements it knows: a Domain round trip drops
// unknown elements (and unknown children of known ones) and rewrites
// namespace prefixes such as KubeVirt's qemu:commandline. So the domain is
// never re-marshalled as a whole: the document is scanned token by token to
// find <devices> and its <hostdev> children, and only our hostdevs (built
// with libvirtxml) are spliced into the original bytes. Everything else in
// the input is copied byte for byte.
package domain

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"sync"

	"k8s.io/klog/v2"
	"libvirt.org/go/libvirtxml"

	vfhostdev "github.com/vfnet-io/vfnet/pkg/contract/hostdev"
	"github.com/vfnet-io/vfnet/pkg/contract/metadata"
	"github.com/vfnet-io/vfnet/pkg/contract/pciaddr"
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
// replacing any hostdev with the same alias that an earlier call wrote.
// Every other part of the document is left as it is. cache, if not nil,
// keeps the hostdev XML of earlier calls for reuse. The logger comes from
// ctx.
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
	for _, ci := range ifaces {
		h, err := buildHostdev(logger, ci, reader)
		if err != nil {
			return nil, err
		}
		if other, dup := sources[h.source]; dup {
			return nil, fmt.Errorf("%s: VF %s already backs interface %q; each vfnet interface needs its own claim request", describe(ci), h.source, other)
		}
		sources[h.source] = ci.Interface.Name
		wanted = append(wanted, h)
		logger.V(2).Info("VF hostdev for interface", "interface", ci.Interface.Name, "claim", ci.PodClaimName, "request", ci.RequestName, "pciBusID", h.source)
	}
	return doc.splice(domainXML, wanted, cache, doc.keepHotpluggable(logger, wanted))
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

type hostdev struct {
	alias  string
	source string // PCI address of the VF
	el     *libvirtxml.DomainHostdev
	key    specKey
}

// specKey is a vfhostdev.Spec as a comparable value.
type specKey struct {
	iface             string
	source, guest     pciaddr.Address
	hasGuest, hasBoot bool
	boot              uint
}

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

func buildHostdev(logger klog.Logger, ci vmiview.ClaimInterface, reader MetadataReader) (hostdev, error) {
	iface := ci.Interface
	if !validAliasName(iface.Name) {
		return hostdev{}, fmt.Errorf("%s: the name cannot form a libvirt user alias (%s<name> allows only letters, digits, '-' and '_'); rename the interface", describe(ci), AliasPrefix)
	}
	dev, err := reader.Read(ci)
	if err != nil {
		return hostdev{}, fmt.Errorf("%s: %w", describe(ci), err)
	}
	spec := vfhostdev.Spec{Interface: iface.Name, BootOrder: iface.BootOrder}
	if spec.Source, err = pciaddr.Parse(dev.PCIBusID); err != nil {
		return hostdev{}, fmt.Errorf("%s: metadata attribute %s %q: %w; the metadata file is damaged", describe(ci), metadata.PCIBusIDAttribute, dev.PCIBusID, err)
	}
	if iface.MacAddress != "" {
		want, err := net.ParseMAC(iface.MacAddress)
		if err != nil {
			return hostdev{}, fmt.Errorf("%s: macAddress %q: %w; fix spec.domain.devices.interfaces[].macAddress", describe(ci), iface.MacAddress, err)
		}
		hw := dev.HardwareAddress()
		if hw == "" {
			logger.Info("metadata has no networkData.hardwareAddress; cannot verify that the VF carries the interface's macAddress",
				"interface", iface.Name, "macAddress", iface.MacAddress, "pciBusID", dev.PCIBusID)
		} else {
			got, err := net.ParseMAC(hw)
			if err != nil || !bytes.Equal(got, want) {
				return hostdev{}, fmt.Errorf("%s: VF %s carries MAC %q but the interface asks for %s; vfnet-driver sets the VMI's macAddress unless the claim's VFConfig sets another mac: make them agree, then restart the VM", describe(ci), dev.PCIBusID, hw, iface.MacAddress)
			}
		}
	}
	if iface.PciAddress != "" {
		guest, err := pciaddr.ParseLoose(iface.PciAddress)
		if err != nil {
			return hostdev{}, fmt.Errorf("%s: pciAddress %q: %w; fix spec.domain.devices.interfaces[].pciAddress", describe(ci), iface.PciAddress, err)
		}
		spec.Guest = &guest
	}
	return hostdev{alias: Alias(iface.Name), source: dev.PCIBusID, el: spec.Element(), key: keyOf(spec)}, nil
}

// validAliasName reports whether libvirt accepts ua-sriov-<name> as a user
// alias; it also keeps the alias free of characters XML would escape, which
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
