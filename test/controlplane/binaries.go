package controlplane

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Binaries the plane runs; all must be in one directory.
var requiredBinaries = []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl"}

// EnvBinDir names the directory holding prebuilt control-plane binaries.
const EnvBinDir = "VFNET_K8S_BIN"

// BinDir finds the control-plane binaries: $VFNET_K8S_BIN when set, else the
// directory test/tools/build.sh reports for a warm cache. It never starts a
// cold build (15 minutes) behind a test's back: a missing cache is an error
// that says how to build it.
func BinDir(ctx context.Context) (string, error) {
	if dir := os.Getenv(EnvBinDir); dir != "" {
		return dir, checkBinaries(dir)
	}
	script, err := buildScript()
	if err != nil {
		return "", err
	}
	cmd := exec.CommandContext(ctx, "bash", script, "--dir")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("compute control-plane cache dir from %s: %w: %s", script, err, stderr.String())
	}
	dir := strings.TrimSpace(string(out))
	if err := checkBinaries(dir); err != nil {
		return "", fmt.Errorf("%w\ncontrol-plane binaries are not built yet: run `%s` (about 15 minutes the first time) or set %s", err, script, EnvBinDir)
	}
	return filepath.Clean(dir), nil
}

func checkBinaries(dir string) error {
	var missing []string
	for _, b := range requiredBinaries {
		st, err := os.Stat(filepath.Join(dir, b))
		if err != nil || st.Mode()&0o111 == 0 {
			missing = append(missing, b)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("control-plane binaries %v missing in %s", missing, dir)
	}
	return nil
}

// buildScript locates test/tools/build.sh in the module, so tests in any
// package of the module find it.
func buildScript() (string, error) {
	root, err := RepoRoot()
	if err != nil {
		return "", fmt.Errorf("locate test/tools/build.sh: %w", err)
	}
	script := filepath.Join(root, "test", "tools", "build.sh")
	if _, err := os.Stat(script); err != nil {
		return "", fmt.Errorf("locate test/tools/build.sh: %w", err)
	}
	return script, nil
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
