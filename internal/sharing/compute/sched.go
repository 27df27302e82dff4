// Package compute shares a GPU's compute by quota from the node: per
// shared GPU, a time-slice scheduler in the spirit of Gemini's tokens. Each
// sharing pod with a compute target holds the token for slices of time and
// has its cgroup frozen when it has none; the pod furthest below its
// target (by its measured use) gets the next slice. Sched is the decision,
// pure (times and measurements in, who runs out); Controller is its I/O
// (the book, the holders, the utilization, the freezer, the journal that
// lets the next gpud thaw what this one froze).
package compute

import (
	"cmp"
	"maps"
	"math"
	"slices"
	"time"
)

// Settings are the scheduler's times.
type Settings struct {
	// Slice is the token: the time one pod runs alone before the next
	// choice. Shorter follows targets closer over short windows, at more
	// freezes and thaws a second.
	Slice time.Duration
	// Period bounds how long a busy pod is frozen in a row (it gets a
	// slice at least once a Period, whatever its target) and is the
	// horizon of the measured share.
	Period time.Duration
}

// idleBelow: a busy pod whose measured use over an idle window is under
// this fraction of the time it was thawed is idle: it has no work for the
// GPU, is thawed and leaves its share to the others. Judged over a window
// of wall time, not per slice: NVML's per-process utilization is an
// average over its own sample period (about 1/6 s), late by as much.
const idleBelow = 0.25

// idleWindow is the wall time a busy pod's use is judged over.
func (s Settings) idleWindow() time.Duration { return max(500*time.Millisecond, s.Period/2) }

// Pod is one sharing pod on the GPU.
type Pod struct {
	UID string
	// Target is the percent of the GPU it was given (1–100).
	Target int
	// HardCap: never more than Target, even with the GPU otherwise idle.
	HardCap bool
	// Exempt: never frozen (a high-priority pod): it runs as it likes and
	// is only measured.
	Exempt bool
}

// State is what the scheduler does with a pod now.
type State string

// States.
const (
	Running  State = "running" // holds the token
	Waiting  State = "waiting" // busy, frozen until its turn
	Capped   State = "capped"  // hard-capped, frozen: over its target
	Idle     State = "idle"    // no work seen: thawed, its share to others
	Exempted State = "exempt"  // high priority: never frozen
)

// PodStatus is one pod as the scheduler sees it (Snapshot).
type PodStatus struct {
	UID     string
	Target  int
	HardCap bool
	// Share is the measured share of the GPU, percent, averaged over about
	// a Period.
	Share float64
	// Throttled is the time it has spent frozen by the scheduler.
	Throttled time.Duration
	State     State
}

type podState struct {
	Pod
	pass        float64 // charged use / target: the lowest is furthest below its target
	idle        bool
	heldAcc     float64 // seconds thawed in the idle window
	usedAcc     float64 // seconds of measured use in it
	windowStart time.Time
	share       float64 // measured share, EWMA over Period (0–1)
	credit      float64 // hard cap: seconds of GPU it may still use
	ratio       float64 // measured use per second of token (1 until measured)
	wokeAt      time.Time
	heldLong    float64 // thawed seconds, decayed over ratioHorizon
	usedLong    float64 // measured use in them
	frozenSince time.Time
	frozen      bool
	throttled   time.Duration
}

// Sched is one GPU's scheduler. Not safe for concurrent use.
type Sched struct {
	set        Settings
	pods       map[string]*podState
	holder     string
	tokenStart time.Time
	last       time.Time
}

// NewSched returns a scheduler with no pods.
func NewSched(s Settings) *Sched {
	return &Sched{set: s, pods: map[string]*podState{}}
}

