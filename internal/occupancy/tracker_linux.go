package occupancy

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cilium/ebpf/ringbuf"
	"github.com/gpud/gpud/bpf"
)

// EventSource is the kernel side as the tracker sees it (a *bpf.Monitor).
type EventSource interface {
	ReadEvent(*ringbuf.Record, *bpf.Event) error
	SetDeadline(time.Time)
	Pending() int
	Dropped() (uint64, error)
}

// Tracker applies kernel events to the ledger, reconciling from /proc what
// the events cannot say (fork, exec, dup2, close_range, SCM_RIGHTS) and
// everything after lost events.
type Tracker struct {
	Ledger *Ledger
	Proc   *ProcFS
	Log    *slog.Logger
	// Classify, when set, fills in a new holder's priority.
	Classify func(*ProcInfo)
	// Watch, when set, makes the kernel side follow a process found in /proc
	// (bpf.Monitor.WatchProcess); without it, its closes and exit would be
	// filtered out.
	Watch func(pid int) error
	// Gate, when set, receives the gate's events (EventGateHigh, EventDeny).
	Gate func(*bpf.Event)
	// Opened, when set, is called after a GPU open is recorded, with the
	// holder's identity.
	Opened func(info ProcInfo, gpu int, ev *bpf.Event)
	// Drained, when set, is called each time the ring buffer has been
	// drained, with the CLOCK_MONOTONIC time taken before the check: every
	// event the kernel queued before then has been applied.
	Drained func(mono uint64)
	// Applied, when set, is called after each event is applied (benchmarks).
	Applied func(*bpf.Event)

	Events      atomic.Uint64 // events applied
	Drops       atomic.Uint64 // events the kernel lost
	Resyncs     atomic.Uint64 // full reconciliations
	DropResyncs atomic.Uint64 // of which answered lost events
	// ByType counts events applied, by bpf.EventType (metrics).
	ByType [bpf.EventTypes]atomic.Uint64

	monoOffset int64 // wall ns - monotonic ns
	lastDrops  uint64

	// Identities of processes seen opening a GPU, so that a process that
	// opens and closes in a loop is read from /proc once. An entry goes with
	// the process's exit event (the kernel reports the exit of every process
	// it saw open a GPU) and all go with a resync.
	idMu  sync.Mutex
	known map[int]ProcInfo
}

// Wall converts a CLOCK_MONOTONIC timestamp to wall-clock time.
func (t *Tracker) Wall(mono uint64) time.Time {
	if t.monoOffset == 0 {
		t.monoOffset = time.Now().UnixNano() - int64(bpf.MonotonicNow())
	}
	return time.Unix(0, int64(mono)+t.monoOffset)
}

func (t *Tracker) logger() *slog.Logger {
	if t.Log == nil {
		return slog.Default()
	}
	return t.Log
}

// Handle applies one event.
func (t *Tracker) Handle(ev *bpf.Event) {
	at := t.Wall(ev.Mono)
	pid := int(ev.TGID)
	switch ev.Type {
	case bpf.EventOpen:
		info, ok := t.Ledger.Has(pid)
		if !ok {
			info, ok = t.cached(pid)
		}
		if !ok {
			info = t.identify(pid, ev)
			t.remember(info)
		}
		t.Ledger.AddFD(info, int(ev.GPU), ev.FD, at)
		if t.Opened != nil {
			t.Opened(info, int(ev.GPU), ev)
		}
	case bpf.EventClose:
		t.Ledger.RemoveFD(pid, int(ev.GPU), ev.FD)
	case bpf.EventExit:
		t.forget(pid)
		t.Ledger.RemoveProcess(pid)
	case bpf.EventFork, bpf.EventExec, bpf.EventResync:
		t.forget(pid)
		t.reconcile(pid, at)
	case bpf.EventGateHigh, bpf.EventDeny:
		if t.Gate != nil {
			t.Gate(ev)
		}
	}
	t.Events.Add(1)
	if int(ev.Type) < len(t.ByType) {
		t.ByType[ev.Type].Add(1)
	}
	if t.Applied != nil {
		t.Applied(ev)
	}
}

func (t *Tracker) cached(pid int) (ProcInfo, bool) {
	t.idMu.Lock()
	defer t.idMu.Unlock()
	info, ok := t.known[pid]
	return info, ok
}

func (t *Tracker) remember(info ProcInfo) {
	t.idMu.Lock()
	defer t.idMu.Unlock()
	if t.known == nil {
		t.known = map[int]ProcInfo{}
	}
	t.known[info.PID] = info
}

func (t *Tracker) forget(pid int) {
	t.idMu.Lock()
	defer t.idMu.Unlock()
	delete(t.known, pid)
}

