// Package shipbuild is how vfnet's shipped binaries are built: static (no
// cgo: the images carry no C library) with the flags below. The
// Dockerfile, hack/mkimages, and every test that builds a binary to run it
// use the same configuration, so a cold Go cache compiles the dependency
// tree once for all of them instead of once per set of flags.
package shipbuild

// Env is what go build needs in its environment besides the caller's.
func Env() []string { return []string{"CGO_ENABLED=0"} }

// Args are the go build flags. The tag drops grpc's x/net/trace debug
// pages, which nothing serves.
func Args() []string { return []string{"-trimpath", "-tags", "grpcnotrace", "-ldflags=-s -w"} }
