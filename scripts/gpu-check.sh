#!/usr/bin/env bash
# scripts/gpu-check.sh [--double] [--out FILE] [--gpud PATH] [--device N]
#                      [--rounds N] [--limit SECONDS]
# `make gpu-check`: on a real node, what the doubles stand in for.
#
# A small CUDA program (tools/gpucheck/cudaprobe.c, built here with gcc: it
# dlopen()s libcuda.so.1 and runs a PTX kernel the driver compiles itself,
# so the driver is all a node needs: no CUDA toolkit, no network) holds and
# computes on a GPU while gpud (bin/gpud) watches the real /dev/nvidia*.
# Each check is one row of a table, PASS, FAIL or SKIP(reason) with its
# figure, printed and written to --out (default bin/gpu-check.txt); the
# exit status is 1 when a row FAILs. docs/real-gpu.md ("make gpu-check")
# says what each row means and when it passes.
#
# --double runs the same checks against the repository's doubles: fake GPU
# nodes (mknod with the numbers of /dev/full and /dev/fuse, as
# scripts/demo.sh), the NVML double and the CUDA double (which runs the
# probe's kernel on the CPU and writes the driver's accounting into the
# NVML double's script). CI runs it (make test) so the script cannot rot.
#
# Classes: a host process is always unmanaged, so the preemption rows use
# Docker containers labelled gpud.io/priority (the local engine; an image
# is made here with `docker import` of an empty tree, the probe, the host's
# libraries and the GPU nodes bind-mounted: nothing is pulled). Without a
# Docker engine those rows SKIP.
#
# Runs as root (gpud loads eBPF programs); everything it starts (gpud,
# probes, containers, its image, temp dir, pinned maps) goes at exit, and
# the whole run is bounded by --limit (default 540 s).
set -euo pipefail
. "$(dirname "$0")/lib.sh"

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DOUBLE=false
OUT=$ROOT/bin/gpu-check.txt
GPUD=$ROOT/bin/gpud
DEVICE=0     # CUDA ordinal of the GPU the probe uses
ROUNDS=20    # kill rounds through gpud (and as many bare SIGKILLs)
LIMIT=540    # seconds for the whole run
IDLE_AFTER=3 # seconds, gpud --idle-after

die() { echo "gpu-check.sh: $*" >&2; exit 2; }
usage() { sed -n '2,3p' "$0" | sed 's/^# //' >&2; exit 2; }

while [[ $# -gt 0 ]]; do
	case $1 in
	--double) DOUBLE=true ;;
	--out) OUT=${2:?}; shift ;;
	--gpud) GPUD=${2:?}; shift ;;
	--device) DEVICE=${2:?}; shift ;;
	--rounds) ROUNDS=${2:?}; shift ;;
	--limit) LIMIT=${2:?}; shift ;;
	*) usage ;;
	esac
	shift
done

[[ $(id -u) -eq 0 ]] || die "must run as root (gpud loads eBPF programs)"
[[ -x $GPUD ]] || die "$GPUD: no gpud binary (make build)"
command -v gcc >/dev/null || die "gcc is needed to build the probe"
command -v python3 >/dev/null || die "python3 is needed to read gpud's state file"
GPUD=$(realpath "$GPUD")
mkdir -p "$(dirname "$OUT")"

T=""
GPUD_PID=""
WATCHDOG=""
PIDS=()       # host probes
CONTAINERS=() # containers made here
IMAGE=""
PIN=/sys/fs/bpf/gpud-check-$$
CG="" # row 8's cgroup

