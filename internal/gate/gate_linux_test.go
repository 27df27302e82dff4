package gate

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpud/gpud/bpf"
	"github.com/gpud/gpud/internal/occupancy"
	"github.com/gpud/gpud/internal/preempt"
	"github.com/gpud/gpud/internal/workload"
)

// The rows of the table the gate applies, as preempt.Decide gives them.
var (
	preemptRow = preempt.Decide(preempt.Holding{Low: true}, occupancy.High)
	denyRow    = preempt.Decide(preempt.Holding{High: true}, occupancy.Low)
)

func TestTableRowsAreTheOnesTheGateActsOn(t *testing.T) {
	if !preemptRow.Allow || !preemptRow.KillHolders || preemptRow.Rule != "low-held/high-opens: preempt" {
		t.Fatalf("a high open of a low-held GPU: %+v", preemptRow)
	}
	if denyRow.Allow || !denyRow.ReclaimOpener || denyRow.Rule != "high-held/low-opens: deny" {
		t.Fatalf("a low open of a high-held GPU: %+v", denyRow)
	}
}

func TestHighOpenPreemptsTheLowHolders(t *testing.T) {
	r := newRig(t, 0, 1)
	low1, low2, low3 := r.pod(101, 11, occupancy.Low), r.pod(102, 12, occupancy.Low), r.pod(103, 13, occupancy.Low)
	agent := occupancy.ProcInfo{PID: 7, Comm: "nvidia-persistenced", Priority: occupancy.Low, Agent: true}
	high := r.pod(200, 20, occupancy.High)
	r.ledger.hold(0, low1, low2, agent)
	r.ledger.hold(1, low3) // another GPU's low holder is left alone

	r.c.HandleEvent(event(bpf.EventGateHigh, 0, high, 1000))

	p := r.onePreemption()
	if !p.now || p.gpu != 0 || p.rule != preemptRow.Rule {
		t.Fatalf("preemption %+v: want PreemptNow on GPU 0 under %q", p, preemptRow.Rule)
	}
	if got := p.pids(); !slices.Equal(got, []int{101, 102}) {
		t.Fatalf("victims %v, want the low holders 101 and 102 (no agent, no other GPU's)", got)
	}
	// Before /proc is read: what the event and its cgroup's workload say.
	if p.known.PID != 200 || p.known.PodUID != "pod-20" || p.known.TaskID != "task-20" || p.known.CgroupID != 20 {
		t.Fatalf("known preemptor %+v", p.known)
	}
	if p.by.PID != 200 || p.by.TaskID != "task-20" || p.by.Comm != "proc200" {
		t.Fatalf("preemptor for the record %+v", p.by)
	}
	if !p.decided.Equal(time.Unix(0, 1000)) {
		t.Fatalf("decided %v, want the event's time", p.decided)
	}
	v := p.victims[0]
	if v.TaskID != "task-11" || v.Workload.PodUID != "pod-11" || v.Workload.Namespace != "ns" || v.Workload.Name != "job-11" ||
		!strings.Contains(v.Workload.Reason, "a high-priority process opened GPU 0") {
		t.Fatalf("victim %+v: want its pod reclaimed, with the reason", v)
	}
	// A high open of a lent GPU ends the loan, low holders or not.
	if got := r.loans.takeBacks(); !slices.Equal(got, []int{0}) {
		t.Fatalf("take-backs %v, want GPU 0", got)
	}
}

func TestHighOpenOfAFreeGPUPreemptsNobody(t *testing.T) {
	r := newRig(t, 0)
	high := r.pod(200, 20, occupancy.High)
	r.ledger.hold(0, high)
	r.c.HandleEvent(event(bpf.EventGateHigh, 0, high, 1000))
	r.noPreemption()
}

