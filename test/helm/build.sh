#!/usr/bin/env bash
# Builds the Helm v4 CLI (helm.sh/helm/v4/cmd/helm, at the version this
# module's go.mod pins, from the Go module proxy) that the real-node tier
# installs vfnet with, into a cache directory keyed by this module's go.sum
# and the Go version, and prints the directory. A warm cache returns at
# once; a cold build takes a few CPU-minutes.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cache=${VFNET_CACHE:-$here/../../.cache}
# The product's configuration (hack/shipbuild), as `make test-helm` builds
# the tests, with the same versions of the modules the product and the
# control plane also compile (hack/alignmods): the Kubernetes libraries
# compile once on a cold Go cache.
flags=(-trimpath -tags grpcnotrace -ldflags=-s\ -w)
key=$( (cat "$here/go.sum" "$here/go.mod"; go version; echo "${flags[*]}") | sha256sum | cut -c1-16)
out="$cache/helm-bin/$key"
# --dir: print where the binary belongs without building.
if [ "${1:-}" = "--dir" ]; then echo "$out"; exit 0; fi
if [ -x "$out/helm" ]; then echo "$out"; exit 0; fi
# Two builds at once (parallel make targets, checkouts sharing VFNET_CACHE)
# would write the same .tmp directory: the second waits for the first.
mkdir -p "$(dirname "$out")"
exec 9>"$out.lock"
flock 9
if [ -x "$out/helm" ]; then echo "$out"; exit 0; fi
rm -rf "$out.tmp"; mkdir -p "$out.tmp"
echo ">> building the Helm CLI into $out" >&2
cd "$here"
# One compiler thread per core (test/builds/kubernetes/build.sh).
TIMEFORMAT=">> Helm CLI: go build took %0R s (%0U s user + %0S s sys CPU)"
time GOMAXPROCS=1 CGO_ENABLED=0 go build -p "$(nproc)" "${flags[@]}" -o "$out.tmp/helm" helm.sh/helm/v4/cmd/helm
rm -rf "$out"; mv "$out.tmp" "$out"
echo "$out"
