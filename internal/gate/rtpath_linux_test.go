package gate

import (
	"slices"
	"testing"
	"time"

	"github.com/gpud/gpud/bpf"
	"github.com/gpud/gpud/internal/occupancy"
)

// The event thread's preemption path does not take the gate's lock: Sync
// holds it (map writes, the ledger's counts) on a goroutine at normal
// priority, which a busy node preempts for milliseconds while it holds
// it. Here the lock is held throughout; the preemption must not wait.
func TestHighOpenIsActedOnWhileTheGateLockIsHeld(t *testing.T) {
	r := newRig(t, 0)
	low, high := r.pod(101, 11, occupancy.Low), r.pod(200, 20, occupancy.High)
	r.ledger.hold(0, low)
	r.c.mu.Lock()
	defer r.c.mu.Unlock()
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.c.HandleEvent(event(bpf.EventGateHigh, 0, high, 1000))
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("the high open's preemption waited for the gate's lock")
	}
	if p := r.onePreemption(); !p.now || !slices.Equal(p.pids(), []int{101}) {
		t.Fatalf("preemption %+v: want PreemptNow of the low holder 101", p)
	}
	if got := r.loans.takeBacks(); !slices.Equal(got, []int{0}) {
		t.Fatalf("take-backs %v, want GPU 0", got)
	}
}
