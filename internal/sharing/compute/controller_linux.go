package compute

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gpud/gpud/internal/occupancy"
	"github.com/gpud/gpud/internal/sharing"
	"github.com/gpud/gpud/internal/workload"
)

// Utilization is per-process GPU utilization (NVML's process utilization).
type Utilization interface {
	// Utilization returns the percent of GPU gpu (0–100) each process,
	// by PID, used since the previous call for that GPU (over 100 when
	// a measurement of a longer time arrives in it). Busy processes
	// sharing a GPU share its 100 %; a frozen process uses 0.
	Utilization(gpu int) (map[int]float64, error)
}

// Freezer finds, freezes and thaws workload cgroups (CgroupFreezer).
type Freezer interface {
	Locate(pid int, cgroupID uint64) (Cgroup, error)
	Set(c Cgroup, frozen bool) error
	// Paused: frozen by anyone (a cgroup someone else paused is not the
	// scheduler's).
	Paused(c Cgroup) (bool, error)
}

// Holders is who holds each GPU: the ledger.
type Holders interface {
	Snapshot(now time.Time) occupancy.Snapshot
}

// Workloads finds a pod's workload cgroup: the registry.
type Workloads interface {
	Lookup(p occupancy.ProcInfo) (workload.Workload, bool)
}

// Clock is time, for tests.
type Clock interface {
	Now() time.Time
	After(d time.Duration) <-chan time.Time
}

type realClock struct{}

func (realClock) Now() time.Time                         { return time.Now() }
func (realClock) After(d time.Duration) <-chan time.Time { return time.After(d) }

// Config is what a Controller is built from.
type Config struct {
	Settings
	Book      *sharing.Book
	Holders   Holders
	Workloads Workloads
	// Utilization measures the pods' use; nil: the token's time is
	// charged and no pod is called idle (no work conservation).
	Utilization Utilization
	// Samples, when Utilization is nil, is the GPU time each process
	// used, by PID, summed over NVML's per-process samples from `from`
	// through `through` (the newest sample's time), each sample once
	// (gpumon.Monitor.Busy); a new from starts the sums again.
	Samples func(gpu int) (byPID map[int32]time.Duration, from, through time.Time, err error)
	// Freezer: nil is the cgroups' (CgroupFreezer, on ProcRoot and
	// CgroupRoot).
	Freezer Freezer
	// StateDir holds the journal (JournalFile); CgroupRoot is the cgroup v2
	// mount (journaled paths are checked against it).
	StateDir, CgroupRoot, ProcRoot string
	// Preempted, when set, reports whether the preemption journal holds
	// the cgroup directory path frozen (a previous gpud's preemption, for
	// this one's executor to adopt): the journal thaw at start skips it.
	Preempted func(path string) bool
	// Enforcing: freeze only when rules are carried out (--enforce);
	// otherwise the scheduler runs and is shown, and freezes nothing.
	Enforcing func() bool
	Clock     Clock
	Log       *slog.Logger
	// Thread, when set, raises Run's OS thread above normal work within
	// a CPU budget (kill.EventThread), and Run waits between steps in
	// ppoll on it, so that the kernel wakes it when a run ends, not a Go
	// timer on a normal-priority thread (wait_linux.go). Only with the
	// real clock.
	Thread occupancy.ThreadPriority
}

type locKey struct {
	pid      int
	cgroupID uint64
}

type located struct {
	cg Cgroup
	at time.Time
}

// relocate: how long a found cgroup is used before it is found again (a
// process moved to another cgroup of its pod).
const relocate = 10 * time.Second

// member is a sharing pod on one GPU.
type member struct {
	pod sharing.PodRef
	Pod
	pids []int
	cg   Cgroup
}

// sampled is Utilization from NVML's samples, summed (Samples): what
// each process used since the previous call is the difference of its
// sums, over the time since that call (above 100 % when a sample of
// more time arrives in it; 0 when no new sample came). So each sample is
// charged once, at the first call after it, for the time it covers,
// however many arrive between two calls. The scheduler steps once a run
// (100–200 ms) and NVML is read every 200 ms: charging the last sample's
// percent for each step's time counted some samples twice and others not
// at all, in step with the schedule (a pod's measured use per second of
// token came out 25 % off); and keeping only the last sample, a Step
// late under CPU load (50–100 ms) with two samples since the previous
// lost the first and charged the second for both. A call with no
// previous one of the same sums (the first, after a gap in the samples,
// after maxAge without a call) is where counting starts: no measurement.
// Sums older than maxAge are no measurement.
type sampled struct {
	f      func(gpu int) (map[int32]time.Duration, time.Time, time.Time, error)
	clock  Clock
	maxAge time.Duration
	last   map[int]sampledAt
}