// Identify reads a process's identity, classified (the gate's events name
// processes that may not hold anything yet).
func (t *Tracker) Identify(pid int, ev *bpf.Event) ProcInfo {
	if info, ok := t.Ledger.Has(pid); ok {
		return info
	}
	// A process the gate refused may hold nothing, so its exit is never
	// reported: check that the cached identity is still this PID's.
	if info, ok := t.cached(pid); ok {
		if st, err := StartTime(t.Proc.Root, pid); err == nil && st == info.StartTime {
			return info
		}
		t.forget(pid)
	}
	info := t.identify(pid, ev)
	if info.StartTime != 0 {
		t.remember(info)
	}
	return info
}

// identify reads a new holder's identity; when the process is already gone
// the event's own fields stand in (its exit event follows).
func (t *Tracker) identify(pid int, ev *bpf.Event) ProcInfo {
	info, err := t.Proc.Info(pid)
	if err != nil {
		info = ProcInfo{PID: pid, Comm: ev.Comm, Priority: Unclassified}
	}
	if info.CgroupID == 0 {
		info.CgroupID = ev.CgroupID
	}
	if t.Classify != nil {
		t.Classify(&info)
	}
	return info
}

func (t *Tracker) reconcile(pid int, at time.Time) {
	pf, err := t.Proc.Scan(pid)
	if err != nil {
		if errors.Is(err, ErrNoProcess) {
			t.Ledger.RemoveProcess(pid)
			return
		}
		t.logger().Warn("reconciling process", "pid", pid, "error", err)
		return
	}
	if t.Classify != nil && len(pf.FDs) > 0 {
		t.Classify(&pf.Info)
	}
	t.Ledger.SetProcess(pf, at)
}

// Resync makes the ledger equal to /proc: every process's GPU fds.
func (t *Tracker) Resync() error {
	t.idMu.Lock()
	t.known = nil
	t.idMu.Unlock()
	procs, err := t.Proc.ScanAll()
	if err != nil {
		return err
	}
	// The scan reads each leader's fd table; a holder the ledger knows
	// whose threads keep the GPU where the leader's table does not show
	// it (a thread that unshared its table) is read whole before it is
	// dropped: every thread's table, for these few processes only.
	found := make(map[int]bool, len(procs))
	for _, pf := range procs {
		found[pf.Info.PID] = true
	}
	for pid := range t.Ledger.FDTable() {
		if found[pid] {
			continue
		}
		if pf, err := t.Proc.Scan(pid); err == nil && len(pf.FDs) > 0 {
			procs = append(procs, pf)
		}
	}
	if t.Watch != nil {
		// Watched first, read again second: whatever the process does after
		// the second read is seen by the kernel side.
		kept := procs[:0]
		for _, pf := range procs {
			if err := t.Watch(pf.Info.PID); err != nil {
				t.logger().Warn("watching process", "pid", pf.Info.PID, "error", err)
			}
			again, err := t.Proc.Scan(pf.Info.PID)
			if err != nil || len(again.FDs) == 0 {
				continue // gone, or closed everything, meanwhile
			}
			kept = append(kept, again)
		}
		procs = kept
	}
	if t.Classify != nil {
		for i := range procs {
			t.Classify(&procs[i].Info)
		}
	}
	t.Ledger.ReplaceAll(procs, time.Now())
	t.Resyncs.Add(1)
	return nil
}

// checkDrops resyncs when the kernel lost events since the last check.
func (t *Tracker) checkDrops(src EventSource) {
	n, err := src.Dropped()
	if err != nil || n == t.lastDrops {
		return
	}
	lost := n - t.lastDrops
	t.lastDrops = n
	t.Drops.Add(lost)
	t.logger().Warn("kernel dropped events, resyncing from /proc", "dropped", lost)
	t.DropResyncs.Add(1)
	if err := t.Resync(); err != nil {
		t.logger().Error("resync", "error", err)
	}
}

// Run reads events until ctx ends. Lost events are detected whenever the
// ring buffer has been drained, and answered with a full resync.
func (t *Tracker) Run(ctx context.Context, src EventSource) error {
	if n, err := src.Dropped(); err == nil {
		t.lastDrops = n
	}
	var rec ringbuf.Record
	var ev bpf.Event
	for ctx.Err() == nil {
		src.SetDeadline(time.Now().Add(time.Second))
		err := src.ReadEvent(&rec, &ev)
		switch {
		case err == nil:
			t.Handle(&ev)
		case errors.Is(err, os.ErrDeadlineExceeded):
		case errors.Is(err, bpf.ErrClosed):
			return nil
		case errors.Is(err, bpf.ErrShortEvent), errors.Is(err, bpf.ErrBadEvent):
			t.logger().Error("malformed kernel event", "error", err)
		default:
			return err
		}
		mono := bpf.MonotonicNow()
		if src.Pending() == 0 {
			t.checkDrops(src)
			if t.Drained != nil {
				t.Drained(mono)
			}
		}
	}
	return nil
}
