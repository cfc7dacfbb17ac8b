package node

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"time"

	"github.com/vfnet-io/vfnet/hack/ociimage"
	"github.com/vfnet-io/vfnet/test/kernel"
	"github.com/vfnet-io/vfnet/test/kernel/layout"
	"github.com/vfnet-io/vfnet/test/lib/kvnode"
)

// EnvGuest, with EnvGate, runs the guest steps (guestSteps) instead of the
// tier's: a QEMU guest from the real-kernel tier joins the node's cluster
// as a second node, with real SR-IOV VFs, and KubeVirt v1.9.0's own
// virt-handler and virt-launcher run the example VM there (issue 33 item
// 3; make test-kubevirt-guest).
const EnvGuest = "VFNET_NODE_GUEST"

// Images only the guest's node runs.
const (
	// GuestDriverImage is the shipped vfnet-driver image (hack/mkimages'
	// contents), under the name test/node/testdata/guest-values.yaml gives.
	GuestDriverImage = "vfnet-driver:dev"
	// VMKernelImage is the example VM's kernel-boot container: the guest's
	// kernel and the real-kernel tier's VM initramfs, whose init reports
	// the VF and its MAC on the serial console (layout.MarkInner).
	VMKernelImage = "vfnet.test/vm-kernel:1"
	// VMKernelPath and VMInitrdPath are their files in it.
	VMKernelPath = "/boot/vmlinux"
	VMInitrdPath = "/boot/initrd"
)

// GuestArtifacts are what the parent prepares for the guest (the child
// has no network: nothing it does may need the module proxy).
type GuestArtifacts struct {
	// KernelDir is hack/kernel-deps.sh's directory (kernel.LoadEnv).
	KernelDir string
	// Init and Driver are the guest's /init (the case binary) and
	// vfnet-driver (the initramfs requires it; the node runs the image's).
	Init, Driver string
	// Node is the guest node's programs and the images it imports.
	Node *kernel.NodeImage
	// ConsoleLog is where the guest's console is kept after the run.
	ConsoleLog string
}

// BuildGuest prepares the guest: the real-kernel tier's kernel and QEMU,
// its case binary, the node's programs, and the images the guest's node
// imports: those of images (the real node's, by name: pause, the binding)
// and the shipped driver and the VM's kernel-boot image, written to
// dir/guest-images.
func BuildGuest(ctx context.Context, repo, cache, dir string, images map[string]string) (*GuestArtifacts, error) {
	deps := exec.CommandContext(ctx, filepath.Join(repo, "hack", "kernel-deps.sh"))
	deps.Env = append(os.Environ(), "VFNET_CACHE="+cache)
	if out, err := deps.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("hack/kernel-deps.sh: %w\n%s", err, out)
	}
	kdir := filepath.Join(cache, "kernel")
	env, err := kernel.LoadEnv(kdir)
	if err != nil {
		return nil, err
	}
	binDir := filepath.Join(kdir, "bin")
	if err := os.MkdirAll(binDir, 0o755); err != nil {
		return nil, err
	}
	bins, err := kernel.BuildGuestBinaries(ctx, repo, binDir, false)
	if err != nil {
		return nil, err
	}
	g := &GuestArtifacts{KernelDir: kdir, Init: bins.Init, Driver: bins.Driver,
		ConsoleLog: filepath.Join(kdir, "last-kubevirt-console.log")}
	imgDir := filepath.Join(dir, "guest-images")
	if err := os.MkdirAll(imgDir, 0o755); err != nil {
		return nil, err
	}
	if g.Node, err = kernel.FindNodeImage(ctx, repo, imgDir, env.Busybox); err != nil {
		return nil, fmt.Errorf("the guest's node: %w", err)
	}
	// The images by the archive's name in the guest; pause is the node's
	// sandbox image under the same name in both.
	for _, ref := range []string{BindingImage} {
		g.Node.Images[filepath.Base(images[ref])] = images[ref]
	}
	// KubeVirt's own virt-handler and virt-launcher.
	kv, err := kvnode.Build(ctx, repo, cache)
	if err != nil {
		return nil, err
	}
	for _, archive := range kv {
		g.Node.Images[filepath.Base(archive)] = archive
	}
	bin, err := os.ReadFile(bins.Driver)
	if err != nil {
		return nil, err
	}
	driver, err := ociimage.CachedArchive(imgDir, ociimage.Driver(GuestDriverImage, runtime.GOARCH, bin))
	if err != nil {
		return nil, fmt.Errorf("image %s: %w", GuestDriverImage, err)
	}
	g.Node.Images[filepath.Base(driver)] = driver
	vmKernel, err := vmKernelImage(env, dir)
	if err != nil {
		return nil, err
	}
	kernelArchive, err := ociimage.CachedArchive(imgDir, vmKernel)
	if err != nil {
		return nil, fmt.Errorf("image %s: %w", VMKernelImage, err)
	}
	g.Node.Images[filepath.Base(kernelArchive)] = kernelArchive
	return g, nil
}

// vmKernelImage is the VM's kernel-boot container image: KubeVirt copies
// its kernel and initramfs out of it (kernelBoot.container), with the
// container-disk program of the launcher image as its process. The files
// are readable by the non-root launcher (uid 107).
func vmKernelImage(env *kernel.Env, dir string) (ociimage.Image, error) {
	initrd := filepath.Join(dir, "vm-initrd.cpio")
	if err := env.BuildInnerInitramfs(initrd); err != nil {
		return ociimage.Image{}, fmt.Errorf("build the VM's initramfs: %w", err)
	}
	im := ociimage.Image{Ref: VMKernelImage, Arch: runtime.GOARCH}
	for _, f := range []struct{ path, src string }{{VMKernelPath, env.Vmlinux}, {VMInitrdPath, initrd}} {
		data, err := os.ReadFile(f.src)
		if err != nil {
			return im, err
		}
		im.Files = append(im.Files, ociimage.File{Path: f.path, Mode: 0o644, Data: data})
	}
	return im, nil
}

// GuestLayout is the guest machine for the kubevirt case: the real-kernel
// tier's PFs with the wire (layout.WirePF, whose VFs the VM gets), the
// case, and the API server at its port on the host's loopback as the
// guest reaches it.
func GuestLayout(apiPort string) layout.Layout {
	lay := layout.Default()
	lay.Cases = []string{"kubevirt"}
	lay.APIServer = layout.GuestGateway + ":" + apiPort
	lay.Peer = layout.PeerNIC
	lay.PFs = append(lay.PFs, layout.WirePF)
	return lay
}

// guestBootTimeout bounds QEMU's start to the guest init's machine set-up.
const guestBootTimeout = 10 * time.Minute

// cacheDir is the repository's cache, as the Makefile's VFNET_CACHE sets it.
func cacheDir(repo string) string {
	if c := os.Getenv("VFNET_CACHE"); c != "" {
		return c
	}
	return filepath.Join(repo, ".cache")
}