// sampledAt: the sums at the last call, per GPU.
type sampledAt struct {
	from, call time.Time
	busy       map[int32]time.Duration
}

func (s *sampled) Utilization(gpu int) (map[int]float64, error) {
	busy, from, through, err := s.f(gpu)
	if err != nil {
		return nil, err
	}
	now := s.clock.Now()
	if age := now.Sub(through); age > s.maxAge {
		return nil, fmt.Errorf("compute: GPU %d's utilization sample is %s old", gpu, age.Round(time.Millisecond))
	}
	prev, ok := s.last[gpu]
	s.last[gpu] = sampledAt{from: from, call: now, busy: busy}
	since := now.Sub(prev.call)
	if !ok || !prev.from.Equal(from) || since > s.maxAge {
		return nil, fmt.Errorf("compute: GPU %d's utilization: counted from now", gpu)
	}
	out := make(map[int]float64, len(busy))
	if since <= 0 {
		return out, nil // no time: no use
	}
	for pid, b := range busy {
		d := b - prev.busy[pid]
		if d < 0 {
			d = b // dropped (not sampled for long) and counted from 0 again
		}
		out[int(pid)] = 100 * d.Seconds() / since.Seconds()
	}
	return out, nil
}

// Scheduling reports whether GPU gpu has pods sharing its compute (its
// per-process utilization is then sampled); false for a nil Controller.
func (c *Controller) Scheduling(gpu int) bool {
	if c == nil {
		return false
	}
	st := c.shown.Load()
	return st != nil && st.scheduling[gpu]
}

// Controller runs a Sched per shared GPU with compute targets and freezes
// and thaws the pods' cgroups as they decide.
type Controller struct {
	cfg Config

	mu      sync.Mutex
	scheds  map[int]*Sched
	members map[int][]member
	frozen  map[Cgroup]bool // frozen by the scheduler now
	// others: cgroups paused by someone else (docker pause, a
	// preemption): not scheduled, never written. Read once a Period (at
	// refresh) and before each freeze, not every tick.
	others map[Cgroup]bool
	// preempted: cgroup directories the preemption executor holds
	// (Preempt): never frozen or thawed by the scheduler.
	preempted map[string]bool
	managed   []Cgroup // journaled
	// located: each member's cgroup by its first process and workload
	// cgroup, found again once a relocate (reading /proc and the cgroup
	// tree once a Period for each was a tenth of the scheduler's CPU).
	located map[locKey]located
	guard   *guard // started before the first freeze (GuardExe)
	ops     atomic.Uint64
	// thawedByOther counts the cgroups found thawed while the scheduler
	// held them frozen (checkFrozen).
	thawedByOther atomic.Uint64
	// shown is the scheduling as Snapshot and Scheduling read it, made
	// at each step and refresh: readers on normal-priority goroutines
	// (the state file's writer, the gate, the utilization sampler) never
	// take mu, so the raised thread never waits for one of them that
	// the node's CPU load keeps from running while it holds mu.
	shown atomic.Pointer[shownState]
}

// shownState is the scheduling as last published (Controller.shown).
type shownState struct {
	gpus       []GPUStatus
	scheduling map[int]bool
}

// New builds a Controller; Run starts it.
func New(cfg Config) *Controller {
	if cfg.Clock == nil {
		cfg.Clock = realClock{}
	}
	if cfg.Freezer == nil {
		cfg.Freezer = newFDFreezer(CgroupFreezer{ProcRoot: cfg.ProcRoot, CgroupRoot: cfg.CgroupRoot})
	}
	if cfg.Utilization == nil && cfg.Samples != nil {
		cfg.Utilization = &sampled{f: cfg.Samples, clock: cfg.Clock, maxAge: 2 * cfg.Period, last: map[int]sampledAt{}}
	}
	if cfg.Enforcing == nil {
		cfg.Enforcing = func() bool { return true }
	}
	return &Controller{cfg: cfg, scheds: map[int]*Sched{}, members: map[int][]member{}, frozen: map[Cgroup]bool{}, others: map[Cgroup]bool{}, preempted: map[string]bool{}, located: map[locKey]located{}}
}

