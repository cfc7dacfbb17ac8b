#!/usr/bin/env bash
# Prepares what the real-kernel tier's `vm` case runs inside its guest, from
# Debian packages only, under $VFNET_CACHE/virt (default .cache/virt): libvirt
# 11.x, the newest in bookworm-backports (libvirtd, as Debian ships it, its QEMU driver,
# virtlogd and virsh) and the libraries the host lacks for it, unpacked
# privately. QEMU 10 itself comes from hack/kernel-deps.sh (the same QEMU that
# runs the guest). Nothing is installed on the host; its apt sources and
# state are not touched. A warm cache is a stamp check. Prints nothing on
# success; on failure says which package could not be had and exits 1.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cache=${VFNET_CACHE:-$repo/.cache}
V=$cache/virt
# libvirt's version line in bookworm-backports (KubeVirt v1.9's launcher
# image carries libvirt 11.x too).
LIBVIRT_SERIES=${VFNET_LIBVIRT_SERIES:-11.}
# A recipe change invalidates the cache.
key=$(cat "${BASH_SOURCE[0]}" "$repo/hack/lib/private-apt.sh" | sha256sum | cut -c1-16)
ready() { [[ -f $V/ready && $(<"$V/ready") == "$key" && -f $V/env ]]; }
ready && exit 0
mkdir -p "$V"
exec 9>"$V.lock"
flock 9
ready && exit 0

die() { echo "virt-deps: $*" >&2; exit 1; }
log() { echo "virt-deps: $*" >&2; }
# shellcheck source=lib/private-apt.sh
source "$repo/hack/lib/private-apt.sh"
private_apt "$V"

# libvirtd and the QEMU driver it loads, virtlogd (the QEMU driver's default
# stdio handler), virsh (to read a failing domain by hand).
pkgs=(libvirt-daemon libvirt-daemon-driver-qemu libvirt-daemon-log libvirt-clients libvirt0 libvirt-common libvirt-daemon-common)
want=()
for p in "${pkgs[@]}"; do
  v=$(pcache policy "$p" 2>/dev/null | awk '/^ *(\*\*\* )?[0-9]/ {sub(/^\*\*\* /, ""); print $1}' | grep "^$LIBVIRT_SERIES" | sort -V | tail -1 || true)
  [[ -n $v ]] || die "no $p ${LIBVIRT_SERIES}x in bookworm-backports at $mirror (the vm case needs libvirt $LIBVIRT_SERIES*)"
  want+=("$p=$v")
done
# Everything apt would add for them that the host lacks; the libvirt
# packages themselves always (the host may have an older libvirt0).
deps=$(missing "${want[@]}")
all=$(printf '%s\n' "${want[@]}" $deps | grep -v -E '^(systemd|systemd-sysv|libpam-systemd|libnss-systemd|systemd-timesyncd|systemd-container|systemd-dev|libsystemd-shared|logrotate|dmidecode|qemu-.*|seabios|ipxe-qemu)=' | sort -u)
log "fetching: $(echo $all | tr '\n' ' ')"
# shellcheck disable=SC2086
fetch "$V/root" $all

libvirtd=$V/root/usr/sbin/libvirtd
drv=$V/root/usr/lib/x86_64-linux-gnu/libvirt/connection-driver/libvirt_driver_qemu.so
for f in "$libvirtd" "$drv" "$V/root/usr/sbin/virtlogd" "$V/root/usr/bin/virsh"; do
  [[ -f $f ]] || die "the unpacked libvirt packages have no ${f#"$V/root"}"
done
[[ -d $V/root/usr/share/libvirt/cpu_map ]] || die "the unpacked libvirt packages have no /usr/share/libvirt/cpu_map"
lib=$V/root/usr/lib/x86_64-linux-gnu:$V/root/lib/x86_64-linux-gnu
ver=$(LD_LIBRARY_PATH=$lib:$cache/kernel/qemu/usr/lib/x86_64-linux-gnu "$libvirtd" --version 2>&1 | head -1) ||
  die "the unpacked libvirtd does not run: $ver"
# The README and the tiers speak of libvirt 11.x: another major (an archive
# change, or VFNET_LIBVIRT_SERIES) fails here instead of passing unnoticed.
[[ $ver =~ [[:space:]]11\.[0-9]+ ]] ||
  die "libvirtd reports \"$ver\", not 11.x, which the vm case is written and documented for (VFNET_LIBVIRT_SERIES=$LIBVIRT_SERIES: unset it or name an 11. series)"

cat >"$V/env" <<EOS
VIRT_ROOT=$V/root
LIBVIRT_VERSION=$ver
VIRT_LIBS=$lib
EOS
echo "$key" >"$V/ready"
log "ready: $ver"
