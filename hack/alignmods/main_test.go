package main

import (
	"path/filepath"
	"testing"
)

// TestModulesAligned: the product, the control plane, containerd and Helm
// compile every module they share at one version, so a cold make test
// compiles it once.
func TestModulesAligned(t *testing.T) {
	t.Parallel()
	mm, err := Check(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range mm {
		t.Errorf("compiled at different versions: %s; run go run ./hack/alignmods", m)
	}
}
