package kvnode

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/vfnet-io/vfnet/hack/ociimage"
	"github.com/vfnet-io/vfnet/test/lib/gobuild"
)

// The images take a cgo build of KubeVirt's tree (~200 CPU-s cold) and
// hundreds of MB of files: opt-in, `make test-kubevirt-guest`.
func needGuestTier(t *testing.T) {
	t.Helper()
	if os.Getenv("VFNET_KUBEVIRT_GUEST") != "1" {
		t.Skip("KubeVirt node images: run `make test-kubevirt-guest` (VFNET_KUBEVIRT_GUEST=1)")
	}
}

// built is the images, made once per test binary.
type built struct {
	once     sync.Once
	repo     string
	cache    string
	handler  ociimage.Image
	launcher ociimage.Image
	env      Env
	err      error
}

func (b *built) get(t *testing.T) *built {
	t.Helper()
	b.once.Do(func() {
		if b.repo, b.err = gobuild.RepoRoot(); b.err != nil {
			return
		}
		b.cache = os.Getenv("VFNET_CACHE")
		if b.cache == "" {
			b.cache = filepath.Join(b.repo, ".cache")
		}
		start := time.Now()
		var ims []ociimage.Image
		if ims, b.err = Images(t.Context(), b.repo, b.cache); b.err != nil {
			return
		}
		b.handler, b.launcher = ims[0], ims[1]
		b.env, b.err = Prepare(t.Context(), b.repo, b.cache)
		t.Logf("images assembled in %s", time.Since(start).Round(time.Millisecond))
	})
	if b.err != nil {
		t.Fatal(b.err)
	}
	return b
}

func newBuilt() *built { return &built{} }

// testImages is shared by the tests of this binary.
var testImages = newBuilt()

func size(im ociimage.Image) (n int) {
	for _, f := range im.Files {
		n += len(f.Data)
	}
	return n
}

// Build writes both archives and a second Build reuses them.
func TestKVNodeBuildWritesArchives(t *testing.T) {
	needGuestTier(t)
	b := testImages.get(t)
	start := time.Now()
	got, err := Build(t.Context(), b.repo, b.cache)
	if err != nil {
		t.Fatal(err)
	}
	first := time.Since(start)
	for _, im := range []ociimage.Image{b.handler, b.launcher} {
		st, err := os.Stat(got[im.Ref])
		if err != nil {
			t.Fatalf("%s: %v", im.Ref, err)
		}
		t.Logf("%s: %d files, %d MB uncompressed, archive %d MB (%s)", im.Ref, len(im.Files), size(im)>>20, st.Size()>>20, filepath.Base(got[im.Ref]))
	}
	start = time.Now()
	again, err := Build(t.Context(), b.repo, b.cache)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("Build %s, again (archives cached) %s", first.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
	for ref, f := range got {
		if again[ref] != f {
			t.Errorf("%s: second Build wrote %s, first %s", ref, again[ref], f)
		}
	}
}

// genTool builds a command of test/kubevirt's, built as the other tiers build them.
func genTool(t *testing.T, repo, name string) string {
	t.Helper()
	dir, err := gobuild.KubeVirt(t.Context(), repo, "./cmd/"+name)
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(dir, name)
}

// handlerDaemonSet is virt-handler's DaemonSet as virt-operator v1.9.0
// renders it into its install strategy (genoperator).
func handlerDaemonSet(t *testing.T, repo string) map[string]any {
	t.Helper()
	dir := t.TempDir()
	cmd := exec.CommandContext(t.Context(), genTool(t, repo, "genoperator"), "-o", filepath.Join(dir, "op.yaml"),
		"-cr", filepath.Join(dir, "cr.yaml"), "-strategy", filepath.Join(dir, "strategy.yaml"))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("genoperator: %v\n%s", err, out)
	}
	data, err := os.ReadFile(filepath.Join(dir, "strategy.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(data), -1) {
		var obj map[string]any
		if err := yaml.Unmarshal([]byte(doc), &obj); err != nil || obj == nil {
			continue
		}
		if obj["kind"] == "DaemonSet" && dig(obj, "metadata", "name") == "virt-handler" {
			return obj
		}
	}
	t.Fatal("no DaemonSet virt-handler in genoperator's install strategy")
	return nil
}

func dig(obj any, keys ...string) any {
	for _, k := range keys {
		m, ok := obj.(map[string]any)
		if !ok {
			return nil
		}
		obj = m[k]
	}
	return obj
}

func strs(v any) []string {
	var out []string
	l, _ := v.([]any)
	for _, x := range l {
		if s, ok := x.(string); ok {
			out = append(out, s)
		}
	}
	return out
}

func containers(spec any) []map[string]any {
	var out []map[string]any
	for _, key := range []string{"initContainers", "containers"} {
		l, _ := dig(spec, key).([]any)
		for _, c := range l {
			if m, ok := c.(map[string]any); ok {
				out = append(out, m)
			}
		}
	}
	return out
}

// bazelTar is the srcs of the pkg_tar name in a KubeVirt BUILD.bazel, as
// command names ("//cmd/virt-probe" -> virt-probe, ":virt-launcher",
// "node-labeller/node-labeller.sh", "//cmd/x:container-disk" ->
// container-disk).
func bazelTar(t *testing.T, file, name string) []string {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?s)pkg_tar\(\s*name = "` + regexp.QuoteMeta(name) + `",\s*srcs = \[(.*?)\]`).FindSubmatch(data)
	if m == nil {
		t.Fatalf("%s has no pkg_tar %q with srcs", file, name)
	}
	var out []string
	for _, s := range regexp.MustCompile(`"([^"]+)"`).FindAllSubmatch(m[1], -1) {
		src := string(s[1])
		if i := strings.LastIndexAny(src, ":/"); i >= 0 {
			src = src[i+1:]
		}
		out = append(out, src)
	}
	return out
}