func TestLowOpenRefusedThenEarliestWaiterGetsTheGPU(t *testing.T) {
	r := newRig(t, 0)
	high := r.pod(200, 20, occupancy.High)
	early, late := r.pod(301, 31, occupancy.Low), r.pod(302, 32, occupancy.Low)
	r.ledger.hold(0, high)

	// Reported out of order: the waiters are queued by the refusal's time.
	r.c.HandleEvent(event(bpf.EventDeny, 0, late, 2000))
	r.c.HandleEvent(event(bpf.EventDeny, 0, early, 1000))
	r.c.HandleEvent(event(bpf.EventDeny, 0, late, 3000)) // retried: already waiting

	ref := r.exec.refusals()
	if len(ref) != 2 || r.c.Denials.Load() != 2 {
		t.Fatalf("refusals %+v (counted %d), want one per workload", ref, r.c.Denials.Load())
	}
	for _, d := range ref {
		if d.gpu != 0 || d.rule != denyRow.Rule || !d.reclaim {
			t.Fatalf("refusal %+v: want %q, reclaiming the opener", d, denyRow.Rule)
		}
	}
	if ref[0].opener.PID != 302 || ref[0].workload.Key() != "pod/pod-32" {
		t.Fatalf("first refusal %+v: want pid 302 of pod-32", ref[0])
	}

	r.c.Drained(10_000)
	if _, ok := r.c.Reservation(0); ok {
		t.Fatal("reserved while high priority still holds it")
	}
	if p, _ := r.kernel.gpuPolicy(0); p != (bpf.GPUPolicy{High: 1}) {
		t.Fatalf("policy %+v, want high 1", p)
	}

	r.ledger.release(0)
	r.c.Drained(20_000)
	if cg, ok := r.c.Reservation(0); !ok || cg != 31 {
		t.Fatalf("reservation %d %v, want the earliest waiter's cgroup 31", cg, ok)
	}
	until := uint64(20_000 + testTTL.Nanoseconds())
	if p, conf := r.kernel.gpuPolicy(0); p != (bpf.GPUPolicy{ReservedCgroup: 31, ReservedUntil: until}) || conf != 20_000 {
		t.Fatalf("policy %+v confirmed %d: want reserved for 31 until %d, confirmed at the drain", p, conf, until)
	}

	// The waiter opens it: its reservation is done, the next waiter's turn.
	r.c.Opened(early, 0, event(bpf.EventOpen, 0, early, 21_000))
	if _, ok := r.c.Reservation(0); ok {
		t.Fatal("still reserved after its waiter opened it")
	}
	r.c.Drained(22_000)
	if cg, ok := r.c.Reservation(0); !ok || cg != 32 {
		t.Fatalf("reservation %d %v, want the next waiter's cgroup 32", cg, ok)
	}
	// Expired: nobody waits any more.
	r.c.Drained(22_000 + uint64(testTTL.Nanoseconds()) + 1)
	if cg, ok := r.c.Reservation(0); ok {
		t.Fatalf("reserved for %d after its reservation expired", cg)
	}
	if p, _ := r.kernel.gpuPolicy(0); p != (bpf.GPUPolicy{}) {
		t.Fatalf("policy %+v after expiry, want none", p)
	}
	r.noPreemption()
}

func TestReportedOpenFulfilsTheReservation(t *testing.T) {
	r := newRig(t, 0)
	w := r.pod(301, 31, occupancy.Low)
	r.c.HandleEvent(event(bpf.EventDeny, 0, w, 1000))
	r.c.Drained(2000)
	if _, ok := r.c.Reservation(0); !ok {
		t.Fatal("not reserved")
	}
	// The opener may be gone before its fd is read: the gate's report of
	// the open is enough.
	r.c.HandleEvent(event(bpf.EventOpen, 0, w, 3000))
	if _, ok := r.c.Reservation(0); ok {
		t.Fatal("still reserved after the waiter's reported open")
	}
}

func TestReclaimedWaiterIsDropped(t *testing.T) {
	r := newRig(t, 0)
	high := r.pod(200, 20, occupancy.High)
	r.ledger.hold(0, high)
	r.c.HandleEvent(event(bpf.EventDeny, 0, r.pod(301, 31, occupancy.Low), 1000))
	r.c.HandleEvent(event(bpf.EventDeny, 0, r.pod(302, 32, occupancy.Low), 2000))
	r.c.DropWaiters("pod/pod-31") // reclaimed after its refusal
	r.ledger.release(0)
	r.c.Drained(10_000)
	if cg, ok := r.c.Reservation(0); !ok || cg != 32 {
		t.Fatalf("reservation %d %v, want 32: the reclaimed workload does not wait", cg, ok)
	}
	r.c.DropWaiters("pod/pod-32")
	if _, ok := r.c.Reservation(0); ok {
		t.Fatal("still reserved for a reclaimed workload")
	}
}

