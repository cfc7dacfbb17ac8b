#!/usr/bin/env bash
# Prepares the Debian userland of KubeVirt's node images (test/lib/kvnode)
# under $VFNET_CACHE/kvnode (default .cache/kvnode): the tools the launcher
# image's node-labeller.sh and the pods' containers run (bash, coreutils,
# grep) and procps for the `sysctl` virt-handler execs, from bookworm, and
# qemu-img (qemu-utils, bookworm-backports: the QEMU 10 line), which
# virt-launcher runs on every container disk before it defines the domain;
# unpacked privately with what the host lacks for them. libvirt and QEMU
# come from hack/virt-deps.sh and hack/kernel-deps.sh; the C library and
# the other shared libraries the host already has are taken from the host
# (Debian 12 too). Nothing is installed on the host. A warm cache is a stamp
# check. Prints nothing on success; on failure says what could not be had.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cache=${VFNET_CACHE:-$repo/.cache}
N=$cache/kvnode
key=$(cat "${BASH_SOURCE[0]}" "$repo/hack/lib/private-apt.sh" | sha256sum | cut -c1-16)
ready() { [[ -f $N/ready && $(<"$N/ready") == "$key" && -f $N/env ]]; }
ready && exit 0
mkdir -p "$N"
exec 9>"$N.lock"
flock 9
ready && exit 0

die() { echo "kvnode-deps: $*" >&2; exit 1; }
log() { echo "kvnode-deps: $*" >&2; }
# shellcheck source=lib/private-apt.sh
source "$repo/hack/lib/private-apt.sh"
private_apt "$N"

pkgs=(bash coreutils grep procps)
all=$(missing "${pkgs[@]}")
# The tools themselves always, even when the host has them installed.
for p in "${pkgs[@]}"; do
  grep -q "^$p=" <<<"$all" || all+=$'\n'"$p=$(pcache policy "$p" | awk '/Candidate:/ {print $2}')"
done
qemu_utils=$(missing -t bookworm-backports qemu-utils)
grep -q '^qemu-utils=1:10\.' <<<"$qemu_utils" || die "bookworm-backports at $mirror has no QEMU 10 qemu-utils (apt chose: $(grep '^qemu-utils=' <<<"$qemu_utils" || echo nothing))"
all+=$'\n'$qemu_utils
log "fetching: $(echo $all | tr '\n' ' ')"
# shellcheck disable=SC2086
fetch "$N/root" $all
for f in bin/bash bin/cat bin/cp bin/grep bin/uname bin/mknod bin/chmod usr/bin/cut sbin/sysctl usr/bin/qemu-img; do
  [[ -e $N/root/$f ]] || die "the unpacked packages (${pkgs[*]}) have no /$f"
done
cat >"$N/env" <<EOS
KVNODE_ROOT=$N/root
EOS
echo "$key" >"$N/ready"
log "ready"
