#!/usr/bin/env bash
# scripts/k8s-build.sh — build the Kubernetes binaries the cluster tests need
# into a cache dir outside the repo (once), and unpack Debian's etcd next to them.
#
# Why: test machines have no image registry and no Kubernetes packages, only
# Debian apt and the Go module proxy. kube-apiserver, kubelet, kube-scheduler,
# kube-controller-manager and kubectl are built from the proxy through a
# throw-away wrapper module that requires k8s.io/kubernetes and replaces each
# `k8s.io/X => ./staging/...` of its go.mod with the published `k8s.io/X v0.N.M`
# (see /work/shared/test-cluster.md). etcd comes from Debian's etcd-server,
# unpacked with dpkg-deb so that no service is installed or started.
#
# Output: $GPUD_K8S_CACHE/$K8S_VERSION/bin/{kube-apiserver,kubelet,
# kube-scheduler,kube-controller-manager,kubectl,etcd}
# (default /var/cache/gpud-k8s/v1.36.3/bin). Prints that dir on stdout.
# Skipped when every binary exists and reports its version; `--force` rebuilds.
# A cold build takes ~5 minutes on 2 cores (run with `nice`).
set -euo pipefail

K8S_VERSION=${K8S_VERSION:-v1.36.3}
CACHE_ROOT=${GPUD_K8S_CACHE:-/var/cache/gpud-k8s}
CACHE=$CACHE_ROOT/$K8S_VERSION
BIN=$CACHE/bin
CMDS=(kube-apiserver kubelet kube-scheduler kube-controller-manager kubectl)

die() { echo "k8s-build.sh: $*" >&2; exit 1; }
log() { echo "k8s-build.sh: $*" >&2; }

FORCE=0
case "${1:-}" in
"") ;;
--force) FORCE=1 ;;
*) die "usage: $0 [--force]" ;;
esac

[[ $K8S_VERSION =~ ^v1\.([0-9]+)\.([0-9]+)$ ]] || die "K8S_VERSION must look like v1.36.3"
MINOR=${BASH_REMATCH[1]}
STAGING_VERSION=v0.${BASH_REMATCH[1]}.${BASH_REMATCH[2]}

# Prints the first line of the version a binary reports; fails if it does not
# run. (Output captured whole: `| head -1` could fail the pipe under pipefail.)
bin_version() {
	local b=$BIN/$1 out
	[[ -x $b ]] || return 1
	if [[ $1 == kubectl ]]; then
		out=$(timeout 20 "$b" version --client 2>/dev/null) || return 1
	else
		out=$(timeout 20 "$b" --version 2>/dev/null) || return 1
	fi
	echo "${out%%$'\n'*}"
}

k8s_ok() {
	local c v
	for c in "${CMDS[@]}"; do
		v=$(bin_version "$c") || return 1
		[[ $v == *"$K8S_VERSION"* ]] || return 1
	done
}

etcd_ok() {
	local v
	v=$(bin_version etcd) || return 1
	[[ $v == "etcd Version: 3."* ]]
}

