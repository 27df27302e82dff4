package kill

import (
	"log/slog"
	"runtime"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// The event thread's budget at real-time priority: EventThreadBudget of
// CPU time in each EventThreadWindow (a fifth of one CPU). The reader of
// the gate's events waits on the ring buffer almost all the time; a flood
// of opens (hundreds of thousands a second) would keep it busy, and above
// the budget it reads them at its normal priority, as it did before.
const (
	EventThreadBudget = 20 * time.Millisecond
	EventThreadWindow = 100 * time.Millisecond
)

// EventThread keeps the goroutine that reads the kernel's events
// (occupancy.Tracker.Run, through its Thread field) on one OS thread at
// SCHED_FIFO priority 1 while that thread stays within Budget of CPU time
// in each Window. Why: with every CPU busy at normal priority (a training
// job's data loaders), the reader's wakeup after the gate's decision
// waited for the scheduler to let it in: p99 5.4 ms of decision → event
// read on the 2-vCPU CI machine with a spinning loop per CPU, most of
// gpud's part of a preemption (docs/benchmarks.md). A real-time thread
// woken from its epoll_wait runs at once. Above its budget the thread goes
// back to its own policy until the window ends (Demotions counts those
// windows), so that gpud never takes more than that from the node's work;
// the kernel's own real-time throttling (sched_rt_runtime_us) bounds it
// too. Where real-time priority is refused, the thread stays at its normal
// priority, and that is said once.
type EventThread struct {
	Log *slog.Logger
	// Name is the thread's, in its log lines ("thread"); "": "event reader".
	// The compute scheduler's loop is raised by one too (compute.Config.Thread).
	Name   string
	Budget time.Duration
	Window time.Duration
	// Demotions counts the windows in which the budget ran out.
	Demotions atomic.Uint64

	old       *unix.SchedAttr // the thread's own scheduling, nil: not raised
	on        bool            // at SCHED_FIFO now
	winEnd    time.Time
	cpuAtWin  time.Duration
	nextCheck time.Time
}

// NewEventThread is an EventThread with the default budget.
func NewEventThread(log *slog.Logger) *EventThread {
	return &EventThread{Log: log, Budget: EventThreadBudget, Window: EventThreadWindow}
}

func (r *EventThread) log() *slog.Logger {
	l, name := r.Log, r.Name
	if l == nil {
		l = slog.Default()
	}
	if name == "" {
		name = "event reader"
	}
	return l.With("thread", name)
}

// Enter locks the calling goroutine to its thread and raises the thread.
func (r *EventThread) Enter() {
	runtime.LockOSThread()
	old, err := unix.SchedGetAttr(0, 0)
	if err != nil {
		r.log().Warn("a raised thread runs at normal priority: reading its scheduling", "error", err)
		return
	}
	if err := schedSetAttr(0, fifo1(), 0); err != nil {
		r.log().Warn("a raised thread runs at normal priority: real-time priority refused", "error", err)
		return
	}
	r.old, r.on = old, true
	r.startWindow(time.Now())
}

func fifo1() *unix.SchedAttr {
	return &unix.SchedAttr{Size: unix.SizeofSchedAttr, Policy: unix.SCHED_FIFO, Priority: 1}
}

func (r *EventThread) startWindow(now time.Time) {
	r.winEnd = now.Add(r.Window)
	r.cpuAtWin = threadCPU()
	r.nextCheck = now.Add(r.Budget / 4)
}

// threadCPU is the calling thread's CPU time (a syscall: read every
// Budget/4 of wall time at most, not per event).
func threadCPU() time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts); err != nil {
		return 0
	}
	return time.Duration(ts.Nano())
}

// Tick is called on the thread after each wakeup's work, with the time.
// It lowers the thread to its own scheduling once the window's budget is
// spent, and raises it again in the next window.
func (r *EventThread) Tick(now time.Time) {
	if r.old == nil || now.Before(r.nextCheck) {
		return
	}
	r.nextCheck = now.Add(r.Budget / 4)
	if !now.Before(r.winEnd) {
		r.startWindow(now)
		if !r.on && schedSetAttr(0, fifo1(), 0) == nil {
			r.on = true
		}
		return
	}
	if r.on && threadCPU()-r.cpuAtWin > r.Budget {
		if err := schedSetAttr(0, r.old, 0); err != nil {
			r.log().Error("lowering a raised thread's priority", "error", err)
			return
		}
		r.on = false
		r.Demotions.Add(1)
		r.log().Debug("a raised thread over its real-time budget: normal priority until the window ends", "budget", r.Budget, "window", r.Window)
	}
}

// Leave restores the thread's own scheduling and unlocks it.
func (r *EventThread) Leave() {
	if r.old != nil && r.on {
		if err := schedSetAttr(0, r.old, 0); err != nil {
			// The thread stays locked: Go ends it with its goroutine
			// rather than let other goroutines run on it at real-time.
			r.log().Error("restoring a raised thread's scheduling; the thread is kept apart", "error", err)
			return
		}
	}
	r.old, r.on = nil, false
	runtime.UnlockOSThread()
}
