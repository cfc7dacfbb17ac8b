package kernel

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/vfnet-io/vfnet/hack/shipbuild"
	"github.com/vfnet-io/vfnet/test/lib/gobuild"
)

// GuestBinaries are the programs the guest runs that this module builds.
type GuestBinaries struct {
	// Init is the case binary, the guest's /init; Driver vfnet-driver.
	Init, Driver string
	// Binding (vfnet-binding) and test/kubevirt's Launcher
	// (kernellauncher) and VMIRender (run on the host) are built only for
	// a guest with virt.
	Binding, Launcher, VMIRender string
}

// BuildGuestBinaries builds the case binary and vfnet-driver into dir,
// static (CGO_ENABLED=0): the guest has no C library of its own. With
// virt, also vfnet-binding and test/kubevirt's kernellauncher and
// vmirender. go build leaves an up-to-date binary alone, so a warm run
// skips the links.
func BuildGuestBinaries(ctx context.Context, repo, dir string, virt bool) (GuestBinaries, error) {
	b := GuestBinaries{Init: filepath.Join(dir, "init"), Driver: filepath.Join(dir, "vfnet-driver")}
	// go test puts its own Go first on PATH (runtime.GOROOT is empty
	// under -trimpath).
	goBin, err := exec.LookPath("go")
	if err != nil {
		return b, fmt.Errorf("find the go command: %w", err)
	}
	builds := [][]string{
		// As the images are built (-trimpath, grpcnotrace, no cgo): they
		// share every compiled package, which on a cold Go cache is most of
		// this tier's build.
		{"test", "-c", "-trimpath", "-tags", "kernelguest,grpcnotrace", "-o", b.Init, "./test/kernel/guest"},
		append(append([]string{"build"}, shipbuild.Args()...), "-o", b.Driver, "./cmd/vfnet-driver"),
	}
	if virt {
		b.Binding = filepath.Join(dir, "vfnet-binding")
		builds = append(builds, append(append([]string{"build"}, shipbuild.Args()...), "-o", b.Binding, "./cmd/vfnet-binding"))
	}
	for _, args := range builds {
		cmd := exec.CommandContext(ctx, goBin, args...)
		cmd.Dir = repo
		// GOFLAGS as inherited: make's (no DWARF) are part of the
		// configuration the other tiers compiled.
		cmd.Env = append(append(os.Environ(), shipbuild.Env()...), "GOOS=linux", "GOARCH=amd64", "GONOSUMDB=libvirt.org/go/libvirt")
		if out, err := cmd.CombinedOutput(); err != nil {
			return b, fmt.Errorf("go %s (in %s): %w\n%s", strings.Join(args, " "), repo, err, out)
		}
	}
	if virt {
		// test/kubevirt's, as every tier builds that module.
		kv, err := gobuild.KubeVirt(ctx, repo, "./cmd/kernellauncher", "./cmd/vmirender")
		if err != nil {
			return b, err
		}
		b.Launcher, b.VMIRender = filepath.Join(kv, "kernellauncher"), filepath.Join(kv, "vmirender")
	}
	return b, nil
}
