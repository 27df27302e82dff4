package executor

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/gpud/gpud/internal/cgroups"
	"github.com/gpud/gpud/internal/preempt"
	"github.com/gpud/gpud/internal/preempt/kill"
)

// DefaultFreezeWait bounds how long a freeze may take before the executor
// thaws the cgroup again and kills instead: a task in an uninterruptible
// sleep (in the GPU driver, say) holds a freeze back for as long.
const DefaultFreezeWait = time.Second

// minSuspended is how long a fresh suspension is kept even though its
// GPUs show no high-priority holder: the freeze is decided on the high
// open, and the ledger counts the opener a moment later. Past it, a GPU
// still without one (the high open failed after the gate let it through)
// thaws the workload.
const minSuspended = time.Second

// suspension is one frozen workload.
type suspension struct {
	fz        *cgroups.Freezer // nil when someone else froze it (paused)
	path      string
	kind      string
	since     time.Time
	gpus      map[int]bool
	seenHeld  bool // its GPUs were seen held by high priority since the freeze
	victims   []preempt.Victim
	rule      string
	reason    string
	preemptor preempt.Party
	killAt    time.Time // zero: never
	timer     *time.Timer
	// resumeAfter: not thawed before, unless its GPUs were seen held by
	// high priority since (a fresh freeze: since + minSuspended; an
	// adopted one: the adoption + adoptGrace).
	resumeAfter time.Time
	// checkpointed: the PIDs whose CUDA state was checkpointed (restored
	// after the thaw).
	checkpointed []int
	// refrozenAt: when gpud froze it again, found thawed by someone else
	// (zero: never).
	refrozenAt time.Time
}

func (e *Executor) mode(v preempt.Victim) preempt.Mode {
	m := v.Mode
	if m == "" {
		e.mu.Lock()
		m = e.Mode
		e.mu.Unlock()
	}
	if m == "" {
		return preempt.ModeKill
	}
	return preempt.FreezeSafe(m, v.LivenessProbe)
}

// SetMode changes the default preemption mode for the preemptions that
// start from now on (a reload).
func (e *Executor) SetMode(m preempt.Mode) {
	e.mu.Lock()
	e.Mode = m
	e.mu.Unlock()
}

func (e *Executor) freezeWait() time.Duration {
	if e.FreezeWait > 0 {
		return e.FreezeWait
	}
	return DefaultFreezeWait
}

// suspendedLocked returns the suspension that holds pid, if any.
func (e *Executor) suspendedLocked(pid int) *suspension {
	for _, s := range e.susp {
		for _, v := range s.victims {
			if v.PID == pid {
				return s
			}
		}
	}
	return nil
}

// freezeAll freezes the workloads of victims (each victim's identity and
// place checked as for a kill); it returns the victims it could not
// freeze, for the caller to kill: no freezable cgroup, or a freeze that
// did not complete in time.
//
// preemptor is asked once the first workload is frozen (it may read
// /proc: not before the freeze).
func (e *Executor) freezeAll(gpu int, rule string, preemptor func() preempt.Party, victims []preempt.Victim, decided time.Time) (toKill []preempt.Victim) {
	return e.startFreezes(gpu, rule, victims, decided, false).finish(preemptor)
}

// freezeBatch is one decision's freezes between their writes
// (startFreezes) and their completion (finish).
type freezeBatch struct {
	e       *Executor
	gpu     int
	rule    string
	decided time.Time
	groups  []*freezeGroup
	kill    []preempt. // not frozen: for the caller to kill
		Victim
}

// freezeGroup is one workload cgroup of a batch.
type freezeGroup struct {
	fz      *cgroups.Freezer
	victims []preempt.Victim
	s       *suspension
	now     time.Time
	result  string
	ckpt    []int
	paused  bool  // frozen by someone else: left as it is
	err     error // the freeze's write failed
	// frozenAt: when it was seen frozen right after the write (zero: not
	// yet; finish waits for it).
	frozenAt time.Time
}