// Step accounts the time since the previous Step and decides who runs
// until the next. pods is the GPU's sharing pods now; use is the fraction
// of the GPU (0–1) each pod used since the previous Step, nil when it is
// not measured (then the token's time is charged, and no pod is ever
// called idle). It returns the pods to run (thawed): the token's holder,
// the idle and the exempt ones; every other pod is to be frozen. The next
// Step is due a Slice later.
func (s *Sched) Step(now time.Time, pods []Pod, use map[string]float64) map[string]bool {
	dt := 0.0
	if !s.last.IsZero() && now.After(s.last) {
		dt = now.Sub(s.last).Seconds()
	}
	s.last = now
	s.account(now, dt, use)
	s.sync(now, pods, use != nil)
	s.choose(now)
	run := map[string]bool{}
	for uid, p := range s.pods {
		on := p.Exempt || p.idle || uid == s.holder
		if on {
			run[uid] = true
			p.frozen = false
		} else if !p.frozen {
			p.frozen, p.frozenSince = true, now
		}
	}
	return run
}

// account charges each pod its use over the last dt seconds.
func (s *Sched) account(now time.Time, dt float64, use map[string]float64) {
	if dt == 0 {
		return
	}
	decay := 1 - math.Exp(-dt/s.set.Period.Seconds())
	// Busy processes thawed together share the GPU: an idle pod seen at
	// u beside k-1 others would use k·u alone.
	k := 0
	for uid := range s.pods {
		if use[uid] > 0.02 {
			k++
		}
	}
	for uid, p := range s.pods {
		held := uid == s.holder
		u := 0.0
		switch {
		case use != nil:
			u = min(max(use[uid], 0), 1)
		case held || p.idle || p.Exempt:
			u = 1
		}
		if p.frozen {
			p.throttled += time.Duration(dt * float64(time.Second))
		}
		p.share += (u - p.share) * decay
		if p.Exempt {
			continue
		}
		// The token's time is charged at once, scaled by what the
		// measurement says a second of token is worth (ratio): a
		// measured charge alone arrives a sample late, and the token
		// would stay with one pod until it did.
		if held {
			p.pass += p.ratio * dt / float64(p.Target)
		}
		if p.HardCap {
			// At most one slice banked (the cap holds over short
			// windows), at most a Period owed.
			c := 0.0
			if !p.frozen {
				c = p.ratio * dt
			}
			p.credit = min(max(p.credit+float64(p.Target)/100*dt-c, -s.set.Period.Seconds()), s.set.Slice.Seconds())
		}
		if use == nil {
			continue
		}
		switch {
		case !p.idle:
			if !p.frozen {
				p.heldAcc += dt
			}
			p.usedAcc += u * dt
			if now.Sub(p.wokeAt) >= s.set.Period {
				s.calibrate(p, dt, u) // past the measurement's lag at waking
			}
			if now.Sub(p.windowStart) >= s.set.idleWindow() {
				s.judgeWindow(p, now)
			}
		case u*float64(max(k, 1)) >= s.busyAbove(p):
			s.wake(p, now)
		}
	}
}

// ratioHorizon is the horizon of a pod's ratio: long beside the
// measurement's lag (a sample period or two), so that the lag moves it
// little.
const ratioHorizon = 5 * time.Second

// calibrate follows a busy pod's ratio: its measured use per second of
// token, above 1 when its queued kernels run on after it is frozen, below
// when it does not use all its token.
func (s *Sched) calibrate(p *podState, dt, u float64) {
	d := math.Exp(-dt / ratioHorizon.Seconds())
	p.heldLong *= d
	p.usedLong = p.usedLong*d + u*dt
	if !p.frozen {
		p.heldLong += dt
	}
	if p.heldLong >= 0.1 {
		p.ratio = min(max(p.usedLong/p.heldLong, 0.5), 2)
	}
}

// judgeWindow ends a busy pod's window: idle when it used under a
// quarter of its thawed time.
func (s *Sched) judgeWindow(p *podState, now time.Time) {
	p.idle = p.heldAcc > 0 && p.usedAcc < idleBelow*p.heldAcc
	p.heldAcc, p.usedAcc, p.windowStart = 0, 0, now
}

