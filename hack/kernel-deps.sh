#!/usr/bin/env bash
# Prepares what the real-kernel test tier (test/kernel) boots, from Debian
# packages only, under $VFNET_CACHE/kernel (default .cache/kernel):
#   - a Debian 6.1 kernel: vmlinux (ELF, booted through PVH: a compressed
#     bzImage spends ~35 s decompressing under TCG) and its modules;
#   - QEMU 10 from bookworm-backports (the first QEMU with the SR-IOV igb NIC)
#     and the libraries it needs that the host lacks, unpacked privately;
#   - busybox-static and iproute2 (busybox's ip has no `vf` support) for the guest.
# Nothing is installed on the host and its apt sources and state are not
# touched: a private apt configuration lists bookworm and bookworm-backports
# from the mirror the host already uses. A warm cache is a stamp check.
# Prints nothing on success; on failure says what could not be had and exits 1.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cache=${VFNET_CACHE:-$repo/.cache}
K=$cache/kernel
# The pinned kernel ABI; when the archive no longer has it, the current
# bookworm 6.1 kernel is used instead.
KERNEL_ABI=${VFNET_KERNEL_ABI:-6.1.0-50}
# A recipe change invalidates the cache.
key=$(cat "${BASH_SOURCE[0]}" "$repo/hack/lib/private-apt.sh" | sha256sum | cut -c1-16)
ready() { [[ -f $K/ready && $(<"$K/ready") == "$key" && -f $K/env ]]; }
ready && exit 0
# Two runs at once (make -j, two checkouts sharing VFNET_CACHE) would unpack
# into the same directories: the second waits and finds the first's result.
mkdir -p "$K"
exec 9>"$K.lock"
flock 9
ready && exit 0

die() { echo "kernel-deps: $*" >&2; exit 1; }
log() { echo "kernel-deps: $*" >&2; }

command -v xz >/dev/null || die "needs 'xz' on the host (Debian: apt-get install xz-utils); it is missing"
# shellcheck source=lib/private-apt.sh
source "$repo/hack/lib/private-apt.sh"
private_apt "$K"

# The kernel: the pinned ABI, else the newest 6.1 the archive has.
kpkg=linux-image-$KERNEL_ABI-amd64
if ! pcache show "$kpkg" >/dev/null 2>&1; then
  abi=$({ pcache show linux-image-amd64 2>/dev/null || true; } | sed -n 's/^Depends: .*linux-image-\(6\.1\.0-[0-9]*\)-amd64.*/\1/p' | sort -V | tail -1)
  [[ -n $abi ]] || die "neither $kpkg nor any linux-image-6.1.0-*-amd64 (via linux-image-amd64) is in bookworm at $mirror"
  log "$kpkg is gone from the archive; using linux-image-$abi-amd64"
  KERNEL_ABI=$abi
  kpkg=linux-image-$abi-amd64
fi

# Which packages the host lacks for QEMU 10 (bookworm-backports) and for the
# guest tools (bookworm), as apt would install them.
qemu_pkgs=$(missing -t bookworm-backports qemu-system-x86 seabios)
grep -q '^qemu-system-x86=1:10\.' <<<"$qemu_pkgs" || die "bookworm-backports at $mirror has no QEMU 10 qemu-system-x86 (apt chose: $(grep '^qemu-system-x86=' <<<"$qemu_pkgs" || echo nothing)); the igb SR-IOV NIC needs QEMU >= 8.0"
guest_pkgs=$(missing iproute2 busybox-static)
# Always take the guest tools themselves, even when the host has them installed.
for p in iproute2 busybox-static; do
  grep -q "^$p=" <<<"$guest_pkgs" || guest_pkgs+=$'\n'"$p=$(pcache policy "$p" | awk '/Candidate:/ {print $2}')"
done

log "fetching $kpkg"
kver=$(pcache policy "$kpkg" | awk '/Candidate:/ {print $2}')
[[ -n $kver && $kver != "(none)" ]] || die "no installable version of $kpkg at $mirror"
fetch "$K/linux" "$kpkg=$kver"
log "fetching QEMU 10 and what the host lacks for it: $(echo $qemu_pkgs | tr '\n' ' ')"
# shellcheck disable=SC2086
fetch "$K/qemu" $qemu_pkgs
log "fetching guest tools: $(echo $guest_pkgs | tr '\n' ' ')"
# shellcheck disable=SC2086
fetch "$K/guest" $guest_pkgs

krel=$KERNEL_ABI-amd64
bz=$K/linux/boot/vmlinuz-$krel
moddir=$K/linux/lib/modules/$krel
[[ -f $bz ]] || die "$kpkg has no boot/vmlinuz-$krel"
[[ -d $moddir/kernel ]] || die "$kpkg has no lib/modules/$krel/kernel"

# vmlinux out of the bzImage: find the compressed payload by its magic and
# keep the first one that decompresses to an ELF file.
extract_vmlinux() {
  local off fmt
  for fmt in 'xz:\xfd7zXZ\x00' 'zstd:(\xb5/\xfd' 'gzip:\x1f\x8b\x08'; do
    local tool=${fmt%%:*} magic=${fmt#*:}
    for off in $(LC_ALL=C grep -obUaP "$magic" "$bz" | cut -d: -f1); do
      tail -c +$((off + 1)) "$bz" | "$tool" -dc >"$K/vmlinux.tmp" 2>/dev/null || true
      if [[ $(head -c 4 "$K/vmlinux.tmp" | od -An -c | tr -d ' ') == '177ELF' ]]; then
        mv "$K/vmlinux.tmp" "$K/vmlinux"; return 0
      fi
    done
  done
  rm -f "$K/vmlinux.tmp"
  return 1
}
extract_vmlinux || die "found no compressed ELF kernel inside $bz"

qemu=$K/qemu/usr/bin/qemu-system-x86_64
[[ -x $qemu ]] || die "qemu-system-x86 from bookworm-backports has no usr/bin/qemu-system-x86_64"
qlib=$K/qemu/usr/lib/x86_64-linux-gnu:$K/qemu/lib/x86_64-linux-gnu
qver=$(LD_LIBRARY_PATH=$qlib "$qemu" --version 2>&1 | head -1) || die "the unpacked QEMU does not run: $qver"
ip=$(find "$K/guest" -path '*bin/ip' -type f | head -1)
[[ -n $ip ]] || die "iproute2 has no ip binary"
[[ -x $K/guest/bin/busybox ]] || die "busybox-static has no bin/busybox"

cat >"$K/env" <<EOF
KERNEL_RELEASE=$krel
KERNEL_PACKAGE=$kpkg=$kver
VMLINUX=$K/vmlinux
MODULES=$moddir
QEMU=$qemu
QEMU_VERSION=$qver
QEMU_LD_LIBRARY_PATH=$qlib
QEMU_DATA=$K/qemu/usr/share/qemu:$K/qemu/usr/share/seabios
BUSYBOX=$K/guest/bin/busybox
IP=$ip
GUEST_LIBS=$K/guest/usr/lib/x86_64-linux-gnu:$K/guest/lib/x86_64-linux-gnu:/usr/lib/x86_64-linux-gnu:/lib/x86_64-linux-gnu
EOF
echo "$key" >"$K/ready"
log "ready: $krel, $qver"
