package checkpoint

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vfnet-io/vfnet/driver/kernel/vflink"
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
	// No temp files are left behind. Load leaves other temp files alone:
	// another driver instance may be writing one right now.
	ents, _ := os.ReadDir(filepath.Dir(s.Path))
	if len(ents) != 1 {
		t.Fatalf("directory holds %d entries, want only the checkpoint", len(ents))
	}
	inFlight := filepath.Join(filepath.Dir(s.Path), "."+FileName+".123.tmp")
	if err := os.WriteFile(inFlight, []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Load(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(inFlight); err != nil {
		t.Fatalf("Load removed another writer's temp file: %v", err)
	}
}

func TestRemoveStaleTemps(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "a[1]*") // glob metacharacters in the directory
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-time.Hour)
	files := map[string]bool{ // name -> should be removed
		".x.json.1.tmp": true,  // ours, old
		".x.json.2.tmp": false, // ours, in flight
		".y.json.3.tmp": false, // not ours
		"x.json":        false, // the file itself
	}
	for name, stale := range files {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if stale || name == ".y.json.3.tmp" || name == "x.json" {
			if err := os.Chtimes(p, old, old); err != nil {
				t.Fatal(err)
			}
		}
	}
	removed, err := RemoveStaleTemps([]string{filepath.Join(GlobEscape(dir), TempGlob("x.json"))}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if len(removed) != 1 || filepath.Base(removed[0]) != ".x.json.1.tmp" {
		t.Fatalf("removed %v", removed)
	}
	for name, stale := range files {
		_, err := os.Stat(filepath.Join(dir, name))
		if gone := errors.Is(err, os.ErrNotExist); gone != stale {
			t.Errorf("%s: removed %v, want %v", name, gone, stale)
		}
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