// quickFreezeWait is how long the action's thread waits for its freezes to
// complete, right after writing them, before it returns. A freeze of
// running or sleeping tasks completes in tens of microseconds; seen on the
// action's real-time thread, it is recorded when it happened. Seen by the
// worker goroutine instead (at normal priority, started after the action),
// decision → frozen was that goroutine's start on a busy node: p50 0.9 ms,
// p99 11.5 ms after the write with a CPU hog per core, against 0.14 and
// 9.4 ms for a bare program's write → frozen (docs/benchmarks.md). A
// freeze that takes longer (a task in an uninterruptible sleep) is waited
// for by the worker, as before.
//
// On the real-time thread (rtFreezeWait): the victims must run to freeze,
// and on a busy node they wait for a CPU as long as the bare program's
// victims do (its p99 is milliseconds), so the thread waits as the bare
// program does, up to rtFreezeWait, reading cgroup.events every
// rtFreezePoll, in raw system calls (cgroups.Freezer.WaitFrozenOnThread:
// no Go scheduler between the wakeup and the record). The event loop is
// held that long at most; the waits are sleeps, not CPU time. Elsewhere
// (freezeAll on a worker goroutine) 1 ms, with the scheduler's waits.
const (
	quickFreezeWait = time.Millisecond
	rtFreezeWait    = 8 * time.Millisecond // under the runtime's 10 ms preemption of a running goroutine
	rtFreezePoll    = 50 * time.Microsecond
)

// needsCheckpoint reports whether a victim is preempted in checkpoint
// mode (its CUDA lock may take seconds: never on the event loop).
func (e *Executor) needsCheckpoint(victims []preempt.Victim) bool {
	for _, v := range victims {
		if e.mode(v) == preempt.ModeCheckpoint {
			return true
		}
	}
	return false
}

