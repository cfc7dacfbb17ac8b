package e2e

import (
	"bytes"
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/vfnet-io/vfnet/test/lib/controlplane"
)

// TestDockerfile checks what can be checked without a Docker engine: the
// targets exist, the binding image is non-root (107:107) on scratch, and the
// Dockerfile's own go build command produces static binaries for both
// commands (no ELF interpreter, no shared libraries), which is what lets the
// images have no libc, and that the driver it ships carries no simulator
// (test/lib/simhost is vfnet-driver-sim's alone).
func TestDockerfile(t *testing.T) {
	t.Parallel()
	repo, err := controlplane.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(repo, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	df := string(data)
	stages := map[string]string{} // target -> its lines
	var cur string
	for _, line := range strings.Split(df, "\n") {
		if m := regexp.MustCompile(`^FROM\s+(?:--\S+\s+)*(\S+)(?:\s+AS\s+(\S+))?`).FindStringSubmatch(line); m != nil {
			cur = m[2]
			stages[cur] = line + "\n"
			continue
		}
		stages[cur] += line + "\n"
	}
	for _, target := range []string{"driver", "binding"} {
		if _, ok := stages[target]; !ok {
			t.Fatalf("Dockerfile has no target %q", target)
		}
	}
	if !strings.HasPrefix(stages["binding"], "FROM scratch") || !strings.Contains(stages["binding"], "USER 107:107") {
		t.Errorf("binding stage must run as 107:107 on scratch:\n%s", stages["binding"])
	}
	if !strings.Contains(stages["build"], "CGO_ENABLED=0") {
		t.Errorf("build stage does not disable cgo")
	}
	// Run the stage's go build lines as written.
	builds := regexp.MustCompile(`go build ([^&\n]+?)(?: &&|\n)`).FindAllStringSubmatch(stages["build"], -1)
	if len(builds) != 2 {
		t.Fatalf("want 2 go build commands in the build stage, found %d", len(builds))
	}
	out := t.TempDir()
	for _, b := range builds {
		// As the Dockerfile's RUN does: through a shell, output redirected.
		cmd := exec.Command("bash", "-c", "go build "+strings.ReplaceAll(b[1], "/out/", out+"/"))
		cmd.Dir = repo
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux")
		if o, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go build %s: %v\n%s", b[1], err, o)
		}
	}
	for _, bin := range []string{"vfnet-driver", "vfnet-binding"} {
		f, err := elf.Open(filepath.Join(out, bin))
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range f.Progs {
			if p.Type == elf.PT_INTERP {
				t.Errorf("%s has an ELF interpreter: not static", bin)
			}
		}
		if libs, _ := f.ImportedLibraries(); len(libs) > 0 {
			t.Errorf("%s needs shared libraries %v", bin, libs)
		}
		f.Close()
	}
	// -s -w strips the symbol table, not the function names the runtime
	// keeps (pclntab): a linked package shows there by import path.
	drv, err := os.ReadFile(filepath.Join(out, "vfnet-driver"))
	if err != nil {
		t.Fatal(err)
	}
	const mod = "github.com/vfnet-io/vfnet/"
	if !bytes.Contains(drv, []byte(mod+"driver/prepare.")) {
		t.Errorf("vfnet-driver names no function of %sdriver/prepare: the check below would pass blindly", mod)
	}
	if bytes.Contains(drv, []byte(mod+"test/lib/simhost.")) {
		t.Errorf("the Dockerfile's vfnet-driver links %stest/lib/simhost: the image must ship ./cmd/vfnet-driver, not ./test/cmd/vfnet-driver-sim", mod)
	}
}
