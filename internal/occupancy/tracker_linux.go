package occupancy

import (
	"context"
	"errors"
	"log/slog"
	"maps"
	"os"
	"slices"
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
	// Gate, when set, receives the gate's events (EventGateHigh, EventDeny,
	// and EventOpen where the gate reports opens before their fd exists).
	Gate func(*bpf.Event)
	// Thread, when set, raises Run's OS thread above normal work: the
	// gate's decisions reach user space through this thread, and on a
	// node whose CPUs are all busy its wakeup from the ring buffer's wait
	// was most of gpud's part of a preemption (docs/benchmarks.md).
	Thread ThreadPriority
	// Opened, when set, is called after a GPU open is recorded, with the
	// holder's identity.
	Opened func(info ProcInfo, gpu int, ev *bpf.Event)
	// Drained, when set, is called each time the ring buffer has been
	// drained, with the CLOCK_MONOTONIC time taken before the check: every
	// event the kernel queued before then has been applied.
	Drained func(mono uint64)
	// Resynced, when set, is called after each full resync from /proc: a
	// holder found there came in without an open the rules saw (an fd
	// passed by SCM_RIGHTS or taken by pidfd_getfd where no hook reports
	// received files, or events lost), so the rules must judge it now.
	Resynced func()
	// Applied, when set, is called after each event is applied (benchmarks).
	Applied func(*bpf.Event)
	// RescanHolders, when positive, re-reads every holder's fd table at this
	// interval: the kernel side reports no closes (--hooks driver where the
	// driver's release cannot be hooked), so a holder that closed its GPU
	// fds is dropped at the next rescan, or at its exit.
	RescanHolders time.Duration

	Events      atomic.Uint64 // events applied
	Drops       atomic.Uint64 // events the kernel lost
	Resyncs     atomic.Uint64 // full reconciliations
	DropResyncs atomic.Uint64 // of which answered lost events
	// ByType counts events applied, by bpf.EventType (metrics).
	ByType [bpf.EventTypes]atomic.Uint64
	// reasons counts the resyncs asked for a reason (ResyncFor).
	reasons resyncCounts

	monoOffset int64 // wall ns - monotonic ns
	lastDrops  uint64

	// Identities of processes seen opening a GPU, so that a process that
	// opens and closes in a loop is read from /proc once. An entry goes with
	// the process's exit event (the kernel reports the exit of every process
	// it saw open a GPU) and all go with a resync.
	idMu  sync.Mutex
	known map[int]ProcInfo
	// recent: processes identified or re-read (an exec, a new holder) in
	// the last commYoung, whose names RefreshComms reads at every call;
	// commTick turns the others' reads (RefreshComms).
	recent   map[int]time.Time
	commTick int
	// checks: each holder's fd count (ProcFS.FDCount) at its last whole
	// read by rescanHolders, and when its known fds are next checked.
	checks map[int]holderCheck

	// Opens reported before their fd existed (bpf.FDUnknown): the opener's
	// fd table is read until it shows the GPU, or the tries run out. Used
	// by the goroutine that calls Handle only.
	opening    []pendingOpen
	nextRescan time.Time

	// Rereads counts the holders whose fd table and identity the holders'
	// re-read (RescanHolders) read whole: a known fd no longer named its
	// GPU, or its fd table changed size (or was not seen before).
	Rereads     atomic.Uint64
	OpenRetries atomic.Uint64 // fd-table reads of openers that found no fd yet
	OpenGiveUps atomic.Uint64 // reported opens whose fd never appeared
	// OpenCoalesced counts opens folded into a pending open of the same
	// thread and GPU (coalesce).
	OpenCoalesced atomic.Uint64
	// OpenSettled counts opens reported without fd that a read made after
	// them had settled already (settledBy): given up without a read.
	OpenSettled atomic.Uint64
	// settled is the last read of an opener that found its opening thread
	// out of any open (at mono, before the fd table was read) and no GPU
	// held: every open that thread started before mono had returned, and
	// its fd, if any, was closed again (settledBy).
	settled struct {
		tgid, tid uint32
		mono      uint64
	}
}

