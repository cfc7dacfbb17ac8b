package kernel

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"github.com/vfnet-io/vfnet/hack/ociimage"
	"github.com/vfnet-io/vfnet/test/kernel/layout"
	"github.com/vfnet-io/vfnet/test/lib/controlplane"
	"github.com/vfnet-io/vfnet/test/lib/gobuild"
	"github.com/vfnet-io/vfnet/test/lib/sharedlibs"
)

// NodeImage is what the kubelet case runs inside the guest: the real-node
// tier's parts (test/node: containerd 2.4.2 with its shim and ctr, the
// kubelet of the control plane's build, Debian's runc and CNI plugins)
// and the images its pod runs.
type NodeImage struct {
	// Kubelet is the static kubelet; NodeBin holds the static containerd,
	// containerd-shim-runc-v2 and ctr.
	Kubelet, NodeBin string
	// Runc and CNIDir are the host's Debian runc and CNI plugins
	// (dynamically linked: their libraries come along).
	Runc, CNIDir string
	// Images are OCI archives, by their file name in layout.NodeImageDir.
	Images map[string]string
}

// NodeModules are the modules the node cases load themselves (with what
// they need): overlay for containerd's overlayfs snapshotter, bridge and
// veth for the CNI bridge plugin, and tun and vhost_net, whose devices
// virt-handler's permanent device plugins serve (it reports the node
// unschedulable without them). Only a machine with the node carries them.
func NodeModules() []string { return []string{"overlay", "bridge", "veth", "tun", "vhost_net"} }

// cniPlugins are the CNI plugins the node's network configuration uses.
func cniPlugins() []string { return []string{"bridge", "host-local", "loopback"} }

// FindNodeImage locates the node's programs (building containerd when its
// cache has none: test/builds/containerd/build.sh, about 4 CPU-minutes
// cold) and writes the pod's images into dir. busybox is the guest's own
// busybox-static, the pod container's program.
func FindNodeImage(ctx context.Context, repo, dir, busybox string) (*NodeImage, error) {
	k8s, err := controlplane.BinDir(ctx)
	if err != nil {
		return nil, err
	}
	n := &NodeImage{Kubelet: filepath.Join(k8s, "kubelet"), CNIDir: "/usr/lib/cni", Images: map[string]string{}}
	if _, err := os.Stat(n.Kubelet); err != nil {
		return nil, fmt.Errorf("kubelet missing in %s: run test/builds/kubernetes/build.sh: %w", k8s, err)
	}
	build := exec.CommandContext(ctx, "bash", filepath.Join(repo, "test", "builds", "containerd", "build.sh"))
	var stderr bytes.Buffer
	build.Stderr = &stderr
	out, err := build.Output()
	if err != nil {
		return nil, fmt.Errorf("test/builds/containerd/build.sh: %w\n%s", err, stderr.String())
	}
	n.NodeBin = strings.TrimSpace(string(out))
	if n.Runc, err = exec.LookPath("runc"); err != nil {
		return nil, fmt.Errorf("runc not found: install the Debian package runc (make deps): %w", err)
	}
	for _, p := range cniPlugins() {
		if _, err := os.Stat(filepath.Join(n.CNIDir, p)); err != nil {
			return nil, fmt.Errorf("CNI plugin %s: install the Debian package containernetworking-plugins (make deps): %w", p, err)
		}
	}
	// The sandbox program of the real-node tier, built as its image's is.
	shipped, err := gobuild.Shipped(ctx, repo, "./test/node/internal/pause")
	if err != nil {
		return nil, err
	}
	pause, err := os.ReadFile(filepath.Join(shipped, "pause"))
	if err != nil {
		return nil, err
	}
	bb, err := os.ReadFile(busybox)
	if err != nil {
		return nil, err
	}
	for _, im := range []ociimage.Image{
		{Ref: layout.PauseImage, Arch: "amd64", Files: []ociimage.File{{Path: "/pause", Mode: 0o755, Data: pause}}, Entrypoint: []string{"/pause"}},
		{Ref: layout.BusyboxImage, Arch: "amd64", Files: []ociimage.File{{Path: "/bin/busybox", Mode: 0o755, Data: bb}}, Entrypoint: []string{"/bin/busybox"}},
	} {
		name := strings.NewReplacer("/", "_", ":", "_").Replace(im.Ref) + ".tar"
		file := filepath.Join(dir, name)
		if err := ociimage.WriteArchiveFile(file, im); err != nil {
			return nil, fmt.Errorf("image %s: %w", im.Ref, err)
		}
		n.Images[name] = file
	}
	return n, nil
}

// addNode adds the node's programs, the libraries of the dynamically linked
// ones, and the images.
func (e *Env) addNode(c *CPIO, n *NodeImage) error {
	libs := map[string]string{}
	dyn := map[string]string{layout.Runc: n.Runc}
	for _, p := range cniPlugins() {
		dyn[path.Join(layout.CNIBinDir, p)] = filepath.Join(n.CNIDir, p)
	}
	for g, h := range dyn {
		l, err := sharedlibs.Resolve(h, e.GuestLibs)
		if err != nil {
			return fmt.Errorf("%s: %w", h, err)
		}
		maps.Copy(libs, l)
		c.CopyFile(g, h)
	}
	for _, g := range slices.Sorted(maps.Keys(libs)) {
		c.CopyFile(g, libs[g])
	}
	c.CopyFile(layout.Kubelet, n.Kubelet)
	for g, name := range map[string]string{layout.Containerd: "containerd", layout.ContainerdShim: "containerd-shim-runc-v2", layout.Ctr: "ctr"} {
		c.CopyFile(g, filepath.Join(n.NodeBin, name))
	}
	for _, name := range slices.Sorted(maps.Keys(n.Images)) {
		c.CopyFile(path.Join(layout.NodeImageDir, name), n.Images[name])
	}
	return nil
}
