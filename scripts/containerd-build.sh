#!/usr/bin/env bash
# scripts/containerd-build.sh — build the containerd the test cluster runs
# into a cache dir outside the repo (once).
#
# Why: gpud's NRI plugin needs a containerd with NRI (≥ 1.7). Debian
# bookworm ships 1.6.20, which has none, and test machines have no other
# package source than Debian apt and the Go module proxy. 1.7's go.mod has
# exclude directives, so `go install pkg@version` refuses it: a throw-away
# wrapper module requires it instead (its excludes do not apply there; the
# build proves the versions chosen compile). Built without cgo, leaving out
# the snapshotters the cluster disables anyway (btrfs, devmapper, zfs).
# Why 1.7 and not 2.x: with 2.2.1 a running borrower pod lost its process
# across a kubelet restart (TestLendIdleGPUOnARealKubelet), which 1.6.20
# and 1.7.35 do not show; see docs/rules.md, "Classification paths".
# Docker's own containerd (the private dockerd of scripts/dockerd.sh) stays
# Debian's.
#
# Output: $GPUD_CONTAINERD_CACHE/$CONTAINERD_VERSION/bin/{containerd,
# containerd-shim-runc-v2,ctr} (default /var/cache/gpud-containerd/v1.7.35/bin).
# Prints that dir on stdout. Skipped when every binary exists and reports the
# version; `--force` rebuilds. A cold build takes about 2 minutes on 2 cores.
set -euo pipefail

CONTAINERD_VERSION=${CONTAINERD_VERSION:-v1.7.35}
CACHE=${GPUD_CONTAINERD_CACHE:-/var/cache/gpud-containerd}/$CONTAINERD_VERSION
BIN=$CACHE/bin
CMDS=(containerd containerd-shim-runc-v2 ctr)

die() { echo "containerd-build.sh: $*" >&2; exit 1; }
log() { echo "containerd-build.sh: $*" >&2; }

FORCE=0
case "${1:-}" in
"") ;;
--force) FORCE=1 ;;
*) die "usage: $0 [--force]" ;;
esac
[[ $CONTAINERD_VERSION =~ ^v1\.7\.[0-9]+$ ]] || die "CONTAINERD_VERSION must look like v1.7.35"

built() {
	local out
	[[ -x $BIN/containerd && -x $BIN/containerd-shim-runc-v2 && -x $BIN/ctr ]] || return 1
	out=$(timeout 20 "$BIN/containerd" --version 2>/dev/null) || return 1
	[[ $out == *" ${CONTAINERD_VERSION#v}"* ]]
}

if [[ $FORCE == 0 ]] && built; then
	echo "$BIN"
	exit 0
fi

command -v go >/dev/null 2>&1 || die "go not found on PATH"
tmp=$(mktemp -d /tmp/gpud-containerd-build.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
export GOFLAGS="-mod=mod -buildvcs=false" GOTOOLCHAIN=local GOWORK=off CGO_ENABLED=0
log "building containerd $CONTAINERD_VERSION from the module proxy (about 2 minutes on 2 cores)"
start=$SECONDS
cat >"$tmp/go.mod" <<EOM
module gpud.local/containerd-build

go 1.25.0

require github.com/containerd/containerd $CONTAINERD_VERSION
EOM
pkgs=()
for c in "${CMDS[@]}"; do pkgs+=("github.com/containerd/containerd/cmd/$c"); done
ld="-s -w -X github.com/containerd/containerd/version.Version=${CONTAINERD_VERSION#v}"
mkdir -p "$tmp/out"
(cd "$tmp" && nice -n 10 go build -trimpath -tags "no_btrfs no_devmapper no_zfs no_aufs" -ldflags "$ld" -o "$tmp/out/" "${pkgs[@]}") ||
	die "go build failed"
mkdir -p "$BIN"
for c in "${CMDS[@]}"; do
	[[ -x $tmp/out/$c ]] || die "go install produced no $c"
	mv -f "$tmp/out/$c" "$BIN/$c.new"
	mv -f "$BIN/$c.new" "$BIN/$c"
done
built || die "the built containerd does not report $CONTAINERD_VERSION"
log "built in $((SECONDS - start))s into $BIN"
echo "$BIN"