// Ops counts the freezes and thaws done.
func (c *Controller) Ops() uint64 { return c.ops.Load() }

// Run thaws what a previous gpud left frozen (the journal), then
// schedules until ctx ends, when it thaws everything it froze. It wakes
// when a run ends (the earliest Due of the GPUs' schedulers: one wake-up a
// run, not one a slice) and once a Period to read the book and the
// holders (then it steps too: a pod gone is thawed, a new one seen).
func (c *Controller) Run(ctx context.Context) {
	if n, err := ThawJournal(c.cfg.StateDir, c.cfg.CgroupRoot, c.cfg.Freezer, c.cfg.Preempted); err != nil || n > 0 {
		c.cfg.Log.Warn("thawed the cgroups a previous gpud's compute scheduler left frozen", "cgroups", n, "error", err)
	}
	wait, done := c.waitFor(ctx)
	defer done() // after stop: its thaws run on the raised thread too
	defer c.stop()
	var refreshed, due time.Time
	for {
		now := c.cfg.Clock.Now()
		stepped := false
		if now.Sub(refreshed) >= c.cfg.Period {
			c.refresh(now)
			refreshed = now
			c.tick(now)
			stepped = true
		}
		if !stepped && !now.Before(due) {
			c.tick(now)
		}
		// A late wake-up steps at once; no burst to catch up.
		due = c.due(now)
		next := refreshed.Add(c.cfg.Period)
		if due.Before(next) {
			next = due
		}
		// For next−now from the step's end, not until next: the next
		// holder was thawed at the step's end, once the last was frozen
		// (settle: ms on a busy node), and its run is timed from
		// its thaw.
		if !wait(max(next.Sub(now), time.Millisecond)) {
			return
		}
	}
}

// due is the earliest next Step of the GPUs' schedulers; a Period later
// when nothing is scheduled.
func (c *Controller) due(now time.Time) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	due := now.Add(c.cfg.Period)
	for gpu := range c.members {
		if s := c.scheds[gpu]; s != nil && s.Due().Before(due) {
			due = s.Due()
		}
	}
	return due
}

