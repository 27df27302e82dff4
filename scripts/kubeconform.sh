#!/usr/bin/env bash
# scripts/kubeconform.sh [KUBECONFORM-ARGS...] — run a pinned kubeconform,
# strict, against the JSON schemas of the Kubernetes version the test
# cluster runs, building both first if needed.
#
# Why: test machines reach only Debian apt and the Go module proxy. So
# kubeconform is built once from the proxy into a cache outside the repo
# ($GPUD_KUBECONFORM_CACHE/$KUBECONFORM_VERSION/kubeconform), and the
# schemas are made from the OpenAPI document inside the k8s.io/kubernetes
# module (api/openapi-spec/swagger.json, downloaded from the proxy) by
# tools/kubeschema into $GPUD_KUBECONFORM_CACHE/schemas/$K8S_VERSION.
#
# Without arguments it only makes sure both are there; `--schemas` prints
# the schema directory; anything else is passed to kubeconform after
# -strict -schema-location (e.g. `scripts/kubeconform.sh -summary -`).
set -euo pipefail

KUBECONFORM_VERSION=${KUBECONFORM_VERSION:-v0.8.0}
K8S_VERSION=${K8S_VERSION:-v1.36.3}
ROOT=${GPUD_KUBECONFORM_CACHE:-/var/cache/gpud-kubeconform}
BIN=$ROOT/$KUBECONFORM_VERSION/kubeconform
SCHEMAS=$ROOT/schemas/$K8S_VERSION
REPO=$(cd "$(dirname "$0")/.." && pwd)

die() { echo "kubeconform.sh: $*" >&2; exit 1; }

bin_ok() { [[ -x $BIN ]] && timeout 20 "$BIN" -v 2>/dev/null | grep -q "${KUBECONFORM_VERSION#v}"; }
schemas_ok() { [[ -s $SCHEMAS/daemonset-apps-v1.json && -s $SCHEMAS/.complete ]]; }

if ! bin_ok || ! schemas_ok; then
	command -v go >/dev/null 2>&1 || die "go not found on PATH"
	mkdir -p "$ROOT"
	exec 9>"$ROOT/.lock"
	flock 9
	if ! bin_ok; then
		echo "kubeconform.sh: building kubeconform $KUBECONFORM_VERSION from the module proxy" >&2
		mkdir -p "$(dirname "$BIN")"
		tmp=$(mktemp -d "$ROOT/.build.XXXXXX")
		(cd "$tmp" && GOBIN=$tmp GOWORK=off GOFLAGS=-buildvcs=false CGO_ENABLED=0 \
			nice go install -ldflags "-X main.version=${KUBECONFORM_VERSION#v}" "github.com/yannh/kubeconform/cmd/kubeconform@$KUBECONFORM_VERSION") ||
			{ rm -rf "$tmp"; die "go install kubeconform@$KUBECONFORM_VERSION failed"; }
		mv -f "$tmp/kubeconform" "$BIN"
		rm -rf "$tmp"
		bin_ok || die "built $BIN but it does not report $KUBECONFORM_VERSION"
	fi
	if ! schemas_ok; then
		echo "kubeconform.sh: Kubernetes $K8S_VERSION schemas from the module proxy" >&2
		# Outside any module: gpud's go.mod and go.sum stay as they are.
		dir=$(cd / && GO111MODULE=on GOFLAGS= GOWORK=off go mod download -json "k8s.io/kubernetes@$K8S_VERSION" |
			sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
		[[ -f $dir/api/openapi-spec/swagger.json ]] || die "no api/openapi-spec/swagger.json in k8s.io/kubernetes@$K8S_VERSION ($dir)"
		rm -rf "$SCHEMAS"
		(cd "$REPO" && go run ./tools/kubeschema -o "$SCHEMAS" "$dir/api/openapi-spec/swagger.json") >&2
		date -u >"$SCHEMAS/.complete"
	fi
	exec 9>&-
fi

case "${1:-}" in
"") exit 0 ;;
--schemas) echo "$SCHEMAS" ;;
*) exec "$BIN" -strict -schema-location "$SCHEMAS/{{ .ResourceKind }}{{ .KindSuffix }}.json" "$@" ;;
esac
