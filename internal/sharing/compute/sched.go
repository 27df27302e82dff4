// Package compute shares a GPU's compute by quota from the node: per
// shared GPU, a time-slice scheduler in the spirit of Gemini's tokens. Each
// sharing pod with a compute target holds the token for runs of time and
// has its cgroup frozen when it has none; the pod furthest below its
// target (by its measured use) gets the next run, sized to what it is
// owed this period. Sched is the decision,
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
	// Slice is the token's least run: a pod given the token holds it for
	// what it is owed this period (its target's part of the Period less
	// what it got), at least a Slice and at most runCap.
	Slice time.Duration
	// Period bounds how long a busy pod is frozen in a row (it gets a
	// run at least once a Period, whatever its target) and is the
	// horizon of the measured share.
	Period time.Duration
}

// idleBelow: a busy pod whose measured use over an idle window is under
// this fraction of the time it was thawed is idle: it has no work for the
// GPU, is thawed and leaves its share to the others. Judged over a window
// of wall time, not per run: NVML's per-process utilization is an
// average over its own sample period (200 ms), late by as much and more
// (measureLag).
const idleBelow = 0.25

// idleWindow is the wall time a busy pod's use is judged over.
func (s Settings) idleWindow() time.Duration { return max(500*time.Millisecond, s.Period/2) }

// measureLag is how late a thawed pod's use reaches the scheduler: NVML's
// sample (every 200 ms, of the time since the last), read at the next
// Step (a run, at most runCap, later). At each Step a busy pod's thawed
// time over the idle window that ended measureLag ago (its use is all
// measured by now) is judged against its use measured since that window
// began: the use of time before it or after it, arriving in it, can only
// make a pod look busier, never idle.
func (s Settings) measureLag() time.Duration { return 200*time.Millisecond + s.runCap() }

// runCap is the longest run of the token: a holder that went idle keeps
// the GPU's share from the others at most this long before the next
// choice sees it (and the idle window judges it), and a Period holds
// several runs, so that 1 s windows stay even. Each run is one wake-up
// and at most one freeze and one thaw: with 20 ms slices and targets
// 10/20/30/40 the token moved almost every slice (~50 wake-ups and ~57
// freezer writes a second); in turns of runs it moves four times a
// Period. Under NVML's sample period (200 ms): a sample's use reaches
// the scheduler within a run (gpumon sums the samples, so that one
// arriving beside another before a late Step is not lost: sampled).
func (s Settings) runCap() time.Duration {
	return max(s.Slice, min(150*time.Millisecond, s.Period/5))
}

// capBank is the most GPU time (seconds) a hard-capped pod banks: its
// runs are at most this long (then frozen until it is banked again), so
// that a 1 s window holds its cap within a few points.
func (s Settings) capBank() float64 { return max(s.Slice, s.Period/30).Seconds() }

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
	held, used  []span  // thawed time and measured use, for the idle window
	share       float64 // measured share, EWMA over Period (0–1)
	credit      float64 // hard cap: seconds of GPU it may still use
	ratio       float64 // measured use per second of token (1 until measured)
	wokeAt      time.Time
	heldLong    float64 // thawed seconds, decayed over ratioHorizon
	usedLong    float64 // measured use in them
	calibrating bool    // heldLong and usedLong are being counted (calibrate)
	frozenSince time.Time
	frozen      bool
	throttled   time.Duration
}

// span is dt seconds (thawed, or of measured use) in a step ending at end.
type span struct {
	end time.Time
	dt  float64
}

// Sched is one GPU's scheduler. Not safe for concurrent use.
type Sched struct {
	set    Settings
	pods   map[string]*podState
	holder string
	turn   string // the last holder: the next round-robin turn starts there
	// level is the pass every busy pod reaches this round: a round is a
	// Period of token time, each pod's run(s) its target's part of it,
	// so that any 1 s window holds about one round.
	level  float64
	runEnd time.Time // the holder's run ends
	due    time.Time // the next Step
	last   time.Time
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
// Step is due at Due (the holder's run's end); a Step before it keeps the
// holder, one after it is as good.
func (s *Sched) Step(now time.Time, pods []Pod, use map[string]float64) map[string]bool {
	dt := 0.0
	if !s.last.IsZero() && now.After(s.last) {
		dt = now.Sub(s.last).Seconds()
	}
	s.last = now
	s.account(now, dt, use)
	s.sync(now, pods, use != nil)
	s.choose(now)
	s.plan(now)
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
			// Above 1 when NVML samples for more than the step's
			// time arrive in it (its use is charged when measured,
			// all of it: a short step after a sample sees several).
			u = max(use[uid], 0)
		case held || p.idle || p.Exempt:
			u = 1
		}
		if p.frozen {
			p.throttled += time.Duration(dt * float64(time.Second))
		}
		p.share = min(p.share+(u-p.share)*decay, 1)
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
			// At most capBank banked (the cap holds over short
			// windows), at most a Period owed.
			c := 0.0
			if !p.frozen {
				c = p.ratio * dt
			}
			p.credit = min(max(p.credit+float64(p.Target)/100*dt-c, -s.set.Period.Seconds()), s.set.capBank())
		}
		if use == nil {
			continue
		}
		switch {
		case !p.idle:
			if !p.frozen {
				p.held = append(p.held, span{now, dt})
			}
			if u > 0 {
				p.used = append(p.used, span{now, u * dt})
			}
			if now.Sub(p.wokeAt) >= s.set.Period {
				s.calibrate(p, now, dt, u) // past the measurement's lag at waking
			}
			s.judgeIdle(p, now)
		case u*float64(max(k, 1)) >= s.busyAbove(p):
			s.wake(p, now)
		}
	}
}

