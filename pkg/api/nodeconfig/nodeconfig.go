// Package nodeconfig reads the node configuration of vfnet-driver: which
// SR-IOV physical functions (PFs) of a node to expose, which physical network
// each PF is cabled to, and optionally which of its VF indexes to expose.
//
// File format (YAML, decoded strictly: unknown fields, duplicate keys and
// invalid values are errors naming the file and the field path):
//
//	apiVersion: vfnet.io/v1alpha1
//	kind: NodeConfig
//	pfs:
//	- pfName: ens1f0          # PF netdev name
//	  network: physnet-a      # DNS label, published as vfnet.io/network
//	- pciAddress: "0000:3b:00.1"
//	  vendorID: "8086"        # 4 hex digits, "0x" prefix allowed
//	  deviceID: "1593"
//	  network: physnet-b
//	  vfs: [0, "2", "4-7"]    # optional: VF indexes (integers or "N" / "N-M" ranges)
//	  allowSwitchdev: true    # optional: offer VFs even if the PF's e-switch is in switchdev mode
//	  numVFs: 8               # optional: vfnet makes the PF have exactly 8 VFs (sriov_numvfs)
//	  standby:                # optional: where failover standbys of this PF's VFs connect
//	    bridge: br-phys       # a node bridge on the PF's physical network (netdev name)
//	allowUnsafeNoIOMMU: true  # optional: offer VFs without IOMMU protection (vfio noiommu mode)
//
// allowSwitchdev: in switchdev mode VF traffic follows the flows on the VF
// representors (OVS, TC), and the legacy per-VF knobs vfnet sets through
// the PF (VLAN, spoof check, trust) do not apply; without the opt-in such a
// PF's VFs are not offered. allowUnsafeNoIOMMU: with vfio's
// enable_unsafe_noiommu_mode a VF without an IOMMU group can be bound to
// vfio-pci, but nothing stops the guest's DMA from reaching host memory;
// without the opt-in such VFs are not offered.
//
// numVFs: without it vfnet never writes sriov_numvfs (the VFs are another
// tool's business); with it the driver brings every PF the selector matches
// to that many VFs (driver/vfcount), waiting while any of the PF's VFs is in
// use.
//
// standby: a VF of a claim with VFConfig.failover gets a virtio standby
// in its VM whose host side vfnet connects to this bridge of the node's
// network namespace (driver/standby); the admin creates the bridge on the
// PF's physical network (same VLAN). Without it failover claims on the PF
// are refused at prepare.
//
// A selector names at least one of pfName, pciAddress, vendorID, deviceID;
// when it names several, a PF must match all of them. Without vfs, every VF
// of a matched PF is exposed.
//
// A PF matched by two selectors is an error (see Config.Select), not "first
// wins": the network attribute decides which VMs land on which physical
// network, and silently picking one of two contradicting answers would wire
// VMs to the wrong network.
package nodeconfig

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/vfnet-io/vfnet/driver/kernel/sysfs"
	"github.com/vfnet-io/vfnet/pkg/contract/pciaddr"
)

// APIVersion and Kind are the only header values accepted.
const (
	APIVersion = "vfnet.io/v1alpha1"
	Kind       = "NodeConfig"
)

// MaxVFIndex is the largest VF index a vfs entry may name; sriov_totalvfs is a
// 16-bit value in the PCI SR-IOV capability.
const MaxVFIndex = 65535

// Config is a validated node configuration.
type Config struct {
	// Source names where the configuration came from (the file path), for messages.
	Source string
	PFs    []Selector
	// AllowUnsafeNoIOMMU offers VFs without an IOMMU group when vfio runs
	// in noiommu mode (no DMA isolation from the host).
	AllowUnsafeNoIOMMU bool
}

// Selector selects PFs; every non-empty criterion must match.
type Selector struct {
	// PFName is the PF's netdev name ("ens1f0").
	PFName string
	// PCIAddress is the PF's lower-case BDF ("0000:3b:00.0").
	PCIAddress string
	// VendorID and DeviceID are four lower-case hex digits without "0x".
	VendorID string
	DeviceID string
	// Network is the physical network the PF is cabled to (a DNS label).
	Network string
	// VFs lists the VF indexes to expose; nil means all of them.
	VFs *IndexSet
	// AllowSwitchdev offers the VFs of a PF whose e-switch is in switchdev mode.
	AllowSwitchdev bool
	// NumVFs is the VF count vfnet keeps the PF at; nil: vfnet never
	// changes it.
	NumVFs *int
	// Standby says where the failover standbys of the PF's VFs connect;
	// nil: failover is refused on this PF.
	Standby *Standby
}

// Standby is a PF's failover standby setting.
type Standby struct {
	// Bridge is a bridge netdev in the node's network namespace on the
	// PF's physical network.
	Bridge string
}

