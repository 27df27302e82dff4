package preempt

import (
	"testing"
	"time"
)

func TestUnthawed(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	rec := func(sec int, action, cgroup string, pid int, result string) Record {
		return Record{Time: t0.Add(time.Duration(sec) * time.Second), Action: action, Cgroup: cgroup, Victim: Party{PID: pid}, Result: result}
	}
	got := Unthawed([]Record{
		rec(1, ActionFreeze, "/cg/a", 10, "done"),
		rec(1, ActionFreeze, "/cg/a", 11, "done"), // same workload, one more process
		rec(2, ActionFreeze, "/cg/b", 20, "done"),
		rec(3, ActionThaw, "/cg/b", 20, "done"),                                    // thawed
		rec(4, ActionFreeze, "/cg/c", 30, "paused by someone else: left as it is"), // not gpud's
		rec(5, ActionFreeze, "/cg/d", 40, "done"),
		rec(6, ActionKill, "", 40, "done"),        // killed at --max-frozen
		rec(7, ActionFreeze, "/cg/b", 21, "done"), // frozen again
		rec(8, ActionKill, "", 99, "done"),        // another victim's kill
		rec(9, ActionFreeze, "", 50, "done"),      // no cgroup: nothing to adopt
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
