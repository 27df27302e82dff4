#!/usr/bin/env bash
# scripts/demo.sh [path/to/gpud] — a narrated tour of gpud's main job:
# watching, through eBPF, which processes hold which GPU device files.
#
# Why: most machines (CI included) have no NVIDIA driver. Fake GPUs are made
# with mknod, reusing the numbers of drivers nobody else opens here
# (/dev/full, /dev/fuse): their opens and closes are real kernel events
# (see "Testing without a GPU" in the design notes). On a node with a real
# GPU (/dev/nvidia0, major 195) /dev is used instead.
#
# It starts gpud (default ./bin/gpud; `make demo` builds it first) on a temp
# dir, then opens, forks, closes and containerises GPU holders, printing
# `gpud status` after each step. A Docker engine is started only if none
# answers (scripts/dockerd.sh), the test image built only if missing
# (scripts/image.sh); without Docker only the container step is skipped.
# Everything it started is stopped on exit, Ctrl-C and failure included.
# Runs as root (gpud loads eBPF programs); takes about 20-30 s.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
IDLE_AFTER=4 # seconds, gpud --idle-after
IMAGE=gpud-test-busybox:latest

die() { echo "demo.sh: $*" >&2; exit 1; }

[[ $# -le 1 ]] || die "usage: $0 [path/to/gpud] (default: bin/gpud)"
[[ $(id -u) -eq 0 ]] || die "must run as root (gpud loads eBPF programs): sudo $0${1:+ $1}"
GPUD=${1:-$ROOT/bin/gpud}
[[ -x $GPUD ]] || die "$GPUD: no gpud binary there (build it: go build -o bin/gpud ./cmd/gpud, or make demo)"
GPUD=$(realpath "$GPUD")

T=""
GPUD_PID=""
DEMO_PIDS=()  # host processes holding GPUs
CID=""        # the demo container
STOP_DOCKERD=false
CTL=""        # fd to the gpu-app helper's command fifo
ACK=""        # fd its answers come back on


# Kill and reap the demo's GPU holders, without bash's "Killed" notices.
kill_demo_procs() {
	{
		local pid
		for pid in "${DEMO_PIDS[@]}"; do
			kill -KILL "$pid" || true
		done
		for pid in "${DEMO_PIDS[@]}"; do
			wait "$pid" || true
		done
	} 2>/dev/null
	DEMO_PIDS=()
}

cleanup() {
	local rc=$?
	trap - EXIT INT TERM
	set +e
	local interrupted=false
	((rc == 130 || rc == 143)) && interrupted=true
	if [[ -n $GPUD_PID ]] && ! alive "$GPUD_PID"; then
		wait "$GPUD_PID" 2>/dev/null
		local st=$?
		if ! $interrupted; then
			echo "demo.sh: gpud exited early (status $st); last lines of its log:" >&2
			tail -n 20 "$T/gpud.log" >&2
			((rc != 0)) || rc=1
		fi
		GPUD_PID=""
	elif ((rc != 0)) && ! $interrupted && [[ -n $T && -s $T/gpud.log ]]; then
		echo "demo.sh: failed (status $rc); last lines of gpud's log:" >&2
		tail -n 10 "$T/gpud.log" >&2
	fi
	if [[ -n $CID ]]; then
		timeout 20 docker rm -f "$CID" >/dev/null 2>&1
	fi
	if $DOCKER; then
		local c
		for c in $(timeout 10 docker ps -aq --filter "label=gpud-demo=$$" 2>/dev/null); do
			timeout 20 docker rm -f "$c" >/dev/null 2>&1
		done
	fi
	kill_demo_procs
	if [[ -n $GPUD_PID ]]; then
		kill -TERM "$GPUD_PID" 2>/dev/null
		local i
		for ((i = 0; i < 50; i++)); do
			alive "$GPUD_PID" || break
			sleep 0.1
		done
		alive "$GPUD_PID" && kill -KILL "$GPUD_PID" 2>/dev/null
		wait "$GPUD_PID" 2>/dev/null
	fi
	if $STOP_DOCKERD; then
		# dockerd.sh stop kills every container of the engine: leave it to
		# whoever else started containers on it meanwhile.
		local others
		others=$(timeout 10 docker ps -q 2>/dev/null | wc -l)
		if ((others > 0)); then
			echo "demo.sh: NOTE: leaving the Docker engine running: $others container(s) of others use it (scripts/dockerd.sh stop stops it)" >&2
		else
			"$ROOT/scripts/dockerd.sh" stop
		fi
	fi
	[[ -n $CTL ]] && exec {CTL}>&-
	[[ -n $ACK ]] && exec {ACK}>&-
	[[ -n $T ]] && rm -rf "$T"
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

STEP=0
BOLD="" PLAIN=""
if [[ -t 1 ]]; then BOLD=$'\033[1m' PLAIN=$'\033[0m'; fi
step() {
	STEP=$((STEP + 1))
	printf '\n%s== %d. %s%s\n' "$BOLD" "$STEP" "$*" "$PLAIN"
}
note() { printf '   %s\n' "$*"; }

# The table, half a second after the step (gpud rewrites the state file
# within milliseconds of an event).
show() {
	sleep 0.5
	"$GPUD" status --state-file "$T/state.json" | sed 's/^/   /'
}

# gpu_state N: GPU N's state in the table (free, busy, idle, lent).
gpu_state() {
	"$GPUD" status --state-file "$T/state.json" | awk -v g="$1" '$1 == g && !n++ { print $2 }'
}

T=$(mktemp -d /tmp/gpud-demo.XXXXXX)
mkdir -p "$T/bin"

# GPUs: real ones if the driver is here, fake ones otherwise.
if [[ -c /dev/nvidia0 && $(stat -L -c %t /dev/nvidia0) == c3 ]]; then
	DEV=/dev
	GPU0=/dev/nvidia0
	GPU1=/dev/nvidia1
	G1=1
	[[ -c $GPU1 ]] || { GPU1=$GPU0; G1=0; }
	echo "demo: real NVIDIA GPUs found; watching /dev"
else
	DEV=$T/dev
	mkdir -p "$DEV"
	mknod "$DEV/nvidia0" c 1 7   # the numbers of /dev/full
	mknod "$DEV/nvidia1" c 10 229 # the numbers of /dev/fuse
	GPU0=$DEV/nvidia0
	GPU1=$DEV/nvidia1
	G1=1
	echo "demo: no NVIDIA driver; fake GPUs $GPU0 (1:7, as /dev/full) and $GPU1 (10:229, as /dev/fuse)"
fi

# Demo processes get their names (comm) from the file they exec: symlinks
# to sleep named after their role.
SLEEP=$(command -v sleep)
for n in early-app gpu-app-child; do
	ln -s "$SLEEP" "$T/bin/$n"
done

# Docker, for the container step: an engine (if none answers) and the image.
DOCKER=false
if ! command -v docker >/dev/null 2>&1 || ! command -v dockerd >/dev/null 2>&1; then
	echo "demo: NOTE: Docker is not installed (scripts/deps.sh docker): the container step is skipped"
else
	if ! timeout 5 docker info >/dev/null 2>&1; then
		STOP_DOCKERD=true
		echo "demo: starting a private Docker engine (scripts/dockerd.sh)"
	fi
	if ! "$ROOT/scripts/dockerd.sh" start; then
		echo "demo: NOTE: the Docker engine could not be started: the container step is skipped"
	elif ! "$ROOT/scripts/image.sh" "$IMAGE"; then
		echo "demo: NOTE: the image $IMAGE could not be built: the container step is skipped"
	else
		DOCKER=true
	fi
fi

# A process that holds GPU 1 before gpud starts.
(exec 3<>"$GPU1" && exec -a sleep "$T/bin/early-app" 3600) </dev/null >/dev/null 2>&1 &
DEMO_PIDS+=($!)

"$GPUD" run --dev-dir "$DEV" --state-file "$T/state.json" --control-socket "$T/gpud.sock" \
	--state-dir "$T/lib" --checkpoint-root "$T/checkpoints" --idle-after "${IDLE_AFTER}s" --log-level info \
	--keep-enforcing=false \
	</dev/null >"$T/gpud.log" 2>&1 &
GPUD_PID=$!
for ((i = 0; i < 150; i++)); do
	[[ -s $T/state.json && -S $T/gpud.sock ]] && break
	alive "$GPUD_PID" || die "gpud exited during start"
	sleep 0.1
done
[[ -s $T/state.json ]] || die "gpud wrote no state file within 15 s"
echo "demo: gpud $("$GPUD" version | awk '{print $2}') running (pid $GPUD_PID), log $T/gpud.log"

# gpu-app: a host process that opens, forks and closes on command. It reads
# commands from a fifo and answers on another; bash builtins only, so it
# forks nothing but the child it is asked for.
mkfifo "$T/app.ctl" "$T/app.ack" "$T/park"
exec {CTL}<>"$T/app.ctl" {ACK}<>"$T/app.ack"
gpu_app() {
	printf gpu-app >/proc/self/comm
	local cmd
	while read -r cmd; do
		case $cmd in
		open) exec 3<>"$GPU0" ;;
		fork)
			(exec -a sleep "$T/bin/gpu-app-child" 3600) </dev/null >/dev/null 2>&1 &
			echo "$!" >"$T/child.pid"
			;;
		close) exec 3>&- ;;
		esac
		echo ok >"$T/app.ack"
	done
}
gpu_app <"$T/app.ctl" >/dev/null 2>&1 &
APP=$!
DEMO_PIDS+=("$APP")
app() {
	echo "$1" >&"$CTL"
	local ok
	read -r -t 5 ok <&"$ACK" || die "gpu-app did not do '$1'"
}

