#!/usr/bin/env bash
# scripts/helm.sh [HELM-ARGS...] — run a pinned `helm`, building it first if needed.
#
# Why: test machines have no Helm package, only Debian apt and the Go module
# proxy, and Helm's Go SDK would pull its own k8s.io versions into gpud's
# go.mod. So the chart tests (test/k8s/helm_test.go) use the helm binary,
# built once from the module proxy at a pinned version into a cache outside
# the repo: $GPUD_HELM_CACHE/$HELM_VERSION/helm (default
# /var/cache/gpud-helm/v3.21.4/helm). A cold build takes a few minutes.
#
# Without arguments it only makes sure the binary is there (quiet unless it
# builds); `--path` prints the binary's path; `--built` prints it only if it
# is already built (exit 3 otherwise); anything else is passed to helm.
set -euo pipefail

HELM_VERSION=${HELM_VERSION:-v3.21.4}
CACHE=${GPUD_HELM_CACHE:-/var/cache/gpud-helm}/$HELM_VERSION
HELM=$CACHE/helm

die() { echo "helm.sh: $*" >&2; exit 1; }

helm_ok() {
	[[ -x $HELM ]] || return 1
	local v
	v=$(timeout 20 "$HELM" version --short 2>/dev/null) || return 1
	[[ $v == "$HELM_VERSION"* ]]
}

# --built: the binary's path if it is there (exit 0), else exit 3 without
# building (tests outside `make test` skip rather than build for minutes).
if [[ ${1:-} == --built ]]; then
	helm_ok || exit 3
	echo "$HELM"
	exit 0
fi

if ! helm_ok; then
	command -v go >/dev/null 2>&1 || die "go not found on PATH"
	mkdir -p "$CACHE"
	# One builder at a time (tests and make may race for the cache).
	exec 9>"$CACHE/.lock"
	flock 9
	if ! helm_ok; then
		echo "helm.sh: building helm $HELM_VERSION from the module proxy into $CACHE" >&2
		tmp=$(mktemp -d "$CACHE/.build.XXXXXX")
		# shellcheck disable=SC2064
		trap "rm -rf '$tmp'" EXIT
		# `go install pkg@version` builds outside any module: gpud's go.mod is untouched.
		(cd "$tmp" && GOBIN=$tmp GOWORK=off GOFLAGS=-buildvcs=false CGO_ENABLED=0 \
			nice go install -ldflags "-X helm.sh/helm/v3/internal/version.version=$HELM_VERSION" \
			"helm.sh/helm/v3/cmd/helm@$HELM_VERSION") || die "go install helm.sh/helm/v3/cmd/helm@$HELM_VERSION failed"
		mv -f "$tmp/helm" "$HELM"
		helm_ok || die "built $HELM but it does not report $HELM_VERSION"
	fi
	exec 9>&-
fi

case "${1:-}" in
"") exit 0 ;;
--path) echo "$HELM" ;;
*)
	# Keep helm's own caches and config out of $HOME.
	export HELM_CACHE_HOME=${HELM_CACHE_HOME:-$CACHE/home/cache} \
		HELM_CONFIG_HOME=${HELM_CONFIG_HOME:-$CACHE/home/config} \
		HELM_DATA_HOME=${HELM_DATA_HOME:-$CACHE/home/data}
	exec "$HELM" "$@"
	;;
esac
