package gate

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/gpud/gpud/bpf"
	"github.com/gpud/gpud/internal/occupancy"
)

func (l *fakeLoans) askedCount() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.asked
}

// Under a churn of opens the ring buffer drains at nearly every event: a
// drain that changes nothing the policy is made of, within confirmEvery of
// the last pass, works nothing out again (the pass over every GPU was 39 %
// of gpud's CPU under the big node's churn), asks the lender only about the
// GPUs high priority holds, and still lets suspended workloads resume.
func TestDrainWithNothingChangedSkipsThePass(t *testing.T) {
	r := newRig(t, 0, 1, 2)
	r.ledger.hold(0, r.pod(200, 20, occupancy.High), r.pod(101, 11, occupancy.Low))
	r.ledger.hold(1, r.pod(102, 12, occupancy.Low))
	r.loans.lend(2)

	const t0 = uint64(5 * time.Millisecond)
	r.c.Drained(t0)
	pushes, asked, resumes, passes := r.kernel.pushCount(), r.loans.askedCount(), r.exec.resumes, r.c.passes
	if pushes != 3 {
		t.Fatalf("%d pushes at the first drain, want one per GPU", pushes)
	}
	for i := uint64(1); i <= 50; i++ {
		r.c.Drained(t0 + i*uint64(confirmEvery)/100)
	}
	if r.kernel.pushCount() != pushes || r.loans.askedCount() != asked+50 || r.c.passes != passes {
		t.Fatalf("50 drains with nothing changed: %d pushes, %d passes, the lender asked %d times; want none, none, 50 (GPU 0's loan)",
			r.kernel.pushCount()-pushes, r.c.passes-passes, r.loans.askedCount()-asked)
	}
	if r.exec.resumes != resumes+50 {
		t.Fatalf("resume asked %d times in 50 drains, want every time", r.exec.resumes-resumes)
	}
	// Re-confirmed once confirmEvery has passed, as before.
	r.c.Drained(t0 + uint64(confirmEvery))
	for gpu := range 3 {
		if _, conf := r.kernel.gpuPolicy(gpu); conf != t0+uint64(confirmEvery) {
			t.Fatalf("GPU %d confirmed %d, want %d", gpu, conf, t0+uint64(confirmEvery))
		}
	}
}

// Each input of the policy that changes makes the next drain's pass, however
// soon after the last one.
func TestDrainAfterAChangeMakesThePass(t *testing.T) {
	r := newRig(t, 0, 1, 2)
	r.c.TTL = 100 * time.Microsecond // ends within confirmEvery
	high := r.pod(200, 20, occupancy.High)
	r.ledger.hold(0, high)
	mono := uint64(5 * time.Millisecond)
	drain := func() {
		mono += 10 * uint64(time.Microsecond)
		r.c.Drained(mono)
	}
	drain()
	policy := func(gpu int) bpf.GPUPolicy {
		p, _ := r.kernel.gpuPolicy(gpu)
		return p
	}

	// Counts.
	r.ledger.hold(1, r.pod(101, 11, occupancy.Low))
	drain()
	if p := policy(1); p != (bpf.GPUPolicy{Low: 1}) {
		t.Fatalf("GPU 1 after a low open: %+v", p)
	}
	// A loan the lender made or ended itself.
	r.loans.lend(0)
	drain()
	if p := policy(0); p != (bpf.GPUPolicy{}) {
		t.Fatalf("GPU 0 lent: %+v, want its idle owner not holding it", p)
	}
	r.loans.TakeBack(0)
	drain()
	if p := policy(0); p != (bpf.GPUPolicy{High: 1}) {
		t.Fatalf("GPU 0 taken back: %+v", p)
	}

	// A refused waiter gets the free GPU reserved.
	w := r.pod(301, 31, occupancy.Low)
	r.c.HandleEvent(event(bpf.EventDeny, 2, w, mono))
	drain()
	if p := policy(2); p.ReservedCgroup != 31 || p.ReservedUntil != mono+uint64(r.c.TTL) {
		t.Fatalf("GPU 2 after a refusal: %+v, want reserved for cgroup 31 until %d", p, mono+uint64(r.c.TTL))
	}
	// Its open fulfils the reservation.
	r.c.HandleEvent(event(bpf.EventOpen, 2, w, mono))
	drain()
	if p := policy(2); p != (bpf.GPUPolicy{}) {
		t.Fatalf("GPU 2 after its waiter's open: %+v, want no reservation", p)
	}
	// A reservation that ends.
	r.c.HandleEvent(event(bpf.EventDeny, 2, r.pod(302, 32, occupancy.Low), mono))
	drain()
	if p := policy(2); p.ReservedCgroup != 32 {
		t.Fatalf("GPU 2 after a second refusal: %+v", p)
	}
	end := mono + uint64(r.c.TTL)
	for mono <= end {
		drain()
	}
	if p := policy(2); p != (bpf.GPUPolicy{}) {
		t.Fatalf("GPU 2 at %d, its reservation ended at %d: %+v", mono, end, p)
	}

	// A write that failed is tried again at the next drain.
	r.kernel.mu.Lock()
	r.kernel.failPolicy = map[uint32]bool{1: true}
	r.kernel.mu.Unlock()
	r.ledger.hold(1, r.pod(102, 12, occupancy.Low))
	drain()
	if p := policy(1); p != (bpf.GPUPolicy{Low: 1}) {
		t.Fatalf("GPU 1 written although its write failed: %+v", p)
	}
	r.kernel.mu.Lock()
	r.kernel.failPolicy = nil
	r.kernel.mu.Unlock()
	drain()
	if p, conf := r.kernel.gpuPolicy(1); p != (bpf.GPUPolicy{Low: 2}) || conf != mono {
		t.Fatalf("GPU 1 after its failed write: %+v confirmed %d, want low 2 confirmed %d", p, conf, mono)
	}
}

