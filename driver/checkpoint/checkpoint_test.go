package checkpoint

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vfnet-io/vfnet/pkg/vflink"
)

func TestRoundTrip(t *testing.T) {
	t.Parallel()
	s := Store{Path: filepath.Join(t.TempDir(), FileName)}
	f, err := s.Load()
	if err != nil || len(f.Claims) != 0 {
		t.Fatalf("missing file: %v %v", f, err)
	}
	f.Claims["uid-1"] = &Claim{Namespace: "ns", Name: "c", Phase: PhasePreparing, Devices: []Device{{
		Request: "vf", Pool: "node", Device: "vf-0000-3b-02-1", BDF: "0000:3b:02.1", PFNetDev: "ens1", VFIndex: 1,
		Step: StepConfiguring, OriginalDriver: "iavf",
		Original: vflink.VFState{MAC: net.HardwareAddr{2, 0, 0, 0, 0, 1}, VLAN: 5, LinkState: "auto", SpoofChk: true},
	}}}
	if err := s.Save(f); err != nil {
		t.Fatal(err)
	}
	g, err := s.Load()
	if err != nil {
		t.Fatal(err)
	}
	d := g.Claims["uid-1"].Devices[0]
	if d.Original.MAC.String() != "02:00:00:00:00:01" || d.Step != StepConfiguring || d.OriginalDriver != "iavf" || !d.Original.SpoofChk {
		t.Fatalf("round trip lost data: %+v", d)
	}
	// No temp files are left behind, and a crashed write's are removed.
	if err := os.WriteFile(filepath.Join(filepath.Dir(s.Path), "."+FileName+".123.tmp"), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Load(); err != nil {
		t.Fatal(err)
	}
	ents, _ := os.ReadDir(filepath.Dir(s.Path))
	if len(ents) != 1 {
		t.Fatalf("directory holds %d entries, want only the checkpoint", len(ents))
	}
}

func TestCorrupt(t *testing.T) {
	t.Parallel()
	for name, content := range map[string]string{
		"truncated":     `{"version":1,"claims":{"u":{"namesp`,
		"garbage":       "\x00\x01",
		"no version":    `{"claims":{}}`,
		"other version": `{"version":2,"claims":{}}`,
		"unknown field": `{"version":1,"claims":{},"extra":1}`,
		"bad phase":     `{"version":1,"claims":{"u":{"namespace":"n","name":"c","phase":"x","devices":[]}}}`,
		"no bdf":        `{"version":1,"claims":{"u":{"namespace":"n","name":"c","phase":"Prepared","devices":[{"step":"Bound"}]}}}`,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			p := filepath.Join(t.TempDir(), FileName)
			if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := Store{Path: p}.Load()
			if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), p) || !strings.Contains(err.Error(), "move the file away and restart") {
				t.Fatalf("Load = %v; want ErrCorrupt naming %s and the fix", err, p)
			}
		})
	}
}
