package prepare

import (
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
)

func TestCDIWriteReadRemove(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	w := CDIWriter{Root: filepath.Join(dir, "cdi"), DevRoot: "/dev"}
	ids, err := w.write("1234-uid", []cdiDevice{{Name: "vf-0000-3b-02-1", DevNode: "vfio/42"}, {Name: "vf-0000-3b-02-2", DevNode: "vfio/noiommu-7"}})
	if err != nil {
		t.Fatal(err)
	}
	if ids[0] != "sriov.vfnet.io/vf=1234-uid-vf-0000-3b-02-1" || ids[1] != "sriov.vfnet.io/vf=1234-uid-vf-0000-3b-02-2" {
		t.Fatalf("ids %v", ids)
	}
	// A runtime's CDI cache resolves the IDs to the right nodes.
	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(w.Root), cdiapi.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	if errs := cache.GetErrors(); len(errs) > 0 {
		t.Fatalf("cache errors: %v", errs)
	}
	dev := cache.GetDevice(ids[1])
	if dev == nil {
		t.Fatalf("device %s not found; have %v", ids[1], cache.ListDevices())
	}
	nodes := dev.ContainerEdits.DeviceNodes
	if len(nodes) != 1 || nodes[0].Path != "/dev/vfio/noiommu-7" || nodes[0].HostPath != "/dev/vfio/noiommu-7" {
		t.Fatalf("device nodes %+v", nodes)
	}
	spec := dev.GetSpec()
	if n := spec.ContainerEdits.DeviceNodes; len(n) != 1 || n[0].Path != "/dev/vfio/vfio" {
		t.Fatalf("spec-wide nodes %+v", n)
	}
	ents, _ := os.ReadDir(w.Root)
	if len(ents) != 1 || ents[0].Name() != "sriov.vfnet.io-vf_1234-uid.json" {
		t.Fatalf("cdi dir: %v", ents)
	}
	if err := w.remove("1234-uid"); err != nil {
		t.Fatal(err)
	}
	if err := w.remove("1234-uid"); err != nil {
		t.Fatalf("second remove: %v", err)
	}
	ents, _ = os.ReadDir(w.Root)
	if len(ents) != 0 {
		t.Fatalf("left %v", ents)
	}
}

func TestCDIInvalidRejected(t *testing.T) {
	t.Parallel()
	w := CDIWriter{Root: t.TempDir(), DevRoot: "/dev"}
	// A device name CDI rejects must not end up on disk.
	_, err := w.write("uid", []cdiDevice{{Name: "bad name!", DevNode: "vfio/1"}})
	if err == nil || !strings.Contains(err.Error(), "fails CDI validation") {
		t.Fatalf("write = %v", err)
	}
	ents, _ := os.ReadDir(w.Root)
	if len(ents) != 0 {
		t.Fatalf("left %v", ents)
	}
}

