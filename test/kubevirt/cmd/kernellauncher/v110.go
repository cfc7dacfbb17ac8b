package main

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/digitalocean/go-libvirt"

	"kubevirt.io/kubevirt/pkg/hooks"
	hooksInfo "kubevirt.io/kubevirt/pkg/hooks/info"
	hooksV1alpha3 "kubevirt.io/kubevirt/pkg/hooks/v1alpha3"
	grpcutil "kubevirt.io/kubevirt/pkg/util/net/grpc"
	"kubevirt.io/kubevirt/pkg/virt-launcher/virtwrap/api"

	"github.com/vfnet-io/vfnet/test/kubevirt/internal/pcieports"
)

// How -v110 finds the bus a pcie-root-port provides (-v110-root-port-bus).
const (
	// busFromBusNr is PR 17605 as merged: the port's <target busNr=>.
	// libvirt never writes one on a pcie-root-port and refuses a domain
	// that sets one ("Option 'busNr' is not valid for PCI controller ...
	// model 'pcie-root-port'", libvirt 11.3), so against a real libvirtd
	// this switches nothing off.
	busFromBusNr = "busNr"
	// busFromIndex is libvirt's own rule, which PR 17605's earlier
	// revision used: the pci controller with index N provides bus N (a
	// device with <address bus="N"> sits behind it). It is the form under
	// which the step takes effect.
	busFromIndex = "index"
)

// finishV110 is the tail of allocateHotplugPorts on KubeVirt's main branch
// after v1.9.0 (PR 17605, commits 51ee00a988 "pci: add
// DisableHotplugOnOccupiedRootPorts" and d021b4c56e "manager: read back
// domain spec when placeholderCount is zero"; read at kubevirt/kubevirt
// d923fdb815, pkg/virt-launcher/virtwrap/manager.go:1718-1752 and
// pci/hotplug.go:48-124): without placeholders the inactive XML is read
// back first (so the step sees the address libvirt gave the sidecar's
// hostdev; with placeholders the sidecar's later define dropped it);
// the extra root ports are appended; pci.DisableHotplugOnOccupiedRootPorts
// sets hotplug="off" on pcie-root-ports with a non-interface device; then
// one define through the hooks.
//
// v1.9.0's api.ControllerTarget has no Hotplug field, so the decision is
// made on the api.DomainSpec as main makes it, and hotplug="off" is written
// into the XML handed to the sidecars, which on main carries it (the hook
// manager marshals the spec): the sidecar sees what it would see there.
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
	off, known, ports := occupiedRootPorts(l.spec, l.c.v110Bus)
	hostdevAddr := "none"
	for _, hd := range l.spec.Devices.HostDevices {
		// api.Alias keeps a user alias without its "ua-" prefix.
		if hd.Alias != nil && hd.Alias.IsUserDefined() && strings.HasPrefix(hd.Alias.GetName(), "sriov-") {
			if hd.Address != nil {
				hostdevAddr = hd.Address.Bus
			}
		}
	}
	fmt.Printf("%sv110 bus-key=%s root-ports=%d with-busNr=%d hotplug-off=%v vf-hostdev-guest-bus-in-spec=%s\n", Prefix, l.c.v110Bus, ports, known, off, hostdevAddr)
	return l.defineWithHooksHotplugOff(off, "v110: extra root ports, hotplug off on occupied ones")
}

// defineWithHooksHotplugOff is defineWithHooks for main's last define: the
// hook manager's XML (xml.MarshalIndent of the spec, as OnDefineDomain
// makes it) with hotplug="off" on the given ports goes to each sidecar the
// manager collected, in its order, over KubeVirt's v1alpha3 client; the
// result is decoded back into the spec and defined as returned.
func (l *launcher) defineWithHooksHotplugOff(off []int, why string) (libvirt.Domain, error) {
	fail := func(err error) (libvirt.Domain, error) {
		return libvirt.Domain{}, fmt.Errorf("define %d (%s): %w", l.defines+1, why, err)
	}
	start := time.Now()
	domainXML, err := xml.MarshalIndent(l.spec, "", "\t")
	if err != nil {
		return fail(fmt.Errorf("marshal the domain spec: %w", err))
	}
	withOff, err := setHotplugOff(string(domainXML), off)
	if err != nil {
		return fail(err)
	}
	vmiJSON, err := json.Marshal(l.vmi)
	if err != nil {
		return fail(fmt.Errorf("marshal the VMI: %w", err))
	}
	callbacks, err := onDefineDomainCallbacks(l.hooks)
	if err != nil {
		return fail(err)
	}
	out := []byte(withOff)
	for _, cb := range callbacks {
		if out, err = cb.onDefineDomain(out, vmiJSON); err != nil {
			return fail(err)
		}
	}
	hookTime := time.Since(start)
	fromHooks := &api.DomainSpec{}
	if err := xml.Unmarshal(out, fromHooks); err != nil {
		return fail(fmt.Errorf("decode the hooks' domain into api.DomainSpec: %w", err))
	}
	fromHooks.DeepCopyInto(l.spec)
	r, err := pcieports.Analyze(out)
	if err != nil {
		return fail(fmt.Errorf("read the root ports of the hooks' domain: %w", err))
	}
	var stillOff []int
	for _, p := range r.Ports {
		if p.Hotplug == "off" {
			stillOff = append(stillOff, p.Index)
		}
	}
	fmt.Printf("%sv110 hooks-returned sidecars=%d hotplug-off=%v\n", Prefix, len(callbacks), stillOff)
	dom, err := l.virt.DomainDefineXML(string(out))
	if err != nil {
		return fail(fmt.Errorf("libvirt DomainDefineXML: %w", err))
	}
	l.defines++
	fmt.Printf("%sstep define-%d %s hooks=%s %s\n", Prefix, l.defines, time.Since(start).Round(100*time.Microsecond), hookTime.Round(100*time.Microsecond), why)
	return dom, nil
}