// BenchmarkDrained is one drain of the event ring with nothing changed, on
// 8 GPUs each held by 64 low-priority processes (the big node's, in the
// daemon's ledger): what the event thread pays after nearly every event
// under a churn of opens.
func BenchmarkDrained(b *testing.B) {
	r := newRig(b)
	var gpus []occupancy.GPU
	for i := range 8 {
		gpus = append(gpus, occupancy.GPU{Index: i})
	}
	ledger := occupancy.NewLedger(gpus, time.Minute)
	for i := range 512 {
		ledger.SetProcess(occupancy.ProcFDs{Info: occupancy.ProcInfo{PID: 1000 + i, Priority: occupancy.Low},
			FDs: map[int][]int32{i % 8: {3}}}, time.Now())
	}
	r.c.Ledger = ledger
	mono := uint64(time.Second)
	for b.Loop() {
		mono += 5 * uint64(time.Microsecond) // 200 000 drains a second
		r.c.Drained(mono)
	}
}

// FuzzDrainSkipsOnlyEmptyPasses runs the same holders, loans, refusals,
// reservations and drains through two controllers, one making the pass at
// every drain (Sync): after each drain the gate's maps must be the same in
// both, written as often. A skipped pass may only be one that writes
// nothing.
func FuzzDrainSkipsOnlyEmptyPasses(f *testing.F) {
	f.Add([]byte{0x00, 0x07, 0x11, 0x27, 0x05, 0x47, 0x02, 0x57, 0x31, 0x67, 0x77, 0x07, 0x43, 0x17, 0x27})
	f.Add([]byte{0x15, 0x07, 0x26, 0x17, 0x18, 0x07, 0x07, 0x07, 0xf7, 0x02, 0x27})
	// Longer runs, the same at every run: each input above matters.
	rnd := rand.New(rand.NewPCG(1, 2))
	for range 30 {
		ops := make([]byte, 300)
		for i := range ops {
			ops[i] = byte(rnd.IntN(256))
		}
		f.Add(ops)
	}
	f.Fuzz(fuzzDrainBody)
}

func fuzzDrainBody(t *testing.T, ops []byte) {
	{
		if len(ops) > 400 {
			return
		}
		skip, every := newRig(t, 0, 1, 2), newRig(t, 0, 1, 2)
		for _, r := range []*rig{skip, every} {
			r.c.TTL = 300 * time.Microsecond // reservations end between drains
		}
		mono, pid := uint64(time.Second), 1000
		for i, op := range ops {
			gpu, arg := int(op>>4)%3, int(op>>4)
			pid++
			for _, r := range []*rig{skip, every} {
				switch op & 0xf {
				case 0, 1:
					r.ledger.hold(gpu, r.pod(pid, uint64(10+arg%4), occupancy.Low))
				case 2:
					r.ledger.hold(gpu, r.pod(pid, uint64(20+arg%2), occupancy.High))
				case 3:
					r.ledger.release(gpu)
				case 4:
					r.loans.lend(gpu)
				case 5:
					r.loans.TakeBack(gpu)
				case 6:
					r.c.HandleEvent(event(bpf.EventDeny, gpu, r.pod(pid, uint64(30+arg%3), occupancy.Low), mono))
				case 8:
					r.c.HandleEvent(event(bpf.EventOpen, gpu, r.pod(pid, uint64(30+arg%3), occupancy.Low), mono))
				case 9:
					r.c.DropWaiters(fmt.Sprintf("pod/pod-%d", 30+arg%3))
				case 10:
					r.c.Sync()
				}
			}
			if op&0xf == 7 || op&0xf >= 11 {
				// Up to 15 × 150 µs: drains closer and further apart than
				// confirmEvery and the reservations' TTL.
				step := map[byte]uint64{7: 10, 11: 50, 12: 100, 13: 70, 14: 150, 15: 0}[op&0xf]
				mono += uint64(arg) * step * uint64(time.Microsecond)
				skip.c.Drained(mono)
				every.c.mu.Lock()
				every.c.drainedAt = max(every.c.drainedAt, mono)
				every.c.mu.Unlock()
				every.c.Sync()
				for gpu := range 3 {
					ps, cs := skip.kernel.gpuPolicy(gpu)
					pe, ce := every.kernel.gpuPolicy(gpu)
					if ps != pe || cs != ce {
						t.Fatalf("op %d, GPU %d at %d: %+v confirmed %d, a pass at every drain gives %+v confirmed %d", i, gpu, mono, ps, cs, pe, ce)
					}
				}
				if skip.kernel.pushCount() != every.kernel.pushCount() {
					t.Fatalf("op %d: %d writes, a pass at every drain makes %d", i, skip.kernel.pushCount(), every.kernel.pushCount())
				}
			}
		}
	}
}