// pendingOpen is an open reported by the gate, whose fd is not known yet.
type pendingOpen struct {
	ev    bpf.Event
	tries int
	due   time.Time
	// last is the newest open coalesced into this one (its activity time).
	last uint64
}

// coalesce folds an open into a pending one of the same thread, GPU and
// high mark, and tells whether it did. The fd-table read that resolves
// the pending open comes after both were queued, so it answers for both:
// a thread that opens and closes in a loop costs one read per retry
// interval, not one per open (the event rate would otherwise be bounded by
// /proc reads). The retries start over, at their shortest interval, as for
// a new open; the earliest event stays the one confirmable holds back
// from, the newest is the activity.
func (t *Tracker) coalesce(ev *bpf.Event) bool {
	for i := range t.opening {
		po := &t.opening[i]
		if po.ev.TGID != ev.TGID || po.ev.PID != ev.PID || po.ev.GPU != ev.GPU || po.ev.PPID != ev.PPID {
			continue
		}
		po.last = max(po.last, ev.Mono)
		po.tries = 0
		if due := time.Now().Add(openRetry[0]); po.due.After(due) {
			po.due = due
		}
		t.OpenCoalesced.Add(1)
		return true
	}
	return false
}

// settledBy reports whether the open ev was settled by the last read of
// its thread's process (settled): gated before that read, by a thread
// then out of any open, so it had returned, and its fd was gone by the
// read. Reading the fd table again would find what that read found, or a
// later open's fd, which that open's own event (gated later) reads. A
// program that opens and closes a GPU thousands of times a second costs a
// read per batch of its opens, not one per open.
func (t *Tracker) settledBy(ev *bpf.Event) bool {
	s := t.settled
	if s.mono == 0 || ev.TGID != s.tgid || ev.PID != s.tid || ev.Mono >= s.mono {
		return false
	}
	t.OpenSettled.Add(1)
	t.OpenGiveUps.Add(1)
	return true
}