// IndexSet is a set of VF indexes built from integers and "N-M" ranges.
type IndexSet struct {
	ranges [][2]int // inclusive, sorted, merged
}

// Contains reports whether i is in the set.
func (s *IndexSet) Contains(i int) bool {
	if s == nil {
		return true
	}
	n := sort.Search(len(s.ranges), func(k int) bool { return s.ranges[k][1] >= i })
	return n < len(s.ranges) && s.ranges[n][0] <= i
}

// String renders the set the way the file writes it, e.g. "0-3,7".
func (s *IndexSet) String() string {
	if s == nil {
		return "all"
	}
	parts := make([]string, 0, len(s.ranges))
	for _, r := range s.ranges {
		if r[0] == r[1] {
			parts = append(parts, strconv.Itoa(r[0]))
		} else {
			parts = append(parts, fmt.Sprintf("%d-%d", r[0], r[1]))
		}
	}
	return strings.Join(parts, ",")
}

func newIndexSet(ranges [][2]int) *IndexSet {
	sort.Slice(ranges, func(a, b int) bool { return ranges[a][0] < ranges[b][0] })
	var merged [][2]int
	for _, r := range ranges {
		if n := len(merged); n > 0 && r[0] <= merged[n-1][1]+1 {
			merged[n-1][1] = max(merged[n-1][1], r[1])
			continue
		}
		merged = append(merged, r)
	}
	return &IndexSet{ranges: merged}
}

// Load reads and validates the configuration file at path.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read node config: %w", err)
	}
	return Parse(data, path)
}

var (
	dnsLabelRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)
	hexIDRE    = regexp.MustCompile(`^[0-9a-f]{4}$`)
	rangeRE    = regexp.MustCompile(`^\s*([0-9]+)\s*(?:-\s*([0-9]+)\s*)?$`)
)

// fieldErrors collects every problem of a file, so an admin fixes them in one go.
type fieldErrors struct {
	source string
	errs   []error
}

func (f *fieldErrors) add(path, format string, args ...any) {
	f.errs = append(f.errs, fmt.Errorf("%s: %s: %s", f.source, path, fmt.Sprintf(format, args...)))
}

// Parse validates data, read from source (a file name, used in messages).
func Parse(data []byte, source string) (*Config, error) {
	// YAMLToJSONStrict rejects duplicate keys; the generic walk below
	// rejects unknown fields with their full path, which json's
	// DisallowUnknownFields cannot name.
	j, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		return nil, fmt.Errorf("%s: not valid YAML: %w", source, err)
	}
	dec := json.NewDecoder(bytes.NewReader(j))
	dec.UseNumber()
	var doc any
	if err := dec.Decode(&doc); err != nil {
		return nil, fmt.Errorf("%s: not valid YAML: %w", source, err)
	}
	fe := &fieldErrors{source: source}
	top, ok := doc.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("%s: the document must be a mapping with apiVersion: %s, kind: %s and pfs", source, APIVersion, Kind)
	}
	cfg := &Config{Source: source}
	checkKeys(fe, "", top, "apiVersion", "kind", "pfs", "allowUnsafeNoIOMMU")
	cfg.AllowUnsafeNoIOMMU = boolField(fe, "allowUnsafeNoIOMMU", top)
	if v, _ := top["apiVersion"].(string); v != APIVersion {
		fe.add("apiVersion", "got %s, must be %q", describe(top["apiVersion"]), APIVersion)
	}
	if v, _ := top["kind"].(string); v != Kind {
		fe.add("kind", "got %s, must be %q", describe(top["kind"]), Kind)
	}
	if raw, present := top["pfs"]; present && raw != nil {
		list, ok := raw.([]any)
		if !ok {
			fe.add("pfs", "got %s, must be a list of PF selectors", describe(raw))
		}
		for i, item := range list {
			cfg.PFs = append(cfg.PFs, parseSelector(fe, fmt.Sprintf("pfs[%d]", i), item))
		}
	}
	if len(fe.errs) > 0 {
		return nil, errors.Join(fe.errs...)
	}
	return cfg, nil
}

