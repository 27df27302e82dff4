package executor

import (
	"fmt"
	"slices"
	"time"

	"github.com/gpud/gpud/internal/preempt"
)

// RefreezeWindow: a suspended workload found thawed by someone else is
// frozen again; found thawed again within this long of that, it is killed
// (someone keeps thawing it: freezing it a third time would only let it run
// beside the high holder once more).
const RefreezeWindow = 10 * time.Minute

// watchEvery bounds how often the suspensions' freezers are read: Resume,
// which calls watchThawed, runs on every drain of events.
const watchEvery = 500 * time.Millisecond

// Why a workload found thawed was frozen again or killed.
const (
	reasonRefrozen   = "thawed by someone else (docker unpause, a write to cgroup.freeze) while suspended for a high-priority holder: frozen again"
	reasonKilledThaw = "thawed by someone else again within %s of being frozen again, while suspended for a high-priority holder: kill"
)

// watchThawed finds the workloads gpud froze and still keeps suspended
// (the reason they were frozen holds: Resume kept them) that someone else
// thawed, `docker pause` then `docker unpause` or a runtime update writing
// cgroup.freeze: each runs beside the high holder while listed as
// suspended. The first time it is frozen again; thawed again within
// RefreezeWindow, it is killed and reclaimed. Each is journaled (a freeze
// record with the reason, or the kill's records), logged and counted
// (ThawedByOther). Read at most once per watchEvery: one read of a
// cgroup's freeze state per suspension (the tick that calls Resume each
// second bounds how long it runs unnoticed).
func (e *Executor) watchThawed() {
	now := time.Now()
	e.mu.Lock()
	if len(e.susp) == 0 || now.Sub(e.watchedAt) < watchEvery {
		e.mu.Unlock()
		return
	}
	e.watchedAt = now
	var refrozen, kill []*suspension
	var failed []error
	// Under the lock: gpud's own thaw takes the suspension out of e.susp
	// (under it) before writing, so a freeze written here never follows
	// gpud's thaw of the same suspension.
	for path, s := range e.susp {
		if s.fz == nil { // paused by someone else: theirs to thaw
			continue
		}
		paused, err := s.fz.Paused()
		if err != nil || paused {
			continue
		}
		if !s.refrozenAt.IsZero() && now.Sub(s.refrozenAt) < RefreezeWindow {
			e.endSuspensionLocked(path, s)
			kill = append(kill, s)
			continue
		}
		if err := s.fz.Freeze(); err != nil {
			failed = append(failed, err)
			e.endSuspensionLocked(path, s)
			kill = append(kill, s)
			continue
		}
		s.refrozenAt = now
		refrozen = append(refrozen, s)
	}
	e.mu.Unlock()
	for _, err := range failed {
		e.log().Error("freezing again a workload thawed by someone else: killing instead", "error", err)
	}
	for _, s := range refrozen {
		e.wg.Add(1)
		go func() {
			defer e.wg.Done()
			e.refrozen(s)
		}()
	}
	for _, s := range kill {
		rule := fmt.Sprintf(reasonKilledThaw, RefreezeWindow)
		e.log().Warn("a suspended workload was thawed by someone else again: killing", "cgroup", s.path,
			"gpus", sortedGPUs(s.gpus), "frozen_again_at", s.refrozenAt)
		if e.ThawedByOther != nil {
			e.ThawedByOther("kill")
		}
		e.wg.Add(1)
		go func() {
			defer e.wg.Done()
			e.killSuspended(s.path, s, rule)
		}()
	}
}

// refrozen waits for a workload frozen again to be frozen, and records it;
// one not frozen in time is killed.
func (e *Executor) refrozen(s *suspension) {
	err := s.fz.WaitFrozen(e.freezeWait())
	result := "done"
	if err != nil {
		result = err.Error()
	}
	now := time.Now().UTC()
	gpus := sortedGPUs(s.gpus)
	var recs []preempt.Record
	for _, v := range s.victims {
		rec := preempt.Record{Time: now, GPU: gpus[0], Action: preempt.ActionFreeze, Rule: s.rule, Reason: reasonRefrozen,
			Preemptor: s.preemptor, Victim: preempt.PartyOf(v), Cgroup: s.path, Result: result,
			Checkpointed: slices.Contains(s.checkpointed, v.PID)}
		if e.Journal != nil {
			rec.ID = e.Journal.NewID(now)
		}
		recs = append(recs, rec)
	}
	e.log().Warn("a suspended workload was thawed by someone else while its GPUs are held: frozen again", "cgroup", s.path,
		"gpus", gpus, "frozen_since", s.since, "result", result)
	e.recordAll(recs)
	if e.ThawedByOther != nil {
		e.ThawedByOther("refreeze")
	}
	if err == nil {
		return
	}
	e.mu.Lock()
	if e.susp[s.path] != s { // thawed by gpud meanwhile
		e.mu.Unlock()
		return
	}
	e.endSuspensionLocked(s.path, s)
	e.mu.Unlock()
	e.killSuspended(s.path, s, "frozen again after someone else thawed it, not frozen in time: kill")
}