// openRetry is when an opener's fd table is read again, after each try
// that does not find the new fd: the fd is installed when the driver's
// open returns, which may take seconds (a GPU brought up at its first
// open). While any open waits here, the gate's confirmations stop short of
// it (Drained), so no low-priority open gets past a high one in between.
//
// The first tries are 1 ms apart (the runtime's poller waits no shorter): an
// open that takes long at all is most often one whose opener lost its CPU
// to another task in the driver's open (a busy node), and is back within a
// few ms; the read costs tens of µs.
var openRetry = []time.Duration{
	time.Millisecond, time.Millisecond, time.Millisecond, 2 * time.Millisecond, 2 * time.Millisecond,
	5 * time.Millisecond, 10 * time.Millisecond,
	20 * time.Millisecond, 50 * time.Millisecond, 100 * time.Millisecond, 200 * time.Millisecond,
	500 * time.Millisecond, time.Second, 2 * time.Second, 5 * time.Second,
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
		if ev.FD == bpf.FDUnknown {
			if t.Gate != nil {
				t.Gate(ev)
			}
			if t.coalesce(ev) || t.settledBy(ev) {
				break
			}
			t.opening = append(t.opening, pendingOpen{ev: *ev, last: ev.Mono})
			t.resolveOpen(len(t.opening)-1, time.Now())
			break
		}
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
	case bpf.EventFork, bpf.EventExec:
		t.forget(pid)
		t.reconcile(pid, at)
	case bpf.EventResync:
		// A received fd (SCM_RIGHTS, reported at receipt by the sock
		// tracepoints or sys_exit) or fds changed in bulk: a GPU the
		// process did not hold before came in without an open the gate
		// judged, so the rules judge it now as an open (Opened).
		t.forget(pid)
		if pf, gained := t.reconcile(pid, at); t.Opened != nil {
			for _, gpu := range gained {
				e := *ev
				e.GPU = int32(gpu)
				t.Opened(pf.Info, gpu, &e)
			}
		}
	case bpf.EventRelease:
		t.released(int(ev.GPU), at)
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

// resolveOpen reads the fd table of pending open i's process: when it shows
// the GPU, the process is recorded (and Opened called); when the process
// is gone, or the tries are spent, the open is dropped (the ledger then
// says what /proc says). Otherwise it is tried again later.
func (t *Tracker) resolveOpen(i int, now time.Time) {
	po := &t.opening[i]
	pid := int(po.ev.TGID)
	at := t.Wall(max(po.ev.Mono, po.last))
	done := func() { t.opening = append(t.opening[:i], t.opening[i+1:]...) }
	// Asked before the fd table is read: an open that had returned by then
	// has its fd in the table the read finds.
	asked := bpf.MonotonicNow()
	opening := t.Proc.Opening(pid, int(po.ev.PID))
	pf, err := t.Proc.Scan(pid)
	if err == nil && !opening && len(pf.FDs) == 0 {
		t.settled.tgid, t.settled.tid, t.settled.mono = po.ev.TGID, po.ev.PID, asked
	} else if t.settled.tgid == po.ev.TGID {
		t.settled.mono = 0 // it holds something now: its opens are read
	}
	switch {
	case errors.Is(err, ErrNoProcess):
		t.Ledger.RemoveProcess(pid)
		done()
		return
	case err != nil:
		t.logger().Warn("reading an opener's fds", "pid", pid, "error", err)
	case len(pf.FDs[int(po.ev.GPU)]) > 0:
		t.forget(pid)
		t.readNow(pid)
		if t.Classify != nil {
			t.Classify(&pf.Info)
		}
		t.Ledger.SetProcess(pf, at)
		// The open itself, as an fd the ledger knows now: activity as any
		// open is (a holder's later opens too, without NVML).
		fds := pf.FDs[int(po.ev.GPU)]
		t.Ledger.AddFD(pf.Info, int(po.ev.GPU), slices.Max(fds), at)
		if t.Opened != nil {
			t.Opened(pf.Info, int(po.ev.GPU), &po.ev)
		}
		done()
		return
	}
	if po.tries >= len(openRetry) || (err == nil && !opening) {
		// The open has returned without leaving the GPU open: it failed
		// after the gate let it through (the driver refused it), the file
		// was closed already, or it was an access() check. Nothing to
		// hold; the fd table read says what the process holds.
		if err == nil {
			if t.Classify != nil && len(pf.FDs) > 0 {
				t.Classify(&pf.Info)
			}
			t.Ledger.SetProcess(pf, at)
		}
		t.OpenGiveUps.Add(1)
		done()
		return
	}
	t.OpenRetries.Add(1)
	po.due = now.Add(openRetry[po.tries])
	po.tries++
}

// resolveDue retries the pending opens that are due.
func (t *Tracker) resolveDue(now time.Time) {
	for i := 0; i < len(t.opening); {
		n := len(t.opening)
		if !t.opening[i].due.After(now) {
			t.resolveOpen(i, now)
		}
		if len(t.opening) == n {
			i++
		}
	}
}

// confirmable caps what Drained may confirm: nothing from the earliest
// high-priority open (one the gate marked) whose fd is not known yet on
// (the gate keeps counting that GPU as opened by high priority until then).
// Other pending opens hold nothing back: they set no mark.
func (t *Tracker) confirmable(mono uint64) uint64 {
	for _, po := range t.opening {
		if po.ev.PPID == bpf.OpenMarkedHigh && po.ev.Mono <= mono {
			mono = po.ev.Mono - 1
		}
	}
	return mono
}

// released re-reads the fd tables of gpu's holders: one of its files lost
// its last reference (the driver's release), so some holder no longer
// holds it. Processes with an open pending are left to resolveOpen.
func (t *Tracker) released(gpu int, at time.Time) {
	for pid, gpus := range t.Ledger.FDTable() {
		if _, holds := gpus[gpu]; !holds || t.isOpening(pid) {
			continue
		}
		t.reconcile(pid, at)
	}
}

func (t *Tracker) isOpening(pid int) bool {
	for _, po := range t.opening {
		if int(po.ev.TGID) == pid {
			return true
		}
	}
	return false
}

// holderCheck is one holder's place in the holders' re-read: its fd count
// at its last whole read, how long it has gone unchanged between checks
// (every) and when it is checked next.
type holderCheck struct {
	fds   int64
	every time.Duration
	next  time.Time
}

// RescanBackoff is how many times longer than RescanHolders a holder
// whose fd table has not changed goes between checks at most: each
// unchanged check doubles its wait, up to this (with the 2 s re-read of
// --hooks driver: 2, 4, 8, 16 s); any change starts it again at one.
const RescanBackoff = 8

// rescanHolders checks the holders' known GPU fds (RescanHolders), and
// re-reads the fd table and identity of a holder where one of them no
// longer names its GPU (ProcFS.KnownFDsHold): on a node with hundreds of
// idle holders the full re-read of each was most of gpud's idle CPU
// (issue 31). Exits are events in every mode; a process whose PID is
// reused has exited, so the ledger dropped it at its exit event.
//
// A holder whose fd table changed size since its last whole read (the
// size of /proc/PID/fd: a dup, or any other fd opened or closed) is read
// whole too, so a dup is found as before. Where the kernel does not say the
// size (before Linux 6.2: 0), every holder is read whole, as before this
// check: a dup would otherwise stay out of the ledger until the fd it was
// made from goes (the kernel matrix's 6.1 guest, TestFDLifecycle).
//
// A holder found unchanged is checked less often, up to RescanBackoff
// times RescanHolders apart: a process that has held its GPU the same way
// for a while (a notebook's kernel, a server) mostly goes on so, and the
// check of each one every 2 s was most of what is left of gpud's idle CPU
// on a node with 512 holders. A close found late over-reports, never
// under-reports: the executor re-reads each victim's fds just before its
// signal, so a stale entry never causes a kill; a high-priority holder
// that closed keeps low-priority opens refused until it is found.
func (t *Tracker) rescanHolders(now time.Time) {
	table := t.Ledger.FDTable()
	for pid, fds := range table {
		if t.isOpening(pid) {
			continue
		}
		t.idMu.Lock()
		c, read := t.checks[pid]
		t.idMu.Unlock()
		if read && now.Before(c.next) {
			continue
		}
		n := t.Proc.FDCount(pid)
		if n > 0 && read && c.fds == n && t.Proc.KnownFDsHold(pid, fds) {
			c.every = min(2*c.every, RescanBackoff*t.RescanHolders)
			c.next = now.Add(c.every - t.RescanHolders/4) // checked at the first re-read from then
			t.idMu.Lock()
			t.checks[pid] = c
			t.idMu.Unlock()
			continue
		}
		// Noted before the read: a change after it is seen next time.
		t.idMu.Lock()
		if t.checks == nil {
			t.checks = map[int]holderCheck{}
		}
		t.checks[pid] = holderCheck{fds: n, every: t.RescanHolders}
		t.idMu.Unlock()
		t.Rereads.Add(1)
		t.reconcile(pid, now)
	}
	t.idMu.Lock()
	maps.DeleteFunc(t.checks, func(pid int, _ holderCheck) bool { _, ok := table[pid]; return !ok })
	t.idMu.Unlock()
}

// commYoung and commEvery: RefreshComms reads the name of a process
// identified in the last commYoung at each call, and of every other holder
// at one call in commEvery (with one call a second: 30 s).
const (
	commYoung = 10 * time.Second
	commEvery = 30
)

// RefreshComms re-reads holders' names (Ledger.RefreshComms; called once
// a second): a process renames itself mostly just after its exec or start
// (busybox applets, prctl, setproctitle), so those read in the last
// commYoung are read each time; the others, in turn, one in commEvery a
// time (each holder every commEvery calls): on a node with hundreds of
// holders, every name every second was a sixth of gpud's idle CPU
// (issue 31). A rename found late keeps the old name and the old
// classification until then: a renamed process is not taken for an agent
// before its new name is read.
func (t *Tracker) RefreshComms(now time.Time) {
	t.idMu.Lock()
	t.commTick++
	tick := t.commTick
	maps.DeleteFunc(t.recent, func(_ int, at time.Time) bool { return now.Sub(at) > commYoung })
	t.idMu.Unlock()
	t.Ledger.RefreshComms(func(pid int) (string, bool) {
		if (pid+tick)%commEvery != 0 && !t.isRecent(pid) {
			return "", false
		}
		return t.Proc.Comm(pid)
	})
}

func (t *Tracker) isRecent(pid int) bool {
	t.idMu.Lock()
	defer t.idMu.Unlock()
	_, ok := t.recent[pid]
	return ok
}

// readNow notes that pid's identity was read now (RefreshComms).
func (t *Tracker) readNow(pid int) {
	t.idMu.Lock()
	defer t.idMu.Unlock()
	if t.recent == nil {
		t.recent = map[int]time.Time{}
	}
	t.recent[pid] = time.Now()
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
	delete(t.recent, pid)
	delete(t.checks, pid)
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
	t.readNow(pid)
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

func (t *Tracker) reconcile(pid int, at time.Time) (pf ProcFDs, gained []int) {
	pf, err := t.Proc.Scan(pid)
	if err != nil {
		if errors.Is(err, ErrNoProcess) {
			t.Ledger.RemoveProcess(pid)
			return pf, nil
		}
		t.logger().Warn("reconciling process", "pid", pid, "error", err)
		return pf, nil
	}
	if len(pf.FDs) > 0 {
		t.readNow(pid)
	}
	if t.Classify != nil && len(pf.FDs) > 0 {
		t.Classify(&pf.Info)
	}
	for gpu := range pf.FDs {
		if len(t.Ledger.FDs(pid, gpu)) == 0 {
			gained = append(gained, gpu)
		}
	}
	slices.Sort(gained)
	t.Ledger.SetProcess(pf, at)
	return pf, gained
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
	if t.Resynced != nil {
		t.Resynced()
	}
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

// ThreadPriority raises the priority of the goroutine that calls Enter
// (locking it to its OS thread) until Leave; Tick, called with the time
// after each wakeup's work, keeps the raised priority within a budget.
type ThreadPriority interface {
	Enter()
	Tick(now time.Time)
	Leave()
}

// Run reads events until ctx ends. Lost events are detected whenever the
// ring buffer has been drained, and answered with a full resync.
func (t *Tracker) Run(ctx context.Context, src EventSource) error {
	if n, err := src.Dropped(); err == nil {
		t.lastDrops = n
	}
	if t.Thread != nil {
		t.Thread.Enter()
		defer t.Thread.Leave()
	}
	var rec ringbuf.Record
	var ev bpf.Event
	for ctx.Err() == nil {
		src.SetDeadline(t.wakeAt(time.Now()))
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
		now := time.Now()
		t.resolveDue(now)
		if t.RescanHolders > 0 && !now.Before(t.nextRescan) {
			t.rescanHolders(now)
			t.nextRescan = now.Add(t.RescanHolders)
		}
		if src.Pending() == 0 {
			t.checkDrops(src)
			if t.Drained != nil {
				t.Drained(t.confirmable(mono))
			}
		}
		if t.Thread != nil {
			t.Thread.Tick(now)
		}
	}
	return nil
}

// wakeAt is when Run stops waiting for an event: within a second, and at
// the next pending open's retry or holder rescan.
func (t *Tracker) wakeAt(now time.Time) time.Time {
	at := now.Add(time.Second)
	for _, po := range t.opening {
		if po.due.Before(at) {
			at = po.due
		}
	}
	if t.RescanHolders > 0 && !t.nextRescan.IsZero() && t.nextRescan.Before(at) {
		at = t.nextRescan
	}
	return at
}
