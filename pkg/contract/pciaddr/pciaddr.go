// Package pciaddr is vfnet's one PCI address (domain:bus:slot.function), from
// the sysfs entry the kernel names to the <hostdev> source address QEMU
// opens: it parses the forms an address takes on the way, checks the one
// rule every step applies, formats, orders, and maps an address to and from
// its DRA device name. Nothing else in vfnet parses a PCI address.
//
// The domain rule: vfnet offers, prepares and hands to VMs only functions in
// PCI domains 0000-ffff. The kernel numbers the domains an Intel VMD
// controller creates from 10000 up, and libvirt takes such an address (its
// schema's pciDomain is a uint32; libvirt 11.3 defines the domain and puts
// host "10000:3b:02.1" on QEMU's command line), but QEMU's vfio-pci "host"
// property, the one libvirt fills from the hostdev source, refuses a domain
// beyond ffff (QEMU 10.0: "Property 'vfio-pci.host' doesn't take value
// '10000:3b:02.1'"), so the VM would never start. KubeVirt's PCI address
// parser (pkg/util/hardware ParsePciAddress) and the Kubernetes helpers for
// the standard pciBusID attribute (deviceattribute) take exactly four domain
// digits too. Such a function has a kernel name (ParseKernelName) but is not
// an address vfnet uses (Parse refuses it), and discovery says why. The
// libvirt and QEMU behaviour is checked against the real daemons by
// test/kubevirt/compat/vmddomain_test.go.
package pciaddr

