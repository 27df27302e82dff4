package executor

import (
	"testing"
	"time"

	"github.com/gpud/gpud/internal/preempt"
)

// Resume asks held outside the executor's lock: held takes the ledger's
// and the lender's locks, and the event thread's preemption path takes
// the executor's (a normal-priority goroutine preempted while it held
// both would hold the preemption up). A held that takes the executor's
// lock itself shows it: it would deadlock under it.
func TestResumeAsksHeldOutsideItsLock(t *testing.T) {
	e := &Executor{ProcRoot: "/proc"}
	v := preempt.Victim{}
	v.PID = 4242
	e.susp = map[string]*suspension{"/a": {path: "/a", gpus: map[int]bool{0: true}, victims: []preempt.Victim{v}, resumeAfter: time.Now().Add(-time.Second)}}
	asked := 0
	done := make(chan struct{})
	go func() {
		defer close(done)
		e.Resume(func(gpu int) preempt.Holding {
			asked++
			e.Handled(v) // takes e.mu
			return preempt.Holding{}
		})
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Resume asked held under its lock")
	}
	e.Wait()
	if asked != 1 {
		t.Fatalf("held asked %d times for one GPU, want 1", asked)
	}
	if len(e.Suspensions()) != 0 {
		t.Fatalf("suspensions %+v: want the one on a GPU without high priority ended", e.Suspensions())
	}
}
