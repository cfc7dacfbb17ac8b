#!/usr/bin/env bash
# Builds the container runtime the real-node tier (test/node) runs —
# containerd, containerd-shim-runc-v2 and ctr v2.4.2 from the Go module proxy
# — into a cache directory keyed by this module's go.sum/go.mod and the Go
# version, and prints the directory. A warm cache returns at once; a cold
# build takes about 2 CPU-minutes (BENCHMARKS.md: tiers-cold). runc and the CNI plugins come from Debian
# (hack/install-deps.sh).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cache=${VFNET_CACHE:-$here/../../../.cache}
# Static (the shim is exec'd in the private mount namespace and must not
# depend on the host's libc), no btrfs (cgo, unused by the tier), and
# otherwise the product's configuration (hack/shipbuild) with the same
# versions of the modules both compile (hack/alignmods): grpc, protobuf,
# otel and the rest compile once on a cold Go cache.
flags=(-trimpath -tags no_btrfs,grpcnotrace -ldflags=-s\ -w)
key=$( (cat "$here/go.sum" "$here/go.mod"; go version; echo "${flags[*]}") | sha256sum | cut -c1-16)
out="$cache/node-bin/$key"
bins=(containerd containerd-shim-runc-v2 ctr)
# --dir: print where the binaries belong without building.
if [ "${1:-}" = "--dir" ]; then echo "$out"; exit 0; fi
built() {
  for b in "${bins[@]}"; do [ -x "$out/$b" ] || return 1; done
}
if built; then echo "$out"; exit 0; fi
# A second build at once waits for the first instead of sharing its .tmp.
mkdir -p "$(dirname "$out")"
exec 9>"$out.lock"
flock 9
if built; then echo "$out"; exit 0; fi
rm -rf "$out.tmp"; mkdir -p "$out.tmp"
echo ">> building containerd v2.4.2 (containerd, shim, ctr) into $out" >&2
cd "$here"
# One go build for the three, one compiler thread per core (test/builds/kubernetes/build.sh).
TIMEFORMAT=">> containerd: go build took %0R s (%0U s user + %0S s sys CPU)"
time GOMAXPROCS=1 CGO_ENABLED=0 go build -p "$(nproc)" "${flags[@]}" -o "$out.tmp/" \
  "${bins[@]/#/github.com/containerd/containerd/v2/cmd/}"
rm -rf "$out"; mv "$out.tmp" "$out"
echo "$out"
