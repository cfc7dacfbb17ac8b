package compat

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/vfnet-io/vfnet/test/kubevirt/internal/mountns"
	"github.com/vfnet-io/vfnet/test/kubevirt/internal/product"
)

// binding is the vfnet-binding binary built once for all tests; bindingErr
// says why there is none.
var (
	binding    string
	bindingErr error
)

func TestMain(m *testing.M) {
	if spec, child, err := mountns.Child(); child {
		os.Exit(runChild(spec, err))
	}
	dir, err := os.MkdirTemp("", "vfbin")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	buildBinding(dir)
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func buildBinding(dir string) {
	ok, err := product.HasBinding()
	switch {
	case err != nil:
		bindingErr = err
		return
	case !ok:
		// A moved or renamed binding must fail these tests, not skip them.
		bindingErr = fmt.Errorf("the product has no %s: moved? update product.BindingPackage", product.BindingPackage)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	out := filepath.Join(dir, "vfnet-binding")
	if err := product.Build(ctx, product.BindingPackage, out); err != nil {
		bindingErr = err
		return
	}
	binding = out
}

// needBinding returns the binary or ends the test.
func needBinding(t *testing.T) string {
	t.Helper()
	if bindingErr != nil {
		t.Fatalf("build vfnet-binding: %v", bindingErr)
	}
	return binding
}

// needRoot ends a test that needs root: a failure under make
// test-kubevirt (VFNET_REQUIRE_LIBVIRT=1, where a skip would pass a tier
// that tested nothing), a skip in a developer's go test.
func needRoot(t *testing.T, why string) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	if os.Getenv("VFNET_REQUIRE_LIBVIRT") == "1" {
		t.Fatalf("needs root: %s", why)
	}
	t.Skipf("needs root: %s", why)
}

// runChild is the re-executed test binary inside a private mount namespace.
func runChild(spec mountns.Spec, err error) int {
	if err != nil {
		fmt.Fprintln(os.Stderr, "mount namespace setup:", err)
		return 3
	}
	switch spec.Role {
	case roleLauncher:
		if err := runLauncher(os.Args[1:]); err != nil {
			fmt.Fprintln(os.Stderr, "launcher:", err)
			return 1
		}
		return 0
	default:
		fmt.Fprintf(os.Stderr, "unknown child role %q\n", spec.Role)
		return 2
	}
}

// startBinding runs the binary with fresh short dirs and stops it at cleanup.
func startBinding(t *testing.T, bin, metadataRoot, name string) (*product.Sidecar, string) {
	t.Helper()
	socketDir, err := os.MkdirTemp("", "vf")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(socketDir) })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sc, err := product.StartBinding(ctx, bin, socketDir, metadataRoot, name, os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sc.Stop() })
	return sc, socketDir
}
