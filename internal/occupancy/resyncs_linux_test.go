package occupancy

import (
	"maps"
	"testing"
	"time"

	"github.com/gpud/gpud/bpf"
)

// fakeTracker is a tracker on a fake /proc where pid 123 holds GPU 0
// (/dev/null) through fd 3; no root needed.
func fakeTracker(t *testing.T) (*Tracker, *fakeProc) {
	p := newFakeProc(t)
	p.process(123, "train", 5555, "0::/user.slice\n")
	p.link(123, "3", "/dev/null")
	l := NewLedger([]GPU{{Index: 0, Device: "/dev/null", Major: 1, Minor: 3}}, time.Minute)
	return &Tracker{Ledger: l, Proc: &ProcFS{Root: p.root, Devs: fakeDevs}}, p
}

func TestResyncCountsByReason(t *testing.T) {
	tr, p := fakeTracker(t)
	want := map[string]uint64{ResyncStart: 0, ResyncPeriodic: 0, ResyncMonitoring: 0, ResyncDropped: 0}
	if got := tr.ResyncCounts(); !maps.Equal(got, want) {
		t.Fatalf("before any resync: %v, want every reason at 0", got)
	}
	for _, r := range []string{ResyncStart, ResyncPeriodic, ResyncPeriodic, ResyncMonitoring} {
		if err := tr.ResyncFor(r); err != nil {
			t.Fatal(err)
		}
	}
	if err := tr.Resync(); err != nil { // asked for no reason: not counted
		t.Fatal(err)
	}
	tr.DropResyncs.Add(1)
	want = map[string]uint64{ResyncStart: 1, ResyncPeriodic: 2, ResyncMonitoring: 1, ResyncDropped: 1}
	if got := tr.ResyncCounts(); !maps.Equal(got, want) {
		t.Fatalf("counts %v, want %v", got, want)
	}
	if len(tr.Ledger.FDs(123, 0)) != 1 {
		t.Fatal("the resync did not find pid 123's GPU fd")
	}
	tr.Proc.Root = p.root + "/gone" // unreadable: the resync fails and is not counted
	if err := tr.ResyncFor(ResyncPeriodic); err == nil {
		t.Fatal("a resync of an unreadable /proc succeeded")
	}
	if got := tr.ResyncCounts()[ResyncPeriodic]; got != 2 {
		t.Fatalf("periodic %d after a failed resync, want 2", got)
	}
}

func TestEventCountsNameEveryType(t *testing.T) {
	var tr Tracker
	tr.ByType[bpf.EventDeny].Add(3)
	got := tr.EventCounts()
	if len(got) != int(bpf.EventTypes)-1 || got[bpf.EventDeny.String()] != 3 || got[bpf.EventOpen.String()] != 0 {
		t.Fatalf("event counts %v: want every type, deny 3", got)
	}
}

func TestPeriodicResyncEveryIntervalWhileMonitoring(t *testing.T) {
	tr, _ := fakeTracker(t)
	on := true
	start := time.Unix(1000, 0)
	p := &PeriodicResync{Tracker: tr, Every: 10 * time.Second, On: func() bool { return on }, Last: start}
	periodic := func() uint64 { return tr.ResyncCounts()[ResyncPeriodic] }
	p.Tick(start.Add(9 * time.Second))
	if periodic() != 0 {
		t.Fatal("resynced before the interval")
	}
	p.Tick(start.Add(10 * time.Second))
	if periodic() != 1 {
		t.Fatal("no resync at the interval")
	}
	on = false
	p.Tick(start.Add(25 * time.Second))
	if periodic() != 1 {
		t.Fatal("resynced with monitoring off")
	}
	on = true
	p.Tick(start.Add(26 * time.Second)) // the interval counts from the last resync, not the skipped tick
	if periodic() != 2 {
		t.Fatal("no resync once monitoring is back and the interval has passed")
	}
	never := &PeriodicResync{Tracker: tr, On: func() bool { return true }, Last: start}
	never.Tick(start.Add(time.Hour))
	if periodic() != 2 {
		t.Fatal("--resync-interval 0 resynced")
	}
}

func TestTrackerHolds(t *testing.T) {
	tr, _ := fakeTracker(t)
	if err := tr.Resync(); err != nil {
		t.Fatal(err)
	}
	if !tr.Holds(123, 0) {
		t.Fatal("pid 123 holds GPU 0 through fd 3")
	}
	if tr.Holds(456, 0) {
		t.Fatal("a process that is not there holds GPU 0")
	}
}

func TestNilWriterKickIsANoOp(t *testing.T) {
	var w *Writer
	w.Kick() // a hook that fires before the writer is built must not panic
}
