package main

import (
	"bytes"
	"crypto/rand"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/digitalocean/go-libvirt"

	"github.com/vfnet-io/vfnet/test/kubevirt/internal/pcieports"
)

// hotplugCheck asks the running libvirtd and QEMU whether the VF's root port
// in the defined domain takes what a live migration does to the VF: the
// source detaches it by alias, the target (the source's domain without the
// VF) hot-plugs it again. A host without VFIO cannot start the domain with
// the VF, so each step runs on a twin that boots no kernel and has an
// emulated PCIe NIC (e1000e, same alias; on the source twin at the VF's
// guest address) in the VF's place: a root port's hot-plug setting, which
// libvirt and QEMU enforce for every PCI device alike, is what is checked.
// The re-attach gives the NIC a guest address only when the VMI interface
// sets pciAddress, as driver/migration/attach does. The step's details are
//
//	alias=<a> vf-bus=<n> detach=<accepted|refused: ..> reattach=<accepted|refused: ..> reattach-bus=<n>
//
// and it fails only when a twin cannot be defined or started.
func (l *launcher) hotplugCheck(dom libvirt.Domain) (string, error) {
	raw, err := l.virt.DomainGetXMLDesc(dom, libvirt.DomainXMLInactive)
	if err != nil {
		return "", fmt.Errorf("read the defined domain: %w", err)
	}
	vf, err := findVFHostdev([]byte(raw))
	if err != nil {
		return "", err
	}
	explicit := ""
	for _, iface := range l.vmi.Spec.Domain.Devices.Interfaces {
		if "ua-sriov-"+iface.Name == vf.alias && iface.PciAddress != "" {
			explicit = vf.address
		}
	}
	nic := func(address string) string {
		return `<interface type="user"><model type="e1000e"/><rom enabled="no"/><alias name="` + vf.alias + `"/>` + address + `</interface>`
	}

	src, err := l.startTwin(raw, "src", vf, nic(vf.address))
	if err != nil {
		return "", err
	}
	detach := outcome(l.virt.DomainDetachDeviceAlias(src, vf.alias, uint32(libvirt.DomainAffectLive)))
	l.dropTwin(src)

	tgt, err := l.startTwin(raw, "tgt", vf, "")
	if err != nil {
		return "", err
	}
	defer l.dropTwin(tgt)
	reattach := outcome(l.virt.DomainAttachDeviceFlags(tgt, nic(explicit), uint32(libvirt.DomainAffectLive)))
	reattachBus := -1
	if live, err := l.virt.DomainGetXMLDesc(tgt, 0); err == nil {
		if r, err := pcieports.Analyze([]byte(live)); err == nil {
			for _, p := range r.Ports {
				for _, d := range p.Devices {
					if d == "interface/"+vf.alias {
						reattachBus = p.Index
					}
				}
			}
		}
	}
	return fmt.Sprintf("alias=%s vf-bus=%d detach=%s reattach=%s reattach-bus=%d", vf.alias, vf.bus, detach, reattach, reattachBus), nil
}

func outcome(err error) string {
	if err != nil {
		return "refused: " + strings.ReplaceAll(err.Error(), "\n", " ")
	}
	return "accepted"
}

// vfHostdev is the VF's hostdev in the defined domain: its alias, byte span
// and guest address.
type vfHostdev struct {
	alias      string
	start, end int
	address    string // the guest <address> element as libvirt wrote it
	bus        int
}

func findVFHostdev(domainXML []byte) (vfHostdev, error) {
	var found []vfHostdev
	err := walk(domainXML, func(path []string, t xml.StartElement, start, end int, inner []byte) {
		if strings.Join(path, "/") != "domain/devices/hostdev" {
			return
		}
		h := vfHostdev{start: start, end: end, bus: -1}
		_ = walk(inner, func(p []string, c xml.StartElement, s, e int, _ []byte) {
			switch strings.Join(p, "/") {
			case "hostdev/alias":
				h.alias = attr(c, "name")
			case "hostdev/address":
				h.address = string(inner[s:e])
				if b, err := strconv.ParseInt(attr(c, "bus"), 0, 32); err == nil {
					h.bus = int(b)
				}
			}
		})
		if strings.HasPrefix(h.alias, "ua-sriov-") {
			found = append(found, h)
		}
	})
	if err != nil {
		return vfHostdev{}, fmt.Errorf("scan the defined domain: %w", err)
	}
	if len(found) != 1 || found[0].address == "" {
		return vfHostdev{}, fmt.Errorf("the defined domain has %d ua-sriov- hostdevs, want one with a guest address", len(found))
	}
	return found[0], nil
}

