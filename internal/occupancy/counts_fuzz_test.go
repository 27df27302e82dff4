package occupancy

import (
	"maps"
	"math/rand/v2"
	"testing"
	"time"
)

// ledgerOps drives a ledger through the operations that change its holders
// (opens, closes, exits, /proc reads, full resyncs, PID reuse, agents,
// reclassification), read from ops, and checks after each one that the
// per-GPU counts kept incrementally equal those a walk of every process
// finds, and that a GPU reads Free exactly when no holder holds it.
func ledgerOps(t *testing.T, ops []byte) {
	t.Helper()
	const gpus = 3
	l := NewLedger(testGPUs(gpus), time.Hour)
	// The counts and their version after the last step: the gate skips its
	// pass over the GPUs while the version is unchanged.
	var lastCounts map[int]ClassCounts
	lastGen := ^uint64(0)
	next := func() int {
		if len(ops) == 0 {
			return 0
		}
		b := ops[0]
		ops = ops[1:]
		return int(b)
	}
	info := func(b int) ProcInfo {
		pi := ProcInfo{PID: 1 + b%5, StartTime: uint64(1 + (b>>3)%2), Priority: []Priority{High, Low, Unmanaged, Unclassified}[(b>>4)%4]}
		pi.Agent = (b>>6)%4 == 0
		return pi
	}
	fdsOf := func(b int) map[int][]int32 {
		m := map[int][]int32{}
		for gpu := 0; gpu <= gpus; gpu++ { // gpus itself: a GPU the ledger does not track
			if b&(1<<gpu) != 0 {
				m[gpu] = []int32{int32(3 + gpu), int32(3 + (b>>4)%3)}
			}
		}
		return m
	}
	at := t0
	for step := 0; len(ops) > 0; step++ {
		at = at.Add(time.Second)
		op, a, b := next()%7, next(), next()
		switch op {
		case 0, 1:
			l.AddFD(info(a), b%(gpus+1), int32(3+(b>>2)%3), at)
		case 2:
			l.RemoveFD(1+a%5, b%(gpus+1), int32(3+(b>>2)%3))
		case 3:
			l.RemoveProcess(1 + a%5)
		case 4:
			l.SetProcess(ProcFDs{Info: info(a), FDs: fdsOf(b)}, at)
		case 5:
			var all []ProcFDs
			for i := 0; i < b%4; i++ {
				all = append(all, ProcFDs{Info: info(a + 17*i), FDs: fdsOf(b >> i)})
			}
			l.ReplaceAll(all, at)
		case 6:
			l.Reclassify(func(p *ProcInfo) {
				p.Priority = []Priority{High, Low, Unmanaged, Unclassified}[(p.PID+a)%4]
				p.Agent = (p.PID+b)%5 == 0
			})
		}
		l.mu.Lock()
		want, held := l.recount()
		l.mu.Unlock()
		if got := l.Counts(); !maps.Equal(got, want) {
			t.Fatalf("step %d (op %d): Counts() = %v, a walk of every process finds %v", step, op, got, want)
		}
		if got, gen := l.CountsVersioned(); gen == lastGen && !maps.Equal(got, lastCounts) {
			t.Fatalf("step %d (op %d): counts %v at version %d, %v before at the same version", step, op, got, gen, lastCounts)
		} else {
			lastCounts, lastGen = maps.Clone(got), gen
		}
		snap := l.Snapshot(at)
		for _, g := range snap.GPUs {
			if got := l.CountsOf(g.Index); got != want[g.Index] {
				t.Fatalf("step %d (op %d): CountsOf(%d) = %v, want %v", step, op, g.Index, got, want[g.Index])
			}
			if free := g.State == Free; free != (held[g.Index] == 0) || len(g.Holders) != int(held[g.Index]) {
				t.Fatalf("step %d (op %d): GPU %d is %s with %d holders, a walk finds %d", step, op, g.Index, g.State, len(g.Holders), held[g.Index])
			}
		}
	}
}

// TestCountsIncremental: the counts kept at each change equal the walk's,
// over many random sequences of changes.
func TestCountsIncremental(t *testing.T) {
	r := rand.New(rand.NewPCG(31, 2))
	for i := 0; i < 2000; i++ {
		ops := make([]byte, 3*(1+r.IntN(40)))
		for j := range ops {
			ops[j] = byte(r.UintN(256))
		}
		ledgerOps(t, ops)
	}
}

func FuzzCountsIncremental(f *testing.F) {
	f.Add([]byte{0, 0x10, 1, 0, 0x21, 2, 6, 1, 2, 3, 0, 0})
	f.Add([]byte{4, 0x18, 0x0f, 0, 0x08, 1, 5, 3, 0xff, 2, 1, 1})
	f.Fuzz(func(t *testing.T, ops []byte) {
		if len(ops) > 600 {
			return
		}
		ledgerOps(t, ops)
	})
}