build_k8s() {
	command -v go >/dev/null 2>&1 || die "go not found on PATH"
	local tmp
	tmp=$(mktemp -d /tmp/gpud-k8s-build.XXXXXX)
	# shellcheck disable=SC2064
	trap "rm -rf '$tmp'" EXIT

	export GOFLAGS="-mod=mod -buildvcs=false" GOSUMDB=off GOTOOLCHAIN=local GOWORK=off CGO_ENABLED=0

	log "fetching k8s.io/kubernetes@$K8S_VERSION from the module proxy"
	local gomod
	gomod=$(cd "$tmp" && go mod download -json "k8s.io/kubernetes@$K8S_VERSION" |
		sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p')
	[[ -n $gomod && -f $gomod ]] || die "go mod download k8s.io/kubernetes@$K8S_VERSION gave no go.mod"

	# The wrapper module: k8s.io/kubernetes as its only requirement, the
	# staging replaces mapped onto the published modules (kubernetes has no
	# others; any would be reported, as a wrapper ignores them anyway).
	(
		cd "$tmp"
		cat >go.mod <<EOF
module gpud.local/k8s-build

go 1.24

require k8s.io/kubernetes $K8S_VERSION
EOF
		local n=0 old
		# Lines `k8s.io/X => ./staging/src/k8s.io/X`, in a replace block or not.
		while read -r old; do
			go mod edit -replace "$old=$old@$STAGING_VERSION"
			n=$((n + 1))
		done < <(awk '$0 ~ /=>[[:space:]]*\.\/staging\// { sub(/^[[:space:]]*replace[[:space:]]+/, ""); sub(/^[[:space:]]+/, ""); split($0, f, /[[:space:]]+/); print f[1] }' "$gomod")
		local other
		other=$(awk '/=>/ && !/\.\/staging\// && !/^[[:space:]]*\/\//' "$gomod")
		if [[ -n $other ]]; then
			log "note: $gomod has replaces other than ./staging (ignored):"
			echo "$other" >&2
		fi
		((n > 0)) || die "no ./staging replaces found in $gomod"
		log "wrapper module: $n staging modules replaced with $STAGING_VERSION"
	)

	local pkg ld="" p
	for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
		ld+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$MINOR"
		ld+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
	done
	local pkgs=()
	for p in "${CMDS[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$p"); done

	log "building ${CMDS[*]} $K8S_VERSION (a few minutes on 2 cores)"
	mkdir -p "$tmp/out"
	local start=$SECONDS
	(cd "$tmp" && nice -n 10 go build -trimpath -ldflags "-s -w$ld" -o "$tmp/out/" "${pkgs[@]}") ||
		die "go build failed"
	mkdir -p "$BIN"
	for p in "${CMDS[@]}"; do
		[[ -x $tmp/out/$p ]] || die "go build produced no $p"
		mv -f "$tmp/out/$p" "$BIN/$p.new"
		mv -f "$BIN/$p.new" "$BIN/$p"
	done
	log "built in $((SECONDS - start))s into $BIN"
	rm -rf "$tmp"
	trap - EXIT
}

fetch_etcd() {
	command -v apt-get >/dev/null 2>&1 || die "apt-get not found (etcd comes from Debian's etcd-server)"
	command -v dpkg-deb >/dev/null 2>&1 || die "dpkg-deb not found"
	local tmp
	tmp=$(mktemp -d /tmp/gpud-etcd.XXXXXX)
	# shellcheck disable=SC2064
	trap "rm -rf '$tmp'" EXIT
	# `apt-get download` runs as _apt when it can; let it write here.
	chmod 0777 "$tmp"
	if ! (cd "$tmp" && apt-get -q download etcd-server >/dev/null 2>&1); then
		[[ $(id -u) -eq 0 ]] || die "apt-get download etcd-server failed (and not root to apt-get update)"
		apt-get -q -o DPkg::Lock::Timeout=600 update >/dev/null 2>&1 || die "apt-get update failed"
		(cd "$tmp" && apt-get -q download etcd-server >"$tmp/log" 2>&1) || {
			cat "$tmp/log" >&2
			die "apt-get download etcd-server failed"
		}
	fi
	local deb
	local debs=("$tmp"/etcd-server_*.deb)
	deb=${debs[0]}
	[[ -f $deb ]] || die "apt-get download etcd-server gave no .deb"
	mkdir -p "$tmp/x" "$BIN"
	dpkg-deb -x "$deb" "$tmp/x"
	[[ -x $tmp/x/usr/bin/etcd ]] || die "$deb has no usr/bin/etcd"
	cp "$tmp/x/usr/bin/etcd" "$BIN/etcd.new"
	mv -f "$BIN/etcd.new" "$BIN/etcd"
	log "etcd from $(basename "$deb") into $BIN"
	rm -rf "$tmp"
	trap - EXIT
}

if ((FORCE)) || ! k8s_ok; then
	build_k8s
	k8s_ok || die "the binaries in $BIN do not report $K8S_VERSION"
fi
if ((FORCE)) || ! etcd_ok; then
	fetch_etcd
	etcd_ok || die "$BIN/etcd does not run"
fi
echo "$BIN"
