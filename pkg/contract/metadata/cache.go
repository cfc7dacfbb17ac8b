package metadata

import (
	"os"
	"sync"

	"github.com/vfnet-io/vfnet/pkg/contract/vmiview"
)

// maxCached bounds CachingReader's memory. One sidecar serves one VM, whose
// interfaces name a handful of files; the bound only matters if something
// keeps asking for new paths.
const maxCached = 256

// CachingReader is a FileReader that remembers the device it decoded from
// each file and decodes the file again only when its identity changes
// (path, device and inode, size, mtime or ctime). virt-launcher calls
// OnDefineDomain two or three times per VM start with the same files, and a
// stat is much cheaper than a devicemetadata decode. Errors are never cached.
//
// The Devices it returns share Attributes and NetworkData with the cache:
// callers must not modify them.
type CachingReader struct {
	// Root is the metadata mount point, DefaultRoot in a container.
	Root string

	mu      sync.Mutex
	entries map[string]cachedDevice
	decodes int // files read and decoded, for tests
}

type cachedDevice struct {
	id  fileID
	dev *Device
}

// NewCachingReader returns a CachingReader for the files under root.
func NewCachingReader(root string) *CachingReader {
	return &CachingReader{Root: root, entries: make(map[string]cachedDevice)}
}

// Read returns the vfnet device that backs ci, as FileReader.Read does.
func (r *CachingReader) Read(ci vmiview.ClaimInterface) (*Device, error) {
	path := PathFor(r.Root, ci)
	if fi, err := os.Stat(path); err == nil {
		if d, ok := r.lookup(path, identity(fi)); ok {
			return d, nil
		}
	}
	d, id, err := readIdentified(path)
	r.mu.Lock()
	r.decodes++
	if err != nil || !id.ok {
		delete(r.entries, path)
	} else {
		if len(r.entries) >= maxCached {
			clear(r.entries)
		}
		r.entries[path] = cachedDevice{id: id, dev: d}
	}
	r.mu.Unlock()
	if err != nil {
		return nil, FileReader{Root: r.Root}.explain(ci, path, err)
	}
	c := *d
	return &c, nil
}

func (r *CachingReader) lookup(path string, id fileID) (*Device, bool) {
	if !id.ok {
		return nil, false
	}
	r.mu.Lock()
	e, ok := r.entries[path]
	r.mu.Unlock()
	if !ok || e.id != id {
		return nil, false
	}
	// A copy, so that a caller setting a field cannot change what the next
	// call gets.
	c := *e.dev
	return &c, true
}
