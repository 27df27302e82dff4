package executor

import (
	"context"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/gpud/gpud/internal/occupancy"
	"github.com/gpud/gpud/internal/preempt"
	"github.com/gpud/gpud/internal/preempt/journal"
	"github.com/gpud/gpud/internal/testutil"
)

// counterVictim starts a counting process in a new cgroup (its workload)
// and returns it as a victim with its count file.
func counterVictim(t *testing.T, mode preempt.Mode) (preempt.Victim, string) {
	t.Helper()
	testutil.RequireRoot(t)
	dir, id := testutil.Cgroup(t, "fzv")
	file := filepath.Join(t.TempDir(), "count")
	cmd := testutil.StartCounter(t, file, "", func(pid int) { testutil.JoinCgroup(t, dir, pid) })
	pid := cmd.Process.Pid
	start, err := occupancy.StartTime("/proc", pid)
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 5*time.Second, "the counter counts", func() bool { return testutil.Counted(file) > 2 })
	return preempt.Victim{ProcInfo: occupancy.ProcInfo{PID: pid, StartTime: start, CgroupID: id, Priority: occupancy.Low, Comm: "sh"},
		TaskID: "t1", Mode: mode, WorkloadCgroup: id, Workload: preempt.Target{ContainerID: "c1", Reason: "test"}}, file
}

func actions(j *journal.Journal, action string) []preempt.Record {
	var out []preempt.Record
	for _, r := range j.Recent() {
		if r.Action == action && r.Result != preempt.ResultPending {
			out = append(out, r)
		}
	}
	return out
}

// A freeze-mode victim is frozen, not killed: its count stops, Resume
// leaves it frozen while its GPU is held by high priority and thaws it
// once not, and it counts on from where it stopped.
func TestExecutorFreezeThenThaw(t *testing.T) {
	j, _, err := journal.OpenJournal(filepath.Join(t.TempDir(), "preemptions.jsonl"), 50)
	if err != nil {
		t.Fatal(err)
	}
	e := &Executor{ProcRoot: "/proc", Journal: j, Mode: preempt.ModeKill} // the label's mode wins over the default
	v, file := counterVictim(t, preempt.ModeFreeze)
	done := make(chan struct{})
	e.Preempt(context.Background(), 0, "test rule", preempt.Party{PID: 1}, []preempt.Victim{v}, time.Now(), done)
	<-done
	if !testutil.Alive(v.PID) {
		t.Fatal("a freeze-mode victim was killed")
	}
	if !e.Handled(v) {
		t.Fatal("a frozen victim is not handled: the rules would preempt it again")
	}
	fr := actions(j, preempt.ActionFreeze)
	if len(fr) != 1 || fr[0].Victim.PID != v.PID || fr[0].Result != "done" || fr[0].Cgroup == "" || fr[0].LatencyMS <= 0 {
		t.Fatalf("freeze records: %+v", fr)
	}
	at := testutil.Counted(file)
	held := occupancy.Priority("")
	high := func(int) preempt.Holding { return preempt.Holding{High: held == occupancy.High, Low: true} }
	held = occupancy.High
	for i := 0; i < 5; i++ {
		e.Resume(high)
		time.Sleep(50 * time.Millisecond)
	}
	if n := testutil.Counted(file); n != at {
		t.Fatalf("counted %d → %d while frozen", at, n)
	}
	if s := e.Suspensions(); len(s) != 1 || s[0].PIDs[0] != v.PID || s[0].GPUs[0] != 0 || s[0].Paused || s[0].ThawWhen == "" {
		t.Fatalf("suspensions: %+v", s)
	}
	// A second preemption of the same victim (another GPU) adds the GPU.
	e.Preempt(context.Background(), 1, "test rule", preempt.Party{}, []preempt.Victim{v}, time.Now(), nil)
	if s := e.Suspensions(); len(s) != 1 || len(s[0].GPUs) != 2 {
		t.Fatalf("suspensions after a second GPU: %+v", s)
	}
	held = ""
	e.Resume(high)
	e.Wait()
	testutil.Eventually(t, 5*time.Second, "counting on", func() bool { return testutil.Counted(file) > at+2 })
	if n := len(actions(j, preempt.ActionThaw)); n != 1 {
		t.Fatalf("%d thaw records", n)
	}
	if len(actions(j, preempt.ActionKill)) != 0 || len(e.Suspensions()) != 0 {
		t.Fatal("killed, or still suspended")
	}
}

// A workload frozen longer than MaxFrozen is killed (frozen, through its
// pidfd), recorded, and reclaimed as a kill would have been.
func TestExecutorFrozenTooLong(t *testing.T) {
	j, _, err := journal.OpenJournal(filepath.Join(t.TempDir(), "preemptions.jsonl"), 50)
	if err != nil {
		t.Fatal(err)
	}
	rt := &fakeRuntime{}
	e := &Executor{ProcRoot: "/proc", Journal: j, Mode: preempt.ModeFreeze, MaxFrozen: 300 * time.Millisecond,
		Reclaimer: &Reclaimer{Runtime: rt, Mode: preempt.ReclaimStop}}
	v, _ := counterVictim(t, "")
	e.Preempt(context.Background(), 0, "test rule", preempt.Party{}, []preempt.Victim{v}, time.Now(), nil)
	testutil.Eventually(t, 10*time.Second, "killed after --max-frozen", func() bool { return !testutil.Alive(v.PID) })
	testutil.Eventually(t, 10*time.Second, "a kill record", func() bool { return len(actions(j, preempt.ActionKill)) == 1 })
	k := actions(j, preempt.ActionKill)[0]
	if k.Victim.PID != v.PID || k.Result != "done" || k.Signal != "SIGKILL" {
		t.Fatalf("kill record: %+v", k)
	}
	testutil.Eventually(t, 10*time.Second, "reclaimed", func() bool { return rt.calls() == 1 })
	e.Wait()
	if len(e.Suspensions()) != 0 {
		t.Fatal("still listed as suspended")
	}
}

type fakeRuntime struct {
	mu sync.Mutex
	n  int
}

func (f *fakeRuntime) Reclaim(context.Context, preempt.Target, string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.n++
	return nil
}

func (f *fakeRuntime) calls() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.n
}
