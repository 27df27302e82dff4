package executor

import (
	"context"
	"io"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/gpud/gpud/internal/cgroups"
	"github.com/gpud/gpud/internal/occupancy"
	"github.com/gpud/gpud/internal/preempt"
	"github.com/gpud/gpud/internal/preempt/journal"
	"github.com/gpud/gpud/internal/sharing"
	"github.com/gpud/gpud/internal/sharing/compute"
	"github.com/gpud/gpud/internal/testutil"
	"github.com/gpud/gpud/internal/workload"
)

// shareHolders: each pod's process holds GPU 0.
type shareHolders map[string]int // pod UID → PID

func (h shareHolders) Snapshot(time.Time) occupancy.Snapshot {
	g := occupancy.GPUView{GPU: occupancy.GPU{Index: 0}}
	for uid, pid := range h {
		g.Holders = append(g.Holders, occupancy.HolderView{ProcInfo: occupancy.ProcInfo{PID: pid, PodUID: uid, Priority: occupancy.Low}})
	}
	return occupancy.Snapshot{GPUs: []occupancy.GPUView{g}}
}

// shareWorkloads: each pod's workload cgroup by UID.
type shareWorkloads map[string]uint64

func (w shareWorkloads) Lookup(p occupancy.ProcInfo) (workload.Workload, bool) {
	id, ok := w[p.PodUID]
	return workload.Workload{PodUID: p.PodUID, CgroupID: id}, ok
}

// A freeze-mode preemption of a pod the compute scheduler holds frozen
// (it shares a GPU by compute, 10 %) takes the scheduler's freeze over:
// the pod stays frozen while the preemption lasts (the scheduler's next
// thaw would run a low workload on a GPU a high one needs), and the
// executor, not "someone else", thaws it when the preemption ends.
func TestPreemptionOfAThrottledPodIsNotUndone(t *testing.T) {
	root, _, err := cgroups.V2Root()
	if err != nil {
		testutil.Skip(t, "no cgroup v2 hierarchy: "+err.Error())
	}
	j, _, err := journal.OpenJournal(filepath.Join(t.TempDir(), "preemptions.jsonl"), 50)
	if err != nil {
		t.Fatal(err)
	}
	v, file := counterVictim(t, preempt.ModeFreeze)
	other, _ := counterVictim(t, preempt.ModeFreeze)
	book := sharing.NewBook()
	for uid, target := range map[string]int{"victim": 10, "other": 90} {
		book.Set(uid, []sharing.Share{{ClaimUID: uid, GPU: 0, Compute: target, Pods: []sharing.PodRef{{UID: uid}}}})
	}
	c := compute.New(compute.Config{Settings: compute.Settings{Slice: 20 * time.Millisecond, Period: 200 * time.Millisecond}, Book: book,
		Holders: shareHolders{"victim": v.PID, "other": other.PID}, Workloads: shareWorkloads{"victim": v.WorkloadCgroup, "other": other.WorkloadCgroup},
		StateDir: t.TempDir(), ProcRoot: "/proc", CgroupRoot: root, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	e := &Executor{ProcRoot: "/proc", Journal: j, CgroupRoot: root, Claim: c.Preempt, Unclaim: c.Unpreempt}

	fz, err := cgroups.WorkloadFreezer("/proc", root, v.PID, v.WorkloadCgroup)
	if err != nil {
		t.Fatal(err)
	}
	defer fz.Close()
	testutil.Eventually(t, 5*time.Second, "the scheduler freezes the 10 % pod", func() bool { p, _ := fz.Paused(); return p })
	preempted := make(chan struct{})
	e.Preempt(context.Background(), 0, "test rule", preempt.Party{PID: 1}, []preempt.Victim{v}, time.Now(), preempted)
	<-preempted
	fr := actions(j, preempt.ActionFreeze)
	if len(fr) != 1 || fr[0].Result != "done" {
		t.Fatalf("freeze records %+v: want the scheduler's freeze taken over (done), not left as someone else's", fr)
	}
	at := testutil.Counted(file)
	high := func(int) preempt.Holding { return preempt.Holding{High: true, Low: true} }
	for range 10 { // ten scheduler periods: the 10 % pod's slice comes in each
		e.Resume(high)
		time.Sleep(100 * time.Millisecond)
		if p, _ := fz.Paused(); !p {
			t.Fatal("the pod frozen for a preemption was thawed while its GPU is held by high priority")
		}
	}
	if n := testutil.Counted(file); n != at {
		t.Fatalf("counted %d → %d while preempted", at, n)
	}
	e.Resume(func(int) preempt.Holding { return preempt.Holding{Low: true} })
	e.Wait()
	if th := actions(j, preempt.ActionThaw); len(th) != 1 || th[0].Result != "done" {
		t.Fatalf("thaw records %+v: the executor thaws what it took over", th)
	}
	testutil.Eventually(t, 5*time.Second, "the pod runs again once the preemption ends", func() bool { return testutil.Counted(file) > at })
}
