package compute

import (
	"context"
	"encoding/binary"
	"fmt"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Why Run waits in ppoll on its own thread when it is raised (Thread): a
// late wake-up lengthens the holder's run and keeps the next one frozen
// (50–100 ms late with four spinning loops a CPU). Raising the thread
// alone would not help while it waits for a Go timer: the timer fires on
// whichever thread runs the Go scheduler's timers (one blocked in
// epoll_wait, or sysmon), at normal priority, behind the CPU hogs, and
// only then is the raised thread woken. Blocked in ppoll(2) with a
// timeout, the raised thread is woken by the kernel's timer itself (a
// real-time task's sleep has no timer slack) and preempts the hogs. Back
// from the system call it needs a Go P: between steps gpud is idle and
// its Ps are too, so it takes one at once (exitsyscall's fast path); when
// every P is busy it waits for the Go scheduler, as a timer wake-up
// would. An ordinary system call, not a raw one: the P is given back
// while the thread sleeps (a raw one would hold it, and the garbage
// collector's stop-the-world with it, for the whole wait). The step's
// work then runs on the raised thread too, and the freezes' wait
// (settle: ppoll on cgroup.events) is woken by the kernel in the same
// way; its CPU time is the Thread's to bound (kill.EventThread: a budget
// a window, then normal priority until the window ends).

// threadWaiter waits on the calling thread, in ppoll(2) on an eventfd
// that stop makes readable. mu keeps stop (from ctx's AfterFunc, on
// another goroutine) from writing to the descriptor once closed: its
// number may be another file's by then.
type threadWaiter struct {
	mu  sync.Mutex
	efd int // -1: closed
}

func newThreadWaiter() (*threadWaiter, error) {
	fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("compute: eventfd for the scheduler's wait: %w", err)
	}
	return &threadWaiter{efd: fd}, nil
}

// stop ends the current and every later wait.
func (w *threadWaiter) stop() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.efd < 0 {
		return
	}
	var b [8]byte
	binary.NativeEndian.PutUint64(b[:], 1)
	_, _ = unix.Write(w.efd, b[:]) // an eventfd's counter: it cannot fail for one write
}

// wait sleeps d, or until stop; it reports whether it slept d (false:
// stopped).
func (w *threadWaiter) wait(d time.Duration) bool {
	deadline := time.Now().Add(d)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return true
		}
		ts := unix.NsecToTimespec(left.Nanoseconds())
		fds := []unix.PollFd{{Fd: int32(w.efd), Events: unix.POLLIN}}
		n, err := unix.Ppoll(fds, &ts, nil)
		switch {
		case err == unix.EINTR:
		case err != nil:
			time.Sleep(left) // never seen: a valid eventfd and timeout
			return true
		case n > 0:
			return false
		}
	}
}

func (w *threadWaiter) close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	unix.Close(w.efd)
	w.efd = -1
}

// waitFor is how Run waits d between steps, until ctx ends (false then),
// and what ends it: with a Thread and the real clock, in ppoll on the
// raised thread (the calling goroutine is locked to it until done);
// otherwise on the Clock.
func (c *Controller) waitFor(ctx context.Context) (wait func(d time.Duration) bool, done func()) {
	onClock := func(d time.Duration) bool {
		select {
		case <-ctx.Done():
			return false
		case <-c.cfg.Clock.After(d):
			return true
		}
	}
	if _, real := c.cfg.Clock.(realClock); c.cfg.Thread == nil || !real {
		return onClock, func() {}
	}
	w, err := newThreadWaiter()
	if err != nil {
		c.cfg.Log.Warn("compute scheduler: waits at normal priority", "error", err)
		return onClock, func() {}
	}
	c.cfg.Thread.Enter()
	unhook := context.AfterFunc(ctx, w.stop)
	wait = func(d time.Duration) bool {
		c.cfg.Thread.Tick(time.Now()) // after the step's work: its CPU time counted
		return ctx.Err() == nil && w.wait(d)
	}
	return wait, func() {
		unhook()
		w.close()
		c.cfg.Thread.Leave()
	}
}