step "gpud started after early-app (pid ${DEMO_PIDS[0]}) opened GPU $G1: start-up reconciliation from /proc finds it"
show

step "gpu-app (pid $APP, a host process) opens GPU 0"
app open
show

app fork
CHILD=$(<"$T/child.pid")
DEMO_PIDS+=("$CHILD")
step "gpu-app forks gpu-app-child (pid $CHILD), which inherits the fd: both hold GPU 0"
show

step "gpu-app closes its fd; the child still holds GPU 0"
app close
show

if $DOCKER; then
	CID=$(docker run -d --rm --network none --device "$GPU0:/dev/nvidia0" "$IMAGE" \
		sh -c 'exec 3<>/dev/nvidia0; sleep 600')
	step "a process in Docker container ${CID:0:12} opens GPU 0 (CONTAINER column)"
	sleep 0.2
	if [[ $(docker inspect -f '{{.State.Running}}' "$CID" 2>/dev/null) != true ]]; then
		note "NOTE: the container exited at once (could it not open /dev/nvidia0?)"
		CID=""
	fi
	show
else
	step "(skipped: a process in a Docker container opens GPU 0; Docker is not available)"
fi

step "no new opens for more than --idle-after ${IDLE_AFTER}s: GPU 0 goes idle (GPU $G1, untouched since gpud started, is idle too)"
for ((i = 0; i < 4 * (IDLE_AFTER + 3); i++)); do
	[[ $(gpu_state 0) == idle ]] && break
	sleep 0.25
