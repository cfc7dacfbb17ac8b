package cdi

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
)

func TestWriteReadRemove(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	w := Writer{Root: filepath.Join(dir, "cdi"), DevRoot: "/dev"}
	ids, err := w.Write("1234-uid", []Device{{Name: "vf-0000-3b-02-1", DevNode: "vfio/42"}, {Name: "vf-0000-3b-02-2", DevNode: "vfio/noiommu-7"}})
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
	if err := w.Remove("1234-uid"); err != nil {
		t.Fatal(err)
	}
	if err := w.Remove("1234-uid"); err != nil {
		t.Fatalf("second remove: %v", err)
	}
	ents, _ = os.ReadDir(w.Root)
	if len(ents) != 0 {
		t.Fatalf("left %v", ents)
	}
}

func TestInvalidRejected(t *testing.T) {
	t.Parallel()
	w := Writer{Root: t.TempDir(), DevRoot: "/dev"}
	// A device name CDI rejects must not end up on disk.
	_, err := w.Write("uid", []Device{{Name: "bad name!", DevNode: "vfio/1"}})
	if err == nil || !strings.Contains(err.Error(), "fails CDI validation") {
		t.Fatalf("Write = %v", err)
	}
	ents, _ := os.ReadDir(w.Root)
	if len(ents) != 0 {
		t.Fatalf("left %v", ents)
	}
}
