package sharing

import (
	"bytes"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "github.com/gpud/gpud/api/v1"
	"github.com/gpud/gpud/internal/occupancy"
	"github.com/gpud/gpud/internal/preempt"
	"github.com/gpud/gpud/internal/workload"
)

// fakeLedger is the ledger's snapshot: GPU 0 with its memory and holders.
type fakeLedger struct{ snap occupancy.Snapshot }

func (f *fakeLedger) Snapshot(time.Time) occupancy.Snapshot { return f.snap }

// fakeWorkloads maps pod UIDs to their cgroups.
type fakeWorkloads map[string]uint64

func (f fakeWorkloads) Lookup(p occupancy.ProcInfo) (workload.Workload, bool) {
	id, ok := f[p.PodUID]
	return workload.Workload{PodUID: p.PodUID, CgroupID: id}, ok
}

type ruleCall struct {
	gpu     int
	by      int   // PID
	victims []int // PIDs
	rule    string
}

// fakeGate records what the enforcement asked of the gate, in order.
type fakeGate struct {
	calls     []string
	shared    []int
	fence     map[uint64][]int
	rules     []ruleCall
	intruders [][]int // PIDs per call
}

func (g *fakeGate) FenceShares(shared []int, want map[uint64][]int) {
	g.calls = append(g.calls, "fence")
	g.shared, g.fence = slices.Sorted(slices.Values(shared)), want
}

func (g *fakeGate) ClassChanged(uint64, occupancy.Priority) { g.calls = append(g.calls, "class") }

func (g *fakeGate) PreemptForRule(gpu int, by occupancy.ProcInfo, victims []occupancy.ProcInfo, rule, _ string) int {
	g.rules = append(g.rules, ruleCall{gpu: gpu, by: by.PID, victims: pids(victims), rule: rule})
	return len(victims)
}

func (g *fakeGate) PreemptIntruders(_ int, intruders []occupancy.ProcInfo) int {
	g.intruders = append(g.intruders, pids(intruders))
	return len(intruders)
}

func pids(ps []occupancy.ProcInfo) []int {
	var out []int
	for _, p := range ps {
		out = append(out, p.PID)
	}
	return out
}

type fakeEvents []string // "podUID reason"

func (f *fakeEvents) Warn(podUID, reason, _ string) { *f = append(*f, podUID+" "+reason) }

type rig struct {
	e       *Enforcer
	book    *Book
	ledger  *fakeLedger
	gate    *fakeGate
	events  *fakeEvents
	log     *bytes.Buffer
	enforce bool
	changed int
}

func newRig() *rig {
	r := &rig{book: NewBook(), ledger: &fakeLedger{}, gate: &fakeGate{}, events: &fakeEvents{}, log: &bytes.Buffer{}, enforce: true}
	r.e = NewEnforcer(EnforcerConfig{
		Book: r.book, Holders: r.ledger, Workloads: fakeWorkloads{"hi": 100, "lo": 200}, Fencer: r.gate, Preempter: r.gate,
		Events: r.events, Enforcing: func() bool { return r.enforce }, Changed: func() { r.changed++ },
		Log: slog.New(slog.NewTextHandler(r.log, nil)),
	})
	return r
}

// gpu0 puts GPU 0 in the snapshot with total and used memory and holders.
func (r *rig) gpu0(total, used uint64, hs ...occupancy.HolderView) {
	r.ledger.snap = occupancy.Snapshot{GPUs: []occupancy.GPUView{{
		GPU: occupancy.GPU{Index: 0}, Memory: &occupancy.Memory{Total: total, Used: used}, Holders: hs,
	}}}
}

func holder(pid int, pod string, prio occupancy.Priority, memory uint64) occupancy.HolderView {
	m := memory
	return occupancy.HolderView{ProcInfo: occupancy.ProcInfo{PID: pid, PodUID: pod, Priority: prio}, Memory: &m}
}

func (r *rig) logged(msg string) int { return strings.Count(r.log.String(), msg) }

// overShare: pod hi (4 GiB share, high) uses 1 GiB and needs 3 GiB more,
// only 1 GiB is free; pod lo (2 GiB share, low) uses 7 GiB.
func overShare(r *rig) {
	r.book.Set("uid-a", []Share{share("a", 4*gib, "hi")})
	r.book.Set("uid-b", []Share{share("b", 2*gib, "lo")})
	r.gpu0(10*gib, 9*gib, holder(10, "hi", occupancy.High, gib), holder(20, "lo", occupancy.Low, 6*gib), holder(21, "lo", occupancy.Low, gib))
}