// A kill inside write, after the temporary file is complete and before it
// is renamed, leaves that file under a name of the claim's spec, and no
// spec; removeTemps removes it and nothing of another claim.
func TestKillInsideCDIWriteThenRemoveTemps(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	devs := []cdiDevice{{Name: "vf-0000-3b-02-1", DevNode: "vfio/42"}}
	other := CDIWriter{Root: root, DevRoot: "/dev"}
	if _, err := other.write("uid-b", devs); err != nil {
		t.Fatal(err)
	}
	var inside []string
	w := CDIWriter{Root: root, DevRoot: "/dev", Hook: func(step string) {
		if step != StepCDITempWritten {
			t.Errorf("hook step %q, want %q", step, StepCDITempWritten)
		}
		ents, err := os.ReadDir(root)
		if err != nil {
			t.Error(err)
		}
		for _, e := range ents {
			inside = append(inside, e.Name())
		}
		runtime.Goexit() // the write goes no further, as under a kill
	}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = w.write("uid-a", devs)
		t.Error("write returned after its hook stopped it")
	}()
	<-done
	specA, specB := "sriov.vfnet.io-vf_uid-a.json", "sriov.vfnet.io-vf_uid-b.json"
	// ReadDir sorts: the dot file comes first.
	if len(inside) != 2 || !isTempName(inside[0], specA) || inside[1] != specB {
		t.Fatalf("CDI directory inside the write: %v; want %s and a temporary file of %s", inside, specB, specA)
	}
	if got := names(t, root); !slices.Equal(got, inside) {
		t.Fatalf("CDI directory after the kill: %v, want %v", got, inside)
	}
	// Another claim's temporary files stay.
	plantB := []string{"." + specB + ".77.tmp", "." + specB + ".validate"}
	for _, n := range plantB {
		if err := os.WriteFile(filepath.Join(root, n), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	removed, err := w.removeTemps("uid-a")
	if err != nil {
		t.Fatal(err)
	}
	if len(removed) != 1 || removed[0] != filepath.Join(root, inside[0]) {
		t.Fatalf("removeTemps removed %v, want [%s]", removed, filepath.Join(root, inside[0]))
	}
	want := append([]string{specB}, plantB...)
	slices.Sort(want)
	if got := names(t, root); !slices.Equal(got, want) {
		t.Fatalf("CDI directory after removeTemps(uid-a): %v, want %v", got, want)
	}
	// The claim is written as usual afterwards.
	w.Hook = nil
	if _, err := w.write("uid-a", devs); err != nil {
		t.Fatal(err)
	}
	want = append(want, specA)
	slices.Sort(want)
	if got := names(t, root); !slices.Equal(got, want) {
		t.Fatalf("CDI directory after writing uid-a again: %v, want %v", got, want)
	}
}

// removeTemps removes the claim's temporary files of both kinds (this
// write's and the validation copy older drivers wrote) and nothing else:
// not the spec, not another claim's files, not look-alikes.
func TestCDIRemoveTempsOnlyTheClaims(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	w := CDIWriter{Root: root, DevRoot: "/dev"}
	files := map[string]bool{ // name -> removed by removeTemps("uid-a")
		".sriov.vfnet.io-vf_uid-a.json.123.tmp":        true,
		".sriov.vfnet.io-vf_uid-a.json.4294967295.tmp": true,
		".sriov.vfnet.io-vf_uid-a.json.validate":       true,
		"sriov.vfnet.io-vf_uid-a.json":                 false, // the spec: remove's business
		".sriov.vfnet.io-vf_uid-b.json.123.tmp":        false,
		".sriov.vfnet.io-vf_uid-b.json.validate":       false,
		".sriov.vfnet.io-vf_uid-a.json.x.json.5.tmp":   false, // claim "uid-a.json.x"
		".sriov.vfnet.io-vf_uid-a0.json.123.tmp":       false,
		".sriov.vfnet.io-vf_uid-a.json..tmp":           false,
		".sriov.vfnet.io-vf_uid-a.json.123.tmp.bak":    false,
		".sriov.vfnet.io_metadata_uid-a_vf.json.1.tmp": false, // the helper's: prepare removes it
	}
	for n := range files {
		if err := os.WriteFile(filepath.Join(root, n), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	removed, err := w.removeTemps("uid-a")
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for n, gone := range files {
		_, err := os.Stat(filepath.Join(root, n))
		if errors.Is(err, os.ErrNotExist) != gone {
			t.Errorf("%s: removed %v, want %v", n, !gone, gone)
		}
		if gone {
			want = append(want, filepath.Join(root, n))
		}
	}
	slices.Sort(want)
	slices.Sort(removed)
	if !slices.Equal(removed, want) {
		t.Errorf("removeTemps reported %v, want %v", removed, want)
	}
	if removed, err := w.removeTemps("uid-a"); err != nil || len(removed) != 0 {
		t.Errorf("second removeTemps = %v, %v; want nothing", removed, err)
	}
}

func TestIsTempName(t *testing.T) {
	t.Parallel()
	for name, want := range map[string]bool{
		".a.json.0.tmp":      true,
		".a.json.123456.tmp": true,
		"a.json.1.tmp":       false,
		".a.json.tmp":        false,
		".a.json..tmp":       false,
		".a.json.1a.tmp":     false,
		".a.json.1.tmpx":     false,
		".a.jsonx.1.tmp":     false,
		".b.json.1.tmp":      false,
	} {
		if got := isTempName(name, "a.json"); got != want {
			t.Errorf("isTempName(%q, a.json) = %v, want %v", name, got, want)
		}
	}
}

func names(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}
