// Command mkimages builds the vfnet-driver and vfnet-binding images as OCI
// archives without a Docker engine (`make images` uses it when no engine is
// reachable): the same static builds as the Dockerfile, packed by
// hack/ociimage. Run from the repository root:
//
//	go run ./hack/mkimages [-o bin/images] [-driver vfnet-driver:dev] [-binding vfnet-binding:dev] [-arch amd64]
//
// It prints the archive paths; load them with `ctr -n k8s.io images import
// FILE`, `docker load -i FILE` or `skopeo copy oci-archive:FILE ...`.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"

	"github.com/vfnet-io/vfnet/hack/ociimage"
	"github.com/vfnet-io/vfnet/hack/shipbuild"
)

func main() {
	out := flag.String("o", "bin/images", "output directory")
	driverRef := flag.String("driver", "vfnet-driver:dev", "name of the driver image")
	bindingRef := flag.String("binding", "vfnet-binding:dev", "name of the binding image")
	arch := flag.String("arch", runtime.GOARCH, "GOARCH of the images")
	flag.Parse()
	if err := run(*out, *driverRef, *bindingRef, *arch); err != nil {
		fmt.Fprintln(os.Stderr, "mkimages:", err)
		os.Exit(1)
	}
}

func run(out, driverRef, bindingRef, arch string) error {
	binDir, err := os.MkdirTemp("", "vfnet-mkimages-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(binDir)
	images := []struct {
		pkg, bin, ref, file string
		image               func(ref, arch string, bin []byte) ociimage.Image
	}{
		{"./cmd/vfnet-driver", "vfnet-driver", driverRef, "vfnet-driver.tar", ociimage.Driver},
		{"./cmd/vfnet-binding", "vfnet-binding", bindingRef, "vfnet-binding.tar", ociimage.Binding},
	}
	for _, im := range images {
		bin := filepath.Join(binDir, im.bin)
		args := append([]string{"build"}, shipbuild.Args()...)
		args = append(args, "-o", bin, im.pkg)
		cmd := exec.Command("go", args...)
		cmd.Env = append(append(os.Environ(), shipbuild.Env()...), "GOOS=linux", "GOARCH="+arch)
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("go build %s: %w", im.pkg, err)
		}
		data, err := os.ReadFile(bin)
		if err != nil {
			return err
		}
		file := filepath.Join(out, im.file)
		if err := ociimage.WriteArchiveFile(file, im.image(im.ref, arch, data)); err != nil {
			return err
		}
		fmt.Println(file)
	}
	return nil
}
