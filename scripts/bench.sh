#!/usr/bin/env bash
# scripts/bench.sh — `make bench`: the benchmarks as two series, unloaded and
# loaded, interleaved (unloaded run 1, loaded run 1, unloaded run 2, ...), then
# tools/benchreport: every figure beside its goal (MET / MISSED), and
# docs/benchmarks.md's generated tables from this run.
#
# Why two series: a GPU node is not quiet (data loaders keep its CPUs busy,
# issue 31). "Loaded" is one spinning loop per CPU at normal priority for
# the whole run: the daemon package's test binary starts its own
# (GPUD_BENCH_LOAD=hog, so that its benchmarks report "hogs"), the other
# packages run under scripts/hog.sh. Interleaved so that the machine's
# drift over the half hour falls on both series alike.
#
# The test binaries are built once (go test -c) so that every run measures the
# same code. To fit half an hour on 2 cores: BenchmarkFootprint (7 minutes: 3
# rounds of 2 × 70 s) and BenchmarkLendHealth (100 trials, GPUD_LEND_TRIALS:
# ~2 s each where a close is seen at the holders' re-read, --hooks driver
# without kprobes) run in the first unloaded run only (BENCH_ONCE), and so
# do BenchmarkBigNode (its 60 s idle window and churn) and
# BenchmarkPreemptLatencyCheckpoints (a reported ratio, 1.5 minutes) and
# BenchmarkComputeShare (3 rounds of 2 × ~30 s, GPUD_COMPUTE_ROUNDS and
# GPUD_COMPUTE_WINDOW; its errors and CPU against its own baseline): an
# idle gpud's RSS and CPU are not what a CPU hog changes; the loaded series
# runs the benchmarks whose goals issue 31 sets under load (BENCH_UNDER_LOAD:
# the kill, freeze and 200-victim paths, open → ledger, the gate's race), not
# the throughput, overhead, syscall-tax and DRA ones, which measure gpud
# against a baseline that a hog slows alike; the syscall tax runs 3 rounds
# a run (GPUD_TAX_ROUNDS; 9 over the three runs).
#
# Optionally (BENCH_KMATRIX, default trixie; empty: none) BenchmarkSyscallTax
# also runs in a kernel-matrix guest (scripts/kmatrix.sh, KMATRIX_BENCH=only),
# where --hooks driver attaches its kprobes (this host's kernel has none).
# The guest is emulated (TCG): its ns/call are not real, its ratios are.
#
# Env: GO, RUNS (3), BENCHTIME (1x: each benchmark runs its own rounds),
# BENCH (go test -bench regexp, .; when set, both series run it),
# BENCH_UNDER_LOAD (the loaded series' regexp), BENCH_ONCE (footprint, lending),
# BENCH_OUT (bin/bench: one file per run), BENCH_DOC (docs/benchmarks.md;
# empty: no doc write), BENCH_LOADED (1; 0: the unloaded series only),
# BENCH_KMATRIX (trixie), BENCH_SMOKE (1: CI's smoke run — small sizes, one
# run each, no doc write; it checks that the harness works, not the figures).
# Exit: non-zero when a benchmark failed or the report could not be made;
# a MISSED goal is reported, not an error.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
GO=${GO:-go}
RUNS=${RUNS:-3}
BENCHTIME=${BENCHTIME:-1x}
BENCH=${BENCH:-.}
UNDER_LOAD=${BENCH_UNDER_LOAD:-^Benchmark(PreemptLatency|FreezeLatency|Preempt200|OpenToLedger|GateRace)\$}
[[ $BENCH == . ]] || UNDER_LOAD=$BENCH
export GPUD_TAX_ROUNDS=${GPUD_TAX_ROUNDS:-3}
BENCH_ONCE=${BENCH_ONCE:-^Benchmark(Footprint|BigNode|LendHealth|PreemptLatencyCheckpoints|ComputeShare)\$}
export GPUD_LEND_TRIALS=${GPUD_LEND_TRIALS:-100}
OUT=${BENCH_OUT:-$ROOT/bin/bench}
DOC=${BENCH_DOC-docs/benchmarks.md}
LOADED=${BENCH_LOADED:-1}
KMATRIX=${BENCH_KMATRIX-trixie}
PKGS=(internal/daemon internal/occupancy internal/dra)

