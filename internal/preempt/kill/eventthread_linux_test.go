package kill

import (
	"runtime"
	"testing"
	"time"

	"github.com/gpud/gpud/internal/testutil"
	"golang.org/x/sys/unix"
)

func policy(t *testing.T) *unix.SchedAttr {
	t.Helper()
	a, err := unix.SchedGetAttr(0, 0)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// The event reader's thread is at SCHED_FIFO 1 from Enter; once it has
// spent its budget of CPU time in a window it is back at its own policy
// and nice, at the next window at SCHED_FIFO again, and after Leave at its
// own policy.
func TestEventThreadBudget(t *testing.T) {
	testutil.RequireRoot(t)
	done := make(chan struct{})
	go func() { // a goroutine of its own: Enter locks it to its thread
		defer close(done)
		r := &EventThread{Budget: 4 * time.Millisecond, Window: 60 * time.Millisecond}
		r.Enter()
		defer r.Leave()
		if err := unix.Setpriority(unix.PRIO_PROCESS, 0, 2); err != nil {
			t.Error(err)
			return
		}
		if a := policy(t); a.Policy != unix.SCHED_FIFO || a.Priority != 1 {
			t.Errorf("after Enter: policy %d priority %d, want SCHED_FIFO 1", a.Policy, a.Priority)
			return
		}
		// Spin, ticking, until over the budget: lowered.
		start := threadCPU()
		for threadCPU()-start < 3*r.Budget {
			r.Tick(time.Now())
		}
		if a := policy(t); a.Policy != unix.SCHED_NORMAL {
			t.Errorf("over the budget: policy %d, want SCHED_NORMAL", a.Policy)
		}
		if r.Demotions.Load() != 1 {
			t.Errorf("demotions %d, want 1", r.Demotions.Load())
		}
		time.Sleep(r.Window)
		r.Tick(time.Now())
		if a := policy(t); a.Policy != unix.SCHED_FIFO {
			t.Errorf("next window: policy %d, want SCHED_FIFO", a.Policy)
		}
	}()
	<-done
}

// Leave gives the thread its own scheduling back (nice included).
func TestEventThreadLeaveRestores(t *testing.T) {
	testutil.RequireRoot(t)
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := unix.Setpriority(unix.PRIO_PROCESS, 0, 3); err != nil {
			t.Error(err)
			return
		}
		r := NewEventThread(nil)
		r.Enter()
		r.Leave()
		if a := policy(t); a.Policy != unix.SCHED_NORMAL || a.Nice != 3 {
			t.Errorf("after Leave: policy %d nice %d, want SCHED_NORMAL nice 3", a.Policy, a.Nice)
		}
	}()
	<-done
}

// Refused real-time priority: the reader runs on, at normal priority, and
// Tick and Leave change nothing.
func TestEventThreadRefused(t *testing.T) {
	calls := 0
	schedSetAttr = func(int, *unix.SchedAttr, uint) error { calls++; return unix.EPERM }
	defer func() { schedSetAttr = unix.SchedSetAttr }()
	done := make(chan struct{})
	go func() {
		defer close(done)
		r := NewEventThread(nil)
		r.Enter()
		for i := 0; i < 3; i++ {
			r.Tick(time.Now().Add(time.Duration(i) * time.Second))
		}
		r.Leave()
	}()
	<-done
	if calls != 1 {
		t.Fatalf("real-time priority asked %d times, want once", calls)
	}
}
