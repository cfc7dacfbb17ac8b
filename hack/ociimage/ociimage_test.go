package ociimage

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

type entry struct {
	uid, gid int
	mode     int64
	dir      bool
	data     string
	link     string
}

// readBack unpacks an archive into a directory and opens it as an OCI
// image layout with go-containerregistry, as a reader of the archive would:
// it returns the index annotations, the config and the layer's entries.
func readBack(t *testing.T, archive []byte) (map[string]string, *v1.ConfigFile, map[string]entry) {
	t.Helper()
	dir := t.TempDir()
	tr := tar.NewReader(bytes.NewReader(archive))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, h.Name)
		if h.Typeflag == tar.TypeDir {
			if err := os.MkdirAll(p, 0o755); err != nil {
				t.Fatal(err)
			}
			continue
		}
		data, _ := io.ReadAll(tr)
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		t.Fatalf("not an OCI layout: %v", err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(im.Manifests) != 1 {
		t.Fatalf("index has %d manifests, want 1", len(im.Manifests))
	}
	img, err := idx.Image(im.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	if mt, _ := img.MediaType(); mt != types.OCIManifestSchema1 {
		t.Errorf("manifest media type %s, want OCI", mt)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("layers %d, %v; want 1", len(layers), err)
	}
	// Digests are verified on read: a blob that does not match fails here.
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	files := map[string]entry{}
	lr := tar.NewReader(rc)
	for {
		h, err := lr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		data, _ := io.ReadAll(lr)
		files["/"+strings.TrimSuffix(h.Name, "/")] = entry{uid: h.Uid, gid: h.Gid, mode: h.Mode, dir: h.Typeflag == tar.TypeDir, data: string(data), link: h.Linkname}
	}
	if _, err := io.Copy(io.Discard, rc); err != nil {
		t.Fatal(err)
	}
	return im.Manifests[0].Annotations, cfg, files
}

func archive(t *testing.T, im Image) []byte {
	t.Helper()
	img, err := im.Build()
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := WriteArchive(&buf, im.Ref, img); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestBindingImage(t *testing.T) {
	t.Parallel()
	ann, cfg, files := readBack(t, archive(t, Binding("vfnet-binding:dev", "amd64", []byte("binding-binary"))))
	if ann["io.containerd.image.name"] != "docker.io/library/vfnet-binding:dev" || ann["org.opencontainers.image.ref.name"] != "dev" {
		t.Errorf("annotations %v", ann)
	}
	if cfg.Config.User != "107:107" || !reflect.DeepEqual(cfg.Config.Entrypoint, []string{"/usr/bin/vfnet-binding"}) {
		t.Errorf("user %q entrypoint %q, want 107:107 and /usr/bin/vfnet-binding", cfg.Config.User, cfg.Config.Entrypoint)
	}
	if cfg.OS != "linux" || cfg.Architecture != "amd64" {
		t.Errorf("platform %s/%s", cfg.OS, cfg.Architecture)
	}
	want := map[string]entry{
		"/etc":                    {mode: 0o755, dir: true},
		"/etc/passwd":             {mode: 0o644, data: "root:x:0:0:root:/:/sbin/nologin\nqemu:x:107:107:qemu:/:/sbin/nologin\n"},
		"/etc/group":              {mode: 0o644, data: "root:x:0:\nqemu:x:107:\n"},
		"/var":                    {mode: 0o755, dir: true},
		"/var/run":                {mode: 0o755, dir: true},
		"/var/run/kubevirt-hooks": {uid: 107, gid: 107, mode: 0o755, dir: true},
		"/usr":                    {mode: 0o755, dir: true},
		"/usr/bin":                {mode: 0o755, dir: true},
		"/usr/bin/vfnet-binding":  {mode: 0o755, data: "binding-binary"},
	}
	if !reflect.DeepEqual(files, want) {
		t.Errorf("layer\n got %+v\nwant %+v", files, want)
	}
}

func TestDriverImage(t *testing.T) {
	t.Parallel()
	ann, cfg, files := readBack(t, archive(t, Driver("ghcr.io/vfnet-io/vfnet-driver:v0.1.0", "arm64", []byte("driver-binary"))))
	if ann["io.containerd.image.name"] != "ghcr.io/vfnet-io/vfnet-driver:v0.1.0" {
		t.Errorf("annotations %v", ann)
	}
	if cfg.Config.User != "" || !reflect.DeepEqual(cfg.Config.Entrypoint, []string{"/usr/bin/vfnet-driver"}) || cfg.Architecture != "arm64" {
		t.Errorf("config %+v", cfg.Config)
	}
	if f := files["/usr/bin/vfnet-driver"]; f.uid != 0 || f.mode != 0o755 || f.data != "driver-binary" || len(files) != 3 {
		t.Errorf("layer %+v", files)
	}
}

func TestSymlink(t *testing.T) {
	t.Parallel()
	_, _, files := readBack(t, archive(t, Image{Ref: "x:1", Arch: "amd64", Files: []File{
		{Path: "/bin/tool", Mode: 0o755, Data: []byte("t")},
		{Path: "/bin/alias", Symlink: "tool"},
	}}))
	if f := files["/bin/alias"]; f.link != "tool" || f.data != "" {
		t.Errorf("symlink entry %+v", f)
	}
}

// TestReproducible: the same binaries give byte-identical archives.
func TestReproducible(t *testing.T) {
	t.Parallel()
	a := archive(t, Binding("vfnet-binding:dev", "amd64", []byte("x")))
	b := archive(t, Binding("vfnet-binding:dev", "amd64", []byte("x")))
	if !bytes.Equal(a, b) {
		t.Error("two builds of the same image differ")
	}
}

func TestBadInput(t *testing.T) {
	t.Parallel()
	for _, im := range []Image{
		{Ref: "x:1", Arch: "amd64", Files: []File{{Path: "usr/bin/x"}}},
		{Ref: "x:1", Arch: "amd64", Files: []File{{Path: "/a/../b"}}},
		{Ref: "x:1", Arch: "amd64", Files: []File{{Path: "/a"}, {Path: "/a"}}},
		{Ref: "x:1", Files: []File{{Path: "/a"}}},
	} {
		if _, err := im.Build(); err == nil {
			t.Errorf("%+v built", im)
		}
	}
	img, err := Driver("x:1", "amd64", nil).Build()
	if err != nil {
		t.Fatal(err)
	}
	if err := WriteArchive(io.Discard, "Bad Name", img); err == nil || !strings.Contains(err.Error(), "Bad Name") {
		t.Errorf("bad image name: %v", err)
	}
}

// TestDockerfileAgrees: the Dockerfile (for those with a Docker engine) and
// these images (for those without) ship the same thing: the same
// entrypoints, user, and user database (hack/shipbuild checks the go build
// flags).
func TestDockerfileAgrees(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile(filepath.Join("..", "..", "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	df := string(data)
	stage := func(name string) string {
		m := regexp.MustCompile(`(?s)FROM scratch AS ` + name + `\n(.*?)(\nFROM |$)`).FindStringSubmatch(df)
		if m == nil {
			t.Fatalf("no scratch stage %s", name)
		}
		return m[1]
	}
	for _, c := range []struct {
		stage string
		im    Image
	}{{"driver", Driver("d:1", "amd64", nil)}, {"binding", Binding("b:1", "amd64", nil)}} {
		s := stage(c.stage)
		if !strings.Contains(s, `ENTRYPOINT ["`+c.im.Entrypoint[0]+`"]`) {
			t.Errorf("stage %s: entrypoint is not %v:\n%s", c.stage, c.im.Entrypoint, s)
		}
		hasUser := regexp.MustCompile(`(?m)^USER (\S+)`).FindStringSubmatch(s)
		switch {
		case c.im.User == "" && hasUser != nil:
			t.Errorf("stage %s sets USER %s, image runs as root", c.stage, hasUser[1])
		case c.im.User != "" && (hasUser == nil || hasUser[1] != c.im.User):
			t.Errorf("stage %s USER %v, image %s", c.stage, hasUser, c.im.User)
		}
	}
	b := Binding("b:1", "amd64", nil)
	for _, f := range b.Files[:2] {
		quoted := strings.ReplaceAll(string(f.Data), "\n", `\n`)
		if !strings.Contains(df, "printf '"+quoted+"' > /out"+f.Path) {
			t.Errorf("Dockerfile does not write %s as %q", f.Path, quoted)
		}
	}
	if !strings.Contains(df, "--chown=107:107 /out/var/run/kubevirt-hooks /var/run/kubevirt-hooks") {
		t.Error("Dockerfile does not give /var/run/kubevirt-hooks to 107:107")
	}
}
