#!/usr/bin/env bash
# Regenerates the Go code for vfnet's own KubeVirt hooks wire contract
# (sidecar/hooksapi/**/*.proto) with pinned generators.
#
#   hack/generate.sh          regenerate in place
#   hack/generate.sh --check  regenerate into a temp copy and fail if the
#                             committed code differs (reproducibility check)
#
# The generators are go.mod's tools (`tool` directive), built into .cache/bin
# (ignored by git); protoc comes from Debian's protobuf-compiler, installed if
# missing.
set -euo pipefail
# protoc talks to its plugins over pipes; started with stdin closed (CI runs
# `.ci/run 0<&-`) a pipe takes fd 0, the plugin reads an empty request and
# protoc exits 0 having written nothing. An open stdin avoids that.
exec </dev/null

PROTOC_WANT="libprotoc 3.21.12"     # Debian bookworm/trixie protobuf-compiler

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
bin="$root/.cache/bin"
mkdir -p "$bin"
# make test runs this (verify-generate) while go test runs it too
# (sidecar/hooksapi): one at a time, so neither sees the other's half-done
# generator install.
exec 9>"$bin/.generate.lock"
flock 9

check=false
case "${1:-}" in
  --check) check=true ;;
  "") ;;
  *) echo "usage: $0 [--check]" >&2; exit 2 ;;
esac

if ! command -v protoc >/dev/null 2>&1; then
  echo "installing protobuf-compiler (protoc)" >&2
  apt-get update -qq && apt-get install -y -qq protobuf-compiler >/dev/null
fi
have=$(protoc --version)
if [[ "$have" != "$PROTOC_WANT" ]]; then
  # The version lands in the generated headers; a different one makes --check fail.
  echo "warning: protoc is '$have', the committed code was made with '$PROTOC_WANT'" >&2
fi

# The generators' versions are go.mod's, checked by go.sum like every other
# dependency. `go install module@version` would look the module's latest
# version up on the proxy even with a warm module cache (for deprecation
# notices), and a fresh clone's CI run failed on that lookup's TLS timeout.
# go build is its own up-to-date check (0.5 s when nothing changed). As the
# shipped binaries build (hack/shipbuild), so the protobuf packages they share
# with the product compile once on a cold Go cache; one compiler thread per
# core (test/builds/kubernetes/build.sh).
GOMAXPROCS=1 CGO_ENABLED=0 go build -p "$(nproc)" -trimpath -tags grpcnotrace -o "$bin/" \
  google.golang.org/protobuf/cmd/protoc-gen-go google.golang.org/grpc/cmd/protoc-gen-go-grpc

protos=(sidecar/hooksapi/info/info.proto sidecar/hooksapi/v1alpha3/callbacks.proto)

out="$root"
if $check; then
  out=$(mktemp -d)
  trap 'rm -rf "$out"' EXIT
fi

# Paths relative to the repo root keep the registered proto file names
# distinct from KubeVirt's own (pkg/hooks/...), so both can share a binary's
# file registry.
PATH="$bin:$PATH" protoc -I . \
  --go_out="$out" --go_opt=paths=source_relative \
  --go-grpc_out="$out" --go-grpc_opt=paths=source_relative \
  "${protos[@]}"

if $check; then
  for p in "${protos[@]}"; do
    [[ -s $out/${p%.proto}.pb.go ]] || { echo "protoc wrote no ${p%.proto}.pb.go into $out (generators in $bin: $(ls "$bin"))" >&2; exit 1; }
  done
  rc=0
  for p in "${protos[@]}"; do
    for f in "${p%.proto}.pb.go" "${p%.proto}_grpc.pb.go"; do
      if ! diff -u "$f" "$out/$f"; then
        echo "$f is not what hack/generate.sh produces; run hack/generate.sh and commit" >&2
        rc=1
      fi
    done
  done
  exit $rc
fi