cleanup() {
	local rc=$?
	trap - EXIT INT TERM
	set +e
	[[ -n $WATCHDOG ]] && kill "$WATCHDOG" 2>/dev/null && wait "$WATCHDOG" 2>/dev/null
	[[ -n $CG ]] && echo 0 >"$CG/cgroup.freeze" 2>/dev/null # row 8's: thawed, so its probe dies
	local p c
	for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null; done
	for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null; done
	for c in "${CONTAINERS[@]}"; do timeout 20 docker rm -f "$c" >/dev/null 2>&1; done
	[[ -n $IMAGE ]] && timeout 20 docker rmi -f "$IMAGE" >/dev/null 2>&1
	if [[ -n $GPUD_PID ]]; then
		kill -TERM "$GPUD_PID" 2>/dev/null
		for ((p = 0; p < 50; p++)); do alive "$GPUD_PID" || break; sleep 0.1; done
		alive "$GPUD_PID" && kill -KILL "$GPUD_PID" 2>/dev/null
		wait "$GPUD_PID" 2>/dev/null
	fi
	if ((rc != 0)) && [[ -n $T && -s $T/gpud.log ]]; then
		echo "gpu-check.sh: status $rc; last lines of gpud's log:" >&2
		tail -n 15 "$T/gpud.log" >&2
	fi
	rm -rf "$PIN"
	[[ -n $CG ]] && rmdir "$CG" 2>/dev/null
	[[ -n $T ]] && rm -rf "$T"
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'echo "gpu-check.sh: stopped after --limit ${LIMIT}s" >&2; exit 124' TERM
(
	trap 'kill "$s" 2>/dev/null; exit 0' TERM
	sleep "$LIMIT" &
	s=$!
	wait "$s" && kill -TERM $$
) 2>/dev/null &
WATCHDOG=$!

T=$(mktemp -d /tmp/gpud-check.XXXXXX) # 0700, root's: gpud loads libraries from here
mkdir -p "$T/gc" "$T/run" "$T/lib" "$T/checkpoints"
chmod 755 "$T" "$T/gc"
chmod 777 "$T/run"
gcc -O2 -Wall -Werror -o "$T/gc/cudaprobe" "$ROOT/tools/gpucheck/cudaprobe.c" -ldl ||
	die "building tools/gpucheck/cudaprobe.c failed"
PROBE=$T/gc/cudaprobe
Q() { python3 "$ROOT/tools/gpucheck/state.py" "$T/state.json" "$@"; }

# ---- the node: real, or the doubles ----
GPUD_ARGS=()
PROBE_ARGS=(--device "$DEVICE" --mem 256)
CONTAINER_ARGS=()
if $DOUBLE; then
	MODE="doubles (fake nodes, NVML and CUDA doubles)"
	DEV=$T/dev
	DRV=$T/driver
	mkdir -p "$DEV" "$DRV"
	chmod 755 "$DEV" "$DRV"
	mknod "$DEV/nvidia0" c 1 7    # the numbers of /dev/full
	mknod "$DEV/nvidia1" c 10 229 # the numbers of /dev/fuse
	gcc -O2 -Wall -Werror -shared -fPIC -Wl,-soname,libnvidia-ml.so.1 -o "$DRV/libnvidia-ml.so.1" \
		"$ROOT/internal/nvidia/nvmldouble/nvmldouble.c" -Wl,--no-as-needed -lm -lpthread
	gcc -O2 -Wall -Werror -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$DRV/libcuda.so.1" \
		"$ROOT/internal/nvidia/cudadouble/cudadouble.c" -ldl -lpthread
	UUID0=GPU-6c1b0a2e-0000-4000-8000-00000000c0de
	UUID1=GPU-6c1b0a2e-0000-4000-8000-00000000c1de
	# GPU 1 is in MIG mode with two slices, GPU instances 1 (2g.8gb) and
	# 2 (1g.4gb), laid out as the driver does: a capability node each in
	# nvidia-caps/ (spare numbers: /dev/kmsg's, which the probe of row 7
	# opens, and /dev/port's, which nothing opens) and the mig-minors table
	# naming them under the parent's minor (gpu229).
	MIGA=MIG-6c1b0a2e-0000-4000-8000-0000000a1de0
	MIGB=MIG-6c1b0a2e-0000-4000-8000-0000000b1de0
	mkdir -p "$DEV/nvidia-caps"
	chmod 755 "$DEV/nvidia-caps"
	mknod "$DEV/nvidia-caps/nvidia-cap12" c 1 11 # slice A
	mknod "$DEV/nvidia-caps/nvidia-cap21" c 1 4  # slice B
	cat >"$DRV/mig-minors" <<-EOF
		config 1
		monitor 2
		gpu229/gi1/access 12
		gpu229/gi1/ci0/access 13
		gpu229/gi2/access 21
		gpu229/gi2/ci0/access 22
	EOF
	# NVML's minor numbers are the nodes' (1:7, 10:229).
	cat >"$DRV/nvml-double.txt" <<-EOF
		driver version=570.86.15
		gpu index=0 minor=7 uuid=$UUID0 name=NVIDIA_Test_GPU memory_total=17179869184
		gpu index=1 minor=229 uuid=$UUID1 name=NVIDIA_Test_GPU memory_total=17179869184 mig=1
		mig gpu=1 gi=1 ci=0 uuid=$MIGA profile=2g.8gb memory_total=8589934592
		mig gpu=1 gi=2 ci=0 uuid=$MIGB profile=1g.4gb memory_total=4294967296
	EOF
	# Slice A is the CUDA device CUDA_VISIBLE_DEVICES=$MIGA gives: its
	# context opens the parent's node and the slice's capability node.
	cat >"$DRV/cuda-double.txt" <<-EOF
		driver version=12080
		device node=$DEV/nvidia0 uuid=$UUID0 nvml=0 name=NVIDIA_Test_GPU
		device node=$DEV/nvidia1 cap=$DEV/nvidia-caps/nvidia-cap12 uuid=$MIGA nvml=1 name=NVIDIA_Test_GPU_MIG_2g.8gb
		nvml script=$DRV/nvml-double.txt
	EOF
	chmod 666 "$DRV/cuda-double.txt"
	export GPUCHECK_LIBCUDA=$DRV/libcuda.so.1
	CUDA_LIB=$DRV/libcuda.so.1
	GPUD_ARGS+=(--nvml-library "$DRV/libnvidia-ml.so.1" --mig-minors-file "$DRV/mig-minors")
	# The double's kernel runs on the CPU: a small one.
	PROBE_ARGS+=(--n 4096 --reps 64)
	CONTAINER_ARGS+=(-v "$DRV:$DRV" -e "GPUCHECK_LIBCUDA=$DRV/libcuda.so.1")
	NODES=("$DEV/nvidia0" "$DEV/nvidia1")
else
	MODE="real driver"
	DEV=/dev
	[[ -c /dev/nvidiactl ]] || die "no /dev/nvidiactl: is the NVIDIA driver loaded? (--double runs against the doubles)"
	CUDA_LIB=$(ldconfig -p 2>/dev/null | awk '$1 == "libcuda.so.1" { print $NF; exit }')
	[[ -n $CUDA_LIB ]] || die "no libcuda.so.1 in the loader's cache (ldconfig -p): the driver's user-space part is missing"
	NODES=()
	for n in /dev/nvidia[0-9]* /dev/nvidiactl /dev/nvidia-uvm /dev/nvidia-uvm-tools /dev/nvidia-modeset; do
		[[ -c $n ]] && NODES+=("$n")
	done
	if [[ -d /dev/nvidia-caps ]]; then
		for n in /dev/nvidia-caps/*; do [[ -c $n ]] && NODES+=("$n"); done
	fi
fi
GPUD_ARGS+=(--cuda-library "$CUDA_LIB")

INFO=$("$PROBE" --info 2>&1) || die "the probe cannot use the driver: $INFO"
DRIVER_API=$(sed -n 's/.*driver_api=\([0-9]*\).*/\1/p' <<<"$INFO" | head -1)
CKPT_API=$(sed -n 's/.*checkpoint_api=\([a-z]*\).*/\1/p' <<<"$INFO" | head -1)
UUID=$(awk -v d="$DEVICE" '$1 == "device" && $2 == "ordinal=" d { sub("uuid=", "", $3); print $3 }' <<<"$INFO")
GPUNAME=$(awk -v d="$DEVICE" '$1 == "device" && $2 == "ordinal=" d { sub(/.*name="/, ""); sub(/"$/, ""); print }' <<<"$INFO")
[[ -n $UUID ]] || die "no CUDA device $DEVICE: $INFO"

# ---- Docker, for the rows that need classes ----
DOCKER=false
DOCKER_WHY=""
if ! command -v docker >/dev/null 2>&1; then
	DOCKER_WHY="no Docker on this node: host processes are unmanaged, classes need gpud.io/priority containers"
elif ! timeout 10 docker info >/dev/null 2>&1; then
	# Not started here: an engine started under `flock` would keep its lock.
	DOCKER_WHY="no Docker engine answers (start one: scripts/dockerd.sh start): classes need gpud.io/priority containers"
else
	IMAGE=gpud-gpucheck:$$
	mkdir -p "$T/rootfs"/{gc,gcrun,dev,proc,sys,etc,tmp,usr,lib}
	if tar --numeric-owner --owner=0 --group=0 -C "$T/rootfs" -c . |
		timeout 60 docker import - "$IMAGE" >"$T/import.out" 2>&1; then
		DOCKER=true
	else
		DOCKER_WHY="docker import of an empty image failed: $(tail -1 "$T/import.out")"
		IMAGE=""
	fi
fi

# ---- gpud ----
METRICS=127.0.0.1:$((20000 + $$ % 20000))
if $DOCKER; then DOCKER_HOST_ARG=(); else DOCKER_HOST_ARG=(--docker-host none); fi
"$GPUD" run --dev-dir "$DEV" --state-file "$T/state.json" --control-socket "$T/gpud.sock" \
	--state-dir "$T/lib" --checkpoint-root "$T/checkpoints" --bpf-pin-dir "$PIN" \
	--idle-after "${IDLE_AFTER}s" --log-level debug --keep-enforcing=false --reclaim none \
	--preempt-mode kill --preempt-mode-containers freeze,checkpoint \
	--metrics-addr "$METRICS" --nri-socket none --cri-endpoint none "${DOCKER_HOST_ARG[@]}" \
	"${GPUD_ARGS[@]}" </dev/null >"$T/gpud.log" 2>&1 &
GPUD_PID=$!
for ((i = 0; i < 300; i++)); do
	[[ -s $T/state.json && -S $T/gpud.sock ]] && break
	alive "$GPUD_PID" || die "gpud exited during start: $(tail -5 "$T/gpud.log")"
	sleep 0.1
done
[[ -s $T/state.json ]] || die "gpud wrote no state file within 30 s"

# until SECONDS CMD...: true once CMD succeeds, polling every 0.1 s.
until_ok() {
	local end=$((SECONDS + $1)) t
	shift
	while ((SECONDS < end)); do
		"$@" >/dev/null 2>&1 && return 0
		sleep 0.1
	done
	"$@" >/dev/null 2>&1
}
state_is() { [[ $(Q state "$1") == "$2" ]]; }
held_by() { Q holder "$1" >/dev/null; }
mem_ok() { local m; m=$(Q holder "$1" | sed -n 's/.*memory_bytes=\([0-9]*\).*/\1/p'); [[ -n $m ]] && ((m >= 256 << 20)); }
no_holders() { [[ $(Q holders "$1") == 0 ]]; }
idle_after_busy() { sed -n '/^phase busy/,$p' "$T/holder.out" | grep -q '^phase idle'; }
ms() { awk -v u="$1" 'BEGIN { printf "%.1f", u / 1000 }'; }

GPU_LINE=$(until_ok 10 Q gpu "$UUID" && Q gpu "$UUID") || die "gpud does not list the probe's GPU $UUID: $(Q gpu "$UUID" 2>&1)"
GPU=$(sed -n 's/^index=\([0-9]*\).*/\1/p' <<<"$GPU_LINE")
NODE=$DEV/nvidia$GPU

ROWS=()
FAILED=0
row() { # N NAME RESULT FIGURE
	ROWS+=("$(printf '%-2s %-22s %-6s %s' "$1" "$2" "$3" "$4")")
	[[ $3 == FAIL ]] && FAILED=$((FAILED + 1))
	printf '%-2s %-22s %-6s %s\n' "$1" "$2" "$3" "$4" >&2
}

# probe_host NAME PHASES...: a probe on the host, its output in $T/NAME.out;
# sets PROBE_PID once it is ready.
probe_host() {
	local name=$1
	shift
	"$PROBE" "${PROBE_ARGS[@]}" "$@" >"$T/$name.out" 2>&1 &
	PROBE_PID=$!
	PIDS+=("$PROBE_PID")
	until_ok 60 grep -q '^ready ' "$T/$name.out" || { sed 's/^/  probe: /' "$T/$name.out" >&2; return 1; }
}

# ---- 1 holder, 2 activity, 6 hooks: a host probe ----
NVML=$(Q nvml)
if probe_host holder idle:$((IDLE_AFTER + 2)) busy:5 idle:$((IDLE_AFTER + 3)); then
	P=$PROBE_PID
	if until_ok 10 held_by "$P"; then
		until_ok 10 mem_ok "$P" # NVML's process list is polled
		H=$(Q holder "$P")
		MEM=$(sed -n 's/.*memory_bytes=\([0-9]*\).*/\1/p' <<<"$H")
		HU=$(sed -n 's/.*uuid=\([^ ]*\).*/\1/p' <<<"$H")
		if [[ ${HU#GPU-} == "${UUID#GPU-}" && -n $MEM ]] && ((MEM >= 256 << 20)); then
			row 1 holder PASS "pid $P on GPU $GPU ($HU), memory_bytes $MEM (≥ 256 MiB allocated)"
		else
			row 1 holder FAIL "pid $P listed as: $H (want uuid $UUID, memory_bytes ≥ $((256 << 20)))"
		fi
	else
		row 1 holder FAIL "pid $P (uuid $UUID) not a holder within 10 s"
	fi
	# 2: idle while it only holds, busy while it launches, idle again.
	IDLE1=false BUSY=false IDLE2=false
	until_ok $((IDLE_AFTER + 4)) state_is "$GPU" idle && IDLE1=true
	until_ok $((IDLE_AFTER + 6)) grep -q '^phase busy' "$T/holder.out"
	B0=$SECONDS
	until_ok 5 state_is "$GPU" busy && BUSY=true
	TBUSY=$((SECONDS - B0))
	until_ok 8 idle_after_busy
	I0=$SECONDS
	until_ok $((IDLE_AFTER + 4)) state_is "$GPU" idle && IDLE2=true
	TIDLE=$((SECONDS - I0))
	NVML=$(Q nvml "$GPU")
	FIG="$NVML; idle while holding: $IDLE1, busy ${TBUSY}s after launches began: $BUSY, idle ${TIDLE}s after they stopped (--idle-after ${IDLE_AFTER}s): $IDLE2"
	if $IDLE1 && $BUSY && $IDLE2 && [[ $NVML == activity_source=nvml* ]]; then
		row 2 activity PASS "$FIG"
	else
		row 2 activity FAIL "$FIG"
	fi
	# 6: the probe's exit closes its fds: a close event, the holder gone.
	HOOKS=$(Q hooks)
	C0=$(Q metric "http://$METRICS/metrics" gpud_events_received_total 'type="close"' 2>/dev/null || echo 0)
	until_ok 20 grep -q '^done ok' "$T/holder.out"
	E0=$(date +%s%N)
	GONE=false
	until_ok 5 no_holders "$GPU" && GONE=true
	TGONE=$((($(date +%s%N) - E0) / 1000000))
	C1=$(Q metric "http://$METRICS/metrics" gpud_events_received_total 'type="close"' 2>/dev/null || echo 0)
	FIG="$HOOKS; probe exit → out of the ledger in ${TGONE} ms, close events +$((C1 - C0))"
	if $DOUBLE; then
		FIG="(fake nodes: the hooks are on the stand-in drivers, not nvidia.ko) $FIG"
	fi
	# The doubles' row passes on the holder leaving by whatever route the
	# kernel has (no kprobes: the 2 s re-read); the real one needs the
	# release kprobe on nvidia.ko and its close event.
	if $GONE && { $DOUBLE || { [[ $HOOKS == mode=driver*release:nvidia* ]] && ((C1 > C0)); }; }; then
		row 6 hooks PASS "$FIG"
	else
		row 6 hooks FAIL "$FIG"
	fi
else
	row 1 holder FAIL "the probe did not start: $(tail -1 "$T/holder.out")"
	row 2 activity SKIP "(no probe)"
	row 6 hooks SKIP "(no probe)"
fi

# ---- 3 kill latency, 4 freeze → thaw, 5 checkpoint: containers ----
# ctr NAME LABELS...: a container of the probe (main: --park), its id in CTR.
ctr() {
	local name=$1 devs=() n
	shift
	for n in "${NODES[@]}"; do devs+=(--device "$n:$n"); done
	local binds=(-v "$T/gc:/gc:ro" -v "$T/run:/gcrun")
	for n in /lib /lib64 /usr/lib /usr/lib64 /usr/lib32; do
		[[ -d $n ]] && binds+=(-v "$n:$n:ro")
	done
	[[ -f /etc/ld.so.cache ]] && binds+=(-v /etc/ld.so.cache:/etc/ld.so.cache:ro)
	CTR=$(timeout 60 docker run -d --pid host --network none --name "gpud-check-$name-$$" \
		--label "gpud-check=$$" "$@" "${devs[@]}" "${binds[@]}" "${CONTAINER_ARGS[@]}" \
		"$IMAGE" /gc/cudaprobe --park)
	CONTAINERS+=("$CTR")
}

# probe_in CTR NAME PHASES...: a probe in the container; PROBE_PID once ready.
probe_in() {
	local c=$1 name=$2
	shift 2
	rm -f "$T/run/$name.ready"
	timeout 30 docker exec -d "$c" /gc/cudaprobe "${PROBE_ARGS[@]}" --ready-file "/gcrun/$name.ready" \
		--log-file "/gcrun/$name.log" "$@" || return 1
	until_ok 60 test -s "$T/run/$name.ready" || { cat "$T/run/$name.log" >&2 2>/dev/null; return 1; }
	PROBE_PID=$(sed -n 's/^ready pid=\([0-9]*\).*/\1/p' "$T/run/$name.ready")
}

pct() { # P FILE: the Pth percentile (nearest rank) of the numbers in FILE
	sort -n "$2" | awk -v p="$1" '{ a[NR] = $1 } END { if (NR == 0) { print "nan"; exit } i = int((p * NR + 99) / 100); if (i < 1) i = 1; print a[i] }'
}

if ! $DOCKER; then
	row 3 kill-latency SKIP "($DOCKER_WHY)"
	row 4 freeze-thaw SKIP "($DOCKER_WHY)"
	row 5 checkpoint SKIP "($DOCKER_WHY)"
else
	ctr low --label gpud.io/priority=low
	LOW=$CTR
	ctr high --label gpud.io/priority=high
	HIGH=$CTR
	# 3: rounds alternate: the high open through gpud, a bare SIGKILL.
	: >"$T/gpud.us"
	: >"$T/bare.us"
	BAD=""
	for ((r = 0; r < 2 * ROUNDS; r++)); do
		if ! probe_in "$LOW" "k$r" hold; then BAD="round $r: the probe did not start"; break; fi
		V=$PROBE_PID
		if ! until_ok 10 held_by "$V"; then BAD="round $r: pid $V not a holder within 10 s"; break; fi
		if ((r % 2)); then
			OUTK=$("$PROBE" --sigkill "$V" 2>&1) || { BAD="round $r: bare SIGKILL: $OUTK"; break; }
			sed -n 's/^killed_us=//p' <<<"$OUTK" >>"$T/bare.us"
		else
			OUTK=$(timeout 30 docker exec "$HIGH" /gc/cudaprobe --open-node "$NODE" --victim "$V" 2>&1) ||
				{ BAD="round $r: the high open did not kill pid $V: $OUTK"; break; }
			sed -n 's/^killed_us=//p' <<<"$OUTK" >>"$T/gpud.us"
			until_ok 5 Q records kill "$V" || { BAD="round $r: no kill record for pid $V"; break; }
		fi
		until_ok 10 no_holders "$GPU" || { BAD="round $r: GPU $GPU still held after the round"; break; }
	done
	N=$(wc -l <"$T/gpud.us")
	G50=$(pct 50 "$T/gpud.us") G99=$(pct 99 "$T/gpud.us") B50=$(pct 50 "$T/bare.us") B99=$(pct 99 "$T/bare.us")
	FIG="open → victim gone p50 $(ms "$G50") ms, p99 $(ms "$G99") ms ($N rounds); bare SIGKILL → gone p50 $(ms "$B50") ms, p99 $(ms "$B99") ms"
	if [[ -z $BAD && $N -eq $ROUNDS ]]; then
		FIG+="; ratio p50 $(awk -v a="$G50" -v b="$B50" 'BEGIN { printf "%.2f", a / b }'), p99 $(awk -v a="$G99" -v b="$B99" 'BEGIN { printf "%.2f", a / b }')"
		row 3 kill-latency PASS "$FIG"
	else
		row 3 kill-latency FAIL "$BAD; $FIG"
	fi

	# suspend_row N NAME MODE: a busy probe in a MODE container, a high
	# opener for 3 s, then the thaw; its checks must go on, correct.
	suspend_row() {
		local num=$1 name=$2 mode=$3 c v rec why="" frozen=false thawed=false k0 k1 k2 res
		ctr "$mode" --label gpud.io/priority=low --label "gpud.io/preempt-mode=$mode"
		c=$CTR
		if ! probe_in "$c" "$mode" busy:12; then
			row "$num" "$name" FAIL "the probe did not start"
			return
		fi
		v=$PROBE_PID
		until_ok 10 held_by "$v" || why="pid $v not a holder within 10 s"
		until_ok 5 grep -q '^check ok' "$T/run/$mode.log"
		timeout 30 docker exec -d "$HIGH" /gc/cudaprobe --open-node "$NODE" --hold 3
		until_ok 5 Q records freeze "$v" && frozen=true
		k0=$(grep -c '^check ok' "$T/run/$mode.log")
		sleep 1.5
		k1=$(grep -c '^check ok' "$T/run/$mode.log")
		until_ok 10 Q records thaw "$v" && thawed=true
		k2=$(grep -c '^check ok' "$T/run/$mode.log")
		until_ok 30 grep -q '^done ok\|MISMATCH\|^error' "$T/run/$mode.log"
		local after=$(($(grep -c '^check ok' "$T/run/$mode.log") - k2))
		rec=$(Q records freeze "$v" | tail -1)
		res=$(Q records thaw "$v" | tail -1)
		local fig="freeze: ${rec:-none}; thaw: ${res:-none}; checks while frozen +$((k1 - k0)) in 1.5 s, after thaw $after ok; $(grep -m1 'MISMATCH\|^error\|^done' "$T/run/$mode.log" || echo 'not done')"
		if [[ -z $why ]] && $frozen && $thawed && ((k1 - k0 <= 1 && after > 0)) && grep -q '^done ok' "$T/run/$mode.log" &&
			{ [[ $mode != checkpoint ]] || [[ $rec == *CUDA_checkpointed* ]]; }; then
			row "$num" "$name" PASS "$fig"
		else
			row "$num" "$name" FAIL "${why:+$why; }$fig"
		fi
	}
	suspend_row 4 freeze-thaw freeze
	if [[ $CKPT_API == yes ]]; then
		suspend_row 5 checkpoint checkpoint
	else
		row 5 checkpoint SKIP "(driver API $DRIVER_API, driver $(sed -n 's/.*driver=\([^ ]*\).*/\1/p' <<<"$NVML"): no cuCheckpointProcess* (needs driver API 12080, driver 570+)"
	fi
fi

# ---- 7 MIG ----
# A slice gpud lists (gpus[].mig) is held by the probe as CUDA programs reach
# one, CUDA_VISIBLE_DEVICES=<MIG UUID> (libcuda opens the parent's node and
# the slice's capability node); gpud must list the probe as the holder of
# that slice, with its parent, profile and MIG UUID. The script never
# changes a GPU's MIG mode or makes instances.
LEFT=$(Q left-alone 2>/dev/null || true)
SLICE=$(Q slices 2>/dev/null | head -1 || true)
field() { sed -n "s/.*\<$1=\([^ ]*\).*/\1/p" <<<"$2"; } # field KEY LINE: KEY's value
bare() { local u=${1#GPU-}; echo "${u#MIG-}"; }                 # a UUID without GPU-/MIG-
if [[ -n $SLICE ]]; then
	SU=$(field uuid "$SLICE")
	WANT_PARENT=$(field parent_uuid "$SLICE")
	WANT_PROFILE=$(field profile "$SLICE")
	WHO="gpud's slice"
	if $DOUBLE; then
		WHO="(double: GPU 1 scripted in MIG mode, 2 slices) the script's slice"
		SU=$MIGA WANT_PARENT=$UUID1 WANT_PROFILE=2g.8gb # the CUDA double's MIG device
	elif command -v nvidia-smi >/dev/null; then
		# nvidia-smi -L: "GPU i: ... (UUID: GPU-...)", then its "  MIG <profile> Device j: (UUID: MIG-...)"
		SMI=$(nvidia-smi -L 2>/dev/null | awk -v u="$SU" '/^GPU / { p = $NF; gsub(/[()]/, "", p) } index($0, u) && /MIG/ { print p, $2 }' || true)
		if [[ -n $SMI ]]; then
			WANT_PARENT=${SMI%% *} WANT_PROFILE=${SMI#* }
			WHO="nvidia-smi -L's slice"
		fi
	fi
	export CUDA_VISIBLE_DEVICES=$SU
	if probe_host mig --device 0 busy:2 hold; then
		P=$PROBE_PID
		PU=$(sed -n 's/^ready .*uuid=\([^ ]*\).*/\1/p' "$T/mig.out")
		until_ok 10 Q slice "$P" || true
		S=$(Q slice "$P" 2>/dev/null || true)
		kill -TERM "$P" 2>/dev/null || true
		until_ok 10 grep -q '^done ok\|MISMATCH\|^error' "$T/mig.out" || true
		DONE=$(grep -m1 'MISMATCH\|^error\|^done' "$T/mig.out" || echo 'not done')
		FIG="pid $P with CUDA_VISIBLE_DEVICES=$SU (device uuid ${PU:-?}, ${DONE%% t=*}) holds: ${S:-no slice}; want $WHO: parent $WANT_PARENT, profile $WANT_PROFILE"
		if [[ -n $S && $(bare "$(field uuid "$S")") == $(bare "$SU") &&
			$(bare "$(field parent_uuid "$S")") == $(bare "$WANT_PARENT") &&
			-n $WANT_PROFILE && $(field profile "$S") == "$WANT_PROFILE" && $DONE == "done ok"* ]] &&
			{ ! $DOUBLE || [[ $(field device "$S") == "$DEV/nvidia-caps/nvidia-cap12" ]]; }; then
			row 7 mig PASS "$FIG"
		else
			row 7 mig FAIL "$FIG"
		fi
	else
		row 7 mig FAIL "the probe did not start on slice $SU: $(tail -1 "$T/mig.out")"
	fi
	unset CUDA_VISIBLE_DEVICES
elif $DOUBLE; then
	row 7 mig FAIL "(double: GPU 1 scripted in MIG mode, 2 slices) gpud lists no slice; left alone: ${LEFT:-none}"
elif [[ $LEFT == *MIG_enabled* ]]; then
	if [[ $LEFT == *no_MIG_instance* ]]; then
		row 7 mig SKIP "(a GPU is in MIG mode with no instance: the check makes none; nvidia-smi mig -cgi <profile> -C, then run again. gpud: $LEFT)"
	else
		row 7 mig FAIL "a GPU is in MIG mode but gpud lists no slice of it: $LEFT"
	fi
else
	MODES=$(nvidia-smi --query-gpu=uuid,mig.mode.current --format=csv,noheader 2>/dev/null | tr '\n' ' ' || true)
	if [[ $MODES == *Enabled* ]]; then
		row 7 mig FAIL "nvidia-smi says a GPU is in MIG mode ($MODES) but gpud neither lists its slices nor leaves it alone ($(Q nvml))"
	else
		row 7 mig SKIP "(no GPU in MIG mode${MODES:+: $MODES}; the check does not switch MIG mode: nvidia-smi -i <gpu> -mig 1 with nothing on the GPU, nvidia-smi mig -cgi <profile> -C, then run again)"
	fi
fi

# ---- 8 queued kernels after a freeze ----
# A host probe in a cgroup of its own queues launches without waiting for
# them; the cgroup is then frozen (cgroup.freeze, the freezer gpud's
# time-slicing uses) and NVML's utilization of the GPU polled until it is
# at most 5 %: the freeze stops launches, not the GPU, so the kernels
# already queued run on, and this is for how long (the bound a compute
# share's slice cannot undercut; NVML's sample period is included).
CGROOT=$(awk '$3 == "cgroup2" { print $2; exit }' /proc/mounts)
if [[ -z $CGROOT ]]; then
	row 8 queued-tail SKIP "(no cgroup v2 hierarchy mounted: the freeze is cgroup.freeze)"
else
	CG=$CGROOT/gpud-check-$$
	mkdir "$CG"
	if $DOUBLE; then
		QARGS=(idle:1 queue:100 hold) NVMLLIB=$DRV/libnvidia-ml.so.1
	else
		# ~10 ms a launch on an H100 (each thread 10^6 dependent steps):
		# 500 queued are seconds of work, whatever the launch queue's depth.
		QARGS=(--reps 1000000 idle:1 queue:500 hold) NVMLLIB=libnvidia-ml.so.1
	fi
	if probe_host queued "${QARGS[@]}"; then
		P=$PROBE_PID
		echo "$P" >"$CG/cgroup.procs" # during idle:1, before it launches
		D="the probe queued nothing within 60 s: $(tail -1 "$T/queued.out")"
		if until_ok 60 grep -q '^queued' "$T/queued.out"; then
			D=$("$PROBE" --freeze-drain "$CG" --uuid "$UUID" --nvml-lib "$NVMLLIB" --below 5 --timeout 60 2>&1 | tail -1) || true
		fi
		echo 0 >"$CG/cgroup.freeze"
		until_ok 60 grep -q '^drained' "$T/queued.out" || true
		kill -TERM "$P" 2>/dev/null || true
		BEFORE=$(sed -n 's/^util_before=\([0-9]*\) drain_ms=.*/\1/p' <<<"$D")
		DRAIN=$(sed -n 's/.* drain_ms=\([0-9.]*\).*/\1/p' <<<"$D")
		Q_N=$(sed -n 's/^queued n=\([0-9]*\).*/\1/p' "$T/queued.out")
		if [[ -z $DRAIN ]]; then
			row 8 queued-tail FAIL "${Q_N:-no} launches queued, then: $D"
		elif $DOUBLE; then
			# The CUDA double runs each kernel on the CPU inside
			# cuLaunchKernel: nothing is left queued at the freeze, and
			# the drop is the NVML double's 1 s window of samples.
			row 8 queued-tail PASS "n/a on the double (its kernels run inside cuLaunchKernel: none queued at the freeze); the freeze and NVML's utilization work: ${BEFORE} % → ≤ 5 % in ${DRAIN} ms"
		elif ((BEFORE < 50)); then
			row 8 queued-tail FAIL "the GPU was ${BEFORE} % busy at the freeze, $Q_N launches queued: too little queued to measure"
		else
			row 8 queued-tail PASS "$Q_N launches queued, frozen at ${BEFORE} % busy: the GPU stayed busy ${DRAIN} ms after the freeze"
		fi
	else
		row 8 queued-tail FAIL "the probe did not start: $(tail -1 "$T/queued.out")"
	fi
fi

# ---- the table ----
{
	echo "gpu-check $(date -u +%Y-%m-%dT%H:%M:%SZ) $MODE: GPU $GPU ($UUID, ${GPUNAME:-?}), driver API $DRIVER_API, gpud $("$GPUD" version | awk 'NR == 1 { print $2 }'), kernel $(uname -r)"
	printf '%-2s %-22s %-6s %s\n' "#" check result figure
	printf '%s\n' "${ROWS[@]}" | sort -n -k1,1
} >"$OUT"
cat "$OUT"
((FAILED == 0))
