#!/usr/bin/env bash
# scripts/dockerd.sh start|stop|status — a private Docker engine for tests.
#
# Why: the privileged tests run real containers (fake GPU device nodes passed
# with --device). CI machines have Debian's docker.io installed (scripts/deps.sh
# docker) but no engine running, and images cannot be pulled, so no network
# setup is needed: the engine runs without iptables and without a bridge.
# If an engine already answers on /var/run/docker.sock it is used and left
# alone; `stop` only stops an engine that `start` started (marker file).
# dockerd starts and manages its own containerd when none is given.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

SOCK=/var/run/docker.sock
PIDFILE=/run/gpud-test-dockerd.pid
MARKER=/run/gpud-test-dockerd.started
DATA_ROOT=/var/lib/gpud-test-docker
EXEC_ROOT=/run/gpud-test-docker
LOG=/tmp/gpud-test-dockerd.log
START_TIMEOUT=30
STOP_TIMEOUT=20

die() { echo "dockerd.sh: $*" >&2; exit 1; }

# The last lines the engine logged since the latest start.
log_tail() {
	awk '/^=== .* dockerd.sh start$/ { n = 0 } { l[n++] = $0 } END { for (i = (n > 30 ? n - 30 : 0); i < n; i++) print l[i] }' "$LOG" >&2
}

answers() {
	command -v docker >/dev/null 2>&1 || return 1
	timeout 5 docker -H "unix://$SOCK" info >/dev/null 2>&1
}

# Running and not a zombie (an engine that died as our child stays a zombie).

# alive and named $2 (guards against pid reuse).
running() { alive "$1" && [[ $(cat "/proc/$1/comm" 2>/dev/null) == "$2" ]]; }

# The pid of the engine we started, if it still runs (empty otherwise).
our_pid() {
	[[ -f $MARKER ]] || return 0
	local pid=""
	[[ -s $PIDFILE ]] && pid=$(<"$PIDFILE")
	alive "$pid" || pid=$(<"$MARKER")
	if running "$pid" dockerd; then
		echo "$pid"
	fi
}

start() {
	if answers; then
		return 0 # ours from an earlier start, or a pre-existing engine
	fi
	[[ $(id -u) -eq 0 ]] || die "must run as root"
	command -v dockerd >/dev/null 2>&1 || die "dockerd not found (run scripts/deps.sh docker)"
	command -v docker >/dev/null 2>&1 || die "docker CLI not found (run scripts/deps.sh docker)"

	# A previous engine of ours that no longer answers: clean it up first.
	if [[ -f $MARKER ]]; then
		stop
	fi

	# dockerd and its managed containerd trust their pid files if kill(pid, 0)
	# succeeds, which it does for an unreaped zombie (PID 1 of some sandboxes
	# reaps slowly): drop pid files whose process is dead.
	if [[ -e $PIDFILE ]] && ! running "$(cat "$PIDFILE" 2>/dev/null)" dockerd; then
		rm -f "$PIDFILE"
	fi
	local cpidfile=$EXEC_ROOT/containerd/containerd.pid
	if [[ -e $cpidfile ]] && ! running "$(cat "$cpidfile" 2>/dev/null)" containerd; then
		rm -f "$cpidfile"
	fi

	mkdir -p "$DATA_ROOT" "$EXEC_ROOT"
	echo "=== $(date -Is) dockerd.sh start" >>"$LOG"
	# setsid: own session, so the engine outlives the calling shell/make and
	# gets no terminal signals. In a non-interactive shell the background job
	# is not a group leader, so setsid execs dockerd directly and $! is its pid.
	setsid dockerd \
		--iptables=false --ip6tables=false --bridge=none \
		--host "unix://$SOCK" \
		--pidfile "$PIDFILE" \
		--data-root "$DATA_ROOT" \
		--exec-root "$EXEC_ROOT" \
		</dev/null >>"$LOG" 2>&1 &
	local pid=$!
	disown "$pid" # no "Killed" job notice if we have to SIGKILL it
	echo "$pid" >"$MARKER"

	local deadline=$((SECONDS + START_TIMEOUT))
	until answers; do
		if ! alive "$pid"; then
			echo "dockerd.sh: dockerd exited during start; last log lines:" >&2
			log_tail
			rm -f "$MARKER"
			exit 1
		fi
		if ((SECONDS >= deadline)); then
			echo "dockerd.sh: dockerd did not answer within ${START_TIMEOUT}s; last log lines:" >&2
			log_tail
			stop
			exit 1
		fi
		sleep 0.2
	done
}