if [[ ${BENCH_SMOKE:-} == 1 ]]; then
	RUNS=1 DOC=
	export GPUD_FOOT_PROCS=${GPUD_FOOT_PROCS:-50} GPUD_FOOT_WINDOW=${GPUD_FOOT_WINDOW:-1}
	export GPUD_TAX_ROUNDS=1 GPUD_TAX_DIVIDE=${GPUD_TAX_DIVIDE:-20} GPUD_LEND_TRIALS=5
	export GPUD_PREEMPT_TRIALS=40 GPUD_FREEZE_TRIALS=10 GPUD_PREEMPT200_RUNS=1
	export GPUD_BIGNODE_HOLDERS=4 GPUD_BIGNODE_OTHERS=50 GPUD_BIGNODE_RATE=1000 GPUD_BIGNODE_CHURN_S=1 GPUD_BIGNODE_WINDOW=2
	export GPUD_COMPUTE_ROUNDS=1 GPUD_COMPUTE_WINDOW=2
fi

log() { echo "bench.sh: $*" >&2; }

rm -rf "$OUT/bin" "$OUT/kmatrix"
rm -f "$OUT"/*.txt
mkdir -p "$OUT/bin"
for p in "${PKGS[@]}"; do
	"$GO" test -c -o "$OUT/bin/${p##*/}.test" "./$p" || { log "building the $p test binary failed"; exit 1; }
done

# run SERIES N: one run of every package's benchmarks into $OUT/SERIES-N.txt,
# with the lines tools/benchreport reads as the run's setting (benchmeta:).
failed=0
run() {
	local series=$1 n=$2 f=$OUT/$1-$2.txt skip= hogs=0 bench=$BENCH
	[[ $series != loaded ]] || hogs=$(nproc) bench=$UNDER_LOAD
	[[ $series == unloaded && $n == 1 ]] || skip=$BENCH_ONCE
	{
		echo "benchmeta: series $series"
		echo "benchmeta: run $n"
		echo "benchmeta: date $(date -u +%Y-%m-%dT%H:%M:%SZ)"
		echo "benchmeta: kernel $(uname -r)"
		echo "benchmeta: cpu $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)"
		echo "benchmeta: cores $(nproc)"
		echo "benchmeta: hogs $hogs"
		echo "benchmeta: commit $(git describe --always --dirty 2>/dev/null || echo unknown)"
		echo "benchmeta: load-before $(cut -d' ' -f1-3 /proc/loadavg)"
		echo "benchmeta: benchmarks $bench"
		[[ -z $skip ]] || echo "benchmeta: skipped $skip"
	} >"$f"
	log "$series run $n of $RUNS → $f"
	local start=$SECONDS p rc load hog
	for p in "${PKGS[@]}"; do
		rc=0 load= hog=()
		if [[ $series == loaded && $p == internal/daemon ]]; then
			load=hog
		elif [[ $series == loaded ]]; then
			hog=("$ROOT/scripts/hog.sh")
		fi
		(cd "$p" && GPUD_BENCH_LOAD=$load "${hog[@]}" "$OUT/bin/${p##*/}.test" -test.run '^$' -test.bench "$bench" ${skip:+-test.skip "$skip"} \
			-test.benchtime "$BENCHTIME" -test.count 1 -test.timeout 30m) >>"$f" 2>&1 || rc=$?
		[[ $rc == 0 ]] || { log "$p: benchmarks failed (rc $rc), see $f"; failed=1; }
	done
	{
		echo "benchmeta: load-after $(cut -d' ' -f1-3 /proc/loadavg)"
		echo "benchmeta: seconds $((SECONDS - start))"
	} >>"$f"
}

for ((i = 1; i <= RUNS; i++)); do
	run unloaded "$i"
	[[ $LOADED != 1 ]] || run loaded "$i"
done

files=("$OUT"/unloaded-*.txt)
[[ $LOADED != 1 ]] || files+=("$OUT"/loaded-*.txt)
if [[ -n $KMATRIX ]]; then
	scripts/deps.sh kmatrix
	if KMATRIX_BENCH=only KMATRIX_OUT=$OUT/kmatrix KMATRIX_TIMEOUT=${KMATRIX_TIMEOUT:-900} GO=$GO scripts/kmatrix.sh $KMATRIX; then
		files+=("$OUT"/kmatrix/*.bench.txt)
	else
		log "the syscall-tax benchmark in the kernel-matrix guests failed (logs in $OUT/kmatrix)"
		failed=1
	fi
fi

report=(-strict)
[[ -z $DOC ]] || report+=(-doc "$DOC")
rc=0
"$GO" run ./tools/benchreport "${report[@]}" "${files[@]}" >"$OUT/report.txt" || rc=$?
cat "$OUT/report.txt"
[[ $rc == 0 ]] || log "tools/benchreport failed (rc $rc)"
[[ $rc == 0 && $failed == 0 ]]
