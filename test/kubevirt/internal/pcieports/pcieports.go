// Package pcieports reads a libvirt domain XML and says which pcie-root-port
// controllers hold a device and which are free for a hotplug, which is the
// question issue 21 asks of the domain virt-launcher defines: is there a
// free port for the VF when it is re-attached (e.g. after a migration)?
package pcieports

import (
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/vfnet-io/vfnet/test/kubevirt/internal/xmltree"
)

// Port is one pcie-root-port controller.
type Port struct {
	// Index is the controller's index, which is the number of the bus it
	// provides: a device on it has <address type="pci" bus="Index">.
	Index int
	// Hotplug is <target hotplug="..."/> ("" when absent: libvirt's default, on).
	Hotplug string
	// Devices are "<element>[/<alias>]" of the devices on its bus.
	Devices []string
}

// Report is the root-port picture of a domain.
type Report struct {
	Ports []Port
	// Hostdevs maps each hostdev alias to the bus of its guest address
	// (-1 when it has no PCI address).
	Hostdevs map[string]int
}

// Free counts root ports without a device that accept a hotplug.
func (r Report) Free() int {
	n := 0
	for _, p := range r.Ports {
		if len(p.Devices) == 0 && p.Hotplug != "off" {
			n++
		}
	}
	return n
}

// Port returns the root port with the given index.
func (r Report) Port(index int) (Port, bool) {
	for _, p := range r.Ports {
		if p.Index == index {
			return p, true
		}
	}
	return Port{}, false
}

// String is a one-line summary: every root port, then the hostdevs.
func (r Report) String() string {
	var ports []string
	for _, p := range r.Ports {
		s := strconv.Itoa(p.Index)
		if len(p.Devices) > 0 {
			s += "=" + strings.Join(p.Devices, "+")
		} else {
			s += "=free"
		}
		if p.Hotplug != "" {
			s += "(hotplug=" + p.Hotplug + ")"
		}
		ports = append(ports, s)
	}
	var hds []string
	for a, bus := range r.Hostdevs {
		hds = append(hds, fmt.Sprintf("%s@bus%d", a, bus))
	}
	sort.Strings(hds)
	return fmt.Sprintf("root-ports=%d free-root-ports=%d ports=[%s] hostdevs=[%s]", len(r.Ports), r.Free(), strings.Join(ports, " "), strings.Join(hds, " "))
}

// Analyze reads a domain XML.
func Analyze(domainXML []byte) (Report, error) {
	root, err := xmltree.Parse(domainXML)
	if err != nil {
		return Report{}, err
	}
	devices := root.Child("devices")
	if devices == nil {
		return Report{}, fmt.Errorf("domain XML has no <devices>")
	}
	r := Report{Hostdevs: map[string]int{}}
	byIndex := map[int]int{}
	for _, d := range devices.Children {
		if d.Name.Local == "controller" && d.Attr("type") == "pci" && d.Attr("model") == "pcie-root-port" {
			i, err := strconv.Atoi(d.Attr("index"))
			if err != nil {
				return Report{}, fmt.Errorf("pcie-root-port with index %q", d.Attr("index"))
			}
			p := Port{Index: i}
			if t := d.Child("target"); t != nil {
				p.Hotplug = t.Attr("hotplug")
			}
			byIndex[i] = len(r.Ports)
			r.Ports = append(r.Ports, p)
		}
	}
	for _, d := range devices.Children {
		name := d.Name.Local
		if a := d.Child("alias"); a != nil {
			name += "/" + a.Attr("name")
		}
		bus := -1
		if addr := d.Child("address"); addr != nil && addr.Attr("type") == "pci" {
			b, err := strconv.ParseInt(addr.Attr("bus"), 0, 32)
			if err != nil {
				return Report{}, fmt.Errorf("%s has PCI bus %q", name, addr.Attr("bus"))
			}
			bus = int(b)
		}
		if d.Name.Local == "hostdev" {
			alias := ""
			if a := d.Child("alias"); a != nil {
				alias = a.Attr("name")
			}
			r.Hostdevs[alias] = bus
		}
		if i, ok := byIndex[bus]; ok && bus > 0 {
			r.Ports[i].Devices = append(r.Ports[i].Devices, name)
		}
	}
	sort.Slice(r.Ports, func(a, b int) bool { return r.Ports[a].Index < r.Ports[b].Index })
	return r, nil
}
