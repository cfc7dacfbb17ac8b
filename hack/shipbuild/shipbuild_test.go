package shipbuild

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

func read(t *testing.T, rel string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "..", rel))
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// TestBuildersAgree: the builders that cannot import this package build
// the same way. The Dockerfile ships the binaries; for the others a drift
// costs a second compile of the dependency tree on a cold cache.
func TestBuildersAgree(t *testing.T) {
	t.Parallel()
	env, args := strings.Join(Env(), " "), Args()

	df := read(t, "Dockerfile")
	if !strings.Contains(df, "ENV "+env+" ") {
		t.Errorf("Dockerfile does not set %s", env)
	}
	// As the shell splits them.
	flags := strings.Replace(strings.Join(args, " "), "-ldflags=-s -w", `-ldflags="-s -w"`, 1)
	if n := strings.Count(df, "go build "+flags+" -o /out/"); n != 2 {
		t.Errorf("Dockerfile has %d go build lines with %q, want 2", n, flags)
	}

	// make's static tests: the same compile flags (linker flags do not
	// change what compiles), in the Makefile's included tuning file.
	if !strings.Contains(read(t, "Makefile"), "include hack/tuning.mk\n") {
		t.Error("the Makefile does not include hack/tuning.mk, where SHIPPED_ENV and SHIPPED_GOFLAGS are defined")
	}
	mk := read(t, "hack/tuning.mk")
	for _, want := range []string{"SHIPPED_ENV := " + env + "\n", "SHIPPED_GOFLAGS := " + strings.Join(args[:3], " ") + "\n"} {
		if !strings.Contains(mk, want) {
			t.Errorf("hack/tuning.mk does not define %q", want)
		}
	}

	// test/kubevirt, its own module, builds vfnet-binding for its tests.
	quoted := make([]string, len(args))
	for i, a := range args {
		quoted[i] = strconv.Quote(a)
	}
	const product = "test/kubevirt/internal/product/product.go"
	if src := read(t, product); !strings.Contains(src, strings.Join(quoted, ", ")) ||
		!strings.Contains(src, strconv.Quote(env)) {
		t.Errorf("%s does not build with %s and %s", product, strings.Join(quoted, ", "), strconv.Quote(env))
	}
}
