#!/usr/bin/env bash
# scripts/check-generate.sh — the committed BPF objects and Go bindings
# (bpf/gpud_*_bpfel.{o,go}) must be exactly what `make generate` makes from
# bpf/gpud.bpf.c with this machine's clang: regenerate them in a copy of bpf/
# and compare byte for byte. A difference means someone edited the C source
# without regenerating (or the reverse), and the binary would run other code
# than the source says.
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# The copy keeps the package's import path (bpf2go runs `go` in it), so it
# lives inside the module: a sibling directory the module owns for the run.
work=bpf/.regen.$$
trap 'rm -rf "$tmp" "$work"' EXIT
mkdir "$work"
cp -r bpf/gen.go bpf/gpud.bpf.c bpf/headers "$work"/
(cd "$work" && $GO generate ./... >/dev/null)
status=0
for f in bpf/gpud_*_bpfel.o bpf/gpud_*_bpfel.go; do
	g=$work/$(basename "$f")
	if [ ! -f "$g" ]; then
		echo "check-generate: $f is committed but no longer generated" >&2
		status=1
	elif ! cmp -s "$f" "$g"; then
		echo "check-generate: $f differs from what bpf/gpud.bpf.c gives: run make generate and commit" >&2
		status=1
	fi
done
for g in "$work"/gpud_*_bpfel.*; do
	[ -f "bpf/$(basename "$g")" ] || { echo "check-generate: $(basename "$g") is generated but not committed" >&2; status=1; }
done
[ $status -eq 0 ] && echo "check-generate: committed BPF objects match the C source ($(clang --version | head -1))"
exit $status
