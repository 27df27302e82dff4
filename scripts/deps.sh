#!/usr/bin/env bash
# scripts/deps.sh GROUP... — install the Debian packages a test run needs.
#
# Why: CI runs on a fresh Debian 12 clone as root and nothing may be installed
# by hand, so `make` calls this before tests that need clang/bpftool (eBPF
# objects) or a Docker engine. Packages already present are not touched; apt
# is only used (one `apt-get update`, one install) when something is missing.
# Quiet unless it installs something (one line per group) or fails.
#
# Groups (add one by adding a line to GROUP_PKGS):
#   build   only checks that `go` is on PATH
#   bpf     clang llvm libbpf-dev bpftool
#   docker  docker.io busybox-static
#   test    everything the privileged tests need (docker, and a C compiler for
#           the thread-shape helper, internal/testutil/threads.go)
#   k8s     the one-node test cluster, and Debian's prometheus for test/k8s
#   release readelf, to find the libraries a release image needs
#   kmatrix qemu (KVM), busybox-static, xz, cpio and modinfo for scripts/kmatrix.sh
#   cross-arm64, cross-amd64  a C cross compiler and that architecture's libc
#           (gpud links libc through cgo), and qemu-user to run the result,
#           for scripts/release.sh
set -euo pipefail

declare -A GROUP_PKGS=(
	[build]=""
	[bpf]="clang llvm libbpf-dev bpftool"
	[docker]="docker.io busybox-static"
	[test]="docker.io busybox-static prometheus gcc libc6-dev"
	[k8s]="containerd runc containernetworking-plugins openssl busybox-static iproute2 procps prometheus"
	[release]="binutils"
	[cross-arm64]="gcc-aarch64-linux-gnu libc6-dev-arm64-cross binutils qemu-user"
	[kmatrix]="qemu-system-x86 busybox-static xz-utils cpio kmod"
	[cross-amd64]="gcc-x86-64-linux-gnu libc6-dev-amd64-cross binutils qemu-user"
)

die() { echo "deps.sh: $*" >&2; exit 1; }

installed() {
	[[ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null || true)" == "install ok installed" ]]
}

[[ $# -gt 0 ]] || die "usage: $0 GROUP... (groups: ${!GROUP_PKGS[*]})"

missing_all=()
declare -A group_missing=()
for g in "$@"; do
	[[ -v GROUP_PKGS[$g] ]] || die "unknown group '$g' (groups: ${!GROUP_PKGS[*]})"
	if [[ $g == build ]]; then
		command -v go >/dev/null 2>&1 ||
			die "go not found on PATH (install Go, e.g. /usr/local/go/bin, and add it to PATH)"
	fi
	m=()
	for p in ${GROUP_PKGS[$g]}; do
		installed "$p" || m+=("$p")
	done
	if [[ ${#m[@]} -gt 0 ]]; then
		group_missing[$g]="${m[*]}"
		missing_all+=("${m[@]}")
	fi
done

[[ ${#missing_all[@]} -eq 0 ]] && exit 0

[[ $(id -u) -eq 0 ]] || die "need root to install: ${missing_all[*]}"
command -v apt-get >/dev/null 2>&1 || die "apt-get not found; install by other means: ${missing_all[*]}"

# Deduplicate (groups overlap).
mapfile -t pkgs < <(printf '%s\n' "${missing_all[@]}" | sort -u)

export DEBIAN_FRONTEND=noninteractive
# Wait for a concurrent apt/dpkg instead of failing on its lock.
apt_opts=(-q -o DPkg::Lock::Timeout=600)
log=$(mktemp /tmp/gpud-deps.XXXXXX.log)
trap 'rm -f "$log"' EXIT
if ! apt-get "${apt_opts[@]}" update >"$log" 2>&1; then
	cat "$log" >&2
	die "apt-get update failed"
fi
if ! apt-get "${apt_opts[@]}" install -y --no-install-recommends "${pkgs[@]}" >"$log" 2>&1; then
	cat "$log" >&2
	die "apt-get install failed: ${pkgs[*]}"
fi

for g in "$@"; do
	[[ -v group_missing[$g] ]] && echo "deps.sh: $g: installed ${group_missing[$g]}"
done
exit 0
