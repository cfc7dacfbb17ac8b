// Package ociimage builds container images as OCI image-layout archives
// without a Docker engine or a registry, with go-containerregistry: one
// layer made from a list of files (owner, mode and content each), a config
// with entrypoint and user. `make images` writes the vfnet-driver and
// vfnet-binding images with it (hack/mkimages) from the same static builds
// as the Dockerfile; the real-node tier imports them into containerd.
//
// Archives are reproducible: fixed timestamps, files in the order given.
package ociimage

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// File is one entry of the image's single layer.
type File struct {
	// Path is absolute inside the image, e.g. "/usr/bin/vfnet-driver".
	Path string
	// Mode holds the permission bits; fs.ModeDir marks a directory.
	Mode     fs.FileMode
	UID, GID int
	Data     []byte
	// Symlink makes the entry a symbolic link to this target (Mode and
	// Data unused).
	Symlink string
	// Xattrs are extended attributes (e.g. "security.capability"), written
	// as PAX SCHILY.xattr records, which containerd applies on unpacking.
	Xattrs map[string]string
}

// Image describes an image to build.
type Image struct {
	// Ref is the name the archive carries, e.g.
	// "ghcr.io/vfnet-io/vfnet-driver:v0.1.0".
	Ref        string
	Files      []File
	Entrypoint []string
	Cmd        []string
	// User is the config's user ("107:107"); empty is root.
	User string
	Env  []string
	// Arch is the GOARCH the binaries were built for; OS is always linux.
	Arch string
}

// epoch is every timestamp in the image: builds of the same binaries give
// the same digests.
func epoch() time.Time { return time.Unix(0, 0).UTC() }

// Build returns the image: one gzip layer, OCI media types.
func (im Image) Build() (v1.Image, error) {
	if im.Arch == "" {
		return nil, fmt.Errorf("image %s: Arch is empty (the GOARCH of its binaries)", im.Ref)
	}
	layerTar, err := im.layer()
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, fmt.Errorf("image %s: layer: %w", im.Ref, err)
	}
	base := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	base = mutate.ConfigMediaType(base, types.OCIConfigJSON)
	img, err := mutate.Append(base, mutate.Addendum{Layer: layer, History: v1.History{
		Created: v1.Time{Time: epoch()}, CreatedBy: "vfnet ociimage", Comment: "files of " + im.Ref,
	}})
	if err != nil {
		return nil, fmt.Errorf("image %s: %w", im.Ref, err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cfg = cfg.DeepCopy()
	cfg.OS, cfg.Architecture = "linux", im.Arch
	cfg.Created = v1.Time{Time: epoch()}
	cfg.Config.Entrypoint = im.Entrypoint
	cfg.Config.Cmd = im.Cmd
	cfg.Config.User = im.User
	cfg.Config.Env = im.Env
	img, err = mutate.ConfigFile(img, cfg)
	if err != nil {
		return nil, fmt.Errorf("image %s: config: %w", im.Ref, err)
	}
	return img, nil
}

// layer is the uncompressed layer tar: every parent directory first (root,
// 0755, as COPY creates them), then the files in order.
func (im Image) layer() ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	seen := map[string]bool{}
	var addDirs func(dir string) error
	addDirs = func(dir string) error {
		if dir == "/" || dir == "." || seen[dir] {
			return nil
		}
		if err := addDirs(path.Dir(dir)); err != nil {
			return err
		}
		seen[dir] = true
		return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: strings.TrimPrefix(dir, "/") + "/", Mode: 0o755, ModTime: epoch(), Format: tar.FormatPAX})
	}
	for _, f := range im.Files {
		if !path.IsAbs(f.Path) || path.Clean(f.Path) != f.Path {
			return nil, fmt.Errorf("image %s: file path %q must be absolute and clean", im.Ref, f.Path)
		}
		if seen[f.Path] {
			return nil, fmt.Errorf("image %s: %s listed twice (or after a file inside it)", im.Ref, f.Path)
		}
		if err := addDirs(path.Dir(f.Path)); err != nil {
			return nil, err
		}
		seen[f.Path] = true
		h := &tar.Header{Name: strings.TrimPrefix(f.Path, "/"), Mode: int64(f.Mode.Perm()), Uid: f.UID, Gid: f.GID, ModTime: epoch(), Format: tar.FormatPAX}
		for k, v := range f.Xattrs {
			if h.PAXRecords == nil {
				h.PAXRecords = map[string]string{}
			}
			h.PAXRecords["SCHILY.xattr."+k] = v
		}
		switch {
		case f.Symlink != "":
			h.Typeflag, h.Linkname, h.Mode = tar.TypeSymlink, f.Symlink, 0o777
		case f.Mode.IsDir():
			h.Typeflag, h.Name = tar.TypeDir, h.Name+"/"
		default:
			h.Typeflag, h.Size = tar.TypeReg, int64(len(f.Data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if _, err := tw.Write(f.Data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// WriteArchive writes img as an OCI image layout in tar form (oci-layout,
// index.json, blobs/sha256/...), the format `ctr images import`, `docker
// load` (Docker 25+) and `skopeo copy oci-archive:` read. The index entry
// carries ref as containerd's image name and its tag as the OCI ref name.
func WriteArchive(w io.Writer, ref string, img v1.Image) error {
	full, tag, err := NormalizedName(ref)
	if err != nil {
		return err
	}
	manifest, err := img.RawManifest()
	if err != nil {
		return err
	}
	mdigest, err := img.Digest()
	if err != nil {
		return err
	}
	mt, err := img.MediaType()
	if err != nil {
		return err
	}
	cfgName, err := img.ConfigName()
	if err != nil {
		return err
	}
	cfg, err := img.RawConfigFile()
	if err != nil {
		return err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return err
	}
	index := v1.IndexManifest{
		SchemaVersion: 2,
		MediaType:     types.OCIImageIndex,
		Manifests: []v1.Descriptor{{
			MediaType: mt, Digest: mdigest, Size: int64(len(manifest)),
			Platform: &v1.Platform{OS: cf.OS, Architecture: cf.Architecture},
			Annotations: map[string]string{
				"io.containerd.image.name":          full,
				"org.opencontainers.image.ref.name": tag,
			},
		}},
	}
	indexJSON, err := json.Marshal(index)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(w)
	put := func(name string, data []byte) error {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: int64(len(data)), ModTime: epoch()}); err != nil {
			return err
		}
		_, err := tw.Write(data)
		return err
	}
	for _, d := range []string{"blobs/", "blobs/sha256/"} {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d, Mode: 0o755, ModTime: epoch()}); err != nil {
			return err
		}
	}
	if err := put("oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)); err != nil {
		return err
	}
	if err := put("index.json", indexJSON); err != nil {
		return err
	}
	if err := put("blobs/sha256/"+mdigest.Hex, manifest); err != nil {
		return err
	}
	if err := put("blobs/sha256/"+cfgName.Hex, cfg); err != nil {
		return err
	}
	layers, err := img.Layers()
	if err != nil {
		return err
	}
	for _, l := range layers {
		d, err := l.Digest()
		if err != nil {
			return err
		}
		rc, err := l.Compressed()
		if err != nil {
			return err
		}
		data, err := io.ReadAll(rc)
		rc.Close()
		if err != nil {
			return err
		}
		if err := put("blobs/sha256/"+d.Hex, data); err != nil {
			return err
		}
	}
	return tw.Close()
}

// NormalizedName is ref as the CRI and containerd name it (a pod's
// "vfnet-driver:dev" is "docker.io/library/vfnet-driver:dev"), and its tag.
// Digest references are refused: an archive names a tag.
func NormalizedName(ref string) (full, tag string, err error) {
	t, err := name.NewTag(ref)
	if err != nil {
		return "", "", fmt.Errorf("image name %q (want [registry/]repository[:tag]): %w", ref, err)
	}
	repo := t.Context().Name()
	if r, ok := strings.CutPrefix(repo, name.DefaultRegistry+"/"); ok {
		repo = "docker.io/" + r
	}
	return repo + ":" + t.TagStr(), t.TagStr(), nil
}

// WriteArchiveFile builds im and writes its archive to file atomically.
func WriteArchiveFile(file string, im Image) error {
	img, err := im.Build()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(file), "."+filepath.Base(file)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if err := WriteArchive(tmp, im.Ref, img); err != nil {
		tmp.Close()
		return fmt.Errorf("write image %s to %s: %w", im.Ref, file, err)
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	// CreateTemp makes 0600; an image archive is not secret.
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), file)
}

