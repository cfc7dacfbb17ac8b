package nodeconfig

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vfnet-io/vfnet/driver/kernel/sysfs"
)

const header = "apiVersion: vfnet.io/v1alpha1\nkind: NodeConfig\n"

func TestParseValid(t *testing.T) {
	t.Parallel()
	cfg, err := Parse([]byte(header+`pfs:
- pfName: ens1f0
  network: physnet-a
- pciAddress: "0000:3B:00.1"
  vendorID: "0x8086"
  deviceID: "1593"
  network: physnet-b
  vfs: [0, "2", "4-7", 5, "10 - 11"]
`), "node.yaml")
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	if len(cfg.PFs) != 2 {
		t.Fatalf("got %d selectors, want 2", len(cfg.PFs))
	}
	a, b := cfg.PFs[0], cfg.PFs[1]
	if a.PFName != "ens1f0" || a.Network != "physnet-a" || a.VFs != nil {
		t.Errorf("pfs[0] = %+v", a)
	}
	if b.PCIAddress != "0000:3b:00.1" || b.VendorID != "8086" || b.DeviceID != "1593" || b.Network != "physnet-b" {
		t.Errorf("pfs[1] = %+v", b)
	}
	if got := b.VFs.String(); got != "0,2,4-7,10-11" {
		t.Errorf("vfs = %s, want 0,2,4-7,10-11", got)
	}
	for i, want := range map[int]bool{0: true, 1: false, 2: true, 3: false, 4: true, 7: true, 8: false, 10: true, 11: true, 12: false} {
		if b.VFs.Contains(i) != want {
			t.Errorf("Contains(%d) = %v, want %v", i, !want, want)
		}
	}
}

func TestParseOptIns(t *testing.T) {
	t.Parallel()
	cfg, err := Parse([]byte(header+"allowUnsafeNoIOMMU: true\npfs:\n- pfName: a\n  network: net-a\n  allowSwitchdev: true\n- pfName: b\n  network: net-b\n"), "f")
	if err != nil {
		t.Fatal(err)
	}
	if !cfg.AllowUnsafeNoIOMMU || !cfg.PFs[0].AllowSwitchdev || cfg.PFs[1].AllowSwitchdev {
		t.Fatalf("opt-ins not read: %+v", cfg)
	}
}

// numVFs is optional: absent means vfnet never writes sriov_numvfs, and
// 0 is a valid request (remove every VF).
func TestParseNumVFs(t *testing.T) {
	t.Parallel()
	cfg, err := Parse([]byte(header+"pfs:\n- pfName: a\n  network: net-a\n  numVFs: 7\n- pfName: b\n  network: net-b\n- pfName: c\n  network: net-c\n  numVFs: 0\n"), "f")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.PFs[0].NumVFs == nil || *cfg.PFs[0].NumVFs != 7 || cfg.PFs[1].NumVFs != nil || cfg.PFs[2].NumVFs == nil || *cfg.PFs[2].NumVFs != 0 {
		t.Fatalf("numVFs not read: %+v", cfg.PFs)
	}
}

// pfName matches the uplink, never a representor listed under the PF.
func TestPFNameMatchesUplinkOnly(t *testing.T) {
	t.Parallel()
	pf := sysfs.PF{Function: sysfs.Function{Address: "0000:d8:00.0", NetDevs: []string{"ens8f0_0", "ens8f0np0"}},
		NetDev: "ens8f0np0", Representors: []string{"ens8f0_0"}, Switchdev: true}
	if (Selector{PFName: "ens8f0_0"}).Matches(&pf) || !(Selector{PFName: "ens8f0np0"}).Matches(&pf) {
		t.Fatal("pfName must match the uplink and only the uplink")
	}
}

func TestParseEmptySelectsNothing(t *testing.T) {
	t.Parallel()
	for _, doc := range []string{header, header + "pfs: []\n", header + "pfs:\n"} {
		cfg, err := Parse([]byte(doc), "f")
		if err != nil {
			t.Fatalf("%q: %v", doc, err)
		}
		sel, err := cfg.Select([]sysfs.PF{{Function: sysfs.Function{Address: "0000:01:00.0"}}})
		if err != nil || len(sel) != 0 {
			t.Errorf("%q selected %v, %v", doc, sel, err)
		}
	}
}

