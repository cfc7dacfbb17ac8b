package node

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// Helm runs the Helm CLI as admin against the node's API server. Its
// cache, configuration and data live in the node's scratch directory, not
// in the invoking user's home.
func (n *Node) Helm(ctx context.Context, args ...string) ([]byte, error) {
	home := filepath.Join(n.Dir, "helm")
	cmd := exec.CommandContext(ctx, n.Parts.Helm, args...)
	cmd.Env = append(os.Environ(),
		"KUBECONFIG="+n.Kubeconfig,
		"HELM_CACHE_HOME="+filepath.Join(home, "cache"),
		"HELM_CONFIG_HOME="+filepath.Join(home, "config"),
		"HELM_DATA_HOME="+filepath.Join(home, "data"),
	)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return out.Bytes(), fmt.Errorf("helm %v: %w", args, err)
	}
	return out.Bytes(), nil
}
