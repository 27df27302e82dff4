#!/usr/bin/env bash
# scripts/image.sh [NAME] — build the local test image (default
# gpud-test-busybox:latest) without pulling anything.
#
# Why: test machines cannot pull images, but the privileged tests need a
# container with a shell that can open a (fake) GPU device node. The image is
# a rootfs with Debian's static busybox (busybox-static) and its applet
# symlinks, imported with `docker import`. Skipped if the image exists.
# Needs a running engine (scripts/dockerd.sh start).
set -euo pipefail
. "$(dirname "$0")/lib.sh"

NAME=${1:-gpud-test-busybox:latest}
BUSYBOX=/bin/busybox

die() { echo "image.sh: $*" >&2; exit 1; }

command -v docker >/dev/null 2>&1 || die "docker CLI not found (run scripts/deps.sh docker)"
timeout 10 docker info >/dev/null 2>&1 || die "no Docker engine answers (run scripts/dockerd.sh start)"

if docker image inspect "$NAME" >/dev/null 2>&1; then
	exit 0
fi

[[ -x $BUSYBOX ]] || die "$BUSYBOX not found (run scripts/deps.sh docker)"
static_busybox "$BUSYBOX" || die "$BUSYBOX is not a static busybox (install busybox-static)"

tmp=$(mktemp -d /tmp/gpud-image.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
root=$tmp/rootfs
busybox_rootfs "$BUSYBOX" "$root"

out=$tmp/import.out
if ! tar --numeric-owner --owner=0 --group=0 -C "$root" -c . |
	docker import --change 'CMD ["/bin/sh"]' - "$NAME" >"$out" 2>&1; then
	cat "$out" >&2
	die "docker import failed"
fi
echo "image.sh: built $NAME"
