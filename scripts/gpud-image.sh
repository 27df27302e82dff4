#!/usr/bin/env bash
# scripts/gpud-image.sh BINARY [NAME] [OUT.tar] — gpud's container image,
# built through the local Docker engine without pulling anything: a rootfs
# holding the gpud binary and the glibc it links (NVML is dlopen'ed at run
# time from the driver the node provides), imported with `docker import`.
# With OUT.tar it also writes `docker save` output, which
# `ctr -n k8s.io images import OUT.tar` loads into containerd.
set -euo pipefail
bin=${1:?usage: gpud-image.sh BINARY [NAME] [OUT.tar]}
name=${2:-gpud.local/gpud:dev}
out=${3:-}

root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
mkdir -p "$root"/{etc,tmp,run,var/lib/gpud,proc,sys,dev}
chmod 1777 "$root/tmp"
install -m 0755 "$bin" "$root/gpud"
# the dynamic loader and every library the binary links
for lib in $(ldd "$bin" | grep -o '/[^ ]*'); do
	mkdir -p "$root$(dirname "$lib")"
	cp -L "$lib" "$root$lib"
done
echo 'root:x:0:0:root:/:/gpud' >"$root/etc/passwd"
echo 'root:x:0:' >"$root/etc/group"

tar -C "$root" -c . | docker import \
	--change 'ENTRYPOINT ["/gpud"]' --change 'CMD ["run"]' \
	--change "LABEL org.opencontainers.image.title=gpud org.opencontainers.image.version=$("$bin" version | awk '{print $2}')" \
	- "$name" >/dev/null
echo "image $name"
if [[ -n $out ]]; then
	docker save "$name" -o "$out"
	echo "saved $out (load into containerd: ctr -n k8s.io images import $out)"
fi
