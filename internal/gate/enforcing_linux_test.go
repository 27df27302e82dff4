package gate

import (
	"errors"
	"strings"
	"testing"

	v1 "github.com/gpud/gpud/api/v1"
	"github.com/gpud/gpud/bpf"
	"github.com/gpud/gpud/internal/occupancy"
)

// fakeProtection is the kernel's word on the gate: loaded or not, and the
// GPUs it protects.
type fakeProtection struct {
	err       error
	protected map[uint32]bool
}

func (p fakeProtection) GateErr() error            { return p.err }
func (p fakeProtection) Protected(gpu uint32) bool { return p.protected[gpu] }

var _ Protection = (*bpf.Monitor)(nil)

func TestDecorateShowsWhereTheRulesApply(t *testing.T) {
	doc := func() v1.StateFile { return v1.StateFile{GPUs: []v1.StateGPU{{Index: 0}, {Index: 1}}} }
	enforced := func(f v1.StateFile) []bool {
		var out []bool
		for _, g := range f.GPUs {
			out = append(out, g.Enforced != nil && *g.Enforced)
		}
		return out
	}
	k := fakeProtection{protected: map[uint32]bool{1: true}}
	monitoring := true
	r := newRig(t, 0, 1)
	r.c.Monitoring = func() bool { return monitoring }

	f := doc()
	r.c.Decorate(&f, k)
	if !f.Enforcing || !r.c.Enforcing() || enforced(f)[0] || !enforced(f)[1] {
		t.Fatalf("enforcing %v, enforced %v: want on, GPU 1 only (the one the gate protects)", f.Enforcing, enforced(f))
	}
	// A kernel that refuses the gate: the rules still apply after the
	// fact (Enforcing), never at open time.
	f = doc()
	r.c.Decorate(&f, fakeProtection{err: errors.New("refused"), protected: k.protected})
	if f.Enforcing || !r.c.Enforcing() {
		t.Fatalf("enforcing %v (Enforcing %v) with the gate refused: want off at open time only", f.Enforcing, r.c.Enforcing())
	}
	monitoring = false // nothing observed: nothing to rule on
	f = doc()
	r.c.Decorate(&f, k)
	if f.Enforcing || r.c.Enforcing() || enforced(f)[1] {
		t.Fatalf("enforcing %v, enforced %v with monitoring off", f.Enforcing, enforced(f))
	}
	monitoring, r.c.Enforce = true, false
	f = doc()
	r.c.Decorate(&f, k)
	if f.Enforcing || r.c.Enforcing() || enforced(f)[1] {
		t.Fatalf("enforcing %v, enforced %v without --enforce", f.Enforcing, enforced(f))
	}
}

func TestCountingCountsEachVerdict(t *testing.T) {
	r := newRig(t, 0)
	type verdict struct {
		gpu     int
		allowed bool
	}
	var got []verdict
	opened, handle := r.c.Counting(func(gpu int, allowed bool) { got = append(got, verdict{gpu, allowed}) })
	high := r.pod(200, 20, occupancy.High)
	r.ledger.hold(0, high)
	low := r.pod(301, 31, occupancy.Low)
	handle(event(bpf.EventDeny, 0, low, 1000))
	handle(event(bpf.EventGateHigh, 0, high, 2000))
	opened(high, 0, event(bpf.EventOpen, 0, high, 3000))
	if len(got) != 2 || got[0] != (verdict{0, false}) || got[1] != (verdict{0, true}) {
		t.Fatalf("counted %+v: want the refusal, then the recorded open (a high mark is no verdict)", got)
	}
	// The gate heard of the refusal too: its requester waits for GPU 0.
	r.ledger.release(0)
	r.c.Drained(10_000)
	if cg, ok := r.c.Reservation(0); !ok || cg != 31 {
		t.Fatalf("reservation %d %v: the counted refusal did not reach the gate", cg, ok)
	}
}

func TestReclaimedDropsWaitersOnlyWhenDone(t *testing.T) {
	r := newRig(t, 0)
	r.ledger.hold(0, r.pod(200, 20, occupancy.High))
	r.c.HandleEvent(event(bpf.EventDeny, 0, r.pod(301, 31, occupancy.Low), 1000))
	r.c.Reclaimed("pod/pod-31", errors.New("eviction refused"))
	if !strings.Contains(r.logs.String(), "reclaim failed") {
		t.Fatalf("a failed reclaim not warned of: %s", r.logs)
	}
	r.ledger.release(0)
	r.c.Drained(10_000)
	if cg, ok := r.c.Reservation(0); !ok || cg != 31 {
		t.Fatalf("reservation %d %v: a workload whose reclaim failed still waits", cg, ok)
	}
	r.c.Reclaimed("pod/pod-31", nil)
	if _, ok := r.c.Reservation(0); ok {
		t.Fatal("still reserved for a reclaimed workload")
	}
}

func TestTakeOverThenResync(t *testing.T) {
	r := newRig(t, 0)
	resyncs := 0
	resync := func() error { resyncs++; return errors.New("proc unreadable") }
	r.c.TakeOverThenResync(&fakePinned{k: r.kernel}, []chan struct{}{closed()}, resync)(t.Context())
	if resyncs != 1 || !strings.Contains(r.logs.String(), "resync after taking over the gate") {
		t.Fatalf("resyncs %d, logs %s: want one resync after the takeover, its failure logged", resyncs, r.logs)
	}
	r.c.TakeOverThenResync(&fakePinned{k: r.kernel, err: errors.New("link busy")}, nil, resync)(t.Context())
	if resyncs != 1 {
		t.Fatal("resynced although the old gate stayed")
	}
}
