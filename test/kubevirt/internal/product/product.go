// Package product builds and runs the product's binaries for tests in this
// module. The product module uses k8s.io/* v0.37 while this module pins
// KubeVirt's v0.34.2, so the product is exercised as a separate process over
// its real interfaces (socket, flags, files), built from the product module.
package product

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// ThisModule is the module path of test/kubevirt.
const ThisModule = "github.com/vfnet-io/vfnet/test/kubevirt"

// ModuleDir finds test/kubevirt by walking up from the working directory.
func ModuleDir() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("working directory: %w", err)
	}
	for {
		data, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && strings.Contains(string(data), "module "+ThisModule+"\n") {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("run from inside test/kubevirt: go.mod of " + ThisModule + " not found above the working directory")
		}
		dir = parent
	}
}

// RepoRoot is the product module's root (two levels above test/kubevirt).
func RepoRoot() (string, error) {
	m, err := ModuleDir()
	if err != nil {
		return "", err
	}
	return filepath.Clean(filepath.Join(m, "..", "..")), nil
}

// BindingPackage is the product's binding sidecar main package.
const BindingPackage = "./cmd/vfnet-binding"

// HasBinding reports whether the product tree contains cmd/vfnet-binding.
func HasBinding() (bool, error) {
	root, err := RepoRoot()
	if err != nil {
		return false, err
	}
	_, err = os.Stat(filepath.Join(root, BindingPackage, "main.go"))
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	return err == nil, err
}

// Build runs `go build -C <repo root> -o out pkg` as the product's images
// are built (the product's hack/shipbuild, which this module cannot
// import; its test checks these): the product's packages compile once for
// these tests and every other tier on a cold Go cache.
func Build(ctx context.Context, pkg, out string) error {
	return build(ctx, pkg, out, []string{"CGO_ENABLED=0"}, "-trimpath", "-tags", "grpcnotrace", "-ldflags=-s -w")
}

// BuildAsEnv builds with only what the environment sets (CGO_ENABLED,
// GOFLAGS): bindingbench builds both sidecars alike that way.
func BuildAsEnv(ctx context.Context, pkg, out string) error {
	return build(ctx, pkg, out, nil)
}

func build(ctx context.Context, pkg, out string, env []string, flags ...string) error {
	root, err := RepoRoot()
	if err != nil {
		return err
	}
	args := append(append([]string{"build", "-C", root}, flags...), "-o", out, pkg)
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Env = append(os.Environ(), env...)
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %s in %s: %w\n%s", pkg, root, err, b)
	}
	return nil
}

// Sidecar is a running hook sidecar process.
type Sidecar struct {
	Cmd    *exec.Cmd
	Socket string
	done   chan error
}

// BindingSocket is where vfnet-binding serves for a binding name.
func BindingSocket(socketDir, binding string) string {
	return filepath.Join(socketDir, "vfnet-"+binding+".sock")
}

// StartBinding starts vfnet-binding with the given dirs and binding name and
// waits until its socket exists.
func StartBinding(ctx context.Context, bin, socketDir, metadataRoot, binding string, stderr *os.File) (*Sidecar, error) {
	cmd := exec.Command(bin, "--socket-dir", socketDir, "--metadata-root", metadataRoot)
	cmd.Env = append(os.Environ(), "NETWORK_BINDING_PLUGIN_NAME="+binding)
	cmd.Stdout, cmd.Stderr = stderr, stderr
	return Start(ctx, cmd, BindingSocket(socketDir, binding))
}

// Start starts cmd and waits until socket exists (or the process exits).
func Start(ctx context.Context, cmd *exec.Cmd, socket string) (*Sidecar, error) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", cmd.Path, err)
	}
	s := &Sidecar{Cmd: cmd, Socket: socket, done: make(chan error, 1)}
	go func() { s.done <- cmd.Wait() }()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		// The file exists from bind(2) on, but connections are refused
		// until listen(2): wait until one is accepted, as virt-launcher's
		// hook manager retries a socket that is "not ready yet".
		if c, err := net.Dial("unix", socket); err == nil {
			c.Close()
			return s, nil
		}
		select {
		case err := <-s.done:
			s.done <- err
			return nil, fmt.Errorf("%s exited before serving %s: %v", cmd.Path, socket, err)
		case <-ctx.Done():
			_ = s.Stop()
			return nil, fmt.Errorf("%s did not create %s: %w", cmd.Path, socket, ctx.Err())
		case <-tick.C:
		}
	}
}

