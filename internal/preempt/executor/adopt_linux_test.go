package executor

import (
	"testing"
	"time"

	"github.com/gpud/gpud/internal/preempt"
)

func TestUnthawed(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	rec := func(sec int, action, cgroup string, pid int, result string) preempt.Record {
		return preempt.Record{Time: t0.Add(time.Duration(sec) * time.Second), Action: action, Cgroup: cgroup, Victim: preempt.Party{PID: pid}, Result: result}
	}
	got := Unthawed([]preempt.Record{
		rec(1, preempt.ActionFreeze, "/cg/a", 10, "done"),
		rec(1, preempt.ActionFreeze, "/cg/a", 11, "done"), // same workload, one more process
		rec(2, preempt.ActionFreeze, "/cg/b", 20, "done"),
		rec(3, preempt.ActionThaw, "/cg/b", 20, "done"),                                    // thawed
		rec(4, preempt.ActionFreeze, "/cg/c", 30, "paused by someone else: left as it is"), // not gpud's
		rec(5, preempt.ActionFreeze, "/cg/d", 40, "done"),
		rec(6, preempt.ActionKill, "", 40, "done"),        // killed at --max-frozen
		rec(7, preempt.ActionFreeze, "/cg/b", 21, "done"), // frozen again
		rec(8, preempt.ActionKill, "", 99, "done"),        // another victim's kill
		rec(9, preempt.ActionFreeze, "", 50, "done"),      // no cgroup: nothing to adopt
	})
	if len(got) != 2 {
		t.Fatalf("Unthawed = %+v, want /cg/a and /cg/b", got)
	}
	if r := got["/cg/a"]; !r.Time.Equal(t0.Add(time.Second)) || r.Victim.PID != 10 {
		t.Errorf("/cg/a: %+v, want the first freeze record", r)
	}
	if r := got["/cg/b"]; !r.Time.Equal(t0.Add(7 * time.Second)) {
		t.Errorf("/cg/b: %+v, want the freeze after the thaw", r)
	}
	if len(Unthawed(nil)) != 0 {
		t.Error("Unthawed(nil) not empty")
	}
}

func TestUnder(t *testing.T) {
	for _, c := range []struct {
		path, root string
		want       bool
	}{
		{"/sys/fs/cgroup/a", "/sys/fs/cgroup", true},
		{"/sys/fs/cgroup", "/sys/fs/cgroup", false},
		{"/sys/fs/cgroupx/a", "/sys/fs/cgroup", false},
		{"/sys/fs/cgroup/a", "", false},
		{"/sys/fs/cgroup/freezer/x", "/sys/fs/cgroup/freezer/", true},
	} {
		if got := under(c.path, c.root); got != c.want {
			t.Errorf("under(%q, %q) = %v", c.path, c.root, got)
		}
	}
}

// The CUDA-checkpointed victims of an unthawed freeze: the record's
// Checkpointed, or the PIDs an older record's result names; none once the
// cgroup was thawed.
func TestUnthawedCheckpoints(t *testing.T) {
	rec := func(action, cgroup string, pid int, ckpt bool, result string) preempt.Record {
		return preempt.Record{Action: action, Cgroup: cgroup, Victim: preempt.Party{PID: pid}, Checkpointed: ckpt, Result: result}
	}
	recs := []preempt.Record{
		rec(preempt.ActionFreeze, "/cg/a", 10, true, "done; CUDA checkpointed [10]"),
		rec(preempt.ActionFreeze, "/cg/b", 20, false, "done; CUDA checkpointed [21 20]; failed (x): frozen as it is"), // an older gpud's
		rec(preempt.ActionFreeze, "/cg/b", 22, false, "done; CUDA checkpointed [21 20]; failed (x): frozen as it is"), // its lock failed
		rec(preempt.ActionFreeze, "/cg/c", 30, false, "done"),
	}
	m := unthawed(recs)
	pids := func(path string) []int {
		var out []int
		for _, r := range m[path].ckpt {
			out = append(out, r.Victim.PID)
		}
		return out
	}
	if got := pids("/cg/a"); len(got) != 1 || got[0] != 10 {
		t.Errorf("/cg/a checkpointed %v, want [10]", got)
	}
	if got := pids("/cg/b"); len(got) != 1 || got[0] != 20 {
		t.Errorf("/cg/b checkpointed %v, want [20] (22's checkpoint failed)", got)
	}
	if got := pids("/cg/c"); len(got) != 0 {
		t.Errorf("/cg/c checkpointed %v, want none", got)
	}
	if !UnthawedCheckpoints(recs) {
		t.Error("UnthawedCheckpoints = false with two checkpointed freezes unthawed")
	}
	recs = append(recs, rec(preempt.ActionThaw, "/cg/a", 10, false, "done; CUDA restored [10]"), rec(preempt.ActionThaw, "/cg/b", 20, false, "done"))
	if UnthawedCheckpoints(recs) {
		t.Error("UnthawedCheckpoints = true once every checkpointed cgroup was thawed")
	}
}
