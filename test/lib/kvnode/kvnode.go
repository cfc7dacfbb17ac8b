// Package kvnode builds KubeVirt v1.9.0's node images, virt-handler and
// virt-launcher, from KubeVirt's module (test/kubevirt) and Debian roots,
// as OCI archives to import into a node's containerd.
//
// KubeVirt assembles these images from CentOS RPM trees with Bazel
// (cmd/virt-handler/BUILD.bazel, cmd/virt-launcher/BUILD.bazel, rpm/);
// here the same commands are built from the module with go build and
// gcc, and the userland comes from Debian bookworm(-backports) roots:
// libvirt 11.3 (hack/virt-deps.sh), QEMU 10 (hack/kernel-deps.sh), bash,
// coreutils, grep, procps and qemu-img (hack/kvnode-deps.sh), and the
// host's C library, all laid out merged-/usr as KubeVirt's images are.
// The launcher image carries KubeVirt's own configuration files from the
// module (qemu.conf, virtqemud.conf, nsswitch.conf, the qemu hook and
// node-labeller.sh).
//
// One declared deviation: Debian ships no virtqemud (libvirtd only), so
// /usr/sbin/virtqemud is a shim that runs libvirtd (virtqemud.sh).
package kvnode

import (
	"context"
	_ "embed"
	"encoding/binary"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/vfnet-io/vfnet/hack/ociimage"
	"github.com/vfnet-io/vfnet/test/lib/gobuild"
)

// The images' names: virt-operator derives them from its own image
// (quay.io/kubevirt/<name>:<tag>), so a release install runs these.
const (
	HandlerRef  = "quay.io/kubevirt/virt-handler:v1.9.0"
	LauncherRef = "quay.io/kubevirt/virt-launcher:v1.9.0"
)

// Release is KubeVirt's release the images are: its tag, the tag's commit
// and the commit's time, as KubeVirt's release build stamps them.
func Release() gobuild.KubeVirtVersion {
	return gobuild.KubeVirtVersion{
		Tag:       "v1.9.0",
		Commit:    "79d34c1762169e5b0370ec491cef5ca12e6b504c",
		BuildDate: "2026-07-27T15:21:17Z",
	}
}

// Path is the images' PATH: the pods run some commands by bare name
// (virt-handler; node-labeller.sh through /bin/sh -c).
const Path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// QEMUUID is the qemu user's and group's id in KubeVirt's images: non-root
// launcher pods run as 107.
const QEMUUID = 107

// DaemonLink is the link named virtqemud to libvirtd that the shim runs
// libvirtd through (virtqemud.sh says why).
const DaemonLink = "/usr/libexec/vfnet-virtqemud/virtqemud"

// virtqemudShim is /usr/sbin/virtqemud in the launcher image.
//
//go:embed virtqemud.sh
var virtqemudShim []byte

// Build builds both images (Images) and writes each as an OCI archive
// under cache/kvnode/images, reusing an archive of the same content
// (ociimage.CachedArchive). It returns image name -> archive path. repo is
// the repository root, cache its .cache (VFNET_CACHE).
func Build(ctx context.Context, repo, cache string) (map[string]string, error) {
	ims, err := Images(ctx, repo, cache)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, im := range ims {
		file, err := ociimage.CachedArchive(filepath.Join(cache, "kvnode", "images"), im)
		if err != nil {
			return nil, fmt.Errorf("kvnode: write image %s under %s: %w", im.Ref, cache, err)
		}
		out[im.Ref] = file
	}
	return out, nil
}

// Images builds KubeVirt's node commands and returns the handler's and
// the launcher's images, in that order. It prepares the Debian roots
// first (the three hack scripts; stamp checks when warm).
func Images(ctx context.Context, repo, cache string) ([]ociimage.Image, error) {
	env, err := Prepare(ctx, repo, cache)
	if err != nil {
		return nil, err
	}
	bins, err := BuildCommands(ctx, repo, env)
	if err != nil {
		return nil, err
	}
	h, err := handlerImage(env, bins)
	if err != nil {
		return nil, fmt.Errorf("kvnode: image %s: %w", HandlerRef, err)
	}
	l, err := launcherImage(env, bins)
	if err != nil {
		return nil, fmt.Errorf("kvnode: image %s: %w", LauncherRef, err)
	}
	return []ociimage.Image{h, l}, nil
}

