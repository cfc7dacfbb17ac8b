// Command alignmods keeps the repository's Go modules on one version of
// every module that more than one of them compiles. With the same build
// flags (hack/shipbuild) a package of the same module version with the same
// dependencies compiles to the same Go cache entry, so on a cold cache
// client-go, apiserver, grpc and the rest compile once for the product,
// the control plane (test/builds/kubernetes), containerd (test/builds/containerd) and Helm
// (test/helm) instead of once each.
//
//	go run ./hack/alignmods          # raise the lower versions, go mod tidy
//	go run ./hack/alignmods -check   # list the differences, exit 1 if any
//
// test/kubevirt is left out: KubeVirt v1.9.0 needs Kubernetes 0.34.
package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/mod/semver"
)

// build is one module of the repository and the packages it compiles.
type build struct {
	dir  string
	tags string
	pkgs []string
}

// builds mirrors what make test compiles in each module (test/builds/kubernetes/build.sh,
// test/builds/containerd/build.sh, test/helm/build.sh and make test-helm).
var builds = []build{
	{".", "grpcnotrace", []string{"./..."}},
	{"test/builds/kubernetes", "grpcnotrace", []string{"go.etcd.io/etcd/server/v3", "k8s.io/kubernetes/cmd/kube-apiserver",
		"k8s.io/kubernetes/cmd/kube-controller-manager", "k8s.io/kubernetes/cmd/kube-scheduler",
		"k8s.io/kubernetes/cmd/kubectl", "k8s.io/kubernetes/cmd/kubelet"}},
	{"test/builds/containerd", "no_btrfs,grpcnotrace", []string{"github.com/containerd/containerd/v2/cmd/containerd",
		"github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2", "github.com/containerd/containerd/v2/cmd/ctr"}},
	{"test/helm", "grpcnotrace", []string{"./...", "helm.sh/helm/v4/cmd/helm"}},
}

// Mismatch is a module compiled at different versions.
type Mismatch struct {
	Module   string
	Versions map[string]string // module directory -> version
}

func (m Mismatch) String() string {
	var parts []string
	for _, b := range builds {
		if v, ok := m.Versions[b.dir]; ok {
			parts = append(parts, b.dir+" "+v)
		}
	}
	return m.Module + ": " + strings.Join(parts, ", ")
}

func run(dir string, env []string, args ...string) ([]byte, error) {
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go %s in %s: %w\n%s", strings.Join(args, " "), dir, err, stderr.String())
	}
	return out, nil
}

// compiled lists the modules b compiles packages of, with the version its
// go.mod selects (the version is part of the package's cache key).
func compiled(root string, b build) (map[string]string, error) {
	out, err := run(filepath.Join(root, b.dir), []string{"CGO_ENABLED=0", "GOFLAGS="},
		append([]string{"list", "-deps", "-test", "-tags", b.tags, "-f", "{{with .Module}}{{if not .Main}}{{.Path}} {{.Version}}{{end}}{{end}}"}, b.pkgs...)...)
	if err != nil {
		return nil, err
	}
	mods := map[string]string{}
	for _, l := range strings.Split(string(out), "\n") {
		if f := strings.Fields(l); len(f) == 2 {
			mods[f[0]] = f[1]
		}
	}
	return mods, nil
}

// Check lists the modules that two or more builds compile at different versions.
func Check(root string) ([]Mismatch, error) {
	byModule := map[string]map[string]string{}
	for _, b := range builds {
		mods, err := compiled(root, b)
		if err != nil {
			return nil, err
		}
		for m, v := range mods {
			if byModule[m] == nil {
				byModule[m] = map[string]string{}
			}
			byModule[m][b.dir] = v
		}
	}
	var out []Mismatch
	for m, vs := range byModule {
		var first string
		for _, v := range vs {
			if first == "" {
				first = v
			} else if v != first {
				out = append(out, Mismatch{m, vs})
				break
			}
		}
	}
	slices.SortFunc(out, func(a, b Mismatch) int { return strings.Compare(a.Module, b.Module) })
	return out, nil
}

// Align raises every mismatched module to the highest version among the
// builds and tidies the edited modules, until nothing differs.
func Align(root string) error {
	for round := 0; round < 5; round++ {
		mm, err := Check(root)
		if err != nil || len(mm) == 0 {
			return err
		}
		edits := map[string][]string{}
		for _, m := range mm {
			best := ""
			for _, v := range m.Versions {
				if best == "" || semver.Compare(v, best) > 0 {
					best = v
				}
			}
			for dir, v := range m.Versions {
				if v == best {
					continue
				}
				edits[dir] = append(edits[dir], "-require="+m.Module+"@"+best)
				// test/builds/kubernetes replaces the Kubernetes staging modules.
				if replaced, err := run(filepath.Join(root, dir), nil, "list", "-m", "-f", "{{with .Replace}}yes{{end}}", m.Module); err == nil && strings.TrimSpace(string(replaced)) == "yes" {
					edits[dir] = append(edits[dir], "-replace="+m.Module+"="+m.Module+"@"+best)
				}
			}
		}
		for dir, e := range edits {
			fmt.Fprintf(os.Stderr, "%s: %s\n", dir, strings.Join(e, " "))
			if _, err := run(filepath.Join(root, dir), nil, append([]string{"mod", "edit"}, e...)...); err != nil {
				return err
			}
			if _, err := run(filepath.Join(root, dir), nil, "mod", "tidy"); err != nil {
				return err
			}
		}
	}
	mm, err := Check(root)
	if err == nil && len(mm) > 0 {
		err = fmt.Errorf("still differing after five rounds: %v", mm)
	}
	return err
}

func main() {
	check := flag.Bool("check", false, "only list the modules compiled at different versions")
	flag.Parse()
	var err error
	if *check {
		var mm []Mismatch
		if mm, err = Check("."); err == nil && len(mm) > 0 {
			for _, m := range mm {
				fmt.Println(m)
			}
			err = fmt.Errorf("%d modules are compiled at different versions: run go run ./hack/alignmods", len(mm))
		}
	} else {
		err = Align(".")
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "alignmods:", err)
		os.Exit(1)
	}
}
