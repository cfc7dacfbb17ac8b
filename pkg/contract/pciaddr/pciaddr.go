// Package pciaddr validates and parses PCI addresses (domain:bus:slot.function),
// so sysfs scanning, metadata, node configuration, discovery, the sidecar and
// the migration attacher agree on what an address is.
package pciaddr

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Address is a PCI domain:bus:slot.function.
type Address struct {
	Domain, Bus, Slot, Function uint
}

// String formats the address as a lower-case BDF (0000:3b:02.1).
func (a Address) String() string {
	return fmt.Sprintf("%04x:%02x:%02x.%x", a.Domain, a.Bus, a.Slot, a.Function)
}

// Valid reports whether s is a PCI address in the canonical form the kernel
// names devices with (and the standard pciBusID attribute uses): lower-case
// hex, a 4-8 digit domain (VMD domains exceed 4 digits), 2-digit bus and
// slot, slot at most 0x1f, function at most 7.
func Valid(s string) bool {
	n := len(s)
	if n < 12 || n > 16 || s[n-8] != ':' || s[n-5] != ':' || s[n-2] != '.' {
		return false
	}
	for i := 0; i < n; i++ {
		switch i {
		case n - 8, n - 5, n - 2:
			continue
		}
		if c := s[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return s[n-4] <= '1' && s[n-1] <= '7'
}

// Parse parses a PCI address DDDD:BB:SS.F written by a user (VMI pciAddress)
// or a peer: hex in any case, 1-4 digits per field. Errors do not repeat s;
// callers name the field it came from.
func Parse(s string) (Address, error) {
	parts := strings.Split(s, ":")
	if len(parts) != 3 {
		return Address{}, errors.New("not a PCI address of the form 0000:3b:02.1")
	}
	sf := strings.Split(parts[2], ".")
	if len(sf) != 2 {
		return Address{}, errors.New("not a PCI address of the form 0000:3b:02.1")
	}
	var a Address
	for _, f := range []struct {
		s    string
		max  uint64
		what string
		dst  *uint
	}{{parts[0], 0xffff, "domain", &a.Domain}, {parts[1], 0xff, "bus", &a.Bus}, {sf[0], 0x1f, "slot", &a.Slot}, {sf[1], 7, "function", &a.Function}} {
		if f.s == "" || len(f.s) > 4 {
			return Address{}, fmt.Errorf("PCI %s %q is not 1-4 hex digits", f.what, f.s)
		}
		n, err := strconv.ParseUint(f.s, 16, 16)
		if err != nil || n > f.max {
			return Address{}, fmt.Errorf("PCI %s %q is not a hex number up to %#x", f.what, f.s, f.max)
		}
		*f.dst = uint(n)
	}
	return a, nil
}
