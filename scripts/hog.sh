#!/usr/bin/env bash
# scripts/hog.sh CMD [ARGS...] — runs CMD with every CPU busy: one spinning
# loop per CPU at normal priority (as a training job's data loaders keep a
# GPU node's CPUs), stopped when CMD ends; exits with CMD's status.
# `make test HOG=1` (and .ci/run with GPUD_CI_HOG=1) runs the test suite so:
# tests wait for conditions, not for the machine, and must pass under it.
# HOG_PER_CPU (default 1) spinning loops per CPU.
set -euo pipefail
if [[ $# -eq 0 ]]; then
	echo "usage: scripts/hog.sh CMD [ARGS...]" >&2
	exit 2
fi
n=$(($(nproc) * ${HOG_PER_CPU:-1}))
hogs=()
stop() {
	local p
	for p in "${hogs[@]}"; do kill "$p" 2>/dev/null || true; done
	for p in "${hogs[@]}"; do wait "$p" 2>/dev/null || true; done
	hogs=()
}
trap stop EXIT
trap 'exit 130' INT TERM
for ((i = 0; i < n; i++)); do
	bash -c 'while :; do :; done' </dev/null &
	hogs+=($!)
done
echo "hog.sh: $n spinning loops ($(nproc) CPUs) beside: $*" >&2
rc=0
"$@" || rc=$?
exit "$rc"
