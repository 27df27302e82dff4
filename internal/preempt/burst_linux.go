package preempt

import (
	"runtime"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// Why a batch's signals are sent at real-time priority: the first SIGKILL
// wakes every thread of its victim, and on a node with few CPUs they
// preempt gpud's thread before it signals the next victim. The next one
// then waits behind the first one's teardown (its address space unmapped,
// its files closed), and the victims die one after another instead of
// together. On the 2-vCPU CI machine that was the tail of gpud's own part
// of a kill: open → both victims signalled p99 2.0–2.6 ms, 0.9–1.2 ms with
// the signals sent at SCHED_FIFO (docs/benchmarks.md).
//
// The section is a loop of pidfd_send_signal calls, one per victim of a
// batch (bounded by the GPU's holders), which never blocks; the thread is
// back to its own policy and nice before anything else runs on it. Where
// real-time priority is refused (no CAP_SYS_NICE, or a cgroup v1 cpu
// controller with RT group scheduling and no runtime for gpud's cgroup),
// the signals are sent at gpud's normal priority, and that is said once.

// schedSetAttr is unix.SchedSetAttr; a variable so that a test can refuse it.
var schedSetAttr = unix.SchedSetAttr

// rtRefused is set once real-time priority was refused: later batches do
// not ask again.
var rtRefused atomic.Bool

// signalBurst runs send (the signals of one batch) on a locked thread at
// SCHED_FIFO priority 1, restoring the thread's own scheduling after it.
// It reports whether send ran at real-time priority.
func (e *Executor) signalBurst(send func()) bool {
	if rtRefused.Load() {
		send()
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
			e.log().Warn("kill signals are sent at normal priority: real-time priority refused", "error", err)
		}
		send()
		return false
	}
	send()
	if err := schedSetAttr(0, old, 0); err != nil {
		// Never seen: the thread's policy was just read. Rather than leave
		// it real-time, the default policy; the thread stays locked (Go
		// ends it with its goroutine) if even that fails.
		e.log().Error("restoring the signalling thread's scheduling", "error", err)
		if err := schedSetAttr(0, &unix.SchedAttr{Size: unix.SizeofSchedAttr, Policy: unix.SCHED_NORMAL}, 0); err != nil {
			e.log().Error("resetting the signalling thread's scheduling; the thread is kept apart", "error", err)
			return true
		}
	}
	runtime.UnlockOSThread()
	return true
}
