#!/usr/bin/env bash
# scripts/check-architecture.sh — the package table of docs/architecture.md
# and `go list ./...` (plus the k8s-tagged test package) must name the same
# packages: a package added or moved without its one-line job fails here.
set -euo pipefail
cd "$(dirname "$0")/.."
mod=$(go list -m)
doc=$(grep -oE '^\| `[a-z0-9/._-]+` \|' docs/architecture.md | sed -E 's/^\| `([^`]+)` \|/\1/' | sort -u)
have=$( { go list ./...; go list -tags k8s ./test/...; } | sed "s#^$mod/##" | sort -u)
if [[ "$doc" != "$have" ]]; then
	echo "docs/architecture.md and go list disagree (< only in the doc, > only in the code):" >&2
	diff <(echo "$doc") <(echo "$have") >&2 || true
	exit 1
fi
echo "architecture: $(echo "$have" | wc -l) packages, each with its job in docs/architecture.md"