// notCarried are left out of the launcher image on purpose (kvnode.go:
// staticCommands).
func notCarried() []string { return []string{"virt-freezer"} }

// Each image carries what KubeVirt v1.9.0's own image definitions put in
// /usr/bin, and every program the pods' containers run: virt-handler's
// DaemonSet as virt-operator renders it, the launcher pod as
// virt-controller renders it for the example VM.
func TestKVNodeImagesCarryWhatPodsExec(t *testing.T) {
	needGuestTier(t)
	b := testImages.get(t)
	for _, c := range []struct {
		im         ociimage.Image
		build, tar string
	}{
		{b.handler, "cmd/virt-handler/BUILD.bazel", "virt-handler-tar"},
		{b.launcher, "cmd/virt-launcher/BUILD.bazel", "virt-launcher-tar"},
		{b.launcher, "cmd/virt-launcher/BUILD.bazel", "libvirt-hook-client-tar"},
	} {
		for _, name := range bazelTar(t, filepath.Join(b.env.Module, c.build), c.tar) {
			if slices.Contains(notCarried(), name) {
				continue
			}
			if _, ok := Has(c.im, "/usr/bin/"+name); !ok {
				t.Errorf("%s: no /usr/bin/%s (KubeVirt's %s %s)", c.im.Ref, name, c.build, c.tar)
			}
		}
	}

	// virt-launcher's libvirt binding (-tags libvirt_dlopen) opens these
	// by name at run time: every dlopen in the module's sources.
	for _, lib := range bindingDlopens(t, b.repo) {
		if _, ok := Has(b.launcher, "/usr/lib/x86_64-linux-gnu/"+lib); !ok {
			t.Errorf("%s: no /usr/lib/x86_64-linux-gnu/%s, which libvirt.org/go/libvirt dlopens", b.launcher.Ref, lib)
		}
	}

	// KubeVirt's image sets this file capability (setcaps).
	if f, ok := Has(b.launcher, "/usr/bin/virt-launcher-monitor"); !ok || f.Xattrs["security.capability"] != NetBindServiceCap() {
		t.Errorf("%s: /usr/bin/virt-launcher-monitor lacks cap_net_bind_service=ep (%q)", b.launcher.Ref, f.Xattrs)
	}

	// virt-handler's pod: the handler container and the node-labeller
	// init container (launcher image).
	ds := handlerDaemonSet(t, b.repo)
	spec := dig(ds, "spec", "template", "spec")
	checked := 0
	for _, c := range containers(spec) {
		im := b.handler
		if strings.Contains(dig(c, "image").(string), "virt-launcher") {
			im = b.launcher
		}
		cmd := append(strs(dig(c, "command")), strs(dig(c, "args"))...)
		checkCommand(t, im, dig(c, "name").(string), cmd)
		checked++
	}

	// The launcher pod for the example VM (non-root, as virt-api mutates it).
	cr := filepath.Join(b.repo, "manifests", "kubevirt", "binding-patch.yaml")
	out, err := exec.CommandContext(t.Context(), genTool(t, b.repo, "genlauncherpod"), "-kubevirt", cr,
		"-vm", filepath.Join(b.repo, "manifests", "examples", "vm.yaml"), "-virt-api-mutations").Output()
	if err != nil {
		t.Fatalf("genlauncherpod: %v", err)
	}
	var pod map[string]any
	if err := json.Unmarshal(out, &pod); err != nil {
		t.Fatal(err)
	}
	for _, c := range containers(dig(pod, "spec")) {
		if !strings.Contains(dig(c, "image").(string), "virt-launcher") {
			continue
		}
		cmd := append(strs(dig(c, "command")), strs(dig(c, "args"))...)
		checkCommand(t, b.launcher, dig(c, "name").(string), cmd)
		checked++
	}
	if checked < 4 {
		t.Errorf("checked %d containers; want virt-handler, its node-labeller init and the launcher pod's", checked)
	}
}