// Env is where the images' parts are on this host.
type Env struct {
	// Module is kubevirt.io/kubevirt@v1.9.0's directory (Go module cache).
	Module string
	// QEMURoot (hack/kernel-deps.sh), VirtRoot (hack/virt-deps.sh) and
	// ToolsRoot (hack/kvnode-deps.sh) are unpacked Debian packages.
	QEMURoot, VirtRoot, ToolsRoot string
	// LibDirs are searched for shared libraries, first match wins: the
	// roots', then the host's (the C library and what the host has).
	LibDirs []string
}

// Prepare runs the scripts that unpack the Debian roots and finds
// KubeVirt's module.
func Prepare(ctx context.Context, repo, cache string) (Env, error) {
	var e Env
	for _, s := range []string{"kernel-deps.sh", "virt-deps.sh", "kvnode-deps.sh"} {
		cmd := exec.CommandContext(ctx, filepath.Join(repo, "hack", s))
		cmd.Env = append(os.Environ(), "VFNET_CACHE="+cache)
		if out, err := cmd.CombinedOutput(); err != nil {
			return e, fmt.Errorf("kvnode: hack/%s (Debian packages into %s; needs the Debian mirror): %w\n%s", s, cache, err, out)
		}
	}
	e.QEMURoot = filepath.Join(cache, "kernel", "qemu")
	e.VirtRoot = filepath.Join(cache, "virt", "root")
	e.ToolsRoot = filepath.Join(cache, "kvnode", "root")
	for _, r := range []string{e.QEMURoot, e.VirtRoot, e.ToolsRoot} {
		e.LibDirs = append(e.LibDirs, filepath.Join(r, "usr/lib/x86_64-linux-gnu"), filepath.Join(r, "lib/x86_64-linux-gnu"))
	}
	e.LibDirs = append(e.LibDirs, "/usr/lib/x86_64-linux-gnu", "/lib/x86_64-linux-gnu")
	cmd := exec.CommandContext(ctx, "go", "list", "-m", "-f", "{{.Dir}}", "kubevirt.io/kubevirt")
	cmd.Dir = filepath.Join(repo, "test", "kubevirt")
	cmd.Env = append(os.Environ(), "GONOSUMDB=libvirt.org/go/libvirt")
	out, err := cmd.Output()
	if err != nil {
		return e, fmt.Errorf("kvnode: locate kubevirt.io/kubevirt (go list -m in test/kubevirt; run `go mod download` there): %w", err)
	}
	e.Module = strings.TrimSpace(string(out))
	if e.Module == "" {
		return e, fmt.Errorf("kvnode: kubevirt.io/kubevirt is not in the Go module cache (run `go mod download` in test/kubevirt)")
	}
	return e, nil
}

// Binaries are KubeVirt's node commands, built: command name -> file.
type Binaries map[string]string

// Commands with cgo (virt-handler: <linux/kvm.h>; virt-launcher: libvirt)
// and without, by their package under kubevirt.io/kubevirt/cmd/.
// virt-freezer (guest filesystem freeze for snapshots) is left out:
// vfnet's VM does not use it. libvirt-hook-client is not optional:
// virt-launcher links /etc/libvirt/hooks/qemu to it at start and exits
// without it.
func cgoCommands() []string { return []string{"virt-handler", "virt-launcher"} }
func staticCommands() []string {
	return []string{"virt-chroot", "virt-launcher-monitor", "virt-probe", "virt-tail", "virt-launcher/libvirt-hook-client"}
}