// startFreezes checks the victims, finds their workloads' freezers and
// asks each to freeze (after the CUDA checkpoints in checkpoint mode); the
// caller calls finish. rt: called on the preemption's real-time thread
// (the wait for frozen stays on it: rtFreezeWait).
func (e *Executor) startFreezes(gpu int, rule string, victims []preempt.Victim, decided time.Time, rt bool) *freezeBatch {
	fb := &freezeBatch{e: e, gpu: gpu, rule: rule, decided: decided}
	root, err := e.cgroupRoot()
	if err != nil {
		e.log().Warn("no cgroup v2 hierarchy: killing instead of freezing", "error", err)
		fb.kill = victims
		return fb
	}
	var order []string
	groups := map[string]*freezeGroup{}
	// Each victim checked (identity, still holding, still in its
	// workload) and its workload's freezer found, a few at once.
	fzs := make([]*cgroups.Freezer, len(victims))
	errs := make([]error, len(victims))
	kill.Parallel(len(victims), func(i int) {
		v := victims[i]
		pidfd, err := kill.OpenChecked(e.ProcRoot, v.ProcInfo)
		if err == nil {
			err = kill.StillVictim(e.ProcRoot, e.Holds, gpu, v)
		}
		if err == nil {
			fzs[i], err = cgroups.WorkloadFreezer(e.ProcRoot, root, v.PID, v.WorkloadCgroup)
		}
		if pidfd >= 0 {
			kill.CloseFD(pidfd)
		}
		errs[i] = err
	})
	preempt.Step("checked")
	for i, v := range victims {
		fz, err := fzs[i], errs[i]
		if err != nil {
			if errors.Is(err, kill.ErrGone) || errors.Is(err, kill.ErrNotSameProcess) || errors.Is(err, kill.ErrMovedOut) || errors.Is(err, cgroups.ErrCgroupMoved) {
				e.log().Info("not frozen: no longer the victim", "gpu", gpu, "victim_pid", v.PID, "reason", err.Error())
				e.forget(v)
				continue
			}
			e.log().Warn("cannot freeze: killing instead", "gpu", gpu, "victim_pid", v.PID, "error", err)
			fb.kill = append(fb.kill, v)
			continue
		}
		g := groups[fz.Path]
		if g == nil {
			g = &freezeGroup{fz: fz}
			groups[fz.Path] = g
			order = append(order, fz.Path)
		} else {
			fz.Close()
		}
		g.victims = append(g.victims, v)
	}
	for _, path := range order {
		g := groups[path]
		e.mu.Lock()
		s := e.susp[path]
		if s != nil { // frozen already (another GPU's decision): one more GPU, more processes
			s.gpus[gpu] = true
			for _, v := range g.victims {
				if !slices.ContainsFunc(s.victims, func(x preempt.Victim) bool { return x.PID == v.PID }) {
					s.victims = append(s.victims, v)
				}
			}
			e.mu.Unlock()
			g.fz.Close()
			continue
		}
		e.mu.Unlock()
		g.now = time.Now()
		g.s = &suspension{path: path, kind: g.fz.Kind, since: g.now.UTC(), resumeAfter: g.now.Add(minSuspended), gpus: map[int]bool{gpu: true},
			victims: g.victims, rule: rule, reason: g.victims[0].Workload.Reason}
		g.result = "done"
		throttled := e.claim(path)
		paused, err := g.fz.Paused()
		switch {
		case err != nil:
			g.fz.Close()
			e.unclaim(path)
			e.log().Warn("cannot read the freezer: killing instead", "cgroup", path, "error", err)
			fb.kill = append(fb.kill, g.victims...)
			continue
		case paused && !throttled:
			// `docker pause` or an admin froze it: not gpud's to thaw or
			// to kill; it holds its GPU memory but runs nothing.
			g.fz.Close()
			g.paused = true
			g.result = "paused by someone else: left as it is"
		default:
			ckpt, killGroup, note := e.checkpointGroup(g.victims)
			if killGroup {
				g.fz.Close()
				e.unclaim(path)
				e.log().Warn("checkpoint mode: killing instead", "cgroup", path, "why", note)
				fb.kill = append(fb.kill, g.victims...)
				continue
			}
			if note != "" {
				g.result = "done; " + note
			}
			g.ckpt = ckpt
			for i := range g.s.victims {
				if slices.Contains(ckpt, g.s.victims[i].PID) {
					g.s.victims[i].Released = true
				}
			}
			g.err = g.fz.Freeze()
			preempt.Step("freeze-written")
		}
		fb.groups = append(fb.groups, g)
	}
	wait := quickFreezeWait
	if rt {
		wait = rtFreezeWait
	}
	deadline := time.Now().Add(wait)
	for _, g := range fb.groups {
		left := time.Until(deadline)
		if g.paused || g.err != nil || left <= 0 {
			continue
		}
		var err error
		if rt {
			err = g.fz.WaitFrozenOnThread(left, rtFreezePoll)
		} else {
			err = g.fz.WaitFrozen(left)
		}
		if err == nil { // not yet, or an error: finish waits and says
			g.frozenAt = time.Now()
			preempt.Step("frozen")
		}
	}
	return fb
}

