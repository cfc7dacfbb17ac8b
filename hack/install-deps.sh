#!/usr/bin/env bash
# Installs the host tools the tests need when they are missing: libvirt's
# virt-xml-validate (which silently needs xmllint from libxml2-utils), protoc,
# and for the real-node tier (test/node) runc and the CNI plugins (bridge,
# host-local, loopback).
# Idempotent; a warm machine returns at once.
set -euo pipefail
need=()
command -v virt-xml-validate >/dev/null 2>&1 || need+=(libvirt-clients)
command -v xmllint >/dev/null 2>&1 || need+=(libxml2-utils)
command -v protoc >/dev/null 2>&1 || need+=(protobuf-compiler)
command -v runc >/dev/null 2>&1 || need+=(runc)
[ -x /usr/lib/cni/bridge ] && [ -x /usr/lib/cni/host-local ] && [ -x /usr/lib/cni/loopback ] || need+=(containernetworking-plugins)
if [ ${#need[@]} -eq 0 ]; then exit 0; fi
echo ">> installing Debian packages: ${need[*]}" >&2
sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq >/dev/null
$sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
