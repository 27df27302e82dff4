package kill

import (
	"runtime"
	"testing"

	"github.com/gpud/gpud/internal/testutil"
	"golang.org/x/sys/unix"
)

// The signals run at SCHED_FIFO, and the thread gets its own policy and
// nice back after them.
func TestAtRealtimeRealtimeThenRestored(t *testing.T) {
	testutil.RequireRoot(t)
	rtRefused.Store(false)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	before, err := unix.SchedGetAttr(0, 0)
	if err != nil {
		t.Fatal(err)
	}
	// A nice of its own, to see that it comes back.
	if err := unix.Setpriority(unix.PRIO_PROCESS, unix.Gettid(), 3); err != nil {
		t.Fatal(err)
	}
	defer unix.SchedSetAttr(0, before, 0)
	var inside *unix.SchedAttr
	if !AtRealtime(nil, func() { inside, _ = unix.SchedGetAttr(0, 0) }) {
		t.Fatal("AtRealtime: not at real-time priority as root")
	}
	if inside == nil || inside.Policy != unix.SCHED_FIFO || inside.Priority != 1 {
		t.Fatalf("inside the burst: %+v, want SCHED_FIFO priority 1", inside)
	}
	after, err := unix.SchedGetAttr(0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if after.Policy != unix.SCHED_NORMAL || after.Nice != 3 {
		t.Fatalf("after the burst: policy %d nice %d, want SCHED_NORMAL nice 3", after.Policy, after.Nice)
	}
}

// Refused real-time priority: the signals are still sent, at normal
// priority, and later bursts do not ask again.
func TestAtRealtimeRefused(t *testing.T) {
	calls := 0
	schedSetAttr = func(int, *unix.SchedAttr, uint) error { calls++; return unix.EPERM }
	rtRefused.Store(false)
	defer func() { schedSetAttr = unix.SchedSetAttr; rtRefused.Store(false) }()
	for i := 0; i < 3; i++ {
		sent := false
		if AtRealtime(nil, func() { sent = true }) {
			t.Fatal("AtRealtime reported real-time priority that was refused")
		}
		if !sent {
			t.Fatal("the signals were not sent")
		}
	}
	if calls != 1 {
		t.Fatalf("real-time priority asked %d times, want once", calls)
	}
	if !rtRefused.Load() {
		t.Fatal("the refusal was not remembered")
	}
}
