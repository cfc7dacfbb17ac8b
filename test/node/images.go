package node

import (
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/vfnet-io/vfnet/hack/ociimage"
	"github.com/vfnet-io/vfnet/test/lib/gobuild"
)

// Image names on the node. The binding image is what `make images` writes
// (the KubeVirt CR points at it). The driver image is the shipped one with
// vfnet-driver-sim in place of vfnet-driver, the driver with --simulate that
// the shipped image lacks (the overlay names it); the launcher stand-in
// carries KubeVirt's launcher image name, which the rendered pod runs.
const (
	SimDriverImage = "vfnet-driver-sim:dev"
	BindingImage   = "vfnet-binding:dev"
	PauseImage     = "vfnet.test/pause:1"
	LauncherImage  = "quay.io/kubevirt/virt-launcher:v1.9.0"
	// ContainerDiskImage is the example VM's disk (a stand-in holding an
	// empty disk file: no VM boots).
	ContainerDiskImage = "quay.io/containerdisks/fedora:latest"
)

// LauncherPodArgs are genlauncherpod's flags for the pod the tier runs: the
// VMI as virt-api mutates it (non-root: containers run as 107), rendered as
// v1.9.0 does (the binding sidecar without claims; the install's KubeVirt
// v1.9 component gives them at admission).
func LauncherPodArgs() []string { return []string{"-virt-api-mutations"} }

// Artifacts are what the parent test builds before entering the namespace
// (the namespace has no network: nothing may need the module proxy there).
type Artifacts struct {
	// Images maps an image name to its OCI archive.
	Images map[string]string
	// GenLauncherPod, GenCRDs and GenOperator are test/kubevirt's
	// commands, built.
	GenLauncherPod, GenCRDs, GenOperator string
	// KubeVirtCR is manifests/kubevirt/binding-patch.yaml with sidecarImage
	// set to BindingImage, as a cluster admin registers their own image.
	KubeVirtCR string
	// VMI is the example VM's VMI (JSON) the stand-in image carries.
	VMI string
}

// simDriverImage is ociimage.Driver with /usr/bin/vfnet-driver-sim as its
// binary and entrypoint: only the program differs from the shipped image.
func simDriverImage(ref, arch string, bin []byte) ociimage.Image {
	const path = "/usr/bin/vfnet-driver-sim"
	img := ociimage.Driver(ref, arch, bin)
	for i := range img.Files {
		if img.Files[i].Path == img.Entrypoint[0] {
			img.Files[i].Path = path
		}
	}
	img.Entrypoint = []string{path}
	return img
}