func parseSelector(fe *fieldErrors, path string, raw any) Selector {
	var s Selector
	m, ok := raw.(map[string]any)
	if !ok {
		fe.add(path, "got %s, must be a mapping with network and at least one of pfName, pciAddress, vendorID, deviceID", describe(raw))
		return s
	}
	checkKeys(fe, path+".", m, "pfName", "pciAddress", "vendorID", "deviceID", "network", "vfs", "allowSwitchdev", "numVFs", "standby")
	s.AllowSwitchdev = boolField(fe, path+".allowSwitchdev", m)
	if raw, present := m["numVFs"]; present {
		s.NumVFs = parseNumVFs(fe, path+".numVFs", raw)
	}
	str := func(key string) (string, bool) {
		v, present := m[key]
		if !present {
			return "", false
		}
		sv, ok := v.(string)
		if !ok {
			fe.add(path+"."+key, "got %s, must be a string", describe(v))
			return "", false
		}
		return sv, true
	}
	if v, ok := str("pfName"); ok {
		if !validNetdevName(v) {
			fe.add(path+".pfName", "%q is not a network interface name: 1 to 15 characters, no '/', ':' or whitespace", v)
		}
		s.PFName = v
	}
	if v, ok := str("pciAddress"); ok {
		lv := strings.ToLower(v)
		// The PF as the kernel names it; discovery applies the domain rule
		// and says why a PF beyond it is not offered.
		if _, err := pciaddr.ParseKernelName(lv); err != nil {
			fe.add(path+".pciAddress", "%q is not a PCI address: use domain:bus:slot.function, e.g. \"0000:3b:00.0\"", v)
		}
		s.PCIAddress = lv
	}
	for _, key := range []string{"vendorID", "deviceID"} {
		v, ok := str(key)
		if !ok {
			continue
		}
		lv := strings.TrimPrefix(strings.ToLower(v), "0x")
		if !hexIDRE.MatchString(lv) {
			fe.add(path+"."+key, "%q is not a PCI ID: use 4 hex digits, e.g. \"8086\" (quote it in YAML)", v)
		}
		if key == "vendorID" {
			s.VendorID = lv
		} else {
			s.DeviceID = lv
		}
	}
	if _, present := m["pfName"]; !present {
		if _, present := m["pciAddress"]; !present {
			if _, present := m["vendorID"]; !present {
				if _, present := m["deviceID"]; !present {
					fe.add(path, "selects every PF: name at least one of pfName, pciAddress, vendorID, deviceID")
				}
			}
		}
	}
	if v, ok := str("network"); ok {
		if len(v) > 63 || !dnsLabelRE.MatchString(v) {
			fe.add(path+".network", "%q is not a DNS label: lower-case letters, digits and '-', 1 to 63 characters, starting and ending with a letter or digit", v)
		}
		s.Network = v
	} else if _, present := m["network"]; !present {
		fe.add(path+".network", "missing: name the physical network this PF is cabled to (a DNS label, e.g. physnet-a)")
	}
	if raw, present := m["vfs"]; present {
		s.VFs = parseVFs(fe, path+".vfs", raw)
	}
	if raw, present := m["standby"]; present {
		s.Standby = parseStandby(fe, path+".standby", raw)
	}
	return s
}

// parseStandby reads standby: {bridge: <netdev>}. Whether the bridge
// exists is checked at prepare (the file is the same on every node).
func parseStandby(fe *fieldErrors, path string, raw any) *Standby {
	m, ok := raw.(map[string]any)
	if !ok {
		fe.add(path, "got %s, must be a mapping with bridge: the node bridge on the PF's physical network, e.g. {bridge: br-phys}", describe(raw))
		return nil
	}
	checkKeys(fe, path+".", m, "bridge")
	v, present := m["bridge"]
	if !present {
		fe.add(path+".bridge", "missing: name the node bridge (netdev) on the PF's physical network that failover standbys connect to")
		return nil
	}
	b, ok := v.(string)
	if !ok || !validNetdevName(b) {
		fe.add(path+".bridge", "got %s, must be a network interface name: 1 to 15 characters, no '/', ':' or whitespace", describe(v))
		return nil
	}
	return &Standby{Bridge: b}
}

// parseNumVFs reads a VF count: sriov_numvfs is a 16-bit value.
func parseNumVFs(fe *fieldErrors, path string, raw any) *int {
	num, ok := raw.(json.Number)
	if !ok {
		fe.add(path, "got %s, must be a non-negative integer: the number of VFs vfnet creates on the PF (omit it to leave sriov_numvfs alone)", describe(raw))
		return nil
	}
	n, err := strconv.Atoi(num.String())
	if err != nil || n < 0 || n > MaxVFIndex {
		fe.add(path, "%s is not a VF count: use an integer from 0 to %d (at most the PF's sriov_totalvfs)", num.String(), MaxVFIndex)
		return nil
	}
	return &n
}