func TestLateClassifiedOpenJudgedAfterTheFact(t *testing.T) {
	t.Run("low opens a GPU high holds", func(t *testing.T) {
		r := newRig(t, 0)
		high, low := r.pod(200, 20, occupancy.High), r.pod(101, 11, occupancy.Low)
		r.ledger.hold(0, high, low)
		r.c.Opened(low, 0, event(bpf.EventOpen, 0, low, 1000))
		p := r.onePreemption()
		if p.now || p.rule != denyRow.Rule+" (after the open)" || !slices.Equal(p.pids(), []int{101}) || p.by != (preempt.Party{}) {
			t.Fatalf("preemption %+v: want the opener preempted under the deny row, after the open", p)
		}
	})
	t.Run("low opens a lent GPU", func(t *testing.T) {
		r := newRig(t, 0)
		owner, borrower := r.pod(200, 20, occupancy.High), r.pod(101, 11, occupancy.Low)
		r.ledger.hold(0, owner, borrower)
		r.loans.lend(0)
		r.c.Opened(borrower, 0, event(bpf.EventOpen, 0, borrower, 1000))
		r.noPreemption() // the loan: the idle owner does not hold it
	})
	t.Run("high opens a GPU low holds", func(t *testing.T) {
		r := newRig(t, 0)
		high, low := r.pod(200, 20, occupancy.High), r.pod(101, 11, occupancy.Low)
		r.ledger.hold(0, low, high)
		r.c.Opened(high, 0, event(bpf.EventOpen, 0, high, 1000))
		p := r.onePreemption()
		if p.now || p.rule != preemptRow.Rule || !slices.Equal(p.pids(), []int{101}) || p.by.PID != 200 || p.by.TaskID != "task-20" {
			t.Fatalf("preemption %+v: want the low holder preempted for 200", p)
		}
		if !p.decided.Equal(time.Unix(0, 1000)) {
			t.Fatalf("decided %v, want the open's time", p.decided)
		}
	})
	t.Run("owner opens its lent GPU", func(t *testing.T) {
		r := newRig(t, 0)
		owner, borrower := r.pod(200, 20, occupancy.High), r.pod(101, 11, occupancy.Low)
		r.ledger.hold(0, borrower, owner)
		r.loans.lend(0)
		r.c.Opened(owner, 0, event(bpf.EventOpen, 0, owner, 1000))
		if got := r.loans.takeBacks(); !slices.Equal(got, []int{0}) {
			t.Fatalf("take-backs %v, want GPU 0", got)
		}
		if p := r.onePreemption(); !slices.Equal(p.pids(), []int{101}) || p.rule != preemptRow.Rule {
			t.Fatalf("preemption %+v: want the borrower preempted", p)
		}
	})
	t.Run("unmanaged opens a GPU high holds", func(t *testing.T) {
		r := newRig(t, 0)
		high := r.pod(200, 20, occupancy.High)
		host := occupancy.ProcInfo{PID: 9, Comm: "nvidia-smi", Priority: occupancy.Unmanaged}
		r.ledger.hold(0, high, host)
		r.c.Opened(host, 0, event(bpf.EventOpen, 0, host, 1000))
		r.noPreemption()
	})
}

func TestOpenMarksAPreemptedTaskResumed(t *testing.T) {
	r := newRig(t, 0)
	changed := 0
	r.c.Changed = func() { changed++ }
	w := r.pod(101, 11, occupancy.Low)
	r.journal.resumable["ns/task-11"] = preempt.Record{ID: "rec-1"}
	r.c.Opened(w, 0, event(bpf.EventOpen, 0, w, 1000))
	if !slices.Equal(r.journal.resumed, []string{"ns/task-11"}) || changed != 1 {
		t.Fatalf("resumed %v, changed %d: want task-11 of ns marked once, the state file told", r.journal.resumed, changed)
	}
	r.c.Opened(w, 0, event(bpf.EventOpen, 0, w, 2000))
	if changed != 1 {
		t.Fatalf("changed %d after an open with nothing to mark", changed)
	}
}