// finish waits for each workload to be frozen (one that is not in time is
// thawed and its victims killed instead), records the suspensions, and
// returns the victims for the caller to kill.
func (fb *freezeBatch) finish(preemptor func() preempt.Party) (toKill []preempt.Victim) {
	e, gpu, rule := fb.e, fb.gpu, fb.rule
	toKill = fb.kill
	var recs []preempt.Record
	for _, g := range fb.groups {
		s, path := g.s, g.s.path
		if !g.paused {
			err := g.err
			if err == nil && g.frozenAt.IsZero() {
				err = g.fz.WaitFrozen(e.freezeWait())
				preempt.Step("frozen")
			}
			if err != nil {
				if terr := g.fz.Thaw(); terr != nil {
					e.log().Error("thawing a failed freeze", "cgroup", path, "error", terr)
				}
				e.restore(g.ckpt)
				g.fz.Close()
				e.unclaim(path)
				e.log().Warn("freeze failed: killing instead", "cgroup", path, "error", err)
				toKill = append(toKill, g.victims...)
				continue
			}
			s.fz = g.fz
			s.checkpointed = g.ckpt
		}
		frozenAt := g.frozenAt
		if frozenAt.IsZero() {
			frozenAt = time.Now()
		}
		s.preemptor = preemptor()
		for _, v := range g.victims {
			rec := preempt.Record{Time: s.since, GPU: gpu, Action: preempt.ActionFreeze, Rule: rule, Preemptor: s.preemptor,
				Victim: preempt.PartyOf(v), Cgroup: path, Result: g.result, Checkpointed: slices.Contains(g.ckpt, v.PID), Reason: v.Why,
				LatencyMS: float64(frozenAt.Sub(fb.decided).Microseconds()) / 1000}
			if e.Journal != nil {
				rec.ID = e.Journal.NewID(g.now)
			}
			recs = append(recs, rec)
			e.log().Info("preempted: frozen", "gpu", gpu, "victim_pid", v.PID, "victim_container", v.ContainerID,
				"cgroup", path, "freezer", g.fz.Kind, "result", g.result, "latency_ms", rec.LatencyMS)
		}
		e.mu.Lock()
		held := e.held
		e.mu.Unlock()
		// Asked outside the lock: it reads the ledger and the loans.
		s.seenHeld = held != nil && !preempt.Resumable(held(gpu))
		e.mu.Lock()
		if e.susp == nil {
			e.susp = map[string]*suspension{}
		}
		e.susp[path] = s
		if s.fz != nil && e.MaxFrozen > 0 {
			s.killAt = g.now.Add(e.MaxFrozen)
			s.timer = time.AfterFunc(e.MaxFrozen, func() { e.frozenTooLong(path, s) })
		}
		for _, v := range g.victims {
			delete(e.killing, v.PID)
		}
		e.mu.Unlock()
	}
	e.recordAll(recs)
	if len(recs) > 0 && e.Suspended != nil {
		e.Suspended()
	}
	return toKill
}

// claim hands path to the executor (Claim): see Executor.Claim.
func (e *Executor) claim(path string) bool {
	return e.Claim != nil && e.Claim(path)
}

func (e *Executor) unclaim(path string) {
	if e.Unclaim != nil {
		e.Unclaim(path)
	}
}

// forget ends the executor's interest in a victim it did not act on.
func (e *Executor) forget(v preempt.Victim) {
	e.mu.Lock()
	delete(e.killing, v.PID)
	e.mu.Unlock()
}

func (e *Executor) recordAll(recs []preempt.Record) {
	if len(recs) == 0 {
		return
	}
	if e.Journal != nil {
		if err := e.Journal.AppendAll(recs); err != nil {
			e.log().Error("journaling suspensions", "records", len(recs), "error", err)
		}
	}
	if e.Recorded != nil {
		for _, r := range recs {
			e.Recorded(r)
		}
	}
}

// Resume thaws the suspended workloads whose GPUs are all Resumable now;
// held says how the rule table sees a GPU's holders. Cheap when nothing
// is suspended: call it whenever holders change. held must read the
// holders live: a new suspension asks it too.
func (e *Executor) Resume(held func(gpu int) preempt.Holding) {
	e.mu.Lock()
	e.held = held
	if len(e.susp) == 0 {
		e.mu.Unlock()
		return
	}
	gpus := map[int]bool{}
	for _, s := range e.susp {
		for gpu := range s.gpus {
			gpus[gpu] = false
		}
	}
	e.mu.Unlock()
	// held is asked outside e.mu: it takes the ledger's and the lender's
	// locks, and e.mu is taken on the event thread's preemption path
	// (Resume runs on normal-priority goroutines too, which a busy node
	// preempts while they hold a lock).
	for gpu := range gpus {
		gpus[gpu] = preempt.Resumable(held(gpu))
	}
	e.mu.Lock()
	var thaw []*suspension
	now := time.Now()
	for path, s := range e.susp {
		ok, all := true, true
		for gpu := range s.gpus {
			r, asked := gpus[gpu]
			ok = ok && (r || !asked)
			all = all && asked
		}
		if !ok {
			s.seenHeld = true
			continue
		}
		if !all {
			continue // a GPU added since they were asked about: the next Resume asks
		}
		if !s.seenHeld && now.Before(s.resumeAfter) {
			continue
		}
		delete(e.susp, path)
		if s.timer != nil {
			s.timer.Stop()
		}
		thaw = append(thaw, s)
	}
	e.mu.Unlock()
	e.watchThawed()
	if len(thaw) == 0 {
		return
	}
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		e.thawAll(thaw, "its GPUs have no high-priority holder")
	}()
}