// checkCommand checks that the image has the program a container runs and
// every absolute /usr/bin path among its arguments (cp's source), and for
// "sh -c X", the first word of X.
func checkCommand(t *testing.T, im ociimage.Image, name string, cmd []string) {
	t.Helper()
	if len(cmd) == 0 {
		t.Errorf("%s: container %s has no command (the image's entrypoint)", im.Ref, name)
		return
	}
	progs := []string{cmd[0]}
	if (cmd[0] == "/bin/sh" || cmd[0] == "/bin/bash") && len(cmd) > 2 && cmd[1] == "-c" {
		progs = append(progs, strings.Fields(cmd[2])[0])
	}
	for _, a := range cmd[1:] {
		if strings.HasPrefix(a, "/usr/bin/") {
			progs = append(progs, a)
		}
	}
	for _, p := range progs {
		if at, ok := InPath(im, p); ok {
			t.Logf("%s: container %s runs %s: %s", im.Ref, name, p, at)
		} else {
			t.Errorf("%s: container %s runs %s (%q), which the image lacks", im.Ref, name, p, cmd)
		}
	}
}

// envOf is the literal env of a container of ds, as NAME=value.
func envOf(ds map[string]any, container string) []string {
	for _, c := range containers(dig(ds, "spec", "template", "spec")) {
		if dig(c, "name") != container {
			continue
		}
		var out []string
		l, _ := dig(c, "env").([]any)
		for _, e := range l {
			if v, ok := dig(e, "value").(string); ok {
				out = append(out, dig(e, "name").(string)+"="+v)
			}
		}
		return out
	}
	return nil
}

