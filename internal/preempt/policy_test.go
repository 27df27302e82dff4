package preempt

import (
	"testing"

	"github.com/gpud/gpud/internal/occupancy"
)

func TestDecideEveryRow(t *testing.T) {
	hi, lo := occupancy.High, occupancy.Low
	for _, tc := range []struct {
		held                 Holding
		opener               occupancy.Priority
		allow, kill, reclaim bool
	}{
		{Holding{Low: true}, hi, true, true, false},              // low held, high opens: preempt
		{Holding{High: true}, hi, true, false, false},            // high/high: share
		{Holding{High: true}, lo, false, false, true},            // high/low: deny, reclaim opener
		{Holding{Low: true}, lo, true, false, false},             // low/low: share
		{Holding{}, hi, true, false, false},                      // free
		{Holding{}, lo, true, false, false},                      // free
		{Holding{High: true, Low: true}, lo, false, false, true}, // transient: still denied
		{Holding{High: true, Low: true}, hi, true, true, false},  // transient: the lows still go
		{Holding{High: true}, occupancy.Unmanaged, true, false, false},
		{Holding{High: true}, occupancy.Unclassified, true, false, false},
		{Holding{Low: true}, occupancy.Unmanaged, true, false, false},
	} {
		v := Decide(tc.held, tc.opener)
		if v.Allow != tc.allow || v.KillHolders != tc.kill || v.ReclaimOpener != tc.reclaim {
			t.Errorf("Decide(%+v, %s) = %+v, want allow=%v kill=%v reclaim=%v", tc.held, tc.opener, v, tc.allow, tc.kill, tc.reclaim)
		}
		if v.Rule == "" {
			t.Errorf("Decide(%+v, %s): no rule named", tc.held, tc.opener)
		}
	}
}

// Every row of the table is reachable, and only the deny row refuses.
func TestRulesTable(t *testing.T) {
	if len(Rules) != 8 {
		t.Fatalf("%d rules", len(Rules))
	}
	for _, r := range Rules {
		held := Holding{High: r.HeldBy == "high", Low: r.HeldBy == "low", Shared: r.HeldBy == "shared"}
		if got := Decide(held, r.Opener); got != r.Verdict {
			t.Errorf("row %+v: Decide = %+v", r, got)
		}
		if !r.Verdict.Allow != (r.HeldBy == "high" && r.Opener == occupancy.Low) {
			t.Errorf("row %+v: only high-held/low-opens may deny", r)
		}
	}
}

func TestParseModeAndResumable(t *testing.T) {
	for _, v := range []string{"kill", "freeze", "checkpoint"} {
		if m, err := ParseMode(v); err != nil || string(m) != v {
			t.Errorf("ParseMode(%q) = %q %v", v, m, err)
		}
	}
	for _, v := range []string{"", "Freeze", " freeze", "freeze\n", "Checkpoint", "stop"} {
		if _, err := ParseMode(v); err == nil {
			t.Errorf("ParseMode(%q) accepted", v)
		}
	}
	if !Resumable(Holding{}) || !Resumable(Holding{Low: true}) || Resumable(Holding{High: true}) || Resumable(Holding{High: true, Low: true}) {
		t.Error("Resumable: a suspended workload resumes exactly when no high priority holds its GPUs")
	}
}

func TestRelendAndFreezeSafe(t *testing.T) {
	for _, c := range []struct {
		s    LoanBack
		want bool
	}{
		{LoanBack{OwnerIdle: true, BorrowerSuspended: true, Healthy: true}, true},
		{LoanBack{OwnerIdle: false, BorrowerSuspended: true, Healthy: true}, false}, // the owner works
		{LoanBack{OwnerIdle: true, BorrowerSuspended: false, Healthy: true}, false}, // killed, or paused by someone else
		{LoanBack{OwnerIdle: true, BorrowerSuspended: true, Healthy: false}, false},
		{LoanBack{}, false},
	} {
		if got := Relend(c.s); got != c.want {
			t.Errorf("Relend(%+v) = %v, want %v", c.s, got, c.want)
		}
	}
	for _, c := range []struct {
		m        Mode
		liveness bool
		want     Mode
	}{
		{ModeFreeze, false, ModeFreeze},
		{ModeFreeze, true, ModeKill},
		{ModeKill, false, ModeKill},
		{ModeKill, true, ModeKill},
		{ModeCheckpoint, true, ModeKill},
		{ModeCheckpoint, false, ModeCheckpoint},
		{"", true, ""}, // the node's mode, decided by the executor
	} {
		if got := FreezeSafe(c.m, c.liveness); got != c.want {
			t.Errorf("FreezeSafe(%q, %v) = %q, want %q", c.m, c.liveness, got, c.want)
		}
	}
}
