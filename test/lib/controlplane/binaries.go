package controlplane

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/vfnet-io/vfnet/test/lib/gobuild"
)

// Binaries the plane runs; all must be in one directory.
var requiredBinaries = []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl"}

// EnvBinDir names the directory holding prebuilt control-plane binaries.
const EnvBinDir = "VFNET_K8S_BIN"

// BinDir finds the control-plane binaries: $VFNET_K8S_BIN when set, else the
// directory test/builds/kubernetes/build.sh reports for a warm cache. It never starts a
// cold build (about 10 minutes) behind a test's back: a missing cache is an error
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
		return "", fmt.Errorf("%w\ncontrol-plane binaries are not built yet: run `%s` (about 10 minutes the first time) or set %s", err, script, EnvBinDir)
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

// buildScript locates test/builds/kubernetes/build.sh in the module, so tests in any
// package of the module find it.
func buildScript() (string, error) {
	root, err := RepoRoot()
	if err != nil {
		return "", fmt.Errorf("locate test/builds/kubernetes/build.sh: %w", err)
	}
	script := filepath.Join(root, "test", "builds", "kubernetes", "build.sh")
	if _, err := os.Stat(script); err != nil {
		return "", fmt.Errorf("locate test/builds/kubernetes/build.sh: %w", err)
	}
	return script, nil
}

// RepoRoot is the module root (gobuild.RepoRoot).
func RepoRoot() (string, error) { return gobuild.RepoRoot() }