// nsScript runs in a private mount namespace: the launcher image's root
// gets /proc, /sys and a /dev without kvm, then node-labeller.sh runs as
// virt-handler's init container runs it (root, its env), then the shim as
// virt-launcher starts it for a non-root VM (uid 107, XDG dirs, the
// emptyDirs of the launcher pod) and virsh dials the socket virt-launcher
// dials. Every daemon it starts is killed by PID before it exits.
const nsScript = `set -eu
root=$1
mount --make-rprivate /
mount -t proc proc "$root/proc"
mount --rbind /sys "$root/sys"
mount -t tmpfs -o mode=755 dev "$root/dev"
for d in null zero full random urandom tty; do
  touch "$root/dev/$d"; mount --bind /dev/$d "$root/dev/$d"
done
# The links a container runtime makes in /dev.
ln -s /proc/self/fd "$root/dev/fd"
ln -s /proc/self/fd/0 "$root/dev/stdin"; ln -s /proc/self/fd/1 "$root/dev/stdout"; ln -s /proc/self/fd/2 "$root/dev/stderr"
# This host registers a kvm misc device (PVM), which node-labeller.sh would
# mknod and prefer; the tier runs QEMU under TCG: hide it.
grep -vw kvm /proc/misc >"$root/tmp/misc" || true
mount --bind "$root/tmp/misc" "$root/proc/misc"
mkdir -p "$root/var/lib/kubevirt-node-labeller"
test ! -e "$root/dev/kvm" || { echo "/dev/kvm in the root"; exit 1; }
echo "== node-labeller.sh"
rc=0
env -i PATH=` + Path + ` $NODE_LABELLER_ENV chroot "$root" /bin/sh -c node-labeller.sh >"$root/tmp/labeller.log" 2>&1 || rc=$?
pid=$(cat "$root/run/libvirtd.pid" 2>/dev/null || true)
if [ -n "$pid" ]; then
  echo "node-labeller's daemon: pid $pid"
  kill "$pid" || true
  for i in $(seq 1 50); do [ -e /proc/$pid ] || break; sleep 0.1; done
fi
tail -n 5 "$root/tmp/labeller.log"
[ $rc -eq 0 ] || { echo "node-labeller.sh exited $rc"; cat "$root/tmp/labeller.log"; exit 1; }

echo "== virt-launcher's virtqemud"
# The launcher pod's emptyDirs (fresh: node-labeller ran in virt-handler's
# pod, whose /run the root daemon wrote), and what virt-launcher's
# SetupLibvirt copies.
rm -rf "$root/run/libvirt"
for d in var/run/libvirt var/run/kubevirt-private/libvirt; do mkdir -p "$root/$d"; chmod 0777 "$root/$d"; done
cp "$root/etc/libvirt/virtqemud.conf" "$root/var/run/libvirt/virtqemud.conf"
cp "$root/etc/libvirt/qemu.conf" "$root/var/run/kubevirt-private/libvirt/qemu.conf"
chown -R 107:107 "$root/var/run/kubevirt-private"
xdg="XDG_RUNTIME_DIR=/var/run XDG_CONFIG_HOME=/var/run/kubevirt-private XDG_CACHE_HOME=/var/run/kubevirt-private HOME=/home/qemu"
env -i PATH=` + Path + ` $xdg chroot --userspec=107:107 "$root" /usr/sbin/virtqemud -f /var/run/libvirt/virtqemud.conf >"$root/tmp/virtqemud.log" 2>&1 &
daemon=$!
echo "virtqemud (shim -> libvirtd): pid $daemon"
sock=$root/var/run/libvirt/libvirt-sock
for i in $(seq 1 300); do [ -S "$sock" ] && break; sleep 0.1; done
ls -l "$root/var/run/libvirt" | grep sock || true
# libvirtd answers on its socket: virt-handler finds it by the process
# name virtqemud to raise its memlock limit.
exe=$(readlink /proc/$daemon/exe); comm=$(cat /proc/$daemon/comm)
echo "daemon: $exe, process name $comm"
case "$exe" in */usr/sbin/libvirtd) ;; *) echo "the daemon runs $exe, not libvirtd"; exit 1;; esac
[ "$comm" = virtqemud ] || { echo "the daemon's process name is $comm, not virtqemud"; exit 1; }
rc=0
env -i PATH=` + Path + ` $xdg chroot --userspec=107:107 "$root" virsh -c 'qemu+unix:///session?socket=/var/run/libvirt/virtqemud-sock' capabilities >"$root/tmp/session-caps.xml" 2>"$root/tmp/virsh.err" || rc=$?
kill "$daemon" 2>/dev/null || true
wait "$daemon" 2>/dev/null || true
[ $rc -eq 0 ] || { echo "virsh exited $rc"; cat "$root/tmp/virsh.err" "$root/tmp/virtqemud.log"; exit 1; }
echo "session capabilities: $(wc -c <"$root/tmp/session-caps.xml") bytes"

echo "== virt-launcher's hook link"
# What virt-launcher does at start, as the non-root launcher (107): the
# qemu hook becomes a link to libvirt-hook-client.
env -i PATH=` + Path + ` chroot --userspec=107:107 "$root" /bin/sh -c \
  'rm /etc/libvirt/hooks/qemu && ln -s /usr/bin/libvirt-hook-client /etc/libvirt/hooks/qemu && test -x /etc/libvirt/hooks/qemu'
echo "hook: $(readlink "$root/etc/libvirt/hooks/qemu")"
`

