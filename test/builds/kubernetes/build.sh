#!/usr/bin/env bash
# Builds the control-plane binaries and the kubelet the end-to-end and
# real-node tests run, into a cache
# directory keyed by this module's go.sum and the Go version, and prints the
# directory. A warm cache returns at once; a cold build takes about 10 minutes on
# 2 cores.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cache=${VFNET_CACHE:-$here/../../../.cache}
# Static, -trimpath, grpcnotrace: the product's build configuration
# (hack/shipbuild). This module's go.mod selects the same versions as the
# product's for every module both compile (hack/alignmods checks), so
# the shared packages (client-go, apiserver, grpc, ...) compile once on a
# cold Go cache. Kubernetes' own release builds are static too.
flags=(-trimpath -tags grpcnotrace -ldflags=-s\ -w)
key=$( (cat "$here/go.sum" "$here/go.mod"; go version; echo "${flags[*]}") | sha256sum | cut -c1-16)
out="$cache/k8s-bin/$key"
# --dir: print where the binaries belong without building (the Go harness
# uses it to find a warm cache and to name the directory in its error).
if [ "${1:-}" = "--dir" ]; then echo "$out"; exit 0; fi
built() {
  for b in etcd kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet; do
    [ -x "$out/$b" ] || return 1
  done
}
if built; then echo "$out"; exit 0; fi
# Two builds at once (parallel make targets, checkouts sharing VFNET_CACHE)
# would write the same .tmp directory: the second waits for the first.
mkdir -p "$(dirname "$out")"
exec 9>"$out.lock"
flock 9
if built; then echo "$out"; exit 0; fi
mkdir -p "$out.tmp"
echo ">> building etcd v3.7.0 and Kubernetes v1.37.2 control plane into $out" >&2
echo ">> first build takes about 10 minutes on 2 cores; later runs reuse the cache" >&2
cd "$here"
# One go build for all six: the Go scheduler compiles their shared packages
# once and keeps both cores busy to the end instead of linking one at a time.
# One compiler thread per core: GOMAXPROCS=1 with -p = cores. By default each
# compile also runs its backend on a second thread (-c=2) and its GC's idle
# workers on the other core, about 10% more CPU where every core already
# runs a compile (BENCHMARKS.md). Neither is part of Go's cache key: the
# packages are the same ones a plain go build or go test finds.
# Its CPU too (stderr): a cold run's largest single cost.
TIMEFORMAT=">> control plane: go build took %0R s (%0U s user + %0S s sys CPU)"
time GOMAXPROCS=1 CGO_ENABLED=0 go build -p "$(nproc)" "${flags[@]}" -o "$out.tmp/" go.etcd.io/etcd/server/v3 \
  k8s.io/kubernetes/cmd/{kube-apiserver,kube-controller-manager,kube-scheduler,kubectl,kubelet}
mv "$out.tmp/server" "$out.tmp/etcd"  # go.etcd.io/etcd/server/v3 builds as "server"
rm -rf "$out"; mv "$out.tmp" "$out"
echo "$out"