// BuildCommands builds KubeVirt's node commands from test/kubevirt with
// release stamps (gobuild.KubeVirtReleaseCgo, gobuild.KubeVirtRelease)
// and container-disk from the module's C source (gcc -static).
func BuildCommands(ctx context.Context, repo string, env Env) (Binaries, error) {
	b := Binaries{}
	for _, set := range []struct {
		names []string
		build func(context.Context, string, gobuild.KubeVirtVersion, ...string) (string, error)
	}{{cgoCommands(), gobuild.KubeVirtReleaseCgo}, {staticCommands(), gobuild.KubeVirtRelease}} {
		var pkgs []string
		for _, n := range set.names {
			pkgs = append(pkgs, "kubevirt.io/kubevirt/cmd/"+n)
		}
		dir, err := set.build(ctx, repo, Release(), pkgs...)
		if err != nil {
			return nil, fmt.Errorf("kvnode: build KubeVirt's node commands from test/kubevirt (go.mod replaces, third_party/ stand-ins; cgo needs gcc and linux-libc-dev): %w", err)
		}
		for _, n := range set.names {
			b[path.Base(n)] = filepath.Join(dir, path.Base(n))
		}
	}
	cd, err := containerDisk(ctx, repo, env)
	if err != nil {
		return nil, err
	}
	b["container-disk"] = cd
	return b, nil
}