func parseVFs(fe *fieldErrors, path string, raw any) *IndexSet {
	list, ok := raw.([]any)
	if !ok {
		fe.add(path, "got %s, must be a list of VF indexes: integers or \"N-M\" ranges, e.g. [0, \"4-7\"]", describe(raw))
		return nil
	}
	if len(list) == 0 {
		fe.add(path, "empty list exposes no VF: omit vfs to expose all VFs, or list indexes")
		return nil
	}
	var ranges [][2]int
	for i, item := range list {
		ipath := fmt.Sprintf("%s[%d]", path, i)
		var text string
		switch v := item.(type) {
		case json.Number:
			text = v.String()
		case string:
			text = v
		default:
			fe.add(ipath, "got %s, must be a VF index (integer) or a range \"N-M\"", describe(item))
			continue
		}
		sub := rangeRE.FindStringSubmatch(text)
		if sub == nil {
			fe.add(ipath, "%q is not a VF index or range: use a non-negative integer or \"N-M\" with N <= M", text)
			continue
		}
		lo, err1 := strconv.Atoi(sub[1])
		hi, err2 := lo, error(nil)
		if sub[2] != "" {
			hi, err2 = strconv.Atoi(sub[2])
		}
		if err1 != nil || err2 != nil || lo > MaxVFIndex || hi > MaxVFIndex {
			fe.add(ipath, "%q is out of range: VF indexes are 0 to %d", text, MaxVFIndex)
			continue
		}
		if lo > hi {
			fe.add(ipath, "%q is an empty range: write \"N-M\" with N <= M", text)
			continue
		}
		ranges = append(ranges, [2]int{lo, hi})
	}
	if len(ranges) == 0 {
		return nil
	}
	return newIndexSet(ranges)
}

// boolField reads an optional boolean; the key is the last element of path.
func boolField(fe *fieldErrors, path string, m map[string]any) bool {
	key := path[strings.LastIndexByte(path, '.')+1:]
	v, present := m[key]
	if !present {
		return false
	}
	b, ok := v.(bool)
	if !ok {
		fe.add(path, "got %s, must be true or false", describe(v))
	}
	return b
}

func checkKeys(fe *fieldErrors, prefix string, m map[string]any, allowed ...string) {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		known := false
		for _, a := range allowed {
			if k == a {
				known = true
				break
			}
		}
		if !known {
			fe.add(prefix+k, "unknown field; allowed fields here: %s", strings.Join(allowed, ", "))
		}
	}
}

func validNetdevName(s string) bool {
	// Linux IFNAMSIZ is 16 including the terminating NUL.
	if s == "" || len(s) > 15 || s == "." || s == ".." {
		return false
	}
	return !strings.ContainsAny(s, "/: \t\n\r")
}

func describe(v any) string {
	switch x := v.(type) {
	case nil:
		return "nothing"
	case string:
		return strconv.Quote(x)
	case json.Number:
		return "the number " + x.String()
	case bool:
		return fmt.Sprintf("the boolean %t (YAML reads unquoted y, n, yes, no, on, off as booleans: quote the value)", x)
	case []any:
		return "a list"
	case map[string]any:
		return "a mapping"
	default:
		return fmt.Sprintf("%v", x)
	}
}

// Matches reports whether pf satisfies every criterion of s.
func (s Selector) Matches(pf *sysfs.PF) bool {
	// pfName names the uplink: a representor under a switchdev PF is not
	// the PF's name.
	if s.PFName != "" && s.PFName != pf.Uplink() {
		return false
	}
	if s.PCIAddress != "" && s.PCIAddress != pf.Address {
		return false
	}
	if s.VendorID != "" && s.VendorID != pf.VendorID {
		return false
	}
	if s.DeviceID != "" && s.DeviceID != pf.DeviceID {
		return false
	}
	return true
}

// Selected is a PF chosen by the configuration.
type Selected struct {
	PF *sysfs.PF
	// Selector is the index of the matching entry in Config.PFs.
	Selector int
	Network  string
	// VFs limits the exposed VF indexes; nil exposes all.
	VFs *IndexSet
	// NumVFs is the selector's VF count (nil: not managed by vfnet).
	NumVFs *int
	// Standby is the selector's failover standby setting (nil: none).
	Standby *Standby
}

// Select returns the PFs the configuration selects, in the order of pfs. A
// PF matched by more than one selector is an error naming both selectors.
// A nil Config selects nothing.
func (c *Config) Select(pfs []sysfs.PF) ([]Selected, error) {
	if c == nil {
		return nil, nil
	}
	var out []Selected
	var errs []error
	for i := range pfs {
		pf := &pfs[i]
		first := -1
		for j, sel := range c.PFs {
			if !sel.Matches(pf) {
				continue
			}
			if first >= 0 {
				errs = append(errs, fmt.Errorf("%s: PF %s (%s) is matched by pfs[%d] and pfs[%d]: a PF is cabled to one network, make the selectors match disjoint PFs",
					c.Source, pf.Address, strings.Join(pf.NetDevs, ","), first, j))
				continue
			}
			first = j
			out = append(out, Selected{PF: pf, Selector: j, Network: sel.Network, VFs: sel.VFs, NumVFs: sel.NumVFs, Standby: sel.Standby})
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return out, nil
}