// thawAll thaws suspensions gpud froze (those paused by someone else are
// only forgotten) and records each victim's thaw.
func (e *Executor) thawAll(ss []*suspension, why string) {
	var recs []preempt.Record
	for _, s := range ss {
		result := "done"
		if s.fz == nil {
			result = "paused by someone else: left as it is"
		} else {
			if err := s.fz.Thaw(); err != nil {
				result = err.Error()
			} else if msg := e.restore(s.checkpointed); msg != "" {
				result = msg
			} else if len(s.checkpointed) > 0 && e.CUDA != nil {
				result = fmt.Sprintf("done; CUDA restored %v", s.checkpointed)
			}
			s.fz.Close()
		}
		e.unclaim(s.path)
		now := time.Now().UTC()
		gpus := sortedGPUs(s.gpus)
		for _, v := range s.victims {
			rec := preempt.Record{Time: now, GPU: gpus[0], Action: preempt.ActionThaw, Rule: why, Victim: preempt.PartyOf(v), Cgroup: s.path,
				Preemptor: s.preemptor, Result: result}
			if e.Journal != nil {
				rec.ID = e.Journal.NewID(now)
			}
			recs = append(recs, rec)
		}
		e.log().Info("thawed", "cgroup", s.path, "gpus", gpus, "frozen_for", now.Sub(s.since).String(), "why", why, "result", result)
	}
	e.recordAll(recs)
	if e.Suspended != nil {
		e.Suspended()
	}
}

// ThawAll thaws every workload gpud froze, for why (gpud stopping: a
// workload must never stay frozen with no gpud to thaw or kill it; the
// next gpud judges its holders again and freezes what the rules say).
func (e *Executor) ThawAll(why string) {
	e.mu.Lock()
	ss := make([]*suspension, 0, len(e.susp))
	for path, s := range e.susp {
		if s.timer != nil {
			s.timer.Stop()
		}
		ss = append(ss, s)
		delete(e.susp, path)
	}
	e.mu.Unlock()
	if len(ss) > 0 {
		e.thawAll(ss, why)
	}
}

// frozenTooLong kills a workload frozen for --max-frozen and reclaims it,
// as a kill-mode preemption would have at once.
func (e *Executor) frozenTooLong(path string, s *suspension) {
	e.mu.Lock()
	if e.susp[path] != s {
		e.mu.Unlock()
		return // thawed meanwhile
	}
	e.endSuspensionLocked(path, s)
	e.mu.Unlock()
	e.wg.Add(1)
	defer e.wg.Done()
	e.log().Warn("frozen too long: killing", "cgroup", path, "gpus", sortedGPUs(s.gpus), "since", s.since, "max_frozen", e.MaxFrozen.String())
	e.killSuspended(path, s, fmt.Sprintf("frozen longer than --max-frozen (%s): kill", e.MaxFrozen))
}

// endSuspensionLocked takes s out of the suspensions, its victims marked
// as being killed; e.mu held.
func (e *Executor) endSuspensionLocked(path string, s *suspension) {
	delete(e.susp, path)
	e.unclaim(path)
	if s.timer != nil {
		s.timer.Stop()
	}
	if e.killing == nil {
		e.killing = map[int]bool{}
	}
	for _, v := range s.victims {
		e.killing[v.PID] = true
	}
}

