# scripts/lib.sh — shell helpers the set-up scripts share; source it.

# alive PID: running and not a zombie (this machine's PID 1 reaps slowly, and
# `kill -0` succeeds on a zombie).
alive() {
	[[ -n ${1:-} ]] && kill -0 "$1" 2>/dev/null || return 1
	local stat
	stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
	stat=${stat##*) }
	[[ ${stat:0:1} != Z ]]
}

# static_busybox PATH: fails unless PATH is a working static busybox (the
# test images have no libc).
static_busybox() {
	[[ -x $1 ]] && "$1" --list >/dev/null 2>&1 &&
		[[ -z $(ldd "$1" 2>/dev/null | grep -v 'not a dynamic' || true) ]]
}

# busybox_rootfs BUSYBOX DIR: a minimal rootfs in DIR, the busybox with its
# applet symlinks, for the local test images (Docker and containerd alike).
busybox_rootfs() {
	local bb=$1 r=$2 applet
	mkdir -p "$r"/{bin,dev,proc,sys,tmp,etc,root,usr,var}
	chmod 1777 "$r/tmp"
	chmod 0700 "$r/root"
	cp "$bb" "$r/bin/busybox"
	chmod 0755 "$r/bin/busybox"
	while read -r applet; do
		[[ -n $applet && $applet != busybox ]] || continue
		ln -s busybox "$r/bin/$applet"
	done < <("$bb" --list)
	# Scripts that use /usr/bin/env, /sbin/... still find the applets.
	ln -s bin "$r/sbin"
	ln -s ../bin "$r/usr/bin"
	ln -s ../bin "$r/usr/sbin"
	printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' >"$r/etc/passwd"
	printf 'root:x:0:\nnogroup:x:65534:\n' >"$r/etc/group"
}