// containerDisk compiles cmd/container-disk-v2alpha/main.c statically,
// as KubeVirt's cc_binary does (it runs in the container-disk image,
// which has no C library), into gobuild.Dir(repo, "kvnode"); an output
// newer than its source is kept.
func containerDisk(ctx context.Context, repo string, env Env) (string, error) {
	src := filepath.Join(env.Module, "cmd", "container-disk-v2alpha", "main.c")
	dir := gobuild.Dir(repo, "kvnode")
	out := filepath.Join(dir, "container-disk")
	if so, err := os.Stat(src); err != nil {
		return "", fmt.Errorf("kvnode: container-disk source %s: %w", src, err)
	} else if oo, err := os.Stat(out); err == nil && oo.ModTime().After(so.ModTime()) {
		return out, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	tmp := fmt.Sprintf("%s.%d.tmp", out, os.Getpid())
	cmd := exec.CommandContext(ctx, "gcc", "-static", "-O2", "-s", "-o", tmp, src)
	if o, err := cmd.CombinedOutput(); err != nil {
		os.Remove(tmp)
		return "", fmt.Errorf("kvnode: gcc -static %s (needs gcc and libc6-dev): %w\n%s", src, err, o)
	}
	return out, os.Rename(tmp, out)
}

// Arch is the images' architecture: the commands are built for the host.
func Arch() string { return runtime.GOARCH }

// passwd and group are KubeVirt's images' user databases (root and qemu
// 107, cmd/virt-handler/BUILD.bazel and cmd/virt-launcher/BUILD.bazel);
// the handler's qemu has no home. Plus Debian's libvirt-qemu (uid and gid
// 64055 as Debian's package makes them): Debian builds libvirt's QEMU
// driver with that default user, which a privileged daemon resolves before
// it reads qemu.conf (KubeVirt's says user "qemu"), and fails without it.
func passwd(qemuHome string) []byte {
	return fmt.Appendf(nil, "qemu:x:%d:%d::%s:/bin/bash\nroot:x:0:0:root:/root:/bin/bash\nlibvirt-qemu:x:64055:64055::/var/lib/libvirt:/usr/sbin/nologin\n", QEMUUID, QEMUUID, qemuHome)
}

func group() []byte {
	return fmt.Appendf(nil, "qemu:x:%d:\nroot:x:0:\nlibvirt-qemu:x:64055:\n", QEMUUID)
}

// base are the files both images have: the user database, the merged-/usr
// links, /run with /var/run -> ../run (relative: virt-handler reads a
// container's files through /proc/<pid>/root), /tmp and the tools.
func base(t *tree, env Env, qemuHome string) error {
	t.add(ociimage.File{Path: "/etc/passwd", Mode: 0o644, Data: passwd(qemuHome)})
	t.add(ociimage.File{Path: "/etc/group", Mode: 0o644, Data: group()})
	for _, l := range [][2]string{{"/bin", "usr/bin"}, {"/sbin", "usr/sbin"}, {"/lib", "usr/lib"}, {"/lib64", "usr/lib64"}, {"/var/run", "../run"}} {
		t.add(ociimage.File{Path: l[0], Symlink: l[1]})
	}
	t.add(ociimage.File{Path: "/run", Mode: fs.ModeDir | 0o755})
	t.add(ociimage.File{Path: "/tmp", Mode: fs.ModeDir | 0o777})
	t.add(ociimage.File{Path: "/root", Mode: fs.ModeDir | 0o700})
	// bash, coreutils, grep, procps, qemu-img; /bin/sh is bash, as on
	// KubeVirt's CentOS base.
	if err := t.addTree(env.ToolsRoot, "", keepUserland); err != nil {
		return err
	}
	t.add(ociimage.File{Path: "/usr/bin/sh", Symlink: "bash"})
	return nil
}

// keepUserland leaves out documentation and what no container runs.
func keepUserland(rel string) bool {
	for _, p := range []string{"usr/share/doc", "usr/share/man", "usr/share/info", "usr/share/locale", "usr/share/lintian",
		"usr/share/bug", "usr/share/menu", "usr/share/bash-completion", "etc/init.d", "etc/cron", "usr/lib/systemd", "lib/systemd"} {
		if rel == p || strings.HasPrefix(rel, p+"/") {
			return false
		}
	}
	return true
}

func handlerImage(env Env, b Binaries) (ociimage.Image, error) {
	t := newTree()
	if err := base(t, env, ""); err != nil {
		return ociimage.Image{}, err
	}
	for _, n := range []string{"virt-handler", "virt-chroot"} {
		if err := t.addHost("/usr/bin/"+n, b[n], 0o755); err != nil {
			return ociimage.Image{}, err
		}
	}
	if err := t.addHost("/etc/nsswitch.conf", filepath.Join(env.Module, "cmd", "virt-handler", "nsswitch.conf"), 0o644); err != nil {
		return ociimage.Image{}, err
	}
	if err := t.addLibs(env.LibDirs); err != nil {
		return ociimage.Image{}, err
	}
	return ociimage.Image{Ref: HandlerRef, Arch: Arch(), Files: t.list(),
		Entrypoint: []string{"/usr/bin/virt-handler"}, Env: []string{"PATH=" + Path}}, nil
}

func launcherImage(env Env, b Binaries) (ociimage.Image, error) {
	t := newTree()
	if err := base(t, env, "/home/qemu"); err != nil {
		return ociimage.Image{}, err
	}
	for _, n := range []string{"virt-launcher", "virt-launcher-monitor", "virt-probe", "virt-tail", "libvirt-hook-client", "container-disk"} {
		if err := t.addHost("/usr/bin/"+n, b[n], 0o755); err != nil {
			return ociimage.Image{}, err
		}
	}
	// cmd/virt-launcher/BUILD.bazel gives virt-launcher-monitor the file
	// capability cap_net_bind_service (setcaps): a non-root compute
	// container has it in no set, and virt-launcher-monitor starts
	// virt-launcher (and that virtqemud) with it as an ambient capability,
	// which needs it permitted first; without the attribute that start
	// fails with EPERM.
	mon := t.files["/usr/bin/virt-launcher-monitor"]
	mon.Xattrs = map[string]string{"security.capability": NetBindServiceCap()}
	t.add(mon)
	// KubeVirt's own files for the launcher image, from the module. The
	// hooks directory is the non-root launcher's, as KubeVirt's image has
	// it (cmd/virt-launcher/BUILD.bazel's qemu-hook-tar, owner 107):
	// virt-launcher replaces the hook with a link to libvirt-hook-client
	// at start and exits when it cannot.
	t.add(withOwner(ociimage.File{Path: "/etc/libvirt/hooks", Mode: fs.ModeDir | 0o755}, QEMUUID))
	kv := filepath.Join(env.Module, "cmd", "virt-launcher")
	for _, f := range []struct {
		path, src string
		mode      fs.FileMode
		uid       int
	}{
		{"/usr/bin/node-labeller.sh", "node-labeller/node-labeller.sh", 0o755, 0},
		{"/etc/libvirt/qemu.conf", "qemu.conf", 0o644, 0},
		{"/etc/libvirt/virtqemud.conf", "virtqemud.conf", 0o644, 0},
		{"/etc/nsswitch.conf", "nsswitch.conf", 0o644, 0},
		{"/etc/libvirt/hooks/qemu", "qemu", 0o755, QEMUUID},
	} {
		if err := t.addHost(f.path, filepath.Join(kv, f.src), f.mode); err != nil {
			return ociimage.Image{}, err
		}
		t.files[f.path] = withOwner(t.files[f.path], f.uid)
	}
	// libvirt 11.3 as Debian ships it: libvirtd (behind the virtqemud
	// shim), virtlogd, virsh, the QEMU driver, its data and configuration
	// (virt-launcher runs virtlogd -f /etc/libvirt/virtlogd.conf).
	v := env.VirtRoot
	for _, f := range []string{"usr/sbin/libvirtd", "usr/sbin/virtlogd", "usr/bin/virsh",
		"usr/lib/x86_64-linux-gnu/libvirt/connection-driver/libvirt_driver_qemu.so"} {
		if err := t.addHost("/"+f, filepath.Join(v, f), 0o755); err != nil {
			return ociimage.Image{}, err
		}
	}
	for _, f := range []string{"etc/libvirt/virtlogd.conf", "etc/libvirt/libvirtd.conf", "etc/libvirt/libvirt.conf"} {
		if err := t.addHost("/"+f, filepath.Join(v, f), 0o644); err != nil {
			return ociimage.Image{}, err
		}
	}
	if err := t.addTree(v, "usr/share/libvirt", func(rel string) bool { return !strings.HasSuffix(rel, ".png") }); err != nil {
		return ociimage.Image{}, err
	}
	// The daemon's state, cache and log directories, as the packages
	// make them (root mode writes /var/log/libvirt/libvirtd.log when
	// daemonized).
	if err := t.addTree(v, "var", func(string) bool { return true }); err != nil {
		return ociimage.Image{}, err
	}
	t.add(ociimage.File{Path: "/usr/sbin/virtqemud", Mode: 0o755, Data: virtqemudShim})
	t.add(ociimage.File{Path: DaemonLink, Symlink: "/usr/sbin/libvirtd"})
	// virt-launcher's libvirt binding dlopens these (-tags libvirt_dlopen).
	// libvirt-admin too: EventRegisterDefaultImpl, which virt-launcher's
	// init calls and ignores the error of, opens it before it registers
	// the event loop; without it every connection later fails with "could
	// not initialize domain event timer".
	for _, lib := range []string{"libvirt.so.0", "libvirt-qemu.so.0", "libvirt-admin.so.0", "libvirt-lxc.so.0"} {
		t.dlopened = append(t.dlopened, lib)
	}
	// QEMU 10 and the firmware it loads from its built-in paths
	// (/usr/share/qemu, /usr/share/seabios, /usr/lib/ipxe/qemu).
	q := env.QEMURoot
	if err := t.addHost("/usr/bin/qemu-system-x86_64", filepath.Join(q, "usr/bin/qemu-system-x86_64"), 0o755); err != nil {
		return ociimage.Image{}, err
	}
	for _, d := range []string{"usr/share/qemu", "usr/share/seabios", "usr/lib/ipxe"} {
		if err := t.addTree(q, d, func(string) bool { return true }); err != nil {
			return ociimage.Image{}, err
		}
	}
	if err := t.addLibs(env.LibDirs); err != nil {
		return ociimage.Image{}, err
	}
	return ociimage.Image{Ref: LauncherRef, Arch: Arch(), Files: t.list(),
		Entrypoint: []string{"/usr/bin/virt-launcher"}, Env: []string{"PATH=" + Path}, User: fmt.Sprint(QEMUUID)}, nil
}

// NetBindServiceCap is the security.capability attribute value of
// cap_net_bind_service=ep (VFS_CAP_REVISION_2: magic with the effective
// flag, then permitted and inheritable, low and high words, little endian).
func NetBindServiceCap() string {
	const capNetBindService = 10
	var b [20]byte
	binary.LittleEndian.PutUint32(b[0:], 0x02000000|0x1)
	binary.LittleEndian.PutUint32(b[4:], 1<<capNetBindService)
	return string(b[:])
}

func withOwner(f ociimage.File, id int) ociimage.File {
	f.UID, f.GID = id, id
	return f
}
