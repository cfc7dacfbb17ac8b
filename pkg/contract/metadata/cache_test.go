package metadata_test

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vfnet-io/vfnet/pkg/contract/metadata"
	"github.com/vfnet-io/vfnet/test/lib/kubevirtvmi"
	"github.com/vfnet-io/vfnet/test/lib/metadatatest"
)

var (
	cacheClaim = metadatatest.Claim{Namespace: "vms", Name: "vm-a-net-x7k2", UID: "u-1", PodClaimName: "net", Request: "vf"}
	cacheIface = kubevirtvmi.ClaimInterface{PodClaimName: "net", RequestName: "vf"}
)

func writeVF(t *testing.T, path, bdf string) {
	t.Helper()
	if err := metadatatest.Write(path, metadatatest.Stream(cacheClaim, metadatatest.VF(bdf, "02:00:00:00:00:01"))); err != nil {
		t.Fatal(err)
	}
}

func mustRead(t *testing.T, r *metadata.CachingReader, wantBDF string, wantDecodes int) *metadata.Device {
	t.Helper()
	d, err := r.Read(cacheIface)
	if err != nil {
		t.Fatal(err)
	}
	if d.PCIBusID != wantBDF {
		t.Errorf("PCIBusID = %s, want %s", d.PCIBusID, wantBDF)
	}
	if got := metadata.Decodes(r); got != wantDecodes {
		t.Errorf("file decoded %d times, want %d", got, wantDecodes)
	}
	return d
}

func TestCachingReaderHitsUntilFileChanges(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	path := metadata.TemplateClaimPath(root, "net", "vf")
	writeVF(t, path, "0000:3b:02.1")
	r := metadata.NewCachingReader(root)

	d := mustRead(t, r, "0000:3b:02.1", 1)
	d.PCIBusID = "changed by the caller"
	mustRead(t, r, "0000:3b:02.1", 1) // same file: no second decode, caller's edit not seen

	// Replaced by rename (new inode), as atomic writers do.
	tmp := filepath.Join(filepath.Dir(path), ".tmp")
	writeVF(t, tmp, "0000:3b:02.2")
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
	mustRead(t, r, "0000:3b:02.2", 2)

	// Rewritten in place with the same size and the old mtime put back:
	// the ctime still changes, so it is read again.
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(10 * time.Millisecond) // let the ctime move on coarse-clock filesystems
	writeVF(t, path, "0000:3b:02.3")
	if err := os.Chtimes(path, fi.ModTime(), fi.ModTime()); err != nil {
		t.Fatal(err)
	}
	mustRead(t, r, "0000:3b:02.3", 3)
	mustRead(t, r, "0000:3b:02.3", 3)
}

func TestCachingReaderDoesNotCacheErrors(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	path := metadata.TemplateClaimPath(root, "net", "vf")
	writeVF(t, path, "0000:3b:02.1")
	r := metadata.NewCachingReader(root)
	mustRead(t, r, "0000:3b:02.1", 1)

	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	_, err := r.Read(cacheIface)
	if err == nil || !strings.Contains(err.Error(), "did not write device metadata") {
		t.Fatalf("removed file: got %v, want FileReader's explanation", err)
	}
	if err := os.WriteFile(path, []byte("{"), 0o644); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := r.Read(cacheIface); err == nil || !strings.Contains(err.Error(), path) {
			t.Fatalf("damaged file: got %v, want an error naming %s", err, path)
		}
	}
	writeVF(t, path, "0000:3b:02.4")
	mustRead(t, r, "0000:3b:02.4", 5)
}

func TestCachingReaderConcurrent(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	path := metadata.TemplateClaimPath(root, "net", "vf")
	writeVF(t, path, "0000:3b:02.1")
	r := metadata.NewCachingReader(root)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 20 {
				d, err := r.Read(cacheIface)
				if err != nil || d.PCIBusID != "0000:3b:02.1" {
					t.Errorf("Read = %v, %v", d, err)
					return
				}
			}
		})
	}
	wg.Wait()
}