// ratioHorizon is the horizon of a pod's ratio: long beside the
// measurement's lag (measureLag) and a run, so that they move it little
// (a 10 % pod holds the token for 100 ms a second, measured up to 400
// ms late: over 5 s its ratio swung between its bounds); ratioFrom is the
// thawed time it needs before it is used.
const (
	ratioHorizon = 20 * time.Second
	ratioFrom    = time.Second
)

// calibrate follows a busy pod's ratio: its measured use per second of
// token, above 1 when its queued kernels run on after it is frozen, below
// when it does not use all its token.
//
// It is taken only when the use of the pod's thawed time is all measured:
// once it has been frozen measureLag (during and just after a run its
// thawed time is counted and its use not yet: the ratio read then was
// 10 % low, and charged the holder too little), or when it is thawed most
// of the time (then the lag is a small part of heldLong).
//
// It starts counting where no use of the pod's earlier thawed time is
// still to arrive: once it has been frozen measureLag. Started while it
// ran, the use of its thawed time before the start, arriving after it,
// was counted against no thawed time: a 20 % pod's first ratio read 1.10
// and its share 18 %, back to its target only over the ratio's horizon. A
// pod seldom frozen that long (a large target) starts after half a
// horizon awake; its ratio is taken once heldLong is half a horizon, where
// a measureLag of use is a small part of it.
func (s *Sched) calibrate(p *podState, now time.Time, dt, u float64) {
	if !p.calibrating {
		frozenLong := p.frozen && now.Sub(p.frozenSince) >= s.set.measureLag()
		p.calibrating = frozenLong || now.Sub(p.wokeAt) >= ratioHorizon/2
		return // this Step's use is of the time before the start
	}
	d := math.Exp(-dt / ratioHorizon.Seconds())
	p.heldLong *= d
	p.usedLong = p.usedLong*d + u*dt
	if !p.frozen {
		p.heldLong += dt
	}
	measured := p.frozen && now.Sub(p.frozenSince) >= s.set.measureLag() || p.heldLong >= ratioHorizon.Seconds()/2
	if p.heldLong >= ratioFrom.Seconds() && measured {
		p.ratio = min(max(p.usedLong/p.heldLong, 0.5), 2)
	}
}

