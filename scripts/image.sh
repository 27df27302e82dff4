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

NAME=${1:-gpud-test-busybox:latest}
BUSYBOX=/bin/busybox

die() { echo "image.sh: $*" >&2; exit 1; }

command -v docker >/dev/null 2>&1 || die "docker CLI not found (run scripts/deps.sh docker)"
timeout 10 docker info >/dev/null 2>&1 || die "no Docker engine answers (run scripts/dockerd.sh start)"

if docker image inspect "$NAME" >/dev/null 2>&1; then
	exit 0
fi

[[ -x $BUSYBOX ]] || die "$BUSYBOX not found (run scripts/deps.sh docker)"
# The image has no libc: the busybox must be the static one.
if ! "$BUSYBOX" --list >/dev/null 2>&1 || [[ -n $(ldd "$BUSYBOX" 2>/dev/null | grep -v 'not a dynamic' || true) ]]; then
	die "$BUSYBOX is not a static busybox (install busybox-static)"
fi

tmp=$(mktemp -d /tmp/gpud-image.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
root=$tmp/rootfs
mkdir -p "$root"/{bin,dev,proc,sys,tmp,etc,root,usr}
chmod 1777 "$root/tmp"
chmod 0700 "$root/root"
cp "$BUSYBOX" "$root/bin/busybox"
chmod 0755 "$root/bin/busybox"
while read -r applet; do
	[[ -n $applet && $applet != busybox ]] || continue
	ln -s busybox "$root/bin/$applet"
done < <("$BUSYBOX" --list)
# Scripts that use /usr/bin/env, /sbin/... still find the applets.
ln -s bin "$root/sbin"
ln -s ../bin "$root/usr/bin"
ln -s ../bin "$root/usr/sbin"
cat >"$root/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/bin/sh
nobody:x:65534:65534:nobody:/nonexistent:/bin/false
EOF
cat >"$root/etc/group" <<'EOF'
root:x:0:
nogroup:x:65534:
EOF

out=$tmp/import.out
if ! tar --numeric-owner --owner=0 --group=0 -C "$root" -c . |
	docker import --change 'CMD ["/bin/sh"]' - "$NAME" >"$out" 2>&1; then
	cat "$out" >&2
	die "docker import failed"
fi
echo "image.sh: built $NAME"
