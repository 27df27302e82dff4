package gate

import (
	"errors"
	"strings"
	"testing"

	v1 "github.com/gpud/gpud/api/v1"
	"github.com/gpud/gpud/bpf"
	"github.com/gpud/gpud/internal/occupancy"
	"github.com/gpud/gpud/internal/preempt"
	"github.com/gpud/gpud/internal/workload"
)

const explainedCtr = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

// explainRig is a low-priority Docker container's process 4242 ("trainer")
// beside GPUs in each case Explain tells apart:
//
//	0 held by high priority          3 reserved for the process's own cgroup
//	1 held by it and another low     4 held by high priority, lent
//	2 reserved for another cgroup
func explainRig(t *testing.T) (*rig, uint64) {
	t.Helper()
	r := newRig(t, 0, 1, 2, 3, 4)
	proc, cg := fakeProc(t, 4242, "trainer", "/system.slice/docker-"+explainedCtr+".scope")
	r.c.Proc = proc
	r.reg.put(workload.Workload{ContainerID: explainedCtr, Name: "trainer", TaskID: "train", Priority: occupancy.Low, CgroupID: cg})
	self := occupancy.ProcInfo{PID: 4242, Comm: "trainer", CgroupID: cg, ContainerID: explainedCtr, Priority: occupancy.Low}
	r.procs[4242] = self

	r.ledger.hold(0, r.pod(200, 20, occupancy.High))
	r.ledger.hold(1, self, r.pod(101, 11, occupancy.Low))
	r.ledger.hold(4, r.pod(201, 21, occupancy.High))
	r.loans.lend(4)
	// Reservations: refused while GPUs 2 and 3 were busy, freed since.
	r.c.HandleEvent(event(bpf.EventDeny, 2, r.pod(399, 99, occupancy.Low), 1000))
	r.c.HandleEvent(event(bpf.EventDeny, 3, self, 1000))
	r.c.Drained(2000)
	return r, cg
}

func TestExplainSaysWhichRuleApplies(t *testing.T) {
	r, cg := explainRig(t)
	r.exec.suspended[4242] = v1.Suspension{Workload: explainedCtr}
	e, err := r.c.Explain(4242)
	if err != nil {
		t.Fatal(err)
	}
	if e.Comm != "trainer" || e.CgroupID != cg || e.ContainerID != explainedCtr || !strings.HasSuffix(e.Cgroup, explainedCtr+".scope") {
		t.Fatalf("process: %+v", e)
	}
	if e.Priority != occupancy.Low || e.Reason != workload.ReasonLabel || e.Why != "label gpud.io/priority=low on its container" {
		t.Fatalf("class %q reason %q why %q", e.Priority, e.Reason, e.Why)
	}
	if e.Workload == nil || e.Workload.Kind != "container" || e.Workload.TaskID != "train" {
		t.Fatalf("workload %+v", e.Workload)
	}
	if len(e.Holds) != 1 || e.Holds[0] != 1 || !e.Monitoring || !e.Enforcing || e.Suspended == nil {
		t.Fatalf("holds %v monitoring %v enforcing %v suspended %v", e.Holds, e.Monitoring, e.Enforcing, e.Suspended)
	}
	want := []struct {
		allow bool
		rule  string
	}{
		{false, denyRow.Rule},
		{true, "low-held/low-opens: share"},
		{false, reservedRule},
		{true, "free: allow"}, // its own reservation
		{true, "free: allow"}, // lent: its idle owner does not hold it
	}
	if len(e.GPUs) != len(want) {
		t.Fatalf("%d GPUs explained", len(e.GPUs))
	}
	for i, w := range want {
		if g := e.GPUs[i]; g.Allow != w.allow || g.Rule != w.rule {
			t.Errorf("GPU %d: allow %v under %q, want %v under %q", i, g.Allow, g.Rule, w.allow, w.rule)
		}
	}
	if g := e.GPUs[0]; g.HighHolders != 1 || len(g.Effects) != 1 || !strings.Contains(g.Effects[0], "the refusal is recorded") {
		t.Errorf("GPU 0: %+v", g)
	}
	if g := e.GPUs[1]; !g.Holds || g.LowHolders != 1 {
		t.Errorf("GPU 1: %+v, want held by it and one other low holder", g)
	}
	if g := e.GPUs[2]; g.ReservedFor != 99 || len(g.Effects) != 1 || !strings.Contains(g.Effects[0], "it waits its turn") {
		t.Errorf("GPU 2: %+v", g)
	}
	if g := e.GPUs[3]; g.ReservedFor != cg {
		t.Errorf("GPU 3: reserved for %d, want %d", g.ReservedFor, cg)
	}
	if g := e.GPUs[4]; !g.Lent || g.State != occupancy.Lent {
		t.Errorf("GPU 4: %+v, want lent", g)
	}
}

