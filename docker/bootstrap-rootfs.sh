#!/usr/bin/env bash
# Offline base image for machines where no image registry is reachable:
# a Debian root file system made with debootstrap, streamed as a tar to stdout
# (the server imports it with the Engine API as the base of docker/Dockerfile).
# Only Debian's package mirror is needed. Usage: bootstrap-rootfs.sh > rootfs.tar
set -euo pipefail
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
SUITE="${DEBIAN_SUITE:-bookworm}"
if ! command -v debootstrap >/dev/null 2>&1; then
  echo "installing debootstrap" >&2
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >&2
fi
work="$(mktemp -d /tmp/mcp-sandbox-rootfs.XXXXXX)"
trap 'rm -rf "$work"' EXIT
echo "debootstrap $SUITE into $work (about a minute)" >&2
debootstrap --variant=minbase \
  --include=python3,python3-venv,python3-pip,ca-certificates,tini,curl,procps \
  "$SUITE" "$work/rootfs" "$MIRROR" >&2
# The apt lists and caches are not needed in a sandbox.
rm -rf "$work/rootfs/var/cache/apt/archives/"*.deb "$work/rootfs/var/lib/apt/lists/"*
tar -C "$work/rootfs" --numeric-owner -c .