// killSuspended kills the victims of a suspension endSuspensionLocked
// ended, for rule, and reclaims their workloads, as a kill-mode
// preemption would have at once.
func (e *Executor) killSuspended(path string, s *suspension, rule string) {
	e.mu.Lock()
	ctx := e.ctx
	e.mu.Unlock()
	if ctx == nil {
		ctx = context.Background()
	}
	gpus := sortedGPUs(s.gpus)
	// Killed frozen: SIGKILL is taken at the thaw, before any of the
	// workload's code runs again (the v1 freezer needs the thaw to let
	// it die; the v2 one lets it die frozen).
	e.killer().KillAll(gpus[0], rule, s.preemptor, s.victims, time.Now(), func() {
		if err := s.fz.Thaw(); err != nil {
			e.log().Error("thawing a frozen workload to kill it", "cgroup", path, "error", err)
		}
	})
	s.fz.Close()
	if e.Suspended != nil {
		e.Suspended()
	}
	seen := map[string]bool{}
	for _, v := range s.victims {
		if k := v.Workload.Key(); k != "" && !seen[k] {
			seen[k] = true
			e.reclaim(ctx, gpus[0], v.Workload, v.TaskID, s.preemptor)
		}
	}
}

func sortedGPUs(m map[int]bool) []int {
	out := make([]int, 0, len(m))
	for g := range m {
		out = append(out, g)
	}
	sort.Ints(out)
	if len(out) == 0 {
		out = append(out, 0)
	}
	return out
}

// Suspensions lists the suspended workloads, oldest first, for the state
// file.
func (e *Executor) Suspensions() []preempt.Suspension {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make([]preempt.Suspension, 0, len(e.susp))
	for _, s := range e.susp {
		v0 := s.victims[0]
		x := preempt.Suspension{
			Workload: v0.Workload.Key(), ContainerID: v0.ContainerID, PodUID: v0.PodUID,
			Namespace: v0.Workload.Namespace, Pod: v0.Workload.Name, TaskID: v0.TaskID,
			Cgroup: s.path, Freezer: s.kind, GPUs: sortedGPUs(s.gpus), Since: s.since,
			Reason: s.reason, Preemptor: s.preemptor, Paused: s.fz == nil,
			Checkpointed: slices.Clone(s.checkpointed),
		}
		if x.Workload == "" {
			x.Workload = "cgroup " + s.path
		}
		for _, v := range s.victims {
			x.PIDs = append(x.PIDs, v.PID)
		}
		if !s.killAt.IsZero() {
			t := s.killAt.UTC()
			x.KillAt = &t
		}
		x.ThawWhen = ThawWhen(x)
		out = append(out, x)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Since.Before(out[j].Since) })
	return out
}

// ThawWhen says in words what thaws a suspension.
func ThawWhen(s preempt.Suspension) string {
	if s.Paused {
		return "paused by someone else (docker pause, an admin): gpud neither thaws nor kills it; unpause it"
	}
	w := fmt.Sprintf("thawed when no high-priority process holds GPU %v (a lent GPU's owner idle for --idle-after does not: the GPU is lent again)", s.GPUs)
	if s.KillAt != nil {
		w += fmt.Sprintf("; killed and reclaimed if still frozen at %s", s.KillAt.Format(time.RFC3339))
	}
	return w
}

// SuspendedPod reports whether gpud froze (and has not thawed) a workload
// of the pod podUID: a suspension by gpud, not one paused by someone else.
func (e *Executor) SuspendedPod(podUID string) bool {
	if podUID == "" {
		return false
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, s := range e.susp {
		if s.fz == nil {
			continue
		}
		for _, v := range s.victims {
			if v.PodUID == podUID {
				return true
			}
		}
	}
	return false
}

// SuspendedPID reports the suspension that holds pid, if any.
func (e *Executor) SuspendedPID(pid int) (preempt.Suspension, bool) {
	e.mu.Lock()
	s := e.suspendedLocked(pid)
	e.mu.Unlock()
	if s == nil {
		return preempt.Suspension{}, false
	}
	for _, x := range e.Suspensions() {
		if x.Cgroup == s.path {
			return x, true
		}
	}
	return preempt.Suspension{}, false
}