func TestParseErrors(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		doc  string
		want []string // every fragment must appear
	}{
		"not yaml":          {"pfs: [\n", []string{"cfg.yaml: not valid YAML"}},
		"not a mapping":     {"- a\n", []string{"cfg.yaml: the document must be a mapping"}},
		"missing header":    {"pfs: []\n", []string{"apiVersion: got nothing, must be \"vfnet.io/v1alpha1\"", "kind: got nothing, must be \"NodeConfig\""}},
		"wrong apiVersion":  {"apiVersion: v1\nkind: NodeConfig\n", []string{"apiVersion: got \"v1\""}},
		"wrong kind":        {"apiVersion: vfnet.io/v1alpha1\nkind: VFConfig\n", []string{"kind: got \"VFConfig\""}},
		"unknown top field": {header + "pf: []\n", []string{"cfg.yaml: pf: unknown field; allowed fields here: apiVersion, kind, pfs, allowUnsafeNoIOMMU"}},
		"duplicate key":     {header + "kind: NodeConfig\n", []string{"not valid YAML", "kind"}},
		"pfs not a list":    {header + "pfs: {pfName: a}\n", []string{"pfs: got a mapping, must be a list"}},
		"selector scalar":   {header + "pfs: [eth0]\n", []string{"pfs[0]: got \"eth0\", must be a mapping"}},
		"unknown pf field": {header + "pfs:\n- pfName: a\n  network: n\n- pfName: b\n  network: n\n  netwrk: x\n",
			[]string{"cfg.yaml: pfs[1].netwrk: unknown field; allowed fields here: pfName, pciAddress, vendorID, deviceID, network, vfs, allowSwitchdev, numVFs"}},
		"no criterion":              {header + "pfs:\n- network: n\n", []string{"pfs[0]: selects every PF"}},
		"missing network":           {header + "pfs:\n- pfName: a\n", []string{"pfs[0].network: missing"}},
		"network not label":         {header + "pfs:\n- pfName: a\n  network: Phys_Net\n", []string{"pfs[0].network: \"Phys_Net\" is not a DNS label"}},
		"network too long":          {header + "pfs:\n- pfName: a\n  network: " + strings.Repeat("a", 64) + "\n", []string{"pfs[0].network", "not a DNS label"}},
		"network number":            {header + "pfs:\n- pfName: a\n  network: 5\n", []string{"pfs[0].network: got the number 5, must be a string"}},
		"pfName bad":                {header + "pfs:\n- pfName: a/b\n  network: n\n", []string{"pfs[0].pfName: \"a/b\" is not a network interface name"}},
		"pfName long":               {header + "pfs:\n- pfName: abcdefghijklmnop\n  network: n\n", []string{"pfs[0].pfName"}},
		"pciAddress bad":            {header + "pfs:\n- pciAddress: 3b:00.0\n  network: n\n", []string{"pfs[0].pciAddress: \"3b:00.0\" is not a PCI address"}},
		"vendorID bad":              {header + "pfs:\n- vendorID: intel\n  network: n\n", []string{"pfs[0].vendorID: \"intel\" is not a PCI ID"}},
		"deviceID number":           {header + "pfs:\n- deviceID: 1593\n  network: n\n", []string{"pfs[0].deviceID: got the number 1593, must be a string"}},
		"vfs not list":              {header + "pfs:\n- pfName: a\n  network: n\n  vfs: 0-7\n", []string{"pfs[0].vfs: got \"0-7\", must be a list"}},
		"vfs empty":                 {header + "pfs:\n- pfName: a\n  network: n\n  vfs: []\n", []string{"pfs[0].vfs: empty list"}},
		"vfs negative":              {header + "pfs:\n- pfName: a\n  network: n\n  vfs: [-1]\n", []string{"pfs[0].vfs[0]: \"-1\" is not a VF index"}},
		"vfs reversed":              {header + "pfs:\n- pfName: a\n  network: n\n  vfs: [1, \"7-4\"]\n", []string{"pfs[0].vfs[1]: \"7-4\" is an empty range"}},
		"vfs too big":               {header + "pfs:\n- pfName: a\n  network: n\n  vfs: [70000]\n", []string{"pfs[0].vfs[0]: \"70000\" is out of range"}},
		"vfs float":                 {header + "pfs:\n- pfName: a\n  network: n\n  vfs: [1.5]\n", []string{"pfs[0].vfs[0]: \"1.5\" is not a VF index"}},
		"vfs bool":                  {header + "pfs:\n- pfName: a\n  network: n\n  vfs: [true]\n", []string{"pfs[0].vfs[0]: got the boolean true"}},
		"allowSwitchdev string":     {header + "pfs:\n- pfName: a\n  network: n\n  allowSwitchdev: \"yes\"\n", []string{"cfg.yaml: pfs[0].allowSwitchdev: got \"yes\", must be true or false"}},
		"numVFs negative":           {header + "pfs:\n- pfName: a\n  network: n\n  numVFs: -1\n", []string{"cfg.yaml: pfs[0].numVFs: -1 is not a VF count"}},
		"numVFs too big":            {header + "pfs:\n- pfName: a\n  network: n\n  numVFs: 65536\n", []string{"cfg.yaml: pfs[0].numVFs: 65536 is not a VF count"}},
		"numVFs float":              {header + "pfs:\n- pfName: a\n  network: n\n  numVFs: 2.5\n", []string{"pfs[0].numVFs: 2.5 is not a VF count"}},
		"numVFs string":             {header + "pfs:\n- pfName: a\n  network: n\n  numVFs: \"4\"\n", []string{"cfg.yaml: pfs[0].numVFs: got \"4\", must be a non-negative integer"}},
		"allowUnsafeNoIOMMU number": {header + "allowUnsafeNoIOMMU: 1\n", []string{"cfg.yaml: allowUnsafeNoIOMMU: got the number 1, must be true or false"}},
		"several at once": {header + "pfs:\n- pfName: a\n- pfName: b\n  network: B\n",
			[]string{"pfs[0].network: missing", "pfs[1].network: \"B\""}},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			_, err := Parse([]byte(tc.doc), "cfg.yaml")
			if err == nil {
				t.Fatalf("Parse accepted %q", tc.doc)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

func TestLoad(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "node.yaml")
	if err := os.WriteFile(path, []byte(header+"pfs:\n- pfName: a\n  network: n\n  bogus: 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := Load(path)
	if err == nil || !strings.Contains(err.Error(), path+": pfs[0].bogus: unknown field") {
		t.Fatalf("Load error = %v, want file and field path", err)
	}
	if _, err := Load(filepath.Join(dir, "missing.yaml")); err == nil || !strings.Contains(err.Error(), "missing.yaml") {
		t.Fatalf("Load of a missing file: %v", err)
	}
}

func pf(addr, netdev, vendor, device string) sysfs.PF {
	return sysfs.PF{Function: sysfs.Function{Address: addr, VendorID: vendor, DeviceID: device, NetDevs: []string{netdev}}, TotalVFs: 8}
}

func TestSelect(t *testing.T) {
	t.Parallel()
	pfs := []sysfs.PF{
		pf("0000:3b:00.0", "ens1f0", "8086", "1593"),
		pf("0000:3b:00.1", "ens1f1", "8086", "1593"),
		pf("0000:5e:00.0", "ens2f0", "15b3", "101d"),
	}
	cfg, err := Parse([]byte(header+`pfs:
- vendorID: "8086"
  deviceID: "1593"
  pciAddress: "0000:3b:00.1"
  network: b
- pfName: ens2f0
  network: c
  vfs: ["0-1"]
- vendorID: "8086"
  deviceID: "1521"
  network: nope
`), "f")
	if err != nil {
		t.Fatal(err)
	}
	sel, err := cfg.Select(pfs)
	if err != nil {
		t.Fatal(err)
	}
	if len(sel) != 2 || sel[0].PF.Address != "0000:3b:00.1" || sel[0].Network != "b" || sel[0].Selector != 0 ||
		sel[1].PF.Address != "0000:5e:00.0" || sel[1].Network != "c" || sel[1].VFs.Contains(2) {
		t.Fatalf("Select = %+v", sel)
	}
}

func TestSelectOverlapIsError(t *testing.T) {
	t.Parallel()
	pfs := []sysfs.PF{pf("0000:3b:00.0", "ens1f0", "8086", "1593")}
	cfg, err := Parse([]byte(header+"pfs:\n- pfName: ens1f0\n  network: a\n- vendorID: \"8086\"\n  network: b\n"), "node.yaml")
	if err != nil {
		t.Fatal(err)
	}
	_, err = cfg.Select(pfs)
	if err == nil || !strings.Contains(err.Error(), "node.yaml: PF 0000:3b:00.0 (ens1f0) is matched by pfs[0] and pfs[1]") {
		t.Fatalf("Select error = %v", err)
	}
}

// standby names a bridge per PF; a missing or malformed bridge name is an
// error naming the field, and Select carries the setting to the PF.
func TestParseStandby(t *testing.T) {
	t.Parallel()
	cfg, err := Parse([]byte(header+"pfs:\n- pfName: a\n  network: net-a\n  standby: {bridge: br-phys}\n- pfName: b\n  network: net-b\n"), "f")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.PFs[0].Standby == nil || cfg.PFs[0].Standby.Bridge != "br-phys" || cfg.PFs[1].Standby != nil {
		t.Fatalf("standby not read: %+v %+v", cfg.PFs[0].Standby, cfg.PFs[1].Standby)
	}
	sel, err := cfg.Select([]sysfs.PF{{Function: sysfs.Function{Address: "0000:01:00.0", NetDevs: []string{"a"}}}})
	if err != nil || len(sel) != 1 || sel[0].Standby == nil || sel[0].Standby.Bridge != "br-phys" {
		t.Fatalf("Select = %+v, %v; want the standby bridge carried", sel, err)
	}
	for doc, want := range map[string]string{
		"standby: br-phys": "pfs[0].standby: got \"br-phys\", must be a mapping",
		"standby: {}":      "pfs[0].standby.bridge: missing",
		"standby: {bridge: this-name-is-too-long}": "pfs[0].standby.bridge: got \"this-name-is-too-long\", must be a network interface name",
		"standby: {bridge: \"a/b\"}":               "pfs[0].standby.bridge: got \"a/b\"",
		"standby: {bridge: br0, mtu: 9000}":        "pfs[0].standby.mtu: unknown field",
	} {
		_, err := Parse([]byte(header+"pfs:\n- pfName: a\n  network: net-a\n  "+doc+"\n"), "f.yaml")
		if err == nil || !strings.Contains(err.Error(), "f.yaml: "+want) {
			t.Errorf("%s: got %v, want an error containing %q", doc, err, want)
		}
	}
}