func TestRejudgeAfterResync(t *testing.T) {
	r := newRig(t, 0, 1, 2, 3)
	high := r.pod(200, 20, occupancy.High)
	low1, low2 := r.pod(101, 11, occupancy.Low), r.pod(102, 12, occupancy.Low)
	r.ledger.hold(0, high, low1, low2)
	r.exec.handled[102] = true // being killed already: not asked twice
	r.ledger.hold(1, r.pod(103, 13, occupancy.Low))
	r.ledger.hold(2, r.pod(201, 21, occupancy.High), r.pod(104, 14, occupancy.Low))
	r.loans.lend(2) // the borrower beside its idle owner is the loan
	r.ledger.hold(3, r.pod(202, 22, occupancy.High))

	if n := r.c.Rejudge("found holding at a /proc resync"); n != 0 {
		t.Fatalf("Rejudge before Judge preempted %d", n)
	}
	r.noPreemption()

	r.journal.recent = []preempt.Record{{ID: "old"}}
	r.c.Judge()
	if r.ledger.reclassified == 0 {
		t.Fatal("Judge did not classify the holders again before judging")
	}
	if len(r.exec.adopted) != 7 || len(r.exec.adoptRecs) != 1 {
		t.Fatalf("adoption asked with %d candidates and %d records, want every holder and the journal",
			len(r.exec.adopted), len(r.exec.adoptRecs))
	}
	p := r.onePreemption()
	if p.gpu != 0 || p.rule != rejudgedRule || !slices.Equal(p.pids(), []int{101}) || p.by.PID != 200 {
		t.Fatalf("preemption %+v: want 101 on GPU 0 under %q, for 200", p, rejudgedRule)
	}
	if !strings.Contains(p.victims[0].Workload.Reason, "gpud started") || r.c.Rejudged.Load() != 1 {
		t.Fatalf("reason %q, counted %d", p.victims[0].Workload.Reason, r.c.Rejudged.Load())
	}

	if n := r.c.Rejudge("found holding at a /proc resync"); n != 0 {
		t.Fatalf("a second Rejudge preempted %d already handled", n)
	}
	r.ledger.hold(0, r.pod(105, 15, occupancy.Low)) // found by a resync
	if n := r.c.Rejudge("found holding at a /proc resync"); n != 1 {
		t.Fatalf("Rejudge after a resync found a new low holder: preempted %d, want 1", n)
	}
	r.c.Enforce = false
	r.ledger.hold(0, r.pod(106, 16, occupancy.Low))
	if n := r.c.Rejudge("x"); n != 0 {
		t.Fatalf("Rejudge without enforcement preempted %d", n)
	}
}

func TestClassChangedTellsTheKernelAndJudges(t *testing.T) {
	r := newRig(t, 0)
	r.c.Judge()
	high := r.pod(200, 20, occupancy.High)
	unknown := occupancy.ProcInfo{PID: 101, CgroupID: 11, ContainerID: "ctr-11", Priority: occupancy.Unclassified}
	r.ledger.hold(0, high, unknown)
	r.c.Sync()
	r.noPreemption()

	r.reg.put(workload.Workload{ContainerID: "ctr-11", Name: "late", Priority: occupancy.Low, CgroupID: 11})
	r.c.ClassChanged(11, occupancy.Low)
	if r.kernel.prio[11] != bpf.PrioLow {
		t.Fatalf("kernel class %d, want low", r.kernel.prio[11])
	}
	p := r.onePreemption()
	if p.rule != rejudgedRule || !slices.Equal(p.pids(), []int{101}) || !strings.Contains(p.victims[0].Workload.Reason, "class changed") {
		t.Fatalf("preemption %+v: want the newly low holder preempted", p)
	}
	if pol, _ := r.kernel.gpuPolicy(0); pol != (bpf.GPUPolicy{High: 1, Low: 1}) {
		t.Fatalf("policy %+v, want the new class counted", pol)
	}

	for _, c := range []struct {
		p    occupancy.Priority
		want uint32
	}{{occupancy.High, bpf.PrioHigh}, {occupancy.Unmanaged, bpf.PrioWorkload}, {occupancy.Unclassified, bpf.PrioWorkload}} {
		r.c.ClassChanged(30, c.p)
		if r.kernel.prio[30] != c.want {
			t.Fatalf("%s: kernel class %d, want %d", c.p, r.kernel.prio[30], c.want)
		}
	}
	r.c.ClassChanged(30, "")
	if _, ok := r.kernel.prio[30]; ok || !slices.Contains(r.kernel.forgotten, 30) {
		t.Fatal("a cgroup no longer classified is still in the kernel")
	}
}