// hookCallback is one sidecar socket KubeVirt's hook manager collected.
type hookCallback struct{ socket, version string }

// onDefineDomainCallbacks reads the OnDefineDomain sidecars out of v1.9.0's
// hook manager (hookManager.CallbacksPerHookPoint, sorted by Collect), so
// the sockets and their order are KubeVirt's own; the manager offers no way
// to pass it XML instead of an api.DomainSpec.
func onDefineDomainCallbacks(m hooks.Manager) ([]hookCallback, error) {
	const fix = "kernellauncher reads v1.9.0's hook manager: update onDefineDomainCallbacks for this KubeVirt"
	v := reflect.ValueOf(m)
	if v.Kind() != reflect.Pointer || v.Elem().Kind() != reflect.Struct {
		return nil, fmt.Errorf("hook manager is a %T, not a pointer to a struct: %s", m, fix)
	}
	perPoint := v.Elem().FieldByName("CallbacksPerHookPoint")
	if perPoint.Kind() != reflect.Map {
		return nil, fmt.Errorf("hook manager %T has no map CallbacksPerHookPoint: %s", m, fix)
	}
	list := perPoint.MapIndex(reflect.ValueOf(hooksInfo.OnDefineDomainHookPointName))
	if !list.IsValid() {
		return nil, nil
	}
	var out []hookCallback
	for i := 0; i < list.Len(); i++ {
		c := reflect.Indirect(list.Index(i))
		socket, version := c.FieldByName("SocketPath"), c.FieldByName("Version")
		if socket.Kind() != reflect.String || version.Kind() != reflect.String {
			return nil, fmt.Errorf("hook manager callback %s has no SocketPath and Version strings: %s", c.Type(), fix)
		}
		out = append(out, hookCallback{socket: socket.String(), version: version.String()})
	}
	return out, nil
}

// onDefineDomain is the v1alpha3 case of the hook manager's
// onDefineDomainCallback: dial with a 1 s timeout, call with a minute's.
func (c hookCallback) onDefineDomain(domainXML, vmiJSON []byte) ([]byte, error) {
	if c.version != hooksV1alpha3.Version {
		return nil, fmt.Errorf("sidecar %s speaks hooks %s; this define supports %s (vfnet-binding's)", c.socket, c.version, hooksV1alpha3.Version)
	}
	conn, err := grpcutil.DialSocketWithTimeout(c.socket, 1)
	if err != nil {
		return nil, fmt.Errorf("dial sidecar %s: %w", c.socket, err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := hooksV1alpha3.NewCallbacksClient(conn).OnDefineDomain(ctx, &hooksV1alpha3.OnDefineDomainParams{DomainXML: domainXML, Vmi: vmiJSON})
	if err != nil {
		return nil, fmt.Errorf("sidecar %s OnDefineDomain: %w", c.socket, err)
	}
	return res.GetDomainXML(), nil
}

// occupiedRootPorts reproduces main's DisableHotplugOnOccupiedRootPorts
// decision (collectOccupiedPCIBuses / collectNonInterfacePCIAddresses): the
// indices of pcie-root-ports whose bus (busKey: busFromBusNr or
// busFromIndex) is one that a virtio disk, a non-root controller, a virtio
// input, a watchdog, a PCI hostdev (vfnet's VF among them), the balloon,
// the RNG or a memory device sits on. Interfaces are left out so NIC ports
// stay hot-unpluggable. It also returns how many root ports have a BusNr at
// all and how many there are.
func occupiedRootPorts(spec *api.DomainSpec, busKey string) (off []int, withBusNr, ports int) {
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
		i, err := strconv.Atoi(c.Index)
		if err != nil {
			continue
		}
		bus, known := i, busKey == busFromIndex
		if c.Target != nil && c.Target.BusNr != nil {
			withBusNr++
			if busKey == busFromBusNr {
				bus, known = int(*c.Target.BusNr), true
			}
		}
		if known && buses[bus] {
			off = append(off, i)
		}
	}
	sort.Ints(off)
	return off, withBusNr, ports
}

// setHotplugOff writes hotplug="off" on the <target> of the pcie-root-port
// controllers with the given indices, changing only those bytes (the rest of
// the marshalled domain is left as it is).
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
