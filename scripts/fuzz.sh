#!/usr/bin/env bash
# scripts/fuzz.sh [PACKAGE...] — run every Go fuzz target for a bounded time.
#
# Why: the fuzz targets' seed corpora run in every `go test`, but finding new
# inputs needs `go test -fuzz`, which takes one target at a time. This finds
# every FuzzXxx (in the packages given, default all: `go test -list` per
# package that has one, so build tags are honoured) and runs each for
# $FUZZTIME (default 10s), then prints one line per target:
#
#   PACKAGE  TARGET  EXECS  NEW  RESULT
#
# EXECS is the executions in that time, NEW the new interesting inputs (new
# coverage) found. It exits non-zero if any target fails; Go then writes the
# failing input to the package's testdata/fuzz/FuzzXxx/ (printed here), where
# it is a regression seed for every later `go test` once committed.
#
# Environment: FUZZTIME (10s; a duration, or Nx for N executions),
# FUZZMINIMIZETIME (1s: how long a new input is minimized; Go's 60s default
# would spend a short run minimizing, not fuzzing, with its executions
# uncounted), FUZZPARALLEL (workers per target; Go's default is GOMAXPROCS),
# FUZZ_LOG_DIR (keep each target's full output there; default a temp dir
# removed at the end unless a target failed).
set -euo pipefail

GO=${GO:-go}
FUZZTIME=${FUZZTIME:-10s}
FUZZMINIMIZETIME=${FUZZMINIMIZETIME:-1s}
cd "$(dirname "$0")/.."

if (($# == 0)); then
	# Candidate packages: directories with a *_test.go declaring a Fuzz
	# target; `go test -list` below decides what really builds here.
	mapfile -t pkgs < <(grep -rlE --include='*_test.go' '^func Fuzz[A-Z0-9_]' . 2>/dev/null |
		grep -v -e '/testdata/' -e '/vendor/' -e '^\./\.' | xargs -r -n1 dirname | sort -u)
else
	pkgs=("$@")
fi
if ((${#pkgs[@]} == 0)); then
	echo "fuzz.sh: no fuzz targets found" >&2
	exit 1
fi

logs=${FUZZ_LOG_DIR:-}
keep_logs=1
if [[ -z $logs ]]; then
	logs=$(mktemp -d /tmp/gpud-fuzz.XXXXXX)
	keep_logs=0
fi
mkdir -p "$logs"

# deadline_race LOG: the run failed only by Go's deadline race: its one
# failure message is "context deadline exceeded", and no input was written.
deadline_race() {
	! grep -q 'Failing input written' "$1" &&
		[[ $(grep -A1 -E '^--- FAIL: ' "$1" | sed 1d) =~ ^[[:space:]]+context\ deadline\ exceeded$ ]]
}

par=()
[[ -n ${FUZZPARALLEL:-} ]] && par=(-parallel "$FUZZPARALLEL")

fmt='%-28s %-28s %12s %5s  %s\n'
# shellcheck disable=SC2059
printf "$fmt" PACKAGE TARGET EXECS NEW RESULT
failed=0 total=0 start=$SECONDS
for pkg in "${pkgs[@]}"; do
	pkg=./${pkg#./}
	if ! list=$($GO test -list '^Fuzz' "$pkg" 2>&1); then
		# shellcheck disable=SC2059
		printf "$fmt" "${pkg#./}" '-' '-' '-' 'FAIL (does not build)'
		printf '%s\n' "$list" | sed 's/^/    /' >&2
		failed=$((failed + 1))
		continue
	fi
	for name in $(printf '%s\n' "$list" | grep -E '^Fuzz[A-Za-z0-9_]*$' || true); do
		total=$((total + 1))
		log=$logs/$(tr / _ <<<"${pkg#./}").$name.log
		result=ok
		if ! $GO test -run '^$' -fuzz "^${name}\$" -fuzztime "$FUZZTIME" -fuzzminimizetime "$FUZZMINIMIZETIME" "${par[@]}" "$pkg" >"$log" 2>&1; then
			result=FAIL
			if deadline_race "$log"; then
				# Go before 1.27 can fail a target with a bare "context
				# deadline exceeded" when -fuzztime ends while a worker is
				# busy (go.dev/issue/75804): no input failed, none was
				# written. The target passes if its seeds and testdata/fuzz replay clean.
				if $GO test -count=1 -run "^${name}\$" "$pkg" >>"$log" 2>&1; then
					result="ok (go.dev/issue/75804 at the deadline; seeds replayed)"
				fi
			fi
			[[ $result == FAIL ]] && failed=$((failed + 1))
		fi
		# fuzz: elapsed: 10s, execs: 123456 (12345/sec), new interesting: 7 (total: 42)
		last=$(grep -E '^fuzz: elapsed: .*execs: [0-9]+' "$log" | tail -n1 || true)
		execs=$(sed -nE 's/.*execs: ([0-9]+).*/\1/p' <<<"$last")
		newi=$(sed -nE 's/.*new interesting: ([0-9]+).*/\1/p' <<<"$last")
		# shellcheck disable=SC2059
		printf "$fmt" "${pkg#./}" "$name" "${execs:--}" "${newi:--}" "$result"
		if [[ $result != ok ]]; then
			# Go names the input it wrote relative to the package directory.
			sed -nE 's#^.*(Failing input written to )(testdata/fuzz/.*)$#    \1'"${pkg#./}"'/\2#p' "$log"
			grep -E -A1 -- '^\s*--- FAIL|^\s+[a-z_]+_test\.go:[0-9]+:|To re-run' "$log" | grep -v '^--$' |
				head -n 20 | sed 's/^/    /'
			echo "    full output: $log"
			keep_logs=1
		fi
	done
done
echo "fuzz.sh: $total targets, $failed failures, $((SECONDS - start))s (FUZZTIME=$FUZZTIME)"
((keep_logs)) || rm -rf "$logs"
((total > 0)) || { echo "fuzz.sh: no fuzz targets found" >&2; exit 1; }
((failed == 0))