func TestPreemptModeChosenPerWorkload(t *testing.T) {
	for _, c := range []struct {
		label string
		want  preempt.Mode
		warn  bool
	}{
		{"", "", false}, // the node's --preempt-mode
		{"freeze", preempt.ModeFreeze, false},
		{"kill", preempt.ModeKill, false},
		{"checkpoint", preempt.ModeCheckpoint, false},
		{"Freeze ", "", true}, // malformed: the node's, said
	} {
		t.Run(c.label, func(t *testing.T) {
			r := newRig(t, 0)
			r.reg.put(workload.Workload{PodUID: "pod-11", Namespace: "ns", Name: "job", TaskID: "t", ContainerID: "ctr-11",
				Priority: occupancy.Low, CgroupID: 11, PreemptMode: c.label, LivenessProbe: true})
			low := occupancy.ProcInfo{PID: 101, CgroupID: 11, ContainerID: "ctr-11", PodUID: "pod-11", Priority: occupancy.Low}
			r.ledger.hold(0, low)
			if n := r.c.PreemptLow(0, r.pod(200, 20, occupancy.High), "taken back", time.Now()); n != 1 {
				t.Fatalf("PreemptLow: %d, want 1", n)
			}
			v := r.onePreemption().victims[0]
			if v.Mode != c.want || v.WorkloadCgroup != 11 || !v.LivenessProbe {
				t.Fatalf("victim mode %q cgroup %d probe %v, want %q, its workload's cgroup 11, its probe", v.Mode, v.WorkloadCgroup, v.LivenessProbe, c.want)
			}
			if warned := strings.Contains(r.logs.String(), "ignoring the workload's preempt-mode label"); warned != c.warn {
				t.Fatalf("warned %v, want %v: %s", warned, c.warn, r.logs)
			}
		})
	}
}

func TestPreemptSkipsWhatIsHandled(t *testing.T) {
	r := newRig(t, 0)
	owner := r.pod(200, 20, occupancy.High)
	b1, b2 := r.pod(101, 11, occupancy.Unclassified), r.pod(102, 12, occupancy.Low)
	r.exec.handled[102] = true
	// A borrower whose class is not known yet is taken too.
	if n := r.c.Preempt(0, owner, []occupancy.ProcInfo{b1, b2}, "GPU 0 was taken back by its owner"); n != 1 {
		t.Fatalf("Preempt: %d new, want 1", n)
	}
	if p := r.onePreemption(); !slices.Equal(p.pids(), []int{101}) || p.rule != preemptRow.Rule {
		t.Fatalf("preemption %+v", p)
	}
	if n := r.c.Preempt(0, owner, []occupancy.ProcInfo{b1, b2}, "again"); n != 0 {
		t.Fatalf("Preempt again: %d new, want 0", n)
	}
}