import (
	"cmp"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// MaxDomain is the highest PCI domain vfnet offers (see the package doc).
const MaxDomain = 0xffff

// ErrDomain matches (errors.Is) the error for an address beyond MaxDomain.
var ErrDomain = errors.New("PCI domain beyond ffff")

type domainError struct{ domain uint }

func (e domainError) Error() string {
	return fmt.Sprintf("PCI domain %x is beyond ffff (Intel VMD numbers its domains from 10000): QEMU's vfio-pci cannot open such a host device, so vfnet gives it to no VM", e.domain)
}

func (e domainError) Is(target error) bool { return target == ErrDomain }

// Address is a PCI domain:bus:slot.function.
type Address struct {
	Domain, Bus, Slot, Function uint
}

// String formats the address as the kernel names the function: lower-case
// hex, the domain in at least four digits (0000:3b:02.1).
func (a Address) String() string {
	return fmt.Sprintf("%04x:%02x:%02x.%x", a.Domain, a.Bus, a.Slot, a.Function)
}

// Check applies the rule every step applies: bus at most ff, slot at most
// 1f, function at most 7, domain at most MaxDomain.
func (a Address) Check() error {
	switch {
	case a.Bus > 0xff:
		return fmt.Errorf("PCI bus %x is beyond ff", a.Bus)
	case a.Slot > 0x1f:
		return fmt.Errorf("PCI slot %x is beyond 1f", a.Slot)
	case a.Function > 7:
		return fmt.Errorf("PCI function %x is beyond 7", a.Function)
	case a.Domain > MaxDomain:
		return domainError{a.Domain}
	}
	return nil
}

// Compare orders addresses numerically by domain, bus, slot, function.
func (a Address) Compare(b Address) int {
	return cmp.Or(cmp.Compare(a.Domain, b.Domain), cmp.Compare(a.Bus, b.Bus), cmp.Compare(a.Slot, b.Slot), cmp.Compare(a.Function, b.Function))
}

// DeviceName is the DRA device name of the VF at a: 0000:3b:02.1 becomes
// vf-0000-3b-02-1, a DNS label (the API server's rule for a device name) that
// maps back one to one (ParseDeviceName). For an address that passes Check
// it is always 15 characters.
func (a Address) DeviceName() string {
	return fmt.Sprintf("%s%04x-%02x-%02x-%x", deviceNamePrefix, a.Domain, a.Bus, a.Slot, a.Function)
}

const deviceNamePrefix = "vf-"

const wantForm = "want the lower-case form domain:bus:slot.function, e.g. 0000:3b:02.1"

// ParseKernelName parses a PCI function's name as the kernel writes it in
// sysfs (bus/pci/devices, virtfn and physfn links): lower-case hex, a domain
// of 4 to 8 digits, 2-digit bus and slot, slot at most 1f, function at most 7.
// It does not apply the domain rule: this is what the host has, not what
// vfnet uses; only the kernel-side model and the node configuration, which
// names host PFs, call it. Errors do not repeat s; callers name its field.
func ParseKernelName(s string) (Address, error) {
	n := len(s)
	if n < 12 || n > 16 || s[n-8] != ':' || s[n-5] != ':' || s[n-2] != '.' {
		return Address{}, errors.New("not a PCI address: " + wantForm)
	}
	var a Address
	for _, f := range []struct {
		s   string
		dst *uint
	}{{s[:n-8], &a.Domain}, {s[n-7 : n-5], &a.Bus}, {s[n-4 : n-2], &a.Slot}, {s[n-1:], &a.Function}} {
		v, ok := lowerHex(f.s)
		if !ok {
			return Address{}, errors.New("not a PCI address: " + wantForm)
		}
		*f.dst = v
	}
	if a.Slot > 0x1f || a.Function > 7 {
		return Address{}, a.Check()
	}
	return a, nil
}

// Parse parses an address vfnet uses (a VF's pciBusID in a ResourceSlice or
// metadata file, a device name's address): the kernel's form with the
// domain rule applied, so the domain has exactly four digits.
func Parse(s string) (Address, error) {
	a, err := ParseKernelName(s)
	if err != nil {
		return Address{}, err
	}
	if err := a.Check(); err != nil {
		return Address{}, err
	}
	return a, nil
}

// ParseLoose parses an address as a user writes it (a VMI interface's
// pciAddress): hex in either case, 1 to 4 digits per field, then the same
// rule as Parse.
func ParseLoose(s string) (Address, error) {
	dom, rest, ok1 := strings.Cut(s, ":")
	bus, rest, ok2 := strings.Cut(rest, ":")
	slot, fn, ok3 := strings.Cut(rest, ".")
	if !ok1 || !ok2 || !ok3 || strings.ContainsAny(fn, ":.") {
		return Address{}, errors.New("not a PCI address of the form 0000:3b:02.1")
	}
	var a Address
	for _, f := range []struct {
		s, what string
		dst     *uint
	}{{dom, "domain", &a.Domain}, {bus, "bus", &a.Bus}, {slot, "slot", &a.Slot}, {fn, "function", &a.Function}} {
		v, err := strconv.ParseUint(f.s, 16, 32)
		if err != nil || len(f.s) > 4 {
			return Address{}, fmt.Errorf("PCI %s %q is not 1-4 hex digits", f.what, f.s)
		}
		*f.dst = uint(v)
	}
	if err := a.Check(); err != nil {
		return Address{}, err
	}
	return a, nil
}

// DeviceName is Parse, then Address.DeviceName: the DRA device name of the
// VF at bdf, or why bdf names no device vfnet offers.
func DeviceName(bdf string) (string, error) {
	a, err := Parse(bdf)
	if err != nil {
		return "", fmt.Errorf("PCI address %q: %w", bdf, err)
	}
	return a.DeviceName(), nil
}

// ParseDeviceName returns the VF address a device name stands for. A name
// of the form with a domain beyond ffff (no vfnet driver offers one now)
// fails with the domain rule's error.
func ParseDeviceName(name string) (Address, error) {
	s, ok := strings.CutPrefix(name, deviceNamePrefix)
	if n := len(s); ok && n >= 12 && s[n-8] == '-' && s[n-5] == '-' && s[n-2] == '-' {
		a, err := ParseKernelName(s[:n-8] + ":" + s[n-7:n-5] + ":" + s[n-4:n-2] + "." + s[n-1:])
		if err == nil {
			if err := a.Check(); err != nil {
				return Address{}, fmt.Errorf("device %s: %w", name, err)
			}
			return a, nil
		}
	}
	return Address{}, fmt.Errorf("device name %q is not a vfnet VF name (vf-<domain>-<bus>-<slot>-<function>, e.g. vf-0000-3b-02-1)", name)
}

// Compare orders two kernel names (ParseKernelName) numerically; names
// that do not parse sort after those that do, by text.
func Compare(a, b string) int {
	pa, erra := ParseKernelName(a)
	pb, errb := ParseKernelName(b)
	switch {
	case erra == nil && errb == nil:
		return pa.Compare(pb)
	case erra == nil:
		return -1
	case errb == nil:
		return 1
	}
	return strings.Compare(a, b)
}

// lowerHex parses 1-8 lower-case hex digits.
func lowerHex(s string) (uint, bool) {
	if s == "" || len(s) > 8 {
		return 0, false
	}
	var v uint
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= '0' && c <= '9':
			v = v<<4 | uint(c-'0')
		case c >= 'a' && c <= 'f':
			v = v<<4 | uint(c-'a'+10)
		default:
			return 0, false
		}
	}
	return v, true
}
