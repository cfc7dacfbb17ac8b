package hooksapi_test

import (
	"os/exec"
	"path/filepath"
	"testing"
)

// TestGeneratedCodeIsReproducible regenerates the hooks API code with the
// pinned generators and fails if it differs from what is committed.
func TestGeneratedCodeIsReproducible(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("runs go install and protoc; skipped with -short")
	}
	if _, err := exec.LookPath("protoc"); err != nil {
		t.Fatal("protoc not installed: make deps installs it (or apt-get install protobuf-compiler)")
	}
	script, err := filepath.Abs("../../hack/generate.sh")
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("bash", script, "--check").CombinedOutput()
	if err != nil {
		t.Fatalf("hack/generate.sh --check: %v\n%s", err, out)
	}
}