stop() {
	if [[ ! -f $MARKER ]]; then
		return 0 # not started by us: leave any engine alone
	fi
	local pid
	pid=$(our_pid)
	if [[ -n $pid ]]; then
		# On SIGTERM dockerd stops running containers with a 10 s grace
		# period each (`sleep` as PID 1 ignores SIGTERM); the engine is
		# private to the tests, so kill leftover containers right away.
		if answers; then
			local ids
			ids=$(timeout 10 docker -H "unix://$SOCK" ps -q 2>/dev/null || true)
			if [[ -n $ids ]]; then
				# shellcheck disable=SC2086
				timeout 20 docker -H "unix://$SOCK" kill $ids >/dev/null 2>&1 || true
			fi
		fi
		kill -TERM "$pid" 2>/dev/null || true
		local deadline=$((SECONDS + STOP_TIMEOUT))
		while alive "$pid" && ((SECONDS < deadline)); do
			sleep 0.2
		done
		if alive "$pid"; then
			echo "dockerd.sh: dockerd $pid ignored SIGTERM for ${STOP_TIMEOUT}s; sending SIGKILL" >&2
			kill -KILL "$pid" 2>/dev/null || true
			while alive "$pid"; do sleep 0.1; done
		fi
	fi
	# The containerd that dockerd manages normally exits with it; after a
	# SIGKILL (or a crash) it can be left behind.
	local cpid=""
	[[ -s $EXEC_ROOT/containerd/containerd.pid ]] && cpid=$(<"$EXEC_ROOT/containerd/containerd.pid")
	if running "$cpid" containerd; then
		kill -TERM "$cpid" 2>/dev/null || true
		local deadline=$((SECONDS + STOP_TIMEOUT))
		while alive "$cpid" && ((SECONDS < deadline)); do sleep 0.2; done
		alive "$cpid" && kill -KILL "$cpid" 2>/dev/null || true
	fi
	# See start: a zombie must not pass for a running containerd.
	rm -f "$EXEC_ROOT/containerd/containerd.pid"
	# dockerd bind-mounts its data root onto itself (to make it shared) and
	# undoes that on a clean shutdown only; after a crash the mount stays,
	# and the next dockerd would then never unmount it.
	if [[ -e $EXEC_ROOT/unmount-on-shutdown ]]; then
		if mountpoint -q "$DATA_ROOT" 2>/dev/null; then
			umount "$DATA_ROOT" 2>/dev/null || umount -l "$DATA_ROOT" 2>/dev/null || true
		fi
		rm -f "$EXEC_ROOT/unmount-on-shutdown"
	fi
	# Our engine is gone; a socket nobody answers on is stale.
	if [[ -S $SOCK ]] && ! answers; then
		rm -f "$SOCK"
	fi
	rm -f "$MARKER" "$PIDFILE"
}

status() {
	local pid
	pid=$(our_pid)
	if answers; then
		if [[ -n $pid ]]; then
			echo "running (started by scripts/dockerd.sh, pid $pid)"
		else
			echo "running (not started by scripts/dockerd.sh; left alone)"
		fi
		return 0
	fi
	if [[ -n $pid ]]; then
		echo "not answering (started by scripts/dockerd.sh, pid $pid; see $LOG)"
		return 1
	fi
	if [[ -f $MARKER ]]; then
		echo "stopped (an engine started by scripts/dockerd.sh died; see $LOG)"
	else
		echo "stopped"
	fi
	return 3
}

case "${1:-}" in
start) start ;;
stop) stop ;;
status) status ;;
*) die "usage: $0 start|stop|status" ;;
esac