// CachedArchive returns an OCI archive of im in dir, named by im's Ref and
// a digest of its content (Key), written only when no archive of the same
// content is there: KubeVirt's images hold hundreds of MB, which take a
// minute of gzip on a loaded machine per run, and change only when their
// files do. Older archives of the image are removed.
func CachedArchive(dir string, im Image) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	base := strings.NewReplacer("/", "_", ":", "_").Replace(im.Ref)
	file := filepath.Join(dir, base+"-"+Key(im)+".tar")
	if _, err := os.Stat(file); err == nil {
		return file, nil
	}
	// Written beside and renamed: a run that reads it at the same time
	// sees the whole archive or none.
	tmp := fmt.Sprintf("%s.%d.tmp", file, os.Getpid())
	if err := WriteArchiveFile(tmp, im); err != nil {
		os.Remove(tmp)
		return "", err
	}
	old, _ := filepath.Glob(filepath.Join(dir, base+"-*.tar"))
	if err := os.Rename(tmp, file); err != nil {
		return "", err
	}
	for _, f := range old {
		os.Remove(f)
	}
	return file, nil
}

// Key is a digest of everything an archive of im is made from.
func Key(im Image) string {
	h := sha256.New()
	fmt.Fprintf(h, "%q %q %q %q %q %q\n", im.Ref, im.Arch, im.Entrypoint, im.Cmd, im.User, im.Env)
	for _, f := range im.Files {
		fmt.Fprintf(h, "%q %o %d %d %q %d\n", f.Path, uint32(f.Mode), f.UID, f.GID, f.Symlink, len(f.Data))
		if len(f.Xattrs) > 0 {
			// Only files with attributes add to the key: the keys of
			// existing archives stay the same.
			keys := make([]string, 0, len(f.Xattrs))
			for k := range f.Xattrs {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			for _, k := range keys {
				fmt.Fprintf(h, "xattr %q %q\n", k, f.Xattrs[k])
			}
		}
		h.Write(f.Data)
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}
