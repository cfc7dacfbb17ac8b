package nodeconfig

import (
	"strings"
	"testing"
)

// FuzzParse: any input either parses into selectors that satisfy the
// documented invariants or fails with the file name in the message; never
// a panic.
func FuzzParse(f *testing.F) {
	for _, seed := range []string{
		header + "pfs:\n- pfName: ens1f0\n  network: a\n  vfs: [0, \"2-5\"]\n",
		header + "pfs:\n- pciAddress: \"0000:3b:00.0\"\n  vendorID: \"8086\"\n  network: b\n",
		header + "pfs: [{deviceID: \"1593\", network: c, vfs: [\"0-65535\"]}]\n",
		"pfs: 5\n", "- 1\n", "", "{", header + "pfs:\n- vfs: [\"9-1\"]\n",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, doc string) {
		cfg, err := Parse([]byte(doc), "fuzz.yaml")
		if err != nil {
			if !strings.Contains(err.Error(), "fuzz.yaml") {
				t.Fatalf("error without the file name: %v", err)
			}
			return
		}
		for i, s := range cfg.PFs {
			if s.Network == "" || len(s.Network) > 63 || (s.PFName == "" && s.PCIAddress == "" && s.VendorID == "" && s.DeviceID == "") {
				t.Fatalf("pfs[%d] accepted but invalid: %+v", i, s)
			}
			if s.VFs != nil && s.VFs.String() == "" {
				t.Fatalf("pfs[%d]: empty VF set accepted", i)
			}
		}
	})
}
