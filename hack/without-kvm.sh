#!/usr/bin/env bash
# Runs a command as on a machine without KVM: in a private mount namespace
# whose /dev is this machine's without kvm. make test must pass on machines
# with a /dev/kvm node (usable or not by uid 107) and without one; this
# rehearses the second kind on the first:
#   sudo hack/without-kvm.sh bash -c 'CI=true bash .ci/run 0<&-'
# Nothing outside the namespace changes.
set -euo pipefail
if [ "$(id -u)" != 0 ]; then echo "$0: needs root (a private mount namespace)" >&2; exit 1; fi
if [ -z "${VFNET_WITHOUT_KVM:-}" ]; then
  exec unshare -m --propagation private env VFNET_WITHOUT_KVM=1 "$0" "$@"
fi
dev=$(mktemp -d /tmp/vfnet-dev.XXXXXX)
mount -t tmpfs -o mode=0755,nosuid tmpfs "$dev"
shopt -s dotglob nullglob
for e in /dev/*; do
  name=${e#/dev/}
  [ "$name" = kvm ] && continue
  if [ -L "$e" ]; then
    cp -a "$e" "$dev/$name"
  elif [ -d "$e" ]; then
    mkdir "$dev/$name"
    mount --rbind "$e" "$dev/$name"
  else
    : >"$dev/$name"
    mount --bind "$e" "$dev/$name"
  fi
done
mount --move "$dev" /dev
rmdir "$dev"
if [ -e /dev/kvm ]; then echo "$0: /dev/kvm is still there" >&2; exit 1; fi
exec "$@"
