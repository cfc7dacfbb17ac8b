// Package gobuild builds the module's commands for tests into a directory
// under the repository's .cache that outlives the test, as the shipped
// binaries are built (hack/shipbuild). go build leaves an up-to-date binary
// alone, so every build after the first with the same inputs skips the
// link: each link of vfnet-driver-sim costs several CPU-seconds, and the
// tests build it a dozen times per make test. One configuration for all
// of them means a cold Go cache compiles their dependencies once.
package gobuild

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/vfnet-io/vfnet/hack/shipbuild"
)

// Dir is the directory for binaries built under name (one name per set of
// build flags and environment: binaries built differently must not replace
// each other, or every build would link again). Shipped uses "shipped".
func Dir(repo, name string) string {
	return filepath.Join(repo, ".cache", "testbin", name)
}

// Shipped builds pkgs of the module in repo as the images' binaries are
// built, into Dir(repo, "shipped"), and returns that directory. Every test
// that runs vfnet's binaries shares them.
func Shipped(ctx context.Context, repo string, pkgs ...string) (string, error) {
	dir := Dir(repo, "shipped")
	return dir, Into(ctx, repo, dir, shipbuild.Env(), shipbuild.Args(), pkgs...)
}

// KubeVirt builds pkgs of test/kubevirt (KubeVirt v1.9.0's own code, its
// own module) into Dir(repo, "kubevirt") and returns that directory: static
// and -trimpath, as `make vet-kubevirt` and `make test-kubevirt` compile
// that module, so its large dependency tree compiles once on a cold Go
// cache. A `go run` or a build in another configuration compiles all of it
// again, and several tests doing that at once each compile it in full.
func KubeVirt(ctx context.Context, repo string, pkgs ...string) (string, error) {
	dir := Dir(repo, "kubevirt")
	return dir, Into(ctx, filepath.Join(repo, "test", "kubevirt"), dir, kubeVirtEnv(), []string{"-trimpath"}, pkgs...)
}

// KubeVirtRelease builds KubeVirt's own commands (kubevirt.io/kubevirt/cmd/...)
// as KubeVirt's release stamps them, into Dir(repo, "kubevirt-release"),
// and returns that directory. Only the link differs from KubeVirt (the
// version defs of kubevirt.io/client-go/version, which virt-operator
// compares and reports), so the packages compile once for both.
func KubeVirtRelease(ctx context.Context, repo string, version KubeVirtVersion, pkgs ...string) (string, error) {
	dir := Dir(repo, "kubevirt-release")
	return dir, kubeVirtRelease(ctx, repo, dir, version, kubeVirtEnv(), nil, pkgs)
}

// KubeVirtReleaseCgo builds KubeVirt's node commands that need cgo
// (virt-handler: <linux/kvm.h>; virt-launcher: libvirt.org/go/libvirt) as
// KubeVirtRelease stamps them, into Dir(repo, "kubevirt-release-cgo"),
// and returns that directory. The libvirt binding is built with the tag
// libvirt_dlopen: it needs no libvirt headers and dlopens libvirt.so.0
// when the program starts, so the binaries run against the libvirt the
// launcher image carries. A second build configuration of most of
// KubeVirt's tree (cgo changes the packages' build IDs): ~200 CPU-s cold.
func KubeVirtReleaseCgo(ctx context.Context, repo string, version KubeVirtVersion, pkgs ...string) (string, error) {
	dir := Dir(repo, "kubevirt-release-cgo")
	env := []string{"CGO_ENABLED=1", "GONOSUMDB=libvirt.org/go/libvirt"}
	return dir, kubeVirtRelease(ctx, repo, dir, version, env, []string{"-tags=libvirt_dlopen"}, pkgs)
}

// kubeVirtRelease builds pkgs of test/kubevirt into dir with KubeVirt's
// release stamps, env and the extra build flags.
func kubeVirtRelease(ctx context.Context, repo, dir string, version KubeVirtVersion, env, flags, pkgs []string) error {
	const v = "kubevirt.io/client-go/version"
	// -s -w: KubeVirt's images carry stripped binaries; -w is also what
	// the Makefile's GOFLAGS gives every other link, which this replaces.
	ldflags := fmt.Sprintf("-s -w -X %s.gitVersion=%s -X %s.gitCommit=%s -X %s.gitTreeState=clean -X %s.buildDate=%s",
		v, version.Tag, v, version.Commit, v, v, version.BuildDate)
	args := append([]string{"-trimpath", "-ldflags=" + ldflags}, flags...)
	return Into(ctx, filepath.Join(repo, "test", "kubevirt"), dir, env, args, pkgs...)
}

// KubeVirtVersion is what a KubeVirt release build stamps into its
// binaries: the tag, its commit and the commit's time (RFC 3339, UTC).
type KubeVirtVersion struct{ Tag, Commit, BuildDate string }

// kubeVirtEnv is test/kubevirt's build environment: static, and
// GONOSUMDB for libvirt.org/go/libvirt (see test/kubevirt's README).
func kubeVirtEnv() []string {
	return []string{"CGO_ENABLED=0", "GONOSUMDB=libvirt.org/go/libvirt"}
}

// Into runs `go build <args> -o <dir>/ <pkgs>` in moduleDir with env added to
// this process's environment. It holds an exclusive lock on dir meanwhile,
// so test processes that build the same binaries at once take turns and
// each later one finds them up to date. go build renames the new binary
// into place, so a process still running the old one is not disturbed.
func Into(ctx context.Context, moduleDir, dir string, env, args []string, pkgs ...string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create the test binaries' directory: %w", err)
	}
	lock, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return fmt.Errorf("open the lock of %s: %w", dir, err)
	}
	defer lock.Close()
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX); err != nil {
		return fmt.Errorf("lock %s: %w", dir, err)
	}
	defer unix.Flock(int(lock.Fd()), unix.LOCK_UN)
	cmd := exec.CommandContext(ctx, "go", append(append(append([]string{"build"}, args...), "-o", dir+"/"), pkgs...)...)
	cmd.Dir = moduleDir
	cmd.Env = append(os.Environ(), env...)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %v into %s: %w\n%s", pkgs, dir, err, out)
	}
	return nil
}

// Module is the path of the module RepoRoot finds.
const Module = "github.com/vfnet-io/vfnet"

// RepoRoot is the module root: the nearest directory above the working
// directory (a test's package directory, or the repository for `go run`)
// whose go.mod declares Module. Not the source file's path: tests build
// with -trimpath, so that a fresh clone reuses Go's build cache.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("locate repository root: %w", err)
	}
	for {
		data, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && modulePath(data) == Module {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("locate repository root: no go.mod of %s above the working directory; run from inside the repository", Module)
		}
		dir = parent
	}
}

// modulePath is the path a go.mod's module directive declares.
func modulePath(gomod []byte) string {
	for _, l := range strings.Split(string(gomod), "\n") {
		if f := strings.Fields(l); len(f) == 2 && f[0] == "module" {
			return strings.Trim(f[1], `"`)
		}
	}
	return ""
}