// startTwin defines and starts the defined domain renamed to <name>-<role>
// with a new uuid, without kernel boot, with the VF hostdev replaced by
// replacement (nothing for ""), and with QEMU's firmware directories.
func (l *launcher) startTwin(domainXML, role string, vf vfHostdev, replacement string) (libvirt.Domain, error) {
	var u [16]byte
	if _, err := rand.Read(u[:]); err != nil {
		return libvirt.Domain{}, err
	}
	uuid := fmt.Sprintf("%x-%x-%x-%x-%x", u[0:4], u[4:6], u[6:8], u[8:10], u[10:16])
	twin, err := twinXML([]byte(domainXML), l.spec.Name+"-"+role, uuid, vf, replacement, l.c.firmwareDirs)
	if err != nil {
		return libvirt.Domain{}, fmt.Errorf("hotplug-check %s twin: %w", role, err)
	}
	d, err := l.virt.DomainDefineXML(twin)
	if err != nil {
		return libvirt.Domain{}, fmt.Errorf("hotplug-check: define the %s twin: %w", role, err)
	}
	if err := l.virt.DomainCreate(d); err != nil {
		_ = l.virt.DomainUndefineFlags(d, 0)
		return libvirt.Domain{}, fmt.Errorf("hotplug-check: start the %s twin: %w (QEMU's firmware comes from -firmware-dirs %q)", role, err, l.c.firmwareDirs)
	}
	return d, nil
}

func (l *launcher) dropTwin(d libvirt.Domain) {
	if err := l.virt.DomainDestroy(d); err != nil {
		fmt.Printf("%scleanup: destroy %s: %v\n", Prefix, d.Name, err)
	}
	// A transient wait: the destroy returns before libvirt forgets the
	// process, and an undefine in between only marks the domain.
	time.Sleep(100 * time.Millisecond)
	if err := l.virt.DomainUndefineFlags(d, 0); err != nil {
		fmt.Printf("%scleanup: undefine %s: %v\n", Prefix, d.Name, err)
	}
}

// twinXML edits the defined domain's bytes (libvirt's own formatting is
// kept, hotplug settings included). The uuid goes into <uuid> and into
// KubeVirt's SMBIOS system entry, which libvirt requires to agree (and
// takes the domain's uuid from when <uuid> is missing).
func twinXML(domainXML []byte, name, uuid string, vf vfHostdev, replacement, firmwareDirs string) (string, error) {
	type edit struct {
		start, end int
		text       string
	}
	edits := []edit{{vf.start, vf.end, replacement}}
	rootTagEnd := -1
	err := walk(domainXML, func(path []string, t xml.StartElement, start, end int, _ []byte) {
		switch strings.Join(path, "/") {
		case "domain":
			rootTagEnd = bytes.IndexByte(domainXML[start:], '>') + start
		case "domain/name":
			edits = append(edits, edit{start, end, "<name>" + name + "</name>"})
		case "domain/uuid":
			edits = append(edits, edit{start, end, "<uuid>" + uuid + "</uuid>"})
		case "domain/sysinfo/system/entry":
			if attr(t, "name") == "uuid" {
				edits = append(edits, edit{start, end, "<entry name='uuid'>" + uuid + "</entry>"})
			}
		case "domain/os/kernel", "domain/os/initrd", "domain/os/cmdline":
			edits = append(edits, edit{start, end, ""})
		}
	})
	if err != nil {
		return "", err
	}
	closing := bytes.LastIndex(domainXML, []byte("</domain>"))
	if rootTagEnd < 0 || closing < 0 {
		return "", errors.New("no <domain> element")
	}
	if bytes.Contains(domainXML, []byte("qemu:commandline")) {
		return "", errors.New("the domain already has a qemu:commandline; add the firmware directories to it")
	}
	var cmd strings.Builder
	cmd.WriteString("<qemu:commandline>")
	for _, d := range strings.Split(firmwareDirs, ":") {
		if d != "" {
			fmt.Fprintf(&cmd, `<qemu:arg value="-L"/><qemu:arg value=%q/>`, d)
		}
	}
	cmd.WriteString("</qemu:commandline>")
	edits = append(edits,
		edit{rootTagEnd, rootTagEnd, ` xmlns:qemu="http://libvirt.org/schemas/domain/qemu/1.0"`},
		edit{closing, closing, cmd.String()})
	// Apply from the end, so earlier offsets stay valid.
	sort.Slice(edits, func(i, j int) bool { return edits[i].start > edits[j].start })
	out := append([]byte(nil), domainXML...)
	for _, e := range edits {
		out = append(out[:e.start], append([]byte(e.text), out[e.end:]...)...)
	}
	return string(out), nil
}

// walk calls fn for every element of doc with its path of local names, the
// byte span of the whole element and its bytes.
func walk(doc []byte, fn func(path []string, t xml.StartElement, start, end int, inner []byte)) error {
	dec := xml.NewDecoder(bytes.NewReader(doc))
	type open struct {
		t     xml.StartElement
		start int
	}
	var stack []open
	var path []string
	for {
		off := int(dec.InputOffset())
		tok, err := dec.RawToken()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		switch t := tok.(type) {
		case xml.StartElement:
			stack = append(stack, open{t.Copy(), off})
			path = append(path, t.Name.Local)
		case xml.EndElement:
			o := stack[len(stack)-1]
			end := int(dec.InputOffset())
			fn(path, o.t, o.start, end, doc[o.start:end])
			stack, path = stack[:len(stack)-1], path[:len(path)-1]
		}
	}
}
