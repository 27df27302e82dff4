#!/usr/bin/env bash
# scripts/check-architecture.sh — the code must be what docs/architecture.md
# states (tools/archcheck): its package table names the packages of
# `go list ./...` (plus the k8s-tagged test package), each package imports
# only what its "## Import rules" row allows, and a package with a
# "## Line budget" stays within it. Arguments go to archcheck
# (-budget report: print the budgets' counts without failing on them).
set -euo pipefail
cd "$(dirname "$0")/.."
exec "${GO:-go}" run ./tools/archcheck "$@"
