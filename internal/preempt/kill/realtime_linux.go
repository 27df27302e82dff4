package kill

import (
	"log/slog"
	"runtime"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// Why a decision's action runs at real-time priority: on a node with few
// CPUs, gpud's thread between a decision and its signals competes with
// everything else, the victims included. The first SIGKILL wakes every
// thread of its victim, and they preempted gpud's thread before it
// signalled the next victim, which then waited behind the first one's
// teardown (its address space unmapped, its files closed): the victims
// died one after the other instead of together. Before that, the victims'
// identity and last checks (reads of /proc) and the intents' write were
// preempted by whatever else ran. On the 2-vCPU CI machine, gpud's own part
// of a kill (open → both victims signalled) had p99 2.0–2.6 ms; with the
// signals alone at SCHED_FIFO 0.9–1.2 ms; with the whole action at
// SCHED_FIFO 0.58–0.64 ms (docs/benchmarks.md, d⁵ and d⁶).
//
// The section is bounded: a pidfd open, a /proc read or two and a signal
// per victim of one decision (a GPU's holders; more than a few are checked
// by worker goroutines at normal priority while this thread sleeps), one
// journal write, and a cgroup.freeze write per workload to freeze. The
// thread is back to its own policy and nice before anything else runs on
// it. Where real-time priority is refused (no CAP_SYS_NICE, or a cgroup v1
// cpu controller with RT group scheduling and no runtime for gpud's
// cgroup), the action runs at gpud's normal priority, and that is said
// once.

// schedSetAttr is unix.SchedSetAttr; a variable so that a test can refuse it.
var schedSetAttr = unix.SchedSetAttr

// rtRefused is set once real-time priority was refused: later actions do
// not ask again.
var rtRefused atomic.Bool

// AtRealtime runs act on a locked thread at SCHED_FIFO priority 1,
// restoring the thread's own scheduling after it. It reports whether act
// ran at real-time priority. log (nil: slog's default) is told once that
// real-time priority was refused.
func AtRealtime(log *slog.Logger, act func()) bool {
	if log == nil {
		log = slog.Default()
	}
	if rtRefused.Load() {
		act()
		return false
	}
	runtime.LockOSThread()
	old, err := unix.SchedGetAttr(0, 0)
	if err == nil {
		err = schedSetAttr(0, &unix.SchedAttr{Size: unix.SizeofSchedAttr, Policy: unix.SCHED_FIFO, Priority: 1}, 0)
	}
	if err != nil {
		runtime.UnlockOSThread()
		if !rtRefused.Swap(true) {
			log.Warn("preemptions run at normal priority: real-time priority refused", "error", err)
		}
		act()
		return false
	}
	defer func() {
		if err := schedSetAttr(0, old, 0); err != nil {
			// Never seen: the thread's policy was just read. Rather than
			// leave it real-time, the default policy; the thread stays
			// locked (Go ends it with its goroutine) if even that fails.
			log.Error("restoring the preempting thread's scheduling", "error", err)
			if err := schedSetAttr(0, &unix.SchedAttr{Size: unix.SizeofSchedAttr, Policy: unix.SCHED_NORMAL}, 0); err != nil {
				log.Error("resetting the preempting thread's scheduling; the thread is kept apart", "error", err)
				return
			}
		}
		runtime.UnlockOSThread()
	}()
	act()
	return true
}