// refresh reads the book and the holders: each GPU's sharing pods with a
// compute target, their processes on it and their cgroup.
func (c *Controller) refresh(now time.Time) {
	byGPU := map[int][]sharing.Share{}
	for _, sh := range c.cfg.Book.Shares() {
		if sh.Compute > 0 {
			byGPU[sh.GPU] = append(byGPU[sh.GPU], sh)
		}
	}
	members := map[int][]member{}
	kept := map[locKey]located{}
	if len(byGPU) > 0 {
		snap := c.cfg.Holders.Snapshot(now)
		for _, g := range snap.GPUs {
			if len(byGPU[g.Index]) > 0 {
				members[g.Index] = c.membersOf(now, kept, byGPU[g.Index], g.Holders)
			}
		}
	}
	c.located = kept
	if fz, ok := c.cfg.Freezer.(*fdFreezer); ok {
		fz.sweep() // the files of cgroups no longer scheduled
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.members = members
	c.checkFrozen()
	clear(c.others)
	for _, ms := range members {
		for _, m := range ms {
			if !c.frozen[m.cg] && !m.Exempt && c.pausedByOther(m.cg) {
				c.others[m.cg] = true
			}
		}
	}
	for gpu := range c.scheds {
		if _, ok := members[gpu]; !ok {
			delete(c.scheds, gpu)
		}
	}
	for gpu := range members {
		if c.scheds[gpu] == nil {
			c.scheds[gpu] = NewSched(c.cfg.Settings)
		}
	}
	c.publish()
}

func (c *Controller) membersOf(now time.Time, kept map[locKey]located, shares []sharing.Share, holders []occupancy.HolderView) []member {
	byPod := map[string]*member{}
	var order []string
	for _, sh := range shares {
		for _, p := range sh.Pods {
			if p.UID == "" {
				continue
			}
			m := byPod[p.UID]
			if m == nil {
				m = &member{pod: p, Pod: Pod{UID: p.UID}}
				byPod[p.UID] = m
				order = append(order, p.UID)
			}
			m.Target += sh.Compute // two claims of one pod on one GPU: their sum
			m.HardCap = m.HardCap || sh.HardCap
		}
	}
	for _, h := range holders {
		m := byPod[h.PodUID]
		if m == nil || h.PodUID == "" {
			continue
		}
		m.pids = append(m.pids, h.PID)
		if h.Priority == occupancy.High || h.Agent {
			m.Exempt = true // high priority and agents are never frozen
		}
	}
	var out []member
	for _, uid := range order {
		m := byPod[uid]
		if len(m.pids) == 0 {
			continue // not on the GPU: nothing to share
		}
		w, ok := c.cfg.Workloads.Lookup(occupancy.ProcInfo{PodUID: uid})
		if !ok || w.CgroupID == 0 || w.PodUID != uid || w.Agent {
			continue
		}
		key := locKey{m.pids[0], w.CgroupID}
		l, ok := c.located[key]
		if !ok || now.Sub(l.at) >= relocate || now.Before(l.at) {
			cg, err := c.cfg.Freezer.Locate(m.pids[0], w.CgroupID)
			if err != nil {
				c.cfg.Log.Debug("no freezer for a sharing pod", "pod_uid", uid, "error", err)
				continue
			}
			l = located{cg: cg, at: now}
		}
		kept[key] = l
		m.cg = l.cg
		out = append(out, *m)
	}
	return out
}

// tick steps each GPU's scheduler and freezes and thaws as it says.
func (c *Controller) tick(now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	want := map[Cgroup]bool{} // frozen?
	for gpu, ms := range c.members {
		var use map[string]float64
		if c.cfg.Utilization != nil {
			if u, err := c.cfg.Utilization.Utilization(gpu); err == nil {
				use = map[string]float64{}
				for _, m := range ms {
					for _, pid := range m.pids {
						use[m.UID] += u[pid] / 100
					}
				}
			}
		}
		pods := make([]Pod, 0, len(ms))
		for _, m := range ms {
			if c.preempted[m.cg.Path] {
				continue // the executor's: frozen for a preemption, thawed by it
			}
			if c.others[m.cg] && !m.Exempt {
				continue // paused by someone else (docker pause, a preemption): not ours
			}
			pods = append(pods, m.Pod)
		}
		run := c.scheds[gpu].Step(now, pods, use)
		for _, p := range pods {
			m := ms[slices.IndexFunc(ms, func(m member) bool { return m.UID == p.UID })]
			// A pod sharing two GPUs runs only when both let it.
			want[m.cg] = want[m.cg] || !run[p.UID]
		}
	}
	if !c.cfg.Enforcing() {
		clear(want)
	}
	c.journal(want)
	// Freezes first, then, once they are frozen (settle), thaws: the
	// token's old and new holders do not run together.
	var freezing, thawing []Cgroup
	for cg, fz := range want {
		switch {
		case fz && !c.frozen[cg]:
			c.set(cg, true)
			if c.frozen[cg] {
				freezing = append(freezing, cg)
			}
		case !fz && c.frozen[cg]:
			thawing = append(thawing, cg)
		}
	}
	if len(freezing) > 0 && len(thawing) > 0 {
		c.settle(freezing)
	}
	for _, cg := range thawing {
		c.set(cg, false)
	}
	for cg := range c.frozen {
		if _, ok := want[cg]; !ok {
			c.set(cg, false) // no longer scheduled
		}
	}
	c.publish()
}

// frozenWaiter is a Freezer that can wait for a freeze it started to
// complete (fdFreezer).
type frozenWaiter interface {
	WaitFrozen(c Cgroup, deadline time.Time) (bool, error)
}

// settle waits, for at most a runCap and without the lock, until the
// cgroups just frozen are frozen, before the next holder is thawed. A
// spinning task freezes when it is next scheduled: on an idle node at
// once, but with every CPU busy (a training job's data loaders) it first
// waits for a CPU. With four spinning loops a CPU on 2 CPUs half the
// freezes outlasted Set's 5 ms wait (settle then waited up to 18 ms
// more); the next holder, thawed at once, ran beside the old one, which
// the GPU counted busy until it froze, and a 20 % pod frozen twice a
// second had up to 50 % of a second (TestComputeShareTargetsHeld). The
// lock is let go so that a preemption (Preempt) is not held up; set reads
// c.preempted again before each thaw. Taking it back waits only for a
// preemption's hand-over: the readers on normal-priority goroutines (the
// state file's writer, the gate, the utilization sampler) read the
// published copy (shown), so none of them, kept off a CPU by the node's
// load while it held the lock, stands between the freeze and the thaw,
// when neither pod runs. Past the bound (a task in an uninterruptible
// sleep), the next holder runs beside it.
func (c *Controller) settle(cgs []Cgroup) {
	w, ok := c.cfg.Freezer.(frozenWaiter)
	if !ok {
		return
	}
	c.mu.Unlock()
	defer c.mu.Lock()
	deadline := c.cfg.Clock.Now().Add(c.cfg.runCap())
	for _, cg := range cgs {
		if done, err := w.WaitFrozen(cg, deadline); err != nil || !done {
			c.cfg.Log.Debug("compute scheduler: a freeze did not complete; thawing the next holder beside it", "cgroup", cg.Path, "error", err)
		}
	}
}

// checkFrozen reads, once a Period, whether each cgroup the scheduler
// holds frozen still is: one thawed by someone else (a `docker unpause`, a
// tool, a freeze lost) is frozen again at the next step rather than left
// to run until its next turn, and said. Under mu.
func (c *Controller) checkFrozen() {
	for cg := range c.frozen {
		if c.preempted[cg.Path] {
			continue
		}
		if p, err := c.cfg.Freezer.Paused(cg); err == nil && !p {
			delete(c.frozen, cg)
			if n := c.thawedByOther.Add(1); n == 1 || n%100 == 0 {
				c.cfg.Log.Warn("compute scheduler: a cgroup it froze was found thawed; freezing it again", "cgroup", cg.Path, "times", n)
			}
		}
	}
}

func (c *Controller) pausedByOther(cg Cgroup) bool {
	p, err := c.cfg.Freezer.Paused(cg)
	return err == nil && p
}

func (c *Controller) set(cg Cgroup, frozen bool) {
	if c.preempted[cg.Path] {
		delete(c.frozen, cg) // handed to the executor (Preempt): its to thaw
		return
	}
	if frozen && !c.frozen[cg] && c.pausedByOther(cg) {
		// Paused by someone else since it was last read: frozen by us
		// it would be thawed by us, undoing their pause.
		c.others[cg] = true
		return
	}
	c.ops.Add(1)
	if err := c.cfg.Freezer.Set(cg, frozen); err != nil {
		c.cfg.Log.Debug("compute scheduler: freezer write failed", "cgroup", cg.Path, "frozen", frozen, "error", err)
		if !frozen {
			return // still ours to thaw next tick
		}
	}
	if frozen {
		c.frozen[cg] = true
	} else {
		delete(c.frozen, cg)
	}
}

// journal writes the cgroups that may be frozen (those scheduled, those
// still frozen) before any is frozen, when that set grew, and drops the
// ones gone once thawed.
func (c *Controller) journal(want map[Cgroup]bool) {
	set := map[Cgroup]bool{}
	for cg := range want {
		set[cg] = true
	}
	for cg := range c.frozen {
		set[cg] = true
	}
	cgs := slices.SortedFunc(maps.Keys(set), func(a, b Cgroup) int {
		if a.Path != b.Path {
			return strings.Compare(a.Path, b.Path)
		}
		return strings.Compare(a.Kind, b.Kind)
	})
	if slices.Equal(cgs, c.managed) {
		return
	}
	if len(cgs) > 0 && c.guard == nil && GuardExe != "" {
		g, note, err := startGuard(GuardExe, c.cfg.StateDir, c.cfg.CgroupRoot)
		if err != nil {
			// Without a guard a SIGKILLed gpud's freezes would last until
			// the next gpud starts: nothing is frozen.
			c.cfg.Log.Warn("compute scheduler: no thaw guard; freezing nothing", "error", err)
			clear(want)
			return
		}
		c.guard = g
		c.cfg.Log.Info("compute scheduler: thaw guard started", "pid", g.cmd.Process.Pid, "cgroup", note)
	}
	if err := writeJournal(c.cfg.StateDir, cgs); err != nil {
		// Without a journal nothing is frozen: a crash would leave it so.
		c.cfg.Log.Warn("compute scheduler: cannot journal; freezing nothing", "error", err)
		clear(want)
		return
	}
	c.managed = cgs
}

// Preempt hands the cgroup directory path to the preemption executor
// before it reads or writes its freezer: from then on until Unpreempt the
// scheduler neither freezes nor thaws it (a thaw would undo the
// preemption). It reports whether the scheduler held path frozen: that
// freeze is the executor's now (it thaws it when the preemption ends).
// Taken under the lock a tick holds while it freezes and thaws, so no
// thaw of the scheduler's lands after it. Nil-safe.
func (c *Controller) Preempt(path string) (throttled bool) {
	if c == nil {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.preempted[path] = true
	for cg := range c.frozen {
		if cg.Path == path {
			delete(c.frozen, cg)
			throttled = true
		}
	}
	if throttled {
		c.publish()
	}
	// Out of the journal before the executor freezes or journals it: the
	// thaw guard, or the next gpud, must not undo the preemption.
	if kept := slices.DeleteFunc(slices.Clone(c.managed), func(cg Cgroup) bool { return cg.Path == path }); len(kept) != len(c.managed) {
		if err := writeJournal(c.cfg.StateDir, kept); err != nil {
			c.cfg.Log.Warn("compute scheduler: cannot journal a preempted cgroup's hand-over", "cgroup", path, "error", err)
		} else {
			c.managed = kept
		}
	}
	return throttled
}

// Unpreempt gives path back to the scheduler: the executor's preemption of
// it ended (thawed, killed, or never frozen). Nil-safe.
func (c *Controller) Unpreempt(path string) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.preempted, path)
}

