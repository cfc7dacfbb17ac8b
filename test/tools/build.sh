#!/usr/bin/env bash
# Builds the control-plane binaries and the kubelet the end-to-end and
# real-node tests run, into a cache
# directory keyed by this module's go.sum and the Go version, and prints the
# directory. A warm cache returns at once; a cold build takes ~15 minutes on
# 2 cores.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cache=${VFNET_CACHE:-$here/../../.cache}
key=$( (cat "$here/go.sum" "$here/go.mod"; go version) | sha256sum | cut -c1-16)
out="$cache/k8s-bin/$key"
# --dir: print where the binaries belong without building (the Go harness
# uses it to find a warm cache and to name the directory in its error).
if [ "${1:-}" = "--dir" ]; then echo "$out"; exit 0; fi
if [ -x "$out/kube-apiserver" ] && [ -x "$out/etcd" ] && [ -x "$out/kubectl" ] \
   && [ -x "$out/kube-scheduler" ] && [ -x "$out/kube-controller-manager" ] \
   && [ -x "$out/kubelet" ]; then
  echo "$out"; exit 0
fi
mkdir -p "$out.tmp"
echo ">> building etcd v3.7.0 and Kubernetes v1.37.2 control plane into $out" >&2
echo ">> first build takes about 15 minutes on 2 cores; later runs reuse the cache" >&2
start=$(date +%s)
cd "$here"
go build -o "$out.tmp/etcd" go.etcd.io/etcd/server/v3
for c in kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet; do
  echo ">> building $c ($(( $(date +%s) - start ))s elapsed)" >&2
  go build -o "$out.tmp/$c" "k8s.io/kubernetes/cmd/$c"
done
rm -rf "$out"; mv "$out.tmp" "$out"
echo ">> control plane built in $(( $(date +%s) - start ))s" >&2
echo "$out"
