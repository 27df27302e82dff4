// Package executor carries out the rule table's verdicts off the hot
// path: each victim killed (package kill) or its workload suspended
// (frozen, CUDA-checkpointed first in checkpoint mode, thawed when
// preempt.Resumable, killed at --max-frozen, adopted from the journal after
// a crash), every action journaled, the workloads reclaimed.
package executor

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/gpud/gpud/internal/preempt"
	"github.com/gpud/gpud/internal/preempt/journal"
	"github.com/gpud/gpud/internal/preempt/kill"
)

// Executor carries out verdicts off the hot path: it writes the checkpoint
// notice, kills through pidfds, journals a record per victim, and hands the
// containers to the reclaimer.
type Executor struct {
	ProcRoot       string
	Grace          time.Duration // SIGTERM → SIGKILL; 0: SIGKILL at once
	CheckpointRoot string        // "" disables notices
	Journal        *journal.Journal
	Reclaimer      *Reclaimer
	Log            *slog.Logger
	// Holds, when set, tells whether pid holds gpu now; a victim that no
	// longer does is not killed (it closed, or its PID names another process).
	Holds func(pid, gpu int) bool
	// Recorded, when set, is called after each record is journaled.
	Recorded func(preempt.Record)

	// Mode is how victims without a mode of their own are preempted
	// ("": ModeKill).
	Mode preempt.
		// MaxFrozen: a workload frozen this long is killed and reclaimed (0:
		// never).
		Mode

	MaxFrozen time.Duration
	// FreezeWait bounds one freeze (0: DefaultFreezeWait); past it the
	// victims are killed instead.
	FreezeWait time.Duration
	// CgroupRoot is the cgroup v2 mount point ("" detects it).
	CgroupRoot string
	// CUDA is the CUDA checkpoint API for ModeCheckpoint (nil: none on
	// this node, the fallback is used).
	CUDA Checkpointer
	// CheckpointTimeout bounds a CUDA lock (0: DefaultCheckpointTimeout).
	CheckpointTimeout time.Duration
	// CheckpointFallback is what a checkpoint that cannot be done becomes:
	// ModeFreeze ("" too) or ModeKill.
	CheckpointFallback preempt.
		// Suspended, when set, is called when the set of suspended workloads
		// changed (the state file shows it).
		Mode

	Suspended func()
	// ThawedByOther, when set, is called when a suspended workload was
	// found thawed by someone else, with what was done: "refreeze" or
	// "kill" (watchThawed).
	ThawedByOther func(action string)
	// GPUMemory, when set, returns a GPU's free memory and how much of it
	// pids hold (NVML; ok false: not known): a freeze keeps the victims'
	// memory, so it is chosen only when the preemptor can have as much
	// (memoryModes).
	GPUMemory func(gpu int, pids []int) (free, held uint64, ok bool)
	// Claim, when set, is called with a workload's cgroup directory before
	// its freezer is read for a freeze: from then on until Unclaim the
	// compute scheduler neither thaws nor freezes it. It reports whether
	// the scheduler held it frozen: that freeze becomes the executor's
	// (thawed when the suspension ends), not "paused by someone else".
	Claim func(path string) (throttled bool)
	// Unclaim, when set, ends a Claim: the suspension ended or none began.
	Unclaim func(path string)

	watchedAt time.Time // the last watchThawed

	mu      sync.Mutex
	susp    map[string]*suspension        // frozen workloads by cgroup directory
	held    func(gpu int) preempt.Holding // the last Resume's
	ctx     context.Context               // of the last Preempt, for the reclaims of frozen-too-long kills
	killing map[int]bool
	dead    map[deadKey]time.Time // victims killed recently: never killed (or recorded) twice
	wg      sync.WaitGroup
}

// SetGrace changes Grace for the kills that start from now on (a reload).
// Handled reports whether the victim is being killed or was killed
// recently: Preempt would do nothing for it.
func (e *Executor) Handled(v preempt.Victim) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	_, dead := e.dead[deadKey{v.PID, v.StartTime}]
	return dead || e.killing[v.PID] || e.suspendedLocked(v.PID) != nil
}