// judgeIdle: a busy pod is idle when, over the idle window that ended
// measureLag ago, it was thawed a slice or more and its use measured
// since that window began is under a quarter of that time.
func (s *Sched) judgeIdle(p *podState, now time.Time) {
	from, to := now.Add(-s.set.idleWindow()-s.set.measureLag()), now.Add(-s.set.measureLag())
	sum := func(sp []span, to time.Time) (float64, []span) {
		t, i := 0.0, 0
		for ; i < len(sp) && !sp[i].end.After(from); i++ {
		}
		for _, x := range sp[i:] {
			if !x.end.After(to) {
				t += x.dt
			}
		}
		return t, sp[i:] // older ones are judged no more
	}
	held, keep := sum(p.held, to)
	used, keepUsed := sum(p.used, now)
	p.held, p.used = keep, keepUsed
	if now.Sub(p.wokeAt) >= s.set.idleWindow()+s.set.measureLag() && held >= s.set.Slice.Seconds() && used < idleBelow*held {
		p.idle, p.held, p.used = true, nil, nil
	}
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
	// Its ratio is learnt again: the last of it before it went idle
	// was of a token it did not use.
	p.idle, p.held, p.used, p.wokeAt = false, nil, nil, now
	p.ratio, p.heldLong, p.usedLong, p.calibrating = 1, 0, 0, false
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

// capReady: a hard-capped pod may take the token again once its credit
// is (nearly) a full bank: one run of capBank, not many short ones.
// A pod with a small target is ready sooner (what it banks in a Period
// less a slice), so that it is not frozen past a Period banking it; under
// slice/period (2 %) its slice-long runs still overdraw it, and it waits
// slice/target (1 %: 2 s).
func (s *Sched) capReady(p *podState) bool { return p.credit > 0 && p.credit >= 0.99*s.readyAt(p) }

// readyAt is the credit that makes a hard-capped pod ready.
func (s *Sched) readyAt(p *podState) float64 {
	return min(s.set.capBank(), float64(p.Target)/100*(s.set.Period-s.set.Slice).Seconds())
}

// eligible: busy, schedulable, and (hard-capped) with a bank to run on.
func (s *Sched) eligible(p *podState) bool {
	return !p.idle && !p.Exempt && (!p.HardCap || s.capReady(p))
}

// choose keeps the holder until its run ends, else gives the token to the
// eligible pod frozen a Period or more (the bound on a frozen streak),
// else to the next pod still owed time this round (owed), in UID order
// from the last holder (which goes on while it is owed): a stable order,
// each pod's runs of a round back to back, so the token moves about once
// per busy pod a round and every round is the same (a 1 s window holds
// one). When no pod is owed, a new round starts: a Period of token time,
// each eligible pod owed its target's part of it.
func (s *Sched) choose(now time.Time) {
	// A Step within a quarter slice of the run's end ends it: no wake-up
	// for what is left.
	if h, ok := s.pods[s.holder]; ok && !h.idle && !h.Exempt && (!h.HardCap || h.credit > 0) && s.runEnd.Sub(now) > s.set.Slice/4 {
		return
	}
	order := slices.Sorted(maps.Keys(s.pods))
	var best *podState
	for _, uid := range order {
		p := s.pods[uid]
		if s.eligible(p) && p.frozen && now.Sub(p.frozenSince) >= s.set.Period-s.set.Slice &&
			(best == nil || p.frozenSince.Before(best.frozenSince)) {
			best = p
		}
	}
	if best == nil {
		best = s.next(order)
	}
	s.holder = ""
	if best != nil {
		s.holder, s.turn = best.UID, best.UID
		s.runEnd = now.Add(s.runFor(now, best))
	}
}

// rate is the pass a second of token adds to p.
func (p *podState) rate() float64 { return p.ratio / float64(p.Target) }

// owed: p is owed a slice or more this round.
func (s *Sched) owed(p *podState) bool {
	return (s.level-p.pass)/p.rate() >= s.set.Slice.Seconds()
}

// next is the first eligible pod owed time this round, in UID order from
// the last holder; with none owed, a new round starts, from the pod after
// it (the last holder does not go twice in a row).
func (s *Sched) next(order []string) *podState {
	from := max(slices.Index(order, s.turn), 0)
	find := func(from int) *podState {
		for k := range order {
			if p := s.pods[order[(from+k)%len(order)]]; s.eligible(p) && s.owed(p) {
				return p
			}
		}
		return nil
	}
	if p := find(from); p != nil {
		return p
	}
	sum, lo, any := 0.0, 0.0, false
	for _, p := range s.pods {
		if s.eligible(p) {
			if !any || p.pass < lo {
				lo = p.pass
			}
			sum, any = sum+float64(p.Target), true
		}
	}
	if !any {
		return nil
	}
	s.level = max(s.level, lo) + s.set.Period.Seconds()/sum
	return find(from + 1)
}

// runFor is the run p is owed: until its pass reaches the round's level
// (what it is owed this round, less what it got); for a hard-capped pod
// at most its credit; short enough that no other busy pod is frozen past
// a Period (less half a slice for a late Step); at least a Slice, at most
// runCap.
func (s *Sched) runFor(now time.Time, p *podState) time.Duration {
	d := (s.level - p.pass) / p.rate()
	if p.HardCap {
		// Its credit falls by ratio−target a second of token.
		d = min(d, p.credit/max(p.ratio-float64(p.Target)/100, 0.05))
	}
	for _, q := range s.pods {
		if q != p && q.frozen && s.eligible(q) {
			d = min(d, (s.set.Period - s.set.Slice/2 - now.Sub(q.frozenSince)).Seconds())
		}
	}
	return min(max(time.Duration(d*float64(time.Second)), s.set.Slice), s.set.runCap())
}

// plan sets the next Step: the run's end; with no holder, when the first
// hard-capped pod has banked a run, else a runCap later (an idle pod
// seen busy again).
func (s *Sched) plan(now time.Time) {
	if s.holder != "" {
		s.due = s.runEnd
		return
	}
	s.due = now.Add(s.set.runCap())
	for _, p := range s.pods {
		if !p.idle && !p.Exempt && p.HardCap && !s.capReady(p) {
			wait := time.Duration((s.readyAt(p) - p.credit) / (float64(p.Target) / 100) * float64(time.Second))
			s.due = minTime(s.due, now.Add(max(wait, time.Millisecond)))
		}
	}
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// Due is when the next Step is due: the holder's run's end.
func (s *Sched) Due() time.Time { return s.due }

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
		case p.HardCap && !s.capReady(p):
			st = Capped
		}
		out = append(out, PodStatus{UID: uid, Target: p.Target, HardCap: p.HardCap, Share: 100 * p.share, Throttled: p.throttled, State: st})
	}
	slices.SortFunc(out, func(a, b PodStatus) int { return cmp.Compare(a.UID, b.UID) })
	return out
}
