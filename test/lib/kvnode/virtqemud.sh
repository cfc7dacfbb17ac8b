#!/bin/bash
# /usr/sbin/virtqemud in vfnet's KubeVirt launcher image: a DEVIATION from
# KubeVirt's image, which carries libvirt's modular QEMU daemon. Debian's
# libvirt (11.3, bookworm-backports and trixie) ships only the monolithic
# libvirtd, which serves the same QEMU driver (loaded from
# connection-driver/libvirt_driver_qemu.so, the only driver in the image).
#
# Callers, in KubeVirt v1.9.0:
#   virt-launcher  /usr/sbin/virtqemud -f /var/run/libvirt/virtqemud.conf
#                  (as uid 107 with XDG_RUNTIME_DIR=/var/run for non-root
#                  VMs, then dials qemu+unix:///session?socket=
#                  /var/run/libvirt/virtqemud-sock; as root qemu:///system)
#   node-labeller.sh  virtqemud -d   (root; then virsh qemu:///system)
#
# libvirtd takes the same options (-f, -d, -t, -v) and reads the same keys
# from KubeVirt's virtqemud.conf. Without -f it would read libvirtd.conf,
# so the shim passes the file virtqemud reads by default (root:
# /etc/libvirt/virtqemud.conf, KubeVirt's; otherwise
# $XDG_CONFIG_HOME/libvirt/virtqemud.conf if there is one). It names its socket libvirt-sock, in the
# same directory virtqemud uses (root: /run/libvirt; otherwise
# $XDG_RUNTIME_DIR/libvirt). The link virtqemud-sock -> libvirt-sock makes
# the name KubeVirt dials reach it. exec keeps the process id, so
# virt-launcher's supervision (Kill, restart on exit) acts on libvirtd.
# It runs libvirtd through the link DaemonLink, named virtqemud: the kernel
# names a process after the file it executed, and virt-handler finds the
# daemon by that name (pkg/hypervisor/common FindVirtqemudProcess) to raise
# its memlock limit before it starts QEMU for a VFIO device; under another
# name non-root libvirt fails "cannot limit locked memory".
set -e
if [ "$EUID" -eq 0 ]; then
	dir=/run/libvirt
	conf=/etc/libvirt/virtqemud.conf
else
	dir=${XDG_RUNTIME_DIR:-/run/user/$EUID}/libvirt
	conf=${XDG_CONFIG_HOME:-$HOME/.config}/libvirt/virtqemud.conf
fi
config=()
case " $* " in
*" -f "* | *" --config "* | *" --config="*) ;;
*) [ ! -f "$conf" ] || config=(-f "$conf") ;;
esac
mkdir -p "$dir"
if [ ! -L "$dir/virtqemud-sock" ]; then
	rm -f "$dir/virtqemud-sock"
	ln -s libvirt-sock "$dir/virtqemud-sock"
fi
exec /usr/libexec/vfnet-virtqemud/virtqemud "${config[@]}" "$@"