// The launcher image's libvirt runs: node-labeller.sh (with the virtqemud
// shim) writes the capabilities virt-handler reads, for TCG, and the shim
// started as virt-launcher starts it answers on virtqemud-sock.
func TestKVNodeLauncherLibvirtRuns(t *testing.T) {
	needGuestTier(t)
	if os.Geteuid() != 0 {
		t.Fatal("needs root (mount namespace, chroot): run `make test-kubevirt-guest` as root")
	}
	b := testImages.get(t)
	root := t.TempDir()
	if err := os.Chmod(root, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := Unpack(b.launcher, root); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"proc", "sys", "dev"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	labellerEnv := envOf(handlerDaemonSet(t, b.repo), "virt-launcher")
	if len(labellerEnv) == 0 {
		t.Fatal("virt-handler's DaemonSet has no node-labeller init container (virt-launcher) with env")
	}
	t.Logf("node-labeller env (virt-operator's DaemonSet): %v", labellerEnv)
	cmd := exec.CommandContext(t.Context(), "/bin/bash", "-c", nsScript, "ns", root)
	cmd.Env = append(os.Environ(), "NODE_LABELLER_ENV="+strings.Join(labellerEnv, " "))
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	err := cmd.Run()
	t.Logf("namespace script (%s):\n%s", time.Since(start).Round(time.Millisecond), out.String())
	// Anything still running from the root is a leak: kill it by PID.
	if left := processesIn(root); len(left) > 0 {
		for _, pid := range left {
			syscall.Kill(pid, syscall.SIGKILL)
		}
		t.Errorf("processes left running in the root (killed): %v", left)
	}
	if err != nil {
		t.Fatalf("namespace script: %v", err)
	}
	dir := filepath.Join(root, "var/lib/kubevirt-node-labeller")
	for _, f := range []string{"virsh_domcapabilities.xml", "capabilities.xml", "supported_features.xml"} {
		data, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil || len(data) == 0 {
			t.Errorf("node-labeller.sh did not write %s: %v", f, err)
			continue
		}
		t.Logf("%s: %d bytes", f, len(data))
	}
	dc, _ := os.ReadFile(filepath.Join(dir, "virsh_domcapabilities.xml"))
	if m := regexp.MustCompile(`<domain>[^<]*</domain>|<machine>[^<]*</machine>|<path>[^<]*</path>`).FindAll(dc, -1); len(m) > 0 {
		t.Logf("domcapabilities: %s", bytes.Join(m, []byte(" ")))
	}
	if !bytes.Contains(dc, []byte("<domain>qemu</domain>")) {
		t.Errorf("domcapabilities are not for TCG (<domain>qemu</domain>):\n%.600s", dc)
	}
	caps, _ := os.ReadFile(filepath.Join(dir, "capabilities.xml"))
	if !bytes.Contains(caps, []byte("<domain type='qemu'")) {
		t.Errorf("capabilities.xml has no qemu domain type:\n%.600s", caps)
	}
	sc, _ := os.ReadFile(filepath.Join(root, "tmp/session-caps.xml"))
	if !bytes.Contains(sc, []byte("/usr/bin/qemu-system-x86_64")) {
		t.Errorf("the session daemon's capabilities name no /usr/bin/qemu-system-x86_64:\n%.600s", sc)
	}
}

// processesIn lists the processes whose root directory is root.
func processesIn(root string) []int {
	var out []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if r, err := os.Readlink(filepath.Join("/proc", e.Name(), "root")); err == nil && (r == root || strings.HasPrefix(r, root+"/")) {
			out = append(out, pid)
		}
	}
	return out
}

// bindingDlopens are the libraries libvirt.org/go/libvirt, as test/kubevirt
// requires it, opens with dlopen under -tags libvirt_dlopen.
func bindingDlopens(t *testing.T, repo string) []string {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), "go", "list", "-m", "-f", "{{.Dir}}", "libvirt.org/go/libvirt")
	cmd.Dir = filepath.Join(repo, "test", "kubevirt")
	cmd.Env = append(os.Environ(), "GONOSUMDB=libvirt.org/go/libvirt")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("locate libvirt.org/go/libvirt: %v", err)
	}
	files, _ := filepath.Glob(filepath.Join(strings.TrimSpace(string(out)), "*_dlopen.go"))
	seen := map[string]bool{}
	var libs []string
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range regexp.MustCompile(`dlopen\("([^"]+)"`).FindAllSubmatch(data, -1) {
			if l := string(m[1]); !seen[l] {
				seen[l] = true
				libs = append(libs, l)
			}
		}
	}
	if len(libs) == 0 {
		t.Fatalf("no dlopen in %v", files)
	}
	return libs
}
