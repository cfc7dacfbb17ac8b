// Netdevs: a PF's uplink and representors, link type and state.

package sysfs

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"

	"github.com/vfnet-io/vfnet/pkg/contract/pciaddr"
)

// classifyNetDevs splits the netdevs under a PF's device directory into the
// uplink and representors by phys_port_name. Representors of mlx5 and ice
// hang off the PF's PCI device too, so the PF's net/ lists them, and any of
// them can sort before the uplink.
func classifyNetDevs(devDir string, names []string) (uplink string, reps []string, switchdev bool) {
	var plain []string
	for _, n := range names {
		ppn, _ := readAttr(filepath.Join(devDir, "net", n, "phys_port_name"))
		switch {
		case representorRE.MatchString(ppn):
			reps = append(reps, n)
			if vfRepresentorRE.MatchString(ppn) {
				switchdev = true
			}
		case physicalPortRE.MatchString(ppn) && uplink == "":
			uplink = n
		default:
			plain = append(plain, n)
		}
	}
	if uplink == "" && len(plain) > 0 {
		uplink = plain[0]
	}
	return uplink, reps, switchdev
}

// UplinkOf returns the uplink netdev of the PF at pfBDF as the kernel shows
// it now (it may have been renamed since discovery), "" when it has none.
func (h *Host) UplinkOf(pfBDF string) (string, error) {
	if _, err := pciaddr.ParseKernelName(pfBDF); err != nil {
		return "", fmt.Errorf("PCI address %q: %w", pfBDF, err)
	}
	dir := filepath.Join(h.root, PCIDevicesDir, pfBDF)
	names, err := readDirNames(filepath.Join(dir, "net"))
	if errors.Is(err, fs.ErrNotExist) {
		if _, serr := os.Stat(dir); serr != nil {
			return "", fmt.Errorf("PF %s: %w", pfBDF, serr)
		}
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("PF %s: list netdevs: %w", pfBDF, err)
	}
	slices.Sort(names)
	uplink, _, _ := classifyNetDevs(dir, names)
	return uplink, nil
}

// netInfo reads class/net/<ifname>/{type,operstate}.
func (s *scanner) netInfo(ifname string) (linkType, operState string, err error) {
	dir := filepath.Join(s.h.root, ClassNetDir, ifname)
	tp := filepath.Join(dir, "type")
	v, err := readAttr(tp)
	if err != nil {
		return "", "", err
	}
	arphrd, err := strconv.Atoi(v)
	if err != nil {
		return "", "", fmt.Errorf("%s: want an ARPHRD number, got %q", tp, v)
	}
	linkType = LinkTypeFromARPHRD(arphrd)
	if operState, err = readAttr(filepath.Join(dir, "operstate")); err != nil {
		return "", "", err
	}
	return linkType, operState, nil
}

// Link types reported in PF.LinkType.
const (
	LinkTypeEthernet   = "ethernet"
	LinkTypeInfiniband = "infiniband"
)

// LinkTypeFromARPHRD maps a netdev's type (ARPHRD_*) to a link type name:
// "ethernet" (1), "infiniband" (32), else "arphrd <n>" so that a refusal can
// name what the kernel reported.
func LinkTypeFromARPHRD(t int) string {
	switch t {
	case 1:
		return LinkTypeEthernet
	case 32:
		return LinkTypeInfiniband
	}
	return "arphrd " + strconv.Itoa(t)
}

// representorRE matches the phys_port_name of e-switch representors as
// devlink names them (net/devlink/port.c): PCI PF "pf0" (or "c1pf0" on an
// external controller), PCI VF "pf0vf3", PCI SF "pf0sf7". An uplink
// (flavour physical) shows "p0" (split ports "p0s1"); netdevs of drivers
// without a devlink port (igb, i40e, ...) have no readable phys_port_name.
var representorRE = regexp.MustCompile(`^(c[0-9]+)?pf[0-9]+((vf|sf)[0-9]+)?$`)

// vfRepresentorRE matches VF representors only: they exist only in
// switchdev mode (mlx5 and ice create them on the switch to switchdev).
var vfRepresentorRE = regexp.MustCompile(`^(c[0-9]+)?pf[0-9]+vf[0-9]+$`)

// physicalPortRE matches the phys_port_name of an uplink port.
var physicalPortRE = regexp.MustCompile(`^p[0-9]+(s[0-9]+)?$`)