func TestEnforcerPreemptsLowPodOverItsShare(t *testing.T) {
	r := newRig()
	overShare(r)
	r.e.Enforce()
	// A high sharer's need: the rule table's shared/high row.
	want := []ruleCall{{gpu: 0, by: 10, victims: []int{20, 21}, rule: preempt.RuleSharedHigh}}
	if !slicesEqualFunc(r.gate.rules, want) {
		t.Fatalf("preemptions asked: %+v, want %+v", r.gate.rules, want)
	}
	if r.e.Overs() != 1 || r.e.Preemptions() != 1 {
		t.Errorf("overs %d, preemptions %d; want 1, 1", r.e.Overs(), r.e.Preemptions())
	}
	if !slices.Equal(*r.events, []string{"lo GPUMemoryOverShare"}) {
		t.Errorf("events: %q", *r.events)
	}
	if r.changed != 1 {
		t.Errorf("changed called %d times, want 1", r.changed)
	}
	f := &v1.StateFile{GPUs: []v1.StateGPU{{Index: 0}}}
	r.e.Decorate(f)
	g := f.GPUs[0]
	if !g.Shared || len(g.Shares) != 2 {
		t.Fatalf("state: shared %v, shares %+v", g.Shared, g.Shares)
	}
	for _, s := range g.Shares {
		lo := s.PodUID == "lo"
		if s.Over != lo || s.Preempted != lo {
			t.Errorf("state of %s: over %v, preempted %v", s.PodUID, s.Over, s.Preempted)
		}
	}
	// Still over at the next judgement: not warned again.
	r.e.Enforce()
	if r.e.Overs() != 1 || len(*r.events) != 1 || r.logged("a pod is over its GPU memory share") != 1 {
		t.Errorf("warned again: overs %d, events %q", r.e.Overs(), *r.events)
	}
}

func slicesEqualFunc(a, b []ruleCall) bool {
	return slices.EqualFunc(a, b, func(x, y ruleCall) bool {
		return x.gpu == y.gpu && x.by == y.by && x.rule == y.rule && slices.Equal(x.victims, y.victims)
	})
}

func TestEnforcerOverShareWarnsOnly(t *testing.T) {
	t.Run("not enforcing", func(t *testing.T) {
		r := newRig()
		r.enforce = false
		overShare(r)
		r.e.Enforce()
		if len(r.gate.rules) != 0 || len(r.gate.intruders) != 0 || r.e.Preemptions() != 0 {
			t.Errorf("preempted under --enforce=false: %+v %v", r.gate.rules, r.gate.intruders)
		}
		if r.e.Overs() != 1 || len(*r.events) != 1 {
			t.Errorf("not warned: overs %d, events %q", r.e.Overs(), *r.events)
		}
	})
	t.Run("no pod needs the memory", func(t *testing.T) {
		r := newRig()
		overShare(r)
		r.gpu0(40*gib, 9*gib, holder(10, "hi", occupancy.High, gib), holder(20, "lo", occupancy.Low, 7*gib))
		r.e.Enforce()
		if len(r.gate.rules) != 0 {
			t.Errorf("preempted with memory free: %+v", r.gate.rules)
		}
		if r.e.Overs() != 1 || r.logged("a pod is over its GPU memory share") != 1 {
			t.Errorf("not warned: overs %d, log %s", r.e.Overs(), r.log)
		}
	})
}

func TestEnforcerKillsWorkloadWithoutAShare(t *testing.T) {
	for _, enforce := range []bool{true, false} {
		r := newRig()
		r.enforce = enforce
		r.book.Set("uid-a", []Share{share("a", 4*gib, "hi")})
		intruder := holder(30, "", occupancy.High, gib)
		intruder.ContainerID = "c1"
		agent := holder(32, "", occupancy.Low, 0)
		agent.ContainerID, agent.Agent = "c2", true
		r.gpu0(10*gib, 2*gib, holder(10, "hi", occupancy.High, gib), intruder, holder(31, "", occupancy.Low, 0), agent)
		r.e.Enforce()
		var want [][]int
		if enforce {
			want = [][]int{{30}} // not the host process 31, not the agent 32
		}
		if !slices.EqualFunc(r.gate.intruders, want, slices.Equal) {
			t.Errorf("enforce %v: intruders preempted %v, want %v", enforce, r.gate.intruders, want)
		}
		if n := r.logged("outside every share"); n != 3 {
			t.Errorf("enforce %v: %d conflicts logged, want 3", enforce, n)
		}
	}
}