func (e *Executor) SetGrace(d time.Duration) {
	e.mu.Lock()
	e.Grace = d
	e.mu.Unlock()
}

func (e *Executor) grace() time.Duration {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.Grace
}

// killer is how the executor's kills are done, with the grace period of
// now.
func (e *Executor) killer() kill.Killer {
	return kill.Killer{ProcRoot: e.ProcRoot, Grace: e.grace(), CheckpointRoot: e.CheckpointRoot, Journal: e.Journal,
		Log: e.log(), Holds: e.Holds, Recorded: e.Recorded, Ended: e.killed}
}

// killed ends a batch's victims' kills: they are not being killed any
// more, and none of them is killed (or recorded) again for a while.
func (e *Executor) killed(victims []preempt.Victim) {
	e.mu.Lock()
	if e.dead == nil { // a kill with no Preempt before it (an adopted workload frozen too long)
		e.dead = map[deadKey]time.Time{}
	}
	for _, v := range victims {
		delete(e.killing, v.PID)
		e.dead[deadKey{v.PID, v.StartTime}] = time.Now()
	}
	e.mu.Unlock()
}

// cgroupRoot is the cgroup v2 mount point freezers are found under.
func (e *Executor) cgroupRoot() (string, error) {
	if e.CgroupRoot != "" {
		return e.CgroupRoot, nil
	}
	return kill.V2Root()
}

type deadKey struct {
	pid   int
	start uint64
}

// Preempt kills victims (holders of gpu) for preemptor, asynchronously;
// decided is when the decision was taken, for the latency figure. Victims
// already being killed are skipped. done, when non-nil, is closed once every
// victim is confirmed dead (or could not be).
func (e *Executor) Preempt(ctx context.Context, gpu int, rule string, preemptor preempt.Party, victims []preempt.Victim, decided time.Time, done chan<- struct{}) {
	e.preempt(ctx, gpu, rule, preemptor, nil, victims, decided, done, false)
}

// PreemptNow is Preempt for a decision the gate took on an open, called
// from the event loop: the victims to kill are checked and signalled, and
// the workloads to freeze asked to freeze, before it returns, on the
// caller's goroutine (no goroutine to be scheduled between the decision
// and the action); the waits, the records and the reclaims go on
// asynchronously, as do checkpoint mode's freezes (a CUDA lock can take
// seconds). known names
// the preemptor in the intents with what was known without reading /proc;
// preemptor, asked after the signals, names it in the records.
func (e *Executor) PreemptNow(ctx context.Context, gpu int, rule string, known preempt.Party, preemptor func() preempt.Party, victims []preempt.Victim, decided time.Time) {
	e.preempt(ctx, gpu, rule, known, preemptor, victims, decided, nil, true)
}

