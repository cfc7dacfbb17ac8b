package gobuild

import (
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/vfnet-io/vfnet/hack/shipbuild"
)

// A second build with the same inputs leaves the binary alone (no link),
// and builds started at once all succeed.
func TestIntoSkipsUpToDateLink(t *testing.T) {
	repo, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	const pkg = "./test/node/internal/pause"
	// The shipped configuration, whose packages are compiled already.
	env, args := shipbuild.Env(), shipbuild.Args()
	if err := Into(t.Context(), repo, dir, env, args, pkg); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "pause")
	first, err := os.Stat(bin)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make([]error, 3)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = Into(t.Context(), repo, dir, env, args, pkg)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	again, err := os.Stat(bin)
	if err != nil {
		t.Fatal(err)
	}
	// go build touches an up-to-date target but does not replace it: a new
	// link would be renamed into place, a new file.
	if !os.SameFile(first, again) {
		t.Errorf("the up-to-date binary was replaced")
	}
	// Other flags make another binary: go build links again.
	if err := Into(t.Context(), repo, dir, env, append(args, "-ldflags=-s"), pkg); err != nil {
		t.Fatal(err)
	}
	if st, _ := os.Stat(bin); os.SameFile(first, st) {
		t.Errorf("a build with other flags left the old binary")
	}
}

func TestRepoRootFindsModule(t *testing.T) {
	repo, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(repo, "go.mod"))
	if err != nil || modulePath(data) != Module {
		t.Errorf("%s: go.mod %v, module %q", repo, err, modulePath(data))
	}
	if got := Dir(repo, "x"); got != filepath.Join(repo, ".cache", "testbin", "x") {
		t.Errorf("Dir %s", got)
	}
}