// Exited returns the process's exit error once it has exited, or false.
func (s *Sidecar) Exited(timeout time.Duration) (error, bool) {
	select {
	case err := <-s.done:
		s.done <- err
		return err, true
	case <-time.After(timeout):
		return nil, false
	}
}

// Stop sends SIGTERM, waits up to 5 s, then kills. Returns the exit error.
func (s *Sidecar) Stop() error {
	_ = s.Cmd.Process.Signal(syscall.SIGTERM)
	if err, ok := s.Exited(5 * time.Second); ok {
		return err
	}
	_ = s.Cmd.Process.Kill()
	err, _ := s.Exited(5 * time.Second)
	return err
}

// RSSKiB reads VmRSS of pid from /proc.
func RSSKiB(pid int) (int, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, fmt.Errorf("read status of pid %d: %w", pid, err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			var kib int
			if _, err := fmt.Sscanf(strings.TrimSpace(rest), "%d kB", &kib); err != nil {
				return 0, fmt.Errorf("parse VmRSS %q of pid %d: %w", rest, pid, err)
			}
			return kib, nil
		}
	}
	return 0, fmt.Errorf("pid %d: no VmRSS in /proc status", pid)
}

// RunInProductModule runs `go test -run run` on the Go files of srcDir
// copied into a temporary module whose go.mod is the product's own (same
// requirements, same go.sum) plus a requirement on the product module
// replaced by the working tree. This lets test code use product packages
// built with the product's k8s.io/* versions, which this module's KubeVirt
// pins exclude, while always agreeing with the product's dependency set.
func RunInProductModule(ctx context.Context, srcDir, run string, env []string) ([]byte, error) {
	root, err := RepoRoot()
	if err != nil {
		return nil, err
	}
	gomod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		return nil, fmt.Errorf("read product go.mod: %w", err)
	}
	gosum, err := os.ReadFile(filepath.Join(root, "go.sum"))
	if err != nil {
		return nil, fmt.Errorf("read product go.sum: %w", err)
	}
	const productModule = "module github.com/vfnet-io/vfnet\n"
	if !strings.HasPrefix(string(gomod), productModule) {
		return nil, fmt.Errorf("product go.mod does not start with %q", productModule)
	}
	tmp, err := os.MkdirTemp("", "vfmod")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	mod := "module vfnettestprobe\n" + strings.TrimPrefix(string(gomod), productModule) +
		"\nrequire github.com/vfnet-io/vfnet v0.0.0-00010101000000-000000000000\n" +
		"\nreplace github.com/vfnet-io/vfnet => " + root + "\n"
	if err := os.WriteFile(filepath.Join(tmp, "go.mod"), []byte(mod), 0o644); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(tmp, "go.sum"), gosum, 0o644); err != nil {
		return nil, err
	}
	srcs, err := filepath.Glob(filepath.Join(srcDir, "*.go"))
	if err != nil || len(srcs) == 0 {
		return nil, fmt.Errorf("no Go files in %s (%v)", srcDir, err)
	}
	for _, s := range srcs {
		data, err := os.ReadFile(s)
		if err != nil {
			return nil, err
		}
		if err := os.WriteFile(filepath.Join(tmp, filepath.Base(s)), data, 0o644); err != nil {
			return nil, err
		}
	}
	// Static, -trimpath, grpcnotrace as Build: the product's dependencies
	// are the ones every other tier compiled (a cold cache compiled them
	// once more here without these).
	cmd := exec.CommandContext(ctx, "go", "test", "-trimpath", "-tags", "grpcnotrace", "-count=1", "-run", run, ".")
	cmd.Dir = tmp
	// -mod=mod added to the inherited GOFLAGS (make's are part of the
	// configuration the product's packages compiled in).
	goflags := strings.TrimSpace(os.Getenv("GOFLAGS") + " -mod=mod")
	cmd.Env = append(append(os.Environ(), "CGO_ENABLED=0", "GOWORK=off", "GOFLAGS="+goflags), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("go test %s in a module beside the product: %w\n%s", run, err, out)
	}
	return out, nil
}