func (e *Executor) preempt(ctx context.Context, gpu int, rule string, known preempt.Party, preemptor func() preempt.Party, victims []preempt.Victim, decided time.Time, done chan<- struct{}, signalNow bool) {
	preempt.Step("preempt")
	e.mu.Lock()
	if e.killing == nil {
		e.killing = map[int]bool{}
	}
	if e.dead == nil {
		e.dead = map[deadKey]time.Time{}
	}
	now := time.Now()
	for k, t := range e.dead {
		if now.Sub(t) > time.Minute {
			delete(e.dead, k)
		}
	}
	e.ctx = ctx
	var mine []preempt.Victim
	for _, v := range victims {
		if v.Agent {
			// Never a victim, whoever asks: the callers leave agents out
			// (occupancy.Ledger.Holders); this is the last line.
			continue
		}
		if _, ok := e.dead[deadKey{v.PID, v.StartTime}]; ok {
			continue
		}
		if s := e.suspendedLocked(v.PID); s != nil {
			s.gpus[gpu] = true // frozen already; this GPU too waits for it
			continue
		}
		if !e.killing[v.PID] {
			e.killing[v.PID] = true
			mine = append(mine, v)
		}
	}
	e.mu.Unlock()
	var freeze, toKill []preempt.Victim
	mine = e.memoryModes(gpu, mine)
	for _, v := range mine {
		if m := e.mode(v); m == preempt.ModeFreeze || m == preempt.ModeCheckpoint {
			freeze = append(freeze, v)
		} else {
			toKill = append(toKill, v)
		}
	}
	// The signals first, the preemptor's identity after: it is only for
	// the records.
	var first *kill.Batch
	var frozen *freezeBatch
	if signalNow {
		kill.AtRealtime(e.log(), func() {
			first = e.killer().Signal(gpu, rule, known, toKill, decided)
			if len(freeze) > 0 && !e.needsCheckpoint(freeze) {
				frozen = e.startFreezes(gpu, rule, freeze, decided, true)
			}
		})
	}
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		preempt.Step("worker")
		who := sync.OnceValue(func() preempt.Party {
			if preemptor == nil {
				return known
			}
			return preemptor()
		})
		if first != nil {
			first.Finish(who)
		}
		var fallback []preempt.Victim
		switch {
		case frozen != nil:
			fallback = frozen.finish(who)
		case len(freeze) > 0:
			fallback = e.freezeAll(gpu, rule, who, freeze, decided)
		}
		if first == nil {
			fallback = append(toKill, fallback...)
		}
		e.killer().KillAll(gpu, rule, who(), fallback, decided, nil)
		if done != nil {
			close(done)
		}
		mine = fallback
		if first != nil {
			mine = append(toKill[:len(toKill):len(toKill)], fallback...)
		}
		// Containers after processes: the GPU is free as soon as the
		// processes are dead; stopping a container takes longer.
		seen := map[string]bool{}
		for _, v := range mine {
			if k := v.Workload.Key(); k != "" && !seen[k] {
				seen[k] = true
				e.reclaim(ctx, gpu, v.Workload, v.TaskID, who())
			}
		}
	}()
}

func (e *Executor) reclaim(ctx context.Context, gpu int, t preempt.Target, taskID string, by preempt.Party) {
	if e.Reclaimer == nil || !e.Reclaimer.Reclaim(ctx, t) {
		return // reclaim off, no runtime for it, or one already under way
	}
	rec := preempt.Record{Time: time.Now().UTC(), GPU: gpu, Action: preempt.ActionReclaim, Preemptor: by,
		Victim: preempt.Party{ContainerID: t.ContainerID, PodUID: t.PodUID, Namespace: t.Namespace, TaskID: taskID}, Result: e.Reclaimer.Mode}
	if e.Journal != nil {
		rec.ID = e.Journal.NewID(rec.Time)
	}
	e.record(rec)
}

// Denied records a refused low-priority open and, when the verdict says
// so, reclaims the opener's container; off the caller's path (the journal
// fsyncs), like every action.
func (e *Executor) Denied(ctx context.Context, gpu int, rule string, opener preempt.Party, workload preempt.Target, reclaim bool) {
	rec := preempt.Record{Time: time.Now().UTC(), GPU: gpu, Action: preempt.ActionDeny, Rule: rule, Victim: opener, Result: "EPERM"}
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		if e.Journal != nil {
			rec.ID = e.Journal.NewID(rec.Time)
		}
		e.record(rec)
		if reclaim {
			e.reclaim(ctx, gpu, workload, opener.TaskID, preempt.Party{})
		}
	}()
}

func (e *Executor) record(r preempt.Record) {
	if e.Journal != nil {
		if err := e.Journal.Append(r); err != nil {
			e.log().Error("journaling preemption", "error", err)
		}
	}
	if e.Recorded != nil {
		e.Recorded(r)
	}
}

func (e *Executor) log() *slog.Logger {
	if e.Log == nil {
		return slog.Default()
	}
	return e.Log
}

// Wait waits for every action under way.
func (e *Executor) Wait() {
	e.wg.Wait()
	if e.Reclaimer != nil {
		e.Reclaimer.Wait()
	}
}
