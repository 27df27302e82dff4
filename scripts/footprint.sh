#!/usr/bin/env bash
# scripts/footprint.sh BIN [SECONDS] [NPROC] — gpud's idle footprint on a Docker host:
# BIN run with 2 fake GPUs (device numbers 1:7 and 10:229), one holder and NPROC extra idle
# processes; after it settles, RSS (VmRSS) and CPU (utime+stime over SECONDS) are printed.
# Root; hold /tmp/gpud-privtest.lock (flock -o) around it. Extra gpud flags: $GPUD_ARGS.
set -euo pipefail
bin=$(realpath "$1"); secs=${2:-20}; n=${3:-2000}
dir=$(mktemp -d /tmp/gpud-foot.XXXXXX); chmod 700 "$dir"
pids=()
cleanup() {
	[[ -n "${gpid:-}" ]] && kill "$gpid" 2>/dev/null && wait "$gpid" 2>/dev/null
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	rm -rf "$dir"
}
trap cleanup EXIT
mknod "$dir/nvidia0" c 1 7; mknod "$dir/nvidia1" c 10 229; mkdir -m 700 "$dir/state"
sleep 3600 3<"$dir/nvidia0" & pids+=($!)
for ((i = 0; i < n; i++)); do sleep 3600 & pids+=($!); done
"$bin" run --dev-dir "$dir" --state-file "$dir/state/state.json" --state-dir "$dir/state" \
	--control-socket "$dir/state/ctl.sock" --checkpoint-root "$dir/state/ck" --bpf-pin-dir "" \
	--metrics-addr 127.0.0.1:0 --nvml off --node-name foot ${GPUD_ARGS:-} 2>"$dir/log" & gpid=$!
sleep "${SETTLE:-10}"
kill -0 "$gpid" || { cat "$dir/log"; exit 1; }
ticks() { awk '{print $14+$15}' "/proc/$gpid/stat"; }
t0=$(ticks); s0=$(date +%s.%N)
sleep "$secs"
t1=$(ticks); s1=$(date +%s.%N)
rss=$(awk '/VmRSS/{print $2}' "/proc/$gpid/status")
anon=$(awk '/RssAnon/{print $2}' "/proc/$gpid/status")
file=$(awk '/RssFile/{print $2}' "/proc/$gpid/status")
# The ring buffer's pages (mapped twice by the reader, so counted twice; in RssFile).
ring=$(awk '/^[0-9a-f]+-[0-9a-f]+ /{m=($6=="anon_inode:bpf-map")} m&&/^Rss:/{s+=$2} END{print s+0}' "/proc/$gpid/smaps")
hz=$(getconf CLK_TCK)
nprocs=$(ls -d /proc/[0-9]* | wc -l)
awk -v r="$rss" -v a="$anon" -v f="$file" -v g="$ring" -v t="$((t1 - t0))" -v hz="$hz" -v s0="$s0" -v s1="$s1" -v np="$nprocs" \
	'BEGIN{printf "rss_mib=%.1f anon_mib=%.1f ring_mib=%.1f file_mib=%.1f cpu_pct=%.3f procs=%d\n", r/1024, a/1024, g/1024, (f-g)/1024, 100*t/hz/(s1-s0), np}'
if [[ -n "${KEEP_LOG:-}" ]]; then cp "$dir/log" "$KEEP_LOG"; fi