// busyAbove is the use, over a step, that calls an idle pod busy again:
// a quarter of the GPU, less for a hard-capped pod with a small target
// (its light use must not pass its cap unseen).
func (s *Sched) busyAbove(p *podState) float64 {
	if p.HardCap {
		return min(idleBelow, float64(p.Target)/200)
	}
	return idleBelow
}

// wake makes an idle (or new) pod busy: it starts at the busy pods'
// lowest pass, with no credit banked from its idle time.
func (s *Sched) wake(p *podState, now time.Time) {
	p.idle, p.heldAcc, p.usedAcc, p.windowStart, p.wokeAt = false, 0, 0, now, now
	first := true
	low := 0.0
	for _, q := range s.pods {
		if q != p && !q.idle && !q.Exempt {
			if first || q.pass < low {
				low, first = q.pass, false
			}
		}
	}
	if !first {
		p.pass = max(p.pass, low)
	}
}

// sync adds and removes pods. A new pod is busy when its use is not
// measured, else idle until it is seen using the GPU.
func (s *Sched) sync(now time.Time, pods []Pod, measured bool) {
	seen := map[string]bool{}
	for _, pd := range pods {
		if pd.UID == "" || pd.Target <= 0 {
			continue
		}
		pd.Target = min(pd.Target, 100)
		seen[pd.UID] = true
		p, ok := s.pods[pd.UID]
		if !ok {
			p = &podState{Pod: pd, idle: measured, ratio: 1}
			s.pods[pd.UID] = p
			if !measured {
				s.wake(p, now)
			}
			continue
		}
		p.Pod = pd
	}
	for uid := range s.pods {
		if !seen[uid] {
			delete(s.pods, uid)
		}
	}
	if _, ok := s.pods[s.holder]; !ok {
		s.holder = ""
	}
}

// eligible: busy, schedulable, and (hard-capped) within its cap.
func (p *podState) eligible() bool {
	return !p.idle && !p.Exempt && (!p.HardCap || p.credit > 0)
}

// choose keeps the holder for its slice, else gives the token to the
// eligible pod frozen a Period or more (the bound on a frozen streak),
// else to the one furthest below its target (lowest pass).
func (s *Sched) choose(now time.Time) {
	if h, ok := s.pods[s.holder]; ok && h.eligible() && now.Sub(s.tokenStart) < s.set.Slice {
		return
	}
	var best *podState
	starving := func(p *podState) bool {
		return p.frozen && now.Sub(p.frozenSince) >= s.set.Period-s.set.Slice
	}
	for _, uid := range slices.Sorted(maps.Keys(s.pods)) {
		p := s.pods[uid]
		if !p.eligible() {
			continue
		}
		if best == nil {
			best = p
			continue
		}
		if sp, sb := starving(p), starving(best); sp != sb {
			if sp {
				best = p
			}
			continue
		}
		if p.pass < best.pass {
			best = p
		}
	}
	s.holder = ""
	if best != nil {
		s.holder = best.UID
	}
	s.tokenStart = now
}

// Holder is the pod holding the token ("" when none).
func (s *Sched) Holder() string { return s.holder }

// Snapshot is each pod's target, measured share, throttled time and
// state, by UID.
func (s *Sched) Snapshot() []PodStatus {
	var out []PodStatus
	for uid, p := range s.pods {
		st := Waiting
		switch {
		case p.Exempt:
			st = Exempted
		case p.idle:
			st = Idle
		case uid == s.holder:
			st = Running
		case p.HardCap && p.credit <= 0:
			st = Capped
		}
		out = append(out, PodStatus{UID: uid, Target: p.Target, HardCap: p.HardCap, Share: 100 * p.share, Throttled: p.throttled, State: st})
	}
	slices.SortFunc(out, func(a, b PodStatus) int { return cmp.Compare(a.UID, b.UID) })
	return out
}