func TestEnforcerLogsConflictsOnce(t *testing.T) {
	r := newRig()
	r.enforce = false
	r.book.Set("uid-a", []Share{share("a", 4*gib, "hi")})
	host := holder(31, "", occupancy.Low, 0)
	r.gpu0(10*gib, 2*gib, holder(10, "hi", occupancy.High, gib), host)
	const msg = "a process holds a shared GPU outside every share"
	r.e.Enforce()
	r.e.Enforce()
	if n := r.logged(msg); n != 1 {
		t.Fatalf("conflict logged %d times over two judgements, want 1", n)
	}
	// Gone, then back: a new conflict, logged again.
	r.gpu0(10*gib, 2*gib, holder(10, "hi", occupancy.High, gib))
	r.e.Enforce()
	r.gpu0(10*gib, 2*gib, holder(10, "hi", occupancy.High, gib), host)
	r.e.Enforce()
	if n := r.logged(msg); n != 2 {
		t.Errorf("conflict back logged %d times in all, want 2", n)
	}
}

func TestEnforcerFencesBeforeTheClass(t *testing.T) {
	r := newRig()
	r.book.Set("uid-a", []Share{share("a", 4*gib, "hi", "unknown")})
	// The book's change fences at once, before any judgement runs.
	if !slices.Equal(r.gate.calls, []string{"fence"}) || !slices.Equal(r.gate.shared, []int{0}) {
		t.Fatalf("book change: calls %v, shared %v", r.gate.calls, r.gate.shared)
	}
	// Only a pod whose cgroup is known is fenced in.
	if len(r.gate.fence) != 1 || !slices.Equal(r.gate.fence[100], []int{0}) {
		t.Errorf("fence %v, want cgroup 100 to GPU 0", r.gate.fence)
	}
	select {
	case <-r.e.kick:
	default:
		t.Error("the book's change asked for no judgement")
	}
	r.gate.calls = nil
	r.e.ClassChanged(100, occupancy.High)
	if !slices.Equal(r.gate.calls, []string{"fence", "class"}) {
		t.Errorf("class change: calls %v, want the fence first", r.gate.calls)
	}
}

func TestEnforcerNothingSharedAnyMore(t *testing.T) {
	r := newRig()
	overShare(r)
	r.e.Enforce()
	changed := r.changed
	r.book.Remove("uid-a")
	r.book.Remove("uid-b")
	r.e.Enforce()
	if r.changed != changed+1 {
		t.Errorf("changed %d times after the last share went, want once", r.changed-changed)
	}
	f := &v1.StateFile{GPUs: []v1.StateGPU{{Index: 0}}}
	r.e.Decorate(f)
	if f.GPUs[0].Shared || len(f.GPUs[0].Shares) != 0 {
		t.Errorf("state still shows shares: %+v", f.GPUs[0])
	}
	r.e.Enforce()
	if r.changed != changed+1 {
		t.Error("changed again with nothing shared")
	}
	var none *Enforcer
	none.Kick()
	none.Decorate(f) // no book: no-ops
}

// After a preemption the rule waits on that GPU (settleAfterPreempt): the
// victim is gone from the holders before NVML's used memory drops, and a
// judgement in between must not take a sharer within its share for a
// need the victim's memory is about to cover.
func TestEnforcerWaitsForNVMLAfterAPreemption(t *testing.T) {
	r := newRig()
	r.book.Set("uid-a", []Share{share("a", 4*gib, "hi")})
	r.book.Set("uid-b", []Share{share("b", 2*gib, "lo")})
	r.book.Set("uid-c", []Share{share("c", 4*gib, "in")})
	r.gpu0(10*gib, 9*gib, holder(10, "hi", occupancy.High, gib), holder(20, "lo", occupancy.Low, 7*gib), holder(30, "in", occupancy.Low, gib))
	r.e.Enforce()
	if want := []ruleCall{{gpu: 0, by: 10, victims: []int{20}, rule: preempt.RuleSharedHigh}}; !slicesEqualFunc(r.gate.rules, want) {
		t.Fatalf("preemptions asked: %+v, want %+v", r.gate.rules, want)
	}
	// The victim gone, NVML not updated yet: the high pod still looks short.
	r.gpu0(10*gib, 9*gib, holder(10, "hi", occupancy.High, gib), holder(30, "in", occupancy.Low, gib))
	r.e.Enforce()
	if len(r.gate.rules) != 1 {
		t.Fatalf("preempted again before NVML could say what the first freed: %+v", r.gate.rules)
	}
}