// BuildImages builds every image the node runs into dir/images and test/kubevirt's
// generators into the repository's test binaries (test/lib/gobuild: a warm run
// finds them up to date and skips the links), and prepares the KubeVirt CR
// and the VMI.
func BuildImages(ctx context.Context, repo, dir string) (*Artifacts, error) {
	a := &Artifacts{Images: map[string]string{}}
	imgDir := filepath.Join(dir, "images")
	if err := os.MkdirAll(imgDir, 0o755); err != nil {
		return nil, err
	}
	// The product images as hack/mkimages makes them, the driver's with
	// the simulator-carrying build; the binaries are the ones the other
	// tests run. The pause program is built alike.
	shipped, err := gobuild.Shipped(ctx, repo, "./test/cmd/vfnet-driver-sim", "./cmd/vfnet-binding", "./test/node/internal/pause")
	if err != nil {
		return nil, err
	}
	for _, p := range []struct {
		pkg, ref string
		image    func(ref, arch string, bin []byte) ociimage.Image
	}{
		{"./test/cmd/vfnet-driver-sim", SimDriverImage, simDriverImage},
		{"./cmd/vfnet-binding", BindingImage, ociimage.Binding},
	} {
		data, err := os.ReadFile(filepath.Join(shipped, filepath.Base(p.pkg)))
		if err != nil {
			return nil, err
		}
		if err := a.write(imgDir, p.image(p.ref, runtime.GOARCH, data)); err != nil {
			return nil, err
		}
	}

	// The sandbox ("pause") image.
	data, err := os.ReadFile(filepath.Join(shipped, "pause"))
	if err != nil {
		return nil, err
	}
	if err := a.write(imgDir, ociimage.Image{Ref: PauseImage, Arch: runtime.GOARCH,
		Files: []ociimage.File{{Path: "/pause", Mode: 0o755, Data: data}}, Entrypoint: []string{"/pause"}}); err != nil {
		return nil, err
	}

	// test/kubevirt's generators, run later inside the namespace, and the
	// compute container's stand-in (KubeVirt's hook manager and converter).
	kv, err := gobuild.KubeVirt(ctx, repo, "./cmd/genlauncherpod", "./cmd/gencrds", "./cmd/launcherstandin", "./cmd/genoperator")
	if err != nil {
		return nil, err
	}
	a.GenLauncherPod = filepath.Join(kv, "genlauncherpod")
	a.GenCRDs = filepath.Join(kv, "gencrds")
	a.GenOperator = filepath.Join(kv, "genoperator")
	if err := a.writeKubeVirtControlPlane(ctx, repo, imgDir); err != nil {
		return nil, err
	}

	// The KubeVirt CR a cluster admin applies, with their binding image.
	cr, err := os.ReadFile(filepath.Join(repo, "manifests", "kubevirt", "binding-patch.yaml"))
	if err != nil {
		return nil, err
	}
	var obj map[string]any
	if err := yaml.Unmarshal(cr, &obj); err != nil {
		return nil, fmt.Errorf("manifests/kubevirt/binding-patch.yaml: %w", err)
	}
	vfnet, ok := dig(obj, "spec", "configuration", "network", "binding", "vfnet")
	if !ok {
		return nil, fmt.Errorf("manifests/kubevirt/binding-patch.yaml has no spec.configuration.network.binding.vfnet")
	}
	vfnet["sidecarImage"] = BindingImage
	cr, err = yaml.Marshal(obj)
	if err != nil {
		return nil, err
	}
	a.KubeVirtCR = filepath.Join(dir, "kubevirt-cr.yaml")
	if err := os.WriteFile(a.KubeVirtCR, cr, 0o644); err != nil {
		return nil, err
	}
	// The example VM's VMI, as virt-controller makes it; its launcher pod
	// is rendered again inside with the VMI's real UID.
	a.VMI = filepath.Join(dir, "vmi.json")
	cmd := exec.CommandContext(ctx, a.GenLauncherPod, append([]string{"-kubevirt", a.KubeVirtCR,
		"-vm", filepath.Join(repo, "manifests", "examples", "vm.yaml"), "-vmi-out", a.VMI}, LauncherPodArgs()...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if _, err := cmd.Output(); err != nil {
		return nil, fmt.Errorf("genlauncherpod: %w\n%s", err, stderr.String())
	}
	vmi, err := os.ReadFile(a.VMI)
	if err != nil {
		return nil, err
	}

	// The stand-in goes at the path the rendered pod runs.
	if data, err = os.ReadFile(filepath.Join(kv, "launcherstandin")); err != nil {
		return nil, err
	}
	if err := a.write(imgDir, ociimage.Image{Ref: LauncherImage, Arch: runtime.GOARCH,
		Files: []ociimage.File{
			{Path: "/usr/bin/virt-launcher-monitor", Mode: 0o755, Data: data},
			{Path: "/usr/bin/virt-tail", Symlink: "virt-launcher-monitor"},
			{Path: "/usr/bin/container-disk", Symlink: "virt-launcher-monitor"},
			{Path: "/etc/vfnet-standin/vmi.json", Mode: 0o644, Data: vmi},
		},
		Entrypoint: []string{"/usr/bin/virt-launcher-monitor"}, User: "107:107"}); err != nil {
		return nil, err
	}
	if err := a.write(imgDir, ociimage.Image{Ref: ContainerDiskImage, Arch: runtime.GOARCH,
		Files: []ociimage.File{{Path: "/disk/disk.img", Mode: 0o644, UID: 107, GID: 107}}}); err != nil {
		return nil, err
	}
	return a, nil
}

func (a *Artifacts) write(dir string, im ociimage.Image) error {
	name := strings.NewReplacer("/", "_", ":", "_").Replace(im.Ref) + ".tar"
	file := filepath.Join(dir, name)
	if err := ociimage.WriteArchiveFile(file, im); err != nil {
		return err
	}
	a.Images[im.Ref] = file
	return nil
}

func dig(obj map[string]any, path ...string) (map[string]any, bool) {
	cur := obj
	for _, p := range path {
		next, ok := cur[p].(map[string]any)
		if !ok {
			return nil, false
		}
		cur = next
	}
	return cur, true
}

// KubeVirt's release these images stand for: its tag, the tag's commit
// and the commit's time, as KubeVirt's release build stamps them.
var kubeVirtRelease = gobuild.KubeVirtVersion{
	Tag:       "v1.9.0",
	Commit:    "79d34c1762169e5b0370ec491cef5ca12e6b504c",
	BuildDate: "2026-07-27T15:21:17Z",
}

// KubeVirtControlPlane are KubeVirt's components the tier runs for real:
// built from KubeVirt v1.9.0's module (test/kubevirt) and imaged under the
// names virt-operator derives from its own image (quay.io/kubevirt/<name>:
// <tag>), so its Deployments run them as a release install would.
// virt-exportproxy is not used, but virt-operator always deploys it: with
// its image it runs instead of failing to pull.
func KubeVirtControlPlane() []string {
	return []string{"virt-operator", "virt-api", "virt-controller", "virt-exportproxy"}
}

// KubeVirtImage is the image name of a KubeVirt component.
func KubeVirtImage(name string) string { return "quay.io/kubevirt/" + name + ":" + kubeVirtRelease.Tag }

// writeKubeVirtControlPlane builds KubeVirtControlPlane and writes their
// images into dir.
func (a *Artifacts) writeKubeVirtControlPlane(ctx context.Context, repo, dir string) error {
	var pkgs []string
	for _, name := range KubeVirtControlPlane() {
		pkgs = append(pkgs, "kubevirt.io/kubevirt/cmd/"+name)
	}
	bin, err := gobuild.KubeVirtRelease(ctx, repo, kubeVirtRelease, pkgs...)
	if err != nil {
		return fmt.Errorf("build KubeVirt's control plane from test/kubevirt (go.mod and third_party/ stand-ins): %w", err)
	}
	for _, name := range KubeVirtControlPlane() {
		data, err := os.ReadFile(filepath.Join(bin, name))
		if err != nil {
			return err
		}
		im := kubeVirtComponentImage(name, data)
		file, err := ociimage.CachedArchive(filepath.Join(bin, "images"), im)
		if err != nil {
			return fmt.Errorf("image %s: %w", im.Ref, err)
		}
		a.Images[im.Ref] = file
	}
	return nil
}

// kubeVirtComponentImage has what KubeVirt's own images of its static
// components hold: the binary in /usr/bin and a user database naming the
// non-root user 1001 it runs as (the pods set runAsNonRoot without a
// runAsUser, so the image's user must be numeric). PATH: the pods run the
// binary by its bare name; /tmp: Go's os.TempDir for anything it writes.
func kubeVirtComponentImage(name string, bin []byte) ociimage.Image {
	return ociimage.Image{
		Ref:  KubeVirtImage(name),
		Arch: runtime.GOARCH,
		Files: []ociimage.File{
			{Path: "/etc/passwd", Mode: 0o644, Data: []byte("root:x:0:0:root:/:/sbin/nologin\nnonroot-user:x:1001:1001::/home/nonroot-user:/sbin/nologin\n")},
			{Path: "/etc/group", Mode: 0o644, Data: []byte("root:x:0:\nnonroot-user:x:1001:\n")},
			{Path: "/tmp", Mode: fs.ModeDir | 0o777}, // no sticky bit: ociimage writes permission bits only
			{Path: "/usr/bin/" + name, Mode: 0o755, Data: bin},
		},
		Entrypoint: []string{"/usr/bin/" + name},
		Env:        []string{"PATH=/usr/bin:/bin"},
		User:       "1001",
	}
}