func TestExplainHighOpenerKillsLowHolders(t *testing.T) {
	r := newRig(t, 0)
	proc, cg := fakeProc(t, 4242, "serve", "/system.slice/docker-"+explainedCtr+".scope")
	r.c.Proc, r.c.Reclaim = proc, "stop"
	r.reg.put(workload.Workload{ContainerID: explainedCtr, Priority: occupancy.High, CgroupID: cg})
	r.ledger.hold(0, r.pod(102, 12, occupancy.Low), r.pod(101, 11, occupancy.Low))
	e, err := r.c.Explain(4242)
	if err != nil {
		t.Fatal(err)
	}
	g := e.GPUs[0]
	if !g.Allow || g.Rule != preemptRow.Rule || len(g.Effects) != 1 ||
		g.Effects[0] != "the low-priority holders are killed (pid 101, 102), and their workload is reclaimed (--reclaim stop)" {
		t.Fatalf("GPU 0: %+v", g)
	}
}

func TestExplainEnforcementOff(t *testing.T) {
	r, _ := explainRig(t)
	r.c.Enforce = false
	e, err := r.c.Explain(4242)
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range e.GPUs {
		if !g.Allow || g.Rule != "enforcement off: allow" {
			t.Fatalf("GPU %d: %+v", g.Index, g)
		}
	}
}

func TestExplainOpenedBeforeClassified(t *testing.T) {
	r, _ := explainRig(t)
	r.ledger.unknown[4242] = true
	r.journal.recent = []preempt.Record{{GPU: 1, Action: preempt.ActionKill, Result: "done", Rule: rejudgedRule, Victim: preempt.Party{PID: 4242}}}
	e, err := r.c.Explain(4242)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(e.BeforeClassified, "opened GPU 1 before gpud knew its workload") ||
		!strings.Contains(e.BeforeClassified, "kill on GPU 1: done ("+rejudgedRule+")") {
		t.Fatalf("before classified: %q", e.BeforeClassified)
	}
}

func TestExplainNoSuchProcess(t *testing.T) {
	r, _ := explainRig(t)
	if _, err := r.c.Explain(4243); !errors.Is(err, ErrNoSuchProcess) {
		t.Fatalf("Explain of a PID with no process: %v, want ErrNoSuchProcess", err)
	}
}

// On a GPU shared by DRA claims the rule table's shared rows apply, not the
// held-by rows: a high sharer's open names the row that preempts low
// sharers (over-share first), a low sharer's the share row, and a workload
// without a share of the GPU is refused by the fence.
func TestExplainSharedGPUSaysTheSharedRow(t *testing.T) {
	r := newRig(t, 0, 1)
	proc, cg := fakeProc(t, 4242, "serve", "/system.slice/docker-"+explainedCtr+".scope")
	r.c.Proc = proc
	r.reg.put(workload.Workload{ContainerID: explainedCtr, Priority: occupancy.High, CgroupID: cg})
	r.ledger.hold(0, r.pod(101, 11, occupancy.Low))
	r.ledger.hold(1, r.pod(102, 12, occupancy.Low))
	r.c.FenceShares([]int{0, 1}, map[uint64][]int{cg: {0}, 11: {0}})
	e, err := r.c.Explain(4242)
	if err != nil {
		t.Fatal(err)
	}
	if g := e.GPUs[0]; !g.Shared || !g.Allow || g.Rule != preempt.RuleSharedHigh || len(g.Effects) != 1 ||
		!strings.Contains(g.Effects[0], "over their share first") || !strings.Contains(g.Effects[0], "time-slice") {
		t.Errorf("GPU 0, shared, a high sharer: %+v", g)
	}
	if g := e.GPUs[1]; !g.Shared || g.Allow || g.Rule != sharedNoShareRule {
		t.Errorf("GPU 1, shared, no share of it: %+v", g)
	}
	r.reg.put(workload.Workload{ContainerID: explainedCtr, Priority: occupancy.Low, CgroupID: cg})
	if e, err = r.c.Explain(4242); err != nil {
		t.Fatal(err)
	}
	if g := e.GPUs[0]; !g.Allow || g.Rule != preempt.RuleSharedLow || len(g.Effects) != 1 || strings.Contains(g.Effects[0], "over their share first") {
		t.Errorf("GPU 0, shared, a low sharer: %+v", g)
	}
	// A class from the pod's PriorityClass says so.
	if got := r.c.why(workload.Workload{PodUID: "u1"}, true, occupancy.High, workload.ReasonPriorityClass); !strings.Contains(got, "is high by --priority-classes") {
		t.Errorf("why: %q", got)
	}
}