// stop thaws every cgroup the scheduler froze and removes the journal.
func (c *Controller) stop() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for cg := range c.frozen {
		c.set(cg, false)
	}
	if len(c.frozen) == 0 {
		if err := writeJournal(c.cfg.StateDir, nil); err == nil {
			c.managed = nil
		}
	}
	c.guard.close() // nothing journaled: it thaws nothing; else what stayed frozen
	c.guard = nil
	c.members = map[int][]member{}
	c.publish()
	if fz, ok := c.cfg.Freezer.(*fdFreezer); ok {
		fz.Close() // its cgroups' files (a later Run opens them again)
	}
}

// GPUStatus is one shared GPU's compute scheduling (Snapshot).
type GPUStatus struct {
	GPU  int
	Pods []PodShare
}

// PodShare is a pod's status with its name.
type PodShare struct {
	PodStatus
	Namespace, Name string
	// Frozen: its cgroup is frozen by the scheduler now (for this GPU or
	// another it shares).
	Frozen bool
}

// Snapshot is every shared GPU's pods: target, measured share, throttled
// time and state; ordered by GPU, as of the last step (shared by every
// caller: not to be modified). Nil for a nil Controller.
func (c *Controller) Snapshot() []GPUStatus {
	if c == nil {
		return nil
	}
	st := c.shown.Load()
	if st == nil {
		return nil
	}
	return st.gpus
}

// publish makes the scheduling now what Snapshot and Scheduling read.
// Under mu.
func (c *Controller) publish() {
	st := &shownState{gpus: c.snapshotLocked(), scheduling: make(map[int]bool, len(c.members))}
	for gpu, ms := range c.members {
		st.scheduling[gpu] = len(ms) > 0
	}
	c.shown.Store(st)
}

func (c *Controller) snapshotLocked() []GPUStatus {
	var out []GPUStatus
	for _, gpu := range slices.Sorted(maps.Keys(c.scheds)) {
		g := GPUStatus{GPU: gpu}
		for _, st := range c.scheds[gpu].Snapshot() {
			ps := PodShare{PodStatus: st}
			for _, m := range c.members[gpu] {
				if m.UID == st.UID {
					ps.Namespace, ps.Name, ps.Frozen = m.pod.Namespace, m.pod.Name, c.frozen[m.cg]
				}
			}
			g.Pods = append(g.Pods, ps)
		}
		out = append(out, g)
	}
	return out
}