func TestPreemptForRuleTakesOnlyLowWorkloads(t *testing.T) {
	r := newRig(t, 0)
	by := r.pod(200, 20, occupancy.High)
	low := r.pod(101, 11, occupancy.Low)
	handled := r.pod(102, 12, occupancy.Low)
	r.exec.handled[102] = true
	agent := occupancy.ProcInfo{PID: 7, Priority: occupancy.Low, Agent: true}
	other := r.pod(201, 21, occupancy.High)
	n := r.c.PreemptForRule(0, by, []occupancy.ProcInfo{other, low, handled, agent}, "a pod over its GPU memory share: kill", "over its share")
	p := r.onePreemption()
	if n != 1 || p.rule != "a pod over its GPU memory share: kill" || !slices.Equal(p.pids(), []int{101}) || p.by.PID != 200 {
		t.Fatalf("PreemptForRule: %d, %+v: want only the low workload, under the caller's rule", n, p)
	}
}

func TestSyncPushesEachGPUsPolicy(t *testing.T) {
	r := newRig(t, 0, 1, 2)
	r.ledger.hold(0, r.pod(200, 20, occupancy.High), r.pod(101, 11, occupancy.Low), r.pod(102, 12, occupancy.Low))
	r.ledger.hold(2, r.pod(201, 21, occupancy.High), r.pod(103, 13, occupancy.Low))
	r.loans.lend(2) // the idle owner does not hold it for the table

	const t0 = uint64(5 * time.Millisecond)
	r.c.Drained(t0)
	want := map[int]bpf.GPUPolicy{0: {High: 1, Low: 2}, 1: {}, 2: {Low: 1}}
	for gpu, w := range want {
		if p, conf := r.kernel.gpuPolicy(gpu); p != w || conf != t0 {
			t.Fatalf("GPU %d: policy %+v confirmed %d, want %+v confirmed %d", gpu, p, conf, w, t0)
		}
	}
	// Frozen workloads see the GPUs as the table does.
	if r.exec.resumes != 1 || !r.exec.held(0).High || r.exec.held(2).High || r.exec.held(1).Low {
		t.Fatalf("resume asked %d times, holding 0 %+v 1 %+v 2 %+v", r.exec.resumes, r.exec.held(0), r.exec.held(1), r.exec.held(2))
	}

	// Unchanged and confirmed less than confirmEvery ago: not written again.
	pushes := r.kernel.pushCount()
	r.c.Drained(t0 + confirmEvery/2)
	if r.kernel.pushCount() != pushes {
		t.Fatalf("an unchanged policy was pushed again within %v", time.Duration(confirmEvery))
	}
	// A change goes at once.
	r.ledger.hold(1, r.pod(104, 14, occupancy.Low))
	r.c.Drained(t0 + confirmEvery/2 + 1)
	if p, conf := r.kernel.gpuPolicy(1); p != (bpf.GPUPolicy{Low: 1}) || conf != t0+confirmEvery/2+1 || r.kernel.pushCount() != pushes+1 {
		t.Fatalf("GPU 1: policy %+v confirmed %d after %d pushes: want the new holder pushed alone", p, conf, r.kernel.pushCount()-pushes)
	}
	// Re-confirmed once confirmEvery has passed.
	r.c.Drained(t0 + 2*confirmEvery)
	if _, conf := r.kernel.gpuPolicy(0); conf != t0+2*confirmEvery {
		t.Fatalf("GPU 0 confirmed %d, want %d", conf, t0+2*confirmEvery)
	}
	// Sync never confirms past the last drain.
	r.c.Sync()
	if _, conf := r.kernel.gpuPolicy(0); conf != t0+2*confirmEvery {
		t.Fatalf("confirmed %d past the last drain", conf)
	}

	// The owner takes its GPU back: it holds it for the table again.
	r.loans.TakeBack(2)
	r.c.Drained(t0 + 3*confirmEvery)
	if p, _ := r.kernel.gpuPolicy(2); p != (bpf.GPUPolicy{High: 1, Low: 1}) {
		t.Fatalf("GPU 2 after the take-back: %+v", p)
	}
}

func TestHoldingOfALentGPU(t *testing.T) {
	c := occupancy.ClassCounts{High: 1, Low: 1}
	if h := Holding(c, false); !h.High || !h.Low {
		t.Fatalf("not lent: %+v", h)
	}
	if h := Holding(c, true); h.High || !h.Low {
		t.Fatalf("lent: %+v, want the idle owner not holding it", h)
	}
}