done
show

step "gpud monitor off; gpu-app opens GPU 0 again, unseen: the ledger is frozen"
"$GPUD" monitor --control-socket "$T/gpud.sock" off | sed 's/^/   /'
app open
show

step "gpud monitor on: gpud reconciles from /proc and finds gpu-app again"
"$GPUD" monitor --control-socket "$T/gpud.sock" on | sed 's/^/   /'
show

if [[ -n $CID ]]; then
	step "the container is stopped and the host processes killed: both GPUs are free"
else
	step "the host processes are killed: both GPUs are free"
fi
if [[ -n $CID ]]; then
	docker rm -f "$CID" >/dev/null
	CID=""
fi
kill_demo_procs
show

if $DOCKER; then
	# The priority rules: containers labelled gpud.io/priority=low|high.
	prio_ctr() { # NAME PRIORITY → container id, once gpud has classified it
		local id
		id=$(docker run -d --network none --name "gpud-demo-$1-$$" --label "gpud-demo=$$" --label "gpud.io/priority=$2" \
			--label "gpud.io/task-id=demo-$1" --device "$GPU0:/dev/nvidia0" "$IMAGE" \
			sh -c "trap 'exit 0' TERM; sleep 600 & wait")
		sleep 0.5 # gpud classifies it from Docker's start event
		echo "$id"
	}
	LOW=$(prio_ctr train low)
	docker exec -d "$LOW" sh -c 'exec 3<>/dev/nvidia0; exec sleep 600'
	step "container ${LOW:0:12}, labelled gpud.io/priority=low, opens the free GPU 0: allowed"
	show
	HIGH=$(prio_ctr serve high)
	docker exec -d "$HIGH" sh -c 'exec 3<>/dev/nvidia0; exec sleep 600'
	sleep 0.3
	step "container ${HIGH:0:12}, priority high, opens GPU 0: the low holder is killed, its container stopped"
	note "low container running: $(docker inspect -f '{{.State.Running}}' "$LOW")"
	note "resume notice for the task: $(cat "$T/checkpoints/demo-train/gpud-preempted.json" 2>/dev/null | tr -d '\n ' | cut -c1-90)…"
	show
	LOW2=$(prio_ctr retry low)
	step "another low-priority container opens GPU 0 while the high one holds it: the kernel refuses"
	note "inside the container: $(docker exec "$LOW2" sh -c 'exec 3<>/dev/nvidia0 && echo opened' 2>&1 | head -1)"
	show
fi

step "the state file behind the table ($T/state.json, gpud status -o json): the first GPU"
# Everything up to the end of gpus[0], then the closing brackets.
"$GPUD" status --state-file "$T/state.json" -o json | awk '
	done { next }
	{ print "   " $0 }
	/^    }/ { print "   ...\n   ]\n   ...\n   }"; done = 1 }'

printf '\ndemo: done; stopping gpud and cleaning up\n'
