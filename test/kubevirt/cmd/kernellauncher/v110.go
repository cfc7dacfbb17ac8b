package main

import (
	"bytes"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"

	"github.com/digitalocean/go-libvirt"

	"kubevirt.io/kubevirt/pkg/virt-launcher/virtwrap/api"
)

// finishV110 is the tail of allocateHotplugPorts on KubeVirt's main branch
// after v1.9.0 (PR 17605, commits 51ee00a988 "pci: add
// DisableHotplugOnOccupiedRootPorts" and d021b4c56e "manager: read back
// domain spec when placeholderCount is zero"; read at kubevirt/kubevirt
// d923fdb815): without placeholders the inactive XML is read back first; the
// extra root ports are appended; pci.DisableHotplugOnOccupiedRootPorts sets
// hotplug="off" on pcie-root-ports with a non-interface device; then one
// define through the hooks, always.
//
// v1.9.0's api.ControllerTarget has no Hotplug field, so the decision is made
// on the api.DomainSpec exactly as main makes it (occupied buses from the
// devices' PCI addresses, a root port's bus from its Target.BusNr) and
// hotplug="off" is written into the hooks' XML just before
// DomainDefineXML; the sidecar therefore sees the domain without it, which
// it ignores anyway.
func (l *launcher) finishV110(dom libvirt.Domain, placeholders, extra int) (libvirt.Domain, error) {
	if placeholders == 0 {
		raw, err := l.virt.DomainGetXMLDesc(dom, libvirt.DomainXMLInactive)
		if err != nil {
			return libvirt.Domain{}, fmt.Errorf("v110: read back the inactive XML: %w", err)
		}
		back := &api.DomainSpec{}
		if err := xml.Unmarshal([]byte(raw), back); err != nil {
			return libvirt.Domain{}, fmt.Errorf("v110: decode the inactive XML: %w", err)
		}
		back.Devices.DeepCopyInto(&l.spec.Devices)
	}
	if extra > 0 {
		appendRootPorts(l.spec, extra)
	}
	off, known, ports := occupiedRootPorts(l.spec)
	hostdevAddr := "none"
	for _, hd := range l.spec.Devices.HostDevices {
		if hd.Alias != nil && strings.HasPrefix(hd.Alias.GetName(), "ua-sriov-") {
			if hd.Address != nil {
				hostdevAddr = hd.Address.Bus
			}
		}
	}
	fmt.Printf("%sv110 root-ports=%d with-busNr=%d hotplug-off=%v vf-hostdev-guest-bus-in-spec=%s\n", Prefix, ports, known, off, hostdevAddr)
	l.hotplugOff = off
	return l.defineWithHooks(l.spec, "v110: extra root ports, hotplug off on occupied ones")
}

// occupiedRootPorts reproduces main's DisableHotplugOnOccupiedRootPorts
// decision (collectOccupiedPCIBuses / collectNonInterfacePCIAddresses): the
// indices of pcie-root-ports whose Target.BusNr is a bus that a virtio disk,
// a non-root controller, a virtio input, a watchdog, a PCI hostdev, the
// balloon, the RNG or a memory device sits on. Interfaces are left out so
// NIC ports stay hot-unpluggable. It also returns how many root ports have
// a BusNr at all and how many there are.
func occupiedRootPorts(spec *api.DomainSpec) (off []int, withBusNr, ports int) {
	var addrs []*api.Address
	for _, d := range spec.Devices.Disks {
		if d.Target.Bus == "virtio" {
			addrs = append(addrs, d.Address)
		}
	}
	for _, c := range spec.Devices.Controllers {
		switch c.Model {
		case "pci-root", "pcie-root", "pcie-root-port", "pcie-expander-bus":
			continue
		}
		addrs = append(addrs, c.Address)
	}
	for _, in := range spec.Devices.Inputs {
		if in.Bus == "virtio" {
			addrs = append(addrs, in.Address)
		}
	}
	for _, w := range spec.Devices.Watchdogs {
		addrs = append(addrs, w.Address)
	}
	for _, hd := range spec.Devices.HostDevices {
		if hd.Type == "pci" {
			addrs = append(addrs, hd.Address)
		}
	}
	if spec.Devices.Ballooning != nil {
		addrs = append(addrs, spec.Devices.Ballooning.Address)
	}
	if spec.Devices.Rng != nil {
		addrs = append(addrs, spec.Devices.Rng.Address)
	}
	if spec.Devices.Memory != nil {
		addrs = append(addrs, spec.Devices.Memory.Address)
	}
	buses := map[int]bool{}
	for _, a := range addrs {
		if a == nil || a.Bus == "" {
			continue
		}
		if b, err := strconv.ParseInt(strings.TrimPrefix(a.Bus, "0x"), 16, 32); err == nil {
			buses[int(b)] = true
		}
	}
	for _, c := range spec.Devices.Controllers {
		if c.Model != "pcie-root-port" {
			continue
		}
		ports++
		if c.Target == nil || c.Target.BusNr == nil {
			continue
		}
		withBusNr++
		if buses[int(*c.Target.BusNr)] {
			if i, err := strconv.Atoi(c.Index); err == nil {
				off = append(off, i)
			}
		}
	}
	sort.Ints(off)
	return off, withBusNr, ports
}

// setHotplugOff writes hotplug="off" on the <target> of the pcie-root-port
// controllers with the given indices, changing only those bytes (the rest of
// the hooks' XML is passed on as it came).
func setHotplugOff(domainXML string, indices []int) (string, error) {
	want := map[string]bool{}
	for _, i := range indices {
		want[strconv.Itoa(i)] = true
	}
	type edit struct {
		at   int64
		text string
	}
	var edits []edit
	dec := xml.NewDecoder(strings.NewReader(domainXML))
	depth, ctrlDepth := 0, 0
	inCtrl, done := false, false
	found := map[string]bool{}
	for {
		before := dec.InputOffset()
		tok, err := dec.RawToken()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return "", fmt.Errorf("scan the hooks' XML: %w", err)
		}
		switch t := tok.(type) {
		case xml.StartElement:
			depth++
			switch {
			case !inCtrl && t.Name.Local == "controller" && attr(t, "model") == "pcie-root-port" && want[attr(t, "index")]:
				inCtrl, done, ctrlDepth = true, false, depth
				found[attr(t, "index")] = true
			case inCtrl && !done && depth == ctrlDepth+1 && t.Name.Local == "target":
				if h := attr(t, "hotplug"); h != "" {
					return "", fmt.Errorf("pcie-root-port already has hotplug=%q", h)
				}
				edits = append(edits, edit{before + int64(len("<target")), ` hotplug="off"`})
				done = true
			}
		case xml.EndElement:
			if inCtrl && depth == ctrlDepth {
				if !done {
					edits = append(edits, edit{before, `<target hotplug="off"/>`})
				}
				inCtrl = false
			}
			depth--
		}
	}
	if len(found) != len(want) {
		return "", fmt.Errorf("the hooks' XML lacks some of the pcie-root-ports %v", indices)
	}
	var b bytes.Buffer
	last := int64(0)
	for _, e := range edits {
		b.WriteString(domainXML[last:e.at])
		b.WriteString(e.text)
		last = e.at
	}
	b.WriteString(domainXML[last:])
	return b.String(), nil
}

func attr(t xml.StartElement, name string) string {
	for _, a := range t.Attr {
		if a.Name.Local == name {
			return a.Value
		}
	}
	return ""
}
