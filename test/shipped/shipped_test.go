// Package shipped checks the layout rule that lets a path answer "is this in
// production?": cmd/ holds the two programs that ship, everything they link
// lives in the product folders (cmd/, driver/, sidecar/, pkg/), and every
// package there is linked by one of them. Simulators, fakes, measurement and
// image tooling live under test/ and hack/.
package shipped

import (
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/vfnet-io/vfnet/test/lib/controlplane"
)

const module = "github.com/vfnet-io/vfnet"

// mains are the shipped programs, as the Dockerfile and hack/mkimages build them.
var mains = []string{"./cmd/vfnet-driver", "./cmd/vfnet-binding"}

// productDirs are the folders whose packages ship.
var productDirs = []string{"cmd", "driver", "sidecar", "pkg"}

type pkg struct {
	ImportPath string
	GoFiles    []string
	CgoFiles   []string
}

// list runs go list -json in the repository and decodes its packages.
func list(t *testing.T, repo string, args ...string) []pkg {
	t.Helper()
	cmd := exec.Command("go", append([]string{"list", "-json=ImportPath,GoFiles,CgoFiles"}, args...)...)
	cmd.Dir = repo
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list %s: %v", strings.Join(args, " "), err)
	}
	var pkgs []pkg
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for {
		var p pkg
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("decode go list output: %v", err)
		}
		pkgs = append(pkgs, p)
	}
	return pkgs
}

// rel is p's directory relative to the repository, or "" outside the module.
func rel(p string) string {
	if p == module {
		return "."
	}
	r, ok := strings.CutPrefix(p, module+"/")
	if !ok {
		return ""
	}
	return r
}

func under(r string, dirs ...string) bool {
	for _, d := range dirs {
		if r == d || strings.HasPrefix(r, d+"/") {
			return true
		}
	}
	return false
}

func repoRoot(t *testing.T) string {
	t.Helper()
	repo, err := controlplane.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return repo
}

// linked is what the shipped mains link, under each tag set they are built with.
func linked(t *testing.T, repo string) map[string]bool {
	t.Helper()
	got := map[string]bool{}
	for _, tags := range [][]string{nil, {"-tags", "grpcnotrace"}} {
		args := append(append([]string{"-deps"}, tags...), mains...)
		for _, p := range list(t, repo, args...) {
			if r := rel(p.ImportPath); r != "" {
				got[r] = true
			}
		}
	}
	return got
}

// TestShippedMainsLinkOnlyProductFolders fails when a shipped binary reaches
// a package under test/ or hack/ (or anywhere outside the product folders).
func TestShippedMainsLinkOnlyProductFolders(t *testing.T) {
	repo := repoRoot(t)
	got := linked(t, repo)
	if len(got) < len(mains) {
		t.Fatalf("go list -deps found %d of the module's packages; want at least the %d mains", len(got), len(mains))
	}
	for r := range got {
		if !under(r, productDirs...) {
			t.Errorf("a shipped program links %s/%s: only packages under %v may be linked into vfnet-driver or vfnet-binding; move what it needs into a product folder, or stop importing it", module, r, productDirs)
		}
	}
}

// TestProductFoldersHoldOnlyWhatShips fails when a package with non-test
// code under a product folder is linked by neither shipped program: such a
// package belongs under test/ (simulators, fakes, test libraries) or hack/
// (build and image tooling). Packages with only tests are fine.
func TestProductFoldersHoldOnlyWhatShips(t *testing.T) {
	repo := repoRoot(t)
	got := linked(t, repo)
	var patterns []string
	for _, d := range productDirs {
		patterns = append(patterns, "./"+d+"/...")
	}
	n := 0
	for _, p := range list(t, repo, patterns...) {
		if len(p.GoFiles)+len(p.CgoFiles) == 0 {
			continue
		}
		n++
		if r := rel(p.ImportPath); !got[r] {
			t.Errorf("%s is in a product folder but neither %v links it: move it under test/lib (test code) or hack/ (tooling)", r, mains)
		}
	}
	if n == 0 {
		t.Fatal("found no packages under the product folders: is the list of folders stale?")
	}
}

// TestCmdHoldsTheShippedPrograms: cmd/ has one directory per shipped program
// and nothing else, so `ls cmd` is the list of what ships.
func TestCmdHoldsTheShippedPrograms(t *testing.T) {
	entries, err := os.ReadDir(filepath.Join(repoRoot(t), "cmd"))
	if err != nil {
		t.Fatal(err)
	}
	var got, want []string
	for _, e := range entries {
		got = append(got, e.Name())
	}
	for _, m := range mains {
		want = append(want, filepath.Base(m))
	}
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("cmd/ holds %v; want exactly the shipped programs %v (tools and simulators go under test/cmd or hack/)", got, want)
	}
}
