package compute

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math"
	"path/filepath"
	"slices"
	"testing"
	"time"

	v1 "github.com/gpud/gpud/api/v1"
	"github.com/gpud/gpud/internal/sharing"
)

// recFreezer records the freezer's state per cgroup and checks the
// journal lists a cgroup before its first freeze.
type recFreezer struct {
	t      *testing.T
	state  string
	frozen map[Cgroup]bool
	ops    int
	paused map[Cgroup]bool // paused by someone else
	reads  int             // Paused calls
}

func (f *recFreezer) Locate(pid int, _ uint64) (Cgroup, error) {
	return Cgroup{Kind: "freezer.state", Path: fmt.Sprintf("/sys/fs/cgroup/freezer/pod%d", pid)}, nil
}

func (f *recFreezer) Set(c Cgroup, frozen bool) error {
	f.ops++
	if frozen {
		cgs, err := readJournal(f.state)
		found := false
		for _, j := range cgs {
			found = found || j == c
		}
		if err != nil || !found {
			f.t.Errorf("%s frozen before it was journaled (journal %v, %v)", c.Path, cgs, err)
		}
	}
	f.frozen[c] = frozen
	return nil
}

func (f *recFreezer) Paused(c Cgroup) (bool, error) {
	f.reads++
	return f.frozen[c] || f.paused[c], nil
}

func newTestController(t *testing.T, targets ...int) (*Controller, *recFreezer, fakeHolders) {
	state := t.TempDir()
	fz := &recFreezer{t: t, state: state, frozen: map[Cgroup]bool{}, paused: map[Cgroup]bool{}}
	book := sharing.NewBook()
	holders := fakeHolders{}
	for i, target := range targets {
		uid := fmt.Sprintf("pod-%d", i)
		holders[uid] = 100 + i
		book.Set(uid, []sharing.Share{{ClaimUID: uid, GPU: 0, Compute: target, Pods: []sharing.PodRef{{UID: uid, Namespace: "ns", Name: uid}}}})
	}
	c := New(Config{Settings: Settings{Slice: 20 * time.Millisecond, Period: time.Second}, Book: book, Holders: holders,
		Workloads: fakeWorkloads{}, Freezer: fz, StateDir: state, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	return c, fz, holders
}

// The controller journals before freezing, freezes all but the token's
// holder, and thaws everything (and drops the journal) when it stops.
func TestControllerFreezesJournaledAndThawsAtStop(t *testing.T) {
	c, fz, _ := newTestController(t, 25, 75)
	now := time.Unix(1000, 0)
	c.refresh(now)
	if !c.Scheduling(0) || c.Scheduling(1) {
		t.Fatalf("scheduling GPU 0 %v, GPU 1 %v", c.Scheduling(0), c.Scheduling(1))
	}
	held := map[string]int{}
	for range 400 {
		c.tick(now)
		n := 0
		for _, f := range fz.frozen {
			if f {
				n++
			}
		}
		if n != 1 {
			t.Fatalf("%d of 2 pods frozen, want 1", n)
		}
		held[c.scheds[0].Holder()]++
		now = now.Add(20 * time.Millisecond)
	}
	if held["pod-0"] < 90 || held["pod-0"] > 110 {
		t.Errorf("the 25 %% pod held %d of 400 slices", held["pod-0"])
	}
	snap := c.Snapshot()
	if len(snap) != 1 || len(snap[0].Pods) != 2 || snap[0].Pods[0].Name != "pod-0" || snap[0].Pods[0].Target != 25 || snap[0].Pods[0].Throttled < 5*time.Second {
		t.Errorf("snapshot %+v", snap)
	}
	c.stop()
	for cg, f := range fz.frozen {
		if f {
			t.Errorf("%s still frozen after stop", cg.Path)
		}
	}
	if cgs, err := readJournal(c.cfg.StateDir); err != nil || len(cgs) != 0 {
		t.Errorf("journal after stop: %v, %v", cgs, err)
	}
}

// Without --enforce nothing is frozen; a pod paused by someone else
// (docker pause, a preemption) is left alone, never thawed.
func TestControllerNotEnforcingAndPausedByOther(t *testing.T) {
	c, fz, _ := newTestController(t, 50, 50)
	c.cfg.Enforcing = func() bool { return false }
	now := time.Unix(1000, 0)
	c.refresh(now)
	for range 50 {
		c.tick(now)
		now = now.Add(20 * time.Millisecond)
	}
	if fz.ops != 0 {
		t.Errorf("%d freezer writes without --enforce", fz.ops)
	}
	c.cfg.Enforcing = func() bool { return true }
	other := Cgroup{Kind: "freezer.state", Path: filepath.Join("/sys/fs/cgroup/freezer", "pod100")}
	fz.paused[other] = true
	for range 50 {
		c.tick(now)
		now = now.Add(20 * time.Millisecond)
	}
	if _, touched := fz.frozen[other]; touched {
		t.Error("the scheduler wrote the freezer of a cgroup someone else paused")
	}
}

// tickFor ticks c n times, a 20 ms slice apart from now, and returns the
// time after the last.
func tickFor(c *Controller, now time.Time, n int) time.Time {
	for range n {
		c.tick(now)
		now = now.Add(20 * time.Millisecond)
	}
	return now
}

// Whether someone else paused a pod is read before the scheduler freezes
// it and once a Period, not every tick for every running pod (that was a
// read per slice): a 10/90 pair switches the token about twice in ten
// slices.
func TestControllerReadsPausedBeforeFreezing(t *testing.T) {
	c, fz, _ := newTestController(t, 10, 90)
	now := time.Unix(1000, 0)
	c.refresh(now)
	now = tickFor(c, now, 100)
	c.refresh(now)
	tickFor(c, now, 100)
	// A read before each freeze (half the writes, the freezes one more
	// than the thaws at most), and of each of the two pods at each of the
	// two refreshes (a frozen one: is it still? checkFrozen).
	if most := (fz.ops+1)/2 + 4; fz.reads > most {
		t.Errorf("%d reads of the freezers' state in 200 slices (%d freezer writes), want at most %d", fz.reads, fz.ops, most)
	}
}

// A gpud that cannot journal freezes nothing.
func TestControllerWithoutJournalFreezesNothing(t *testing.T) {
	c, fz, _ := newTestController(t, 50, 50)
	c.cfg.StateDir = "/proc/nonexistent/dir"
	now := time.Unix(1000, 0)
	c.refresh(now)
	for range 20 {
		c.tick(now)
		now = now.Add(20 * time.Millisecond)
	}
	for cg, f := range fz.frozen {
		if f {
			t.Errorf("%s frozen without a journal", cg.Path)
		}
	}
}

// A cgroup the preemption executor takes (Preempt) while the scheduler
// holds it frozen stays frozen: no tick, nor stop, thaws it (that would
// undo the preemption); the scheduler's freeze is handed over, the
// journal no longer lists it, and after Unpreempt it is scheduled again.
func TestControllerNeverThawsAPreemptedCgroup(t *testing.T) {
	c, fz, _ := newTestController(t, 50, 50)
	held, now := scheduledAndFrozen(t, c, fz)
	if !c.Preempt(held.Path) {
		t.Fatal("Preempt did not report the scheduler's freeze")
	}
	for range 200 { // both pods would hold the token many times
		c.tick(now)
		now = now.Add(20 * time.Millisecond)
		if !fz.frozen[held] {
			t.Fatalf("the scheduler thawed %s, frozen for a preemption", held.Path)
		}
	}
	if cgs, err := readJournal(c.cfg.StateDir); err != nil || slices.Contains(cgs, held) {
		t.Errorf("journal %v (%v) still lists the preempted cgroup: the next gpud would thaw it", cgs, err)
	}
	c.stop()
	if !fz.frozen[held] {
		t.Fatal("stop thawed a cgroup frozen for a preemption")
	}
	// The executor thaws it when the preemption ends, then gives it back.
	fz.frozen[held] = false
	c.Unpreempt(held.Path)
	c.refresh(now)
	froze := false
	for range 50 {
		c.tick(now)
		now = now.Add(20 * time.Millisecond)
		froze = froze || fz.frozen[held]
	}
	if !froze {
		t.Error("a cgroup given back after its preemption was never scheduled again")
	}
}

// The journal thaw at start leaves a cgroup the preemption journal holds
// frozen, and thaws the others.
func TestThawJournalSkipsPreempted(t *testing.T) {
	state := t.TempDir()
	a := Cgroup{Kind: "freezer.state", Path: "/sys/fs/cgroup/freezer/a"}
	b := Cgroup{Kind: "freezer.state", Path: "/sys/fs/cgroup/freezer/b"}
	if err := writeJournal(state, []Cgroup{a, b}); err != nil {
		t.Fatal(err)
	}
	fz := &recFreezer{t: t, state: state, frozen: map[Cgroup]bool{a: true, b: true}, paused: map[Cgroup]bool{}}
	n, err := ThawJournal(state, "/sys/fs/cgroup", fz, func(path string) bool { return path == a.Path })
	if err != nil || n != 1 || !fz.frozen[a] || fz.frozen[b] {
		t.Fatalf("thawed %d (%v): a frozen %v, b frozen %v; want only b thawed", n, err, fz.frozen[a], fz.frozen[b])
	}
}

// fastClock is a simulated clock: After moves it on by d at once; it
// cancels the run once it reaches end.
type fastClock struct {
	now    time.Time
	end    time.Time
	cancel func()
	wakes  int
}

func (c *fastClock) Now() time.Time { return c.now }

func (c *fastClock) After(d time.Duration) <-chan time.Time {
	c.now = c.now.Add(d)
	c.wakes++
	if !c.now.Before(c.end) {
		c.cancel()
	}
	ch := make(chan time.Time, 1)
	ch <- c.now
	return ch
}

// Run wakes once a run (and once a Period to refresh), not once a slice:
// with 4 busy pods 10/20/30/40 it woke 50 times a second and wrote the
// freezers about 90 times.
func TestControllerWakesOncePerRun(t *testing.T) {
	c, fz, _ := newTestController(t, 10, 20, 30, 40)
	ctx, cancel := context.WithCancel(context.Background())
	clock := &fastClock{now: time.Unix(1000, 0), end: time.Unix(1010, 0), cancel: cancel}
	c.cfg.Clock = clock
	c.Run(ctx)
	if secs := clock.now.Sub(time.Unix(1000, 0)).Seconds(); secs < 10 {
		t.Fatalf("ran %.1f s of simulated time", secs)
	}
	if per := float64(clock.wakes) / 10; per > 10 {
		t.Errorf("%.1f wake-ups a second, want at most 10", per)
	}
	if per := float64(fz.ops) / 10; per > 12 {
		t.Errorf("%.1f freezer writes a second, want at most 12", per)
	}
	t.Logf("%.1f wake-ups, %.1f freezer writes a second", float64(clock.wakes)/10, float64(fz.ops)/10)
}

// sums sums NVML's readings as gpumon.Monitor.Busy does: each reading's
// percents for the time since the one before, from the first reading.
type sums struct {
	from, through time.Time
	busy          map[int32]time.Duration
}

func (s *sums) read(at time.Time, pct map[int32]uint32) {
	if s.from.IsZero() {
		s.from, s.through, s.busy = at, at, map[int32]time.Duration{}
		return
	}
	for pid, p := range pct {
		s.busy[pid] += at.Sub(s.through) * time.Duration(p) / 100
	}
	s.through = at
}

func (s *sums) get(int) (map[int32]time.Duration, time.Time, time.Time, error) {
	if !s.through.After(s.from) {
		return nil, time.Time{}, time.Time{}, fmt.Errorf("no sample yet")
	}
	return maps.Clone(s.busy), s.from, s.through, nil
}

// chargeSampled steps a sampled on GPU 0 at the given step lengths, NVML
// read every 200 ms from start+phase (from start+200 ms), the pod (PID 7)
// busy as busy says; it returns the GPU time charged to the pod and the
// time it used, both from the first measured step on (the one before is
// where counting starts).
func chargeSampled(t *testing.T, phase time.Duration, steps []time.Duration, busy func(from, to time.Time) float64) (charged, used float64) {
	t.Helper()
	start := time.Unix(1000, 0)
	clock := &fastClock{now: start, end: start.Add(time.Hour), cancel: func() {}}
	src := &sums{}
	s := &sampled{clock: clock, maxAge: 2 * time.Second, last: map[int]sampledAt{}, f: src.get}
	next := start.Add(phase)
	var from time.Time // the sums' time at the step counting starts from
	for _, step := range steps {
		prev := clock.now
		clock.now = clock.now.Add(step)
		for ; !next.After(clock.now); next = next.Add(200 * time.Millisecond) {
			if next.Sub(start) >= 200*time.Millisecond {
				src.read(next, map[int32]uint32{7: uint32(math.Round(100 * busy(next.Add(-200*time.Millisecond), next) / 0.2))})
			}
		}
		u, err := s.Utilization(0)
		switch {
		case err != nil && !from.IsZero():
			t.Fatalf("at %s: %v", clock.now.Sub(start), err)
		case err != nil:
			continue
		case from.IsZero():
			from = src.through
			continue
		}
		charged += u[7] / 100 * clock.now.Sub(prev).Seconds()
	}
	return charged, busy(from, src.through)
}

// Each NVML sample is charged once, for the time it covers, whatever the
// steps' times. A pod holding the token 100 ms a second, steps at the
// runs' ends (100 ms, then 150 ms runs), NVML sampling every 200 ms: the
// last sample's percent charged for each step's time came out 0.68 to
// 1.13 of its use, by the samples' phase (the schedule and the samples
// are in step).
func TestSampledChargesEachSampleOnce(t *testing.T) {
	start := time.Unix(1000, 0)
	busy := func(from, to time.Time) float64 { // seconds the pod ran in [from, to)
		n := 0.0
		for x := from; x.Before(to); x = x.Add(time.Millisecond) {
			if x.Sub(start)%time.Second < 100*time.Millisecond {
				n += 0.001
			}
		}
		return n
	}
	var steps []time.Duration
	for range 10 {
		for _, run := range []time.Duration{100, 150, 150, 150, 150, 150, 150} {
			steps = append(steps, run*time.Millisecond)
		}
	}
	for _, phase := range []time.Duration{0, 50 * time.Millisecond, 100 * time.Millisecond, 150 * time.Millisecond} {
		got, want := chargeSampled(t, phase, steps, busy)
		if math.Abs(got-want) > 0.02 {
			t.Errorf("samples at phase %s: charged %.3f s of GPU, it used %.3f s", phase, got, want)
		}
	}
}

// Two samples arriving between two steps (a Step late under CPU load:
// 50–100 ms, up to one more run) are both charged, each for its own time.
// A pod busy for the first 200 ms of each 400, NVML read every 200 ms,
// steps every 400 ms: keeping only the last sample, each step saw only
// the busy one or only the idle one, by phase, and charged the pod 0 or
// twice its use.
func TestSampledChargesSamplesBetweenLateSteps(t *testing.T) {
	start := time.Unix(1000, 0)
	busy := func(from, to time.Time) float64 {
		n := 0.0
		for x := from; x.Before(to); x = x.Add(time.Millisecond) {
			if x.Sub(start)%(400*time.Millisecond) < 200*time.Millisecond {
				n += 0.001
			}
		}
		return n
	}
	steps := slices.Repeat([]time.Duration{400 * time.Millisecond}, 25)
	// Late and uneven: 100 ms runs with a step late by up to 230 ms.
	uneven := slices.Repeat([]time.Duration{100 * time.Millisecond, 330 * time.Millisecond, 100 * time.Millisecond, 250 * time.Millisecond}, 13)
	for _, phase := range []time.Duration{0, 50 * time.Millisecond, 100 * time.Millisecond, 150 * time.Millisecond} {
		for name, st := range map[string][]time.Duration{"400 ms": steps, "uneven": uneven} {
			got, want := chargeSampled(t, phase, st, busy)
			if want < 3 || math.Abs(got-want) > 0.02 {
				t.Errorf("steps %s, samples at phase %s: charged %.3f s of GPU, it used %.3f s", name, phase, got, want)
			}
		}
	}
}

// A gap in the samples (a new from) or a step after more than maxAge is
// where counting starts again: no measurement, not the gap's use charged
// to one step.
func TestSampledStartsAgainAfterAGap(t *testing.T) {
	start := time.Unix(1000, 0)
	clock := &fastClock{now: start, end: start.Add(time.Hour), cancel: func() {}}
	src := &sums{}
	s := &sampled{clock: clock, maxAge: 2 * time.Second, last: map[int]sampledAt{}, f: src.get}
	step := func(d time.Duration, pct uint32) (map[int]float64, error) {
		clock.now = clock.now.Add(d)
		src.read(clock.now, map[int32]uint32{7: pct})
		return s.Utilization(0)
	}
	step(200*time.Millisecond, 50)
	if _, err := step(200*time.Millisecond, 50); err == nil {
		t.Fatal("the first call is measured")
	}
	if u, err := step(200*time.Millisecond, 50); err != nil || math.Abs(u[7]-50) > 0.01 {
		t.Fatalf("a step of one 50 %% sample: %v, %v", u, err)
	}
	*src = sums{} // the sums start again (a gap in the samples)
	step(100*time.Millisecond, 100)
	if u, err := step(100*time.Millisecond, 100); err == nil {
		t.Errorf("the first step of new sums is measured: %v", u)
	}
	if u, err := step(200*time.Millisecond, 100); err != nil || math.Abs(u[7]-100) > 0.01 {
		t.Errorf("a step of one 100 %% sample: %v, %v", u, err)
	}
	src.read(clock.now.Add(2500*time.Millisecond), map[int32]uint32{7: 100}) // 2.5 s at 100 %
	if u, err := step(3*time.Second, 100); err == nil {
		t.Errorf("a step 3 s after the last is measured: %v", u)
	}
}

// slowFreezer is a recFreezer whose freezes complete only when waited for
// (WaitFrozen): a spinning task under CPU load freezes when it next gets a
// CPU. It counts the thaws done while another cgroup was still freezing,
// and checks that the controller's lock is free while it waits.
type slowFreezer struct {
	*recFreezer
	c        *Controller
	freezing map[Cgroup]bool
	waits    int
	beside   int // thaws with a freeze not yet complete
}

func (f *slowFreezer) Set(c Cgroup, frozen bool) error {
	if frozen {
		f.freezing[c] = true
	} else {
		delete(f.freezing, c)
		if len(f.freezing) > 0 {
			f.beside++
		}
	}
	return f.recFreezer.Set(c, frozen)
}

func (f *slowFreezer) WaitFrozen(c Cgroup, _ time.Time) (bool, error) {
	f.waits++
	if !f.c.mu.TryLock() {
		f.t.Error("the controller waits for a freeze holding its lock (a preemption would wait too)")
	} else {
		f.c.mu.Unlock()
	}
	delete(f.freezing, c)
	return true, nil
}

// The token's next holder is thawed only once its previous holder is
// frozen (under CPU load a freeze completes when the task next gets a
// CPU: tens of ms), without the controller's lock held meanwhile.
func TestControllerThawsNextHolderOncePreviousFrozen(t *testing.T) {
	c, rec, _ := newTestController(t, 20, 30, 50)
	fz := &slowFreezer{recFreezer: rec, c: c, freezing: map[Cgroup]bool{}}
	c.cfg.Freezer = fz
	now := time.Unix(1000, 0)
	c.refresh(now)
	moves := 0
	holder := ""
	for range 200 {
		c.tick(now)
		if h := c.scheds[0].Holder(); h != holder {
			moves, holder = moves+1, h
		}
		clear(fz.freezing) // frozen by the next tick, a slice later
		now = now.Add(20 * time.Millisecond)
	}
	if moves < 10 {
		t.Fatalf("the token moved %d times in 4 s", moves)
	}
	if fz.beside > 0 || fz.waits == 0 {
		t.Errorf("%d of %d token moves thawed the next holder beside one still freezing (%d waits)", fz.beside, moves, fz.waits)
	}
}

// preemptingFreezer is a slowFreezer that hands the cgroup about to be
// thawed to the preemption executor while the freeze is waited for.
type preemptingFreezer struct {
	*slowFreezer
	handed []Cgroup
}

func (f *preemptingFreezer) WaitFrozen(c Cgroup, deadline time.Time) (bool, error) {
	for cg, fz := range f.frozen {
		if fz && !f.freezing[cg] && cg != c {
			f.c.Preempt(cg.Path) // the cgroup to be thawed next
			f.handed = append(f.handed, cg)
		}
	}
	return f.slowFreezer.WaitFrozen(c, deadline)
}

// A cgroup handed to the preemption executor while the scheduler waits for
// a freeze (its lock let go) is not thawed as the next holder.
func TestControllerLeavesACgroupPreemptedDuringASettle(t *testing.T) {
	c, rec, _ := newTestController(t, 50, 50)
	fz := &preemptingFreezer{slowFreezer: &slowFreezer{recFreezer: rec, c: c, freezing: map[Cgroup]bool{}}}
	c.cfg.Freezer = fz
	now := time.Unix(1000, 0)
	c.refresh(now)
	for range 100 {
		c.tick(now)
		clear(fz.freezing)
		now = now.Add(20 * time.Millisecond)
		if len(fz.handed) > 0 {
			break
		}
	}
	if len(fz.handed) == 0 {
		t.Fatal("no token move with a holder to thaw")
	}
	for range 50 {
		c.tick(now)
		now = now.Add(20 * time.Millisecond)
	}
	for _, cg := range fz.handed {
		if !fz.frozen[cg] {
			t.Errorf("%s, handed to the executor while a freeze was waited for, was thawed", cg.Path)
		}
	}
}

// The scheduler's readers on normal-priority goroutines (the state file's
// writer, the gate, the utilization sampler) never take its lock: one of
// them kept off a CPU while holding it would hold up the scheduler's next
// step on its raised thread, between a freeze and the next thaw.
func TestControllerReadersDoNotTakeItsLock(t *testing.T) {
	c, _, _ := newTestController(t, 10, 90)
	now := time.Unix(1000, 0)
	c.refresh(now)
	c.tick(now)
	c.mu.Lock()
	done := make(chan [2]int)
	go func() {
		var st v1.StateFile
		st.GPUs = []v1.StateGPU{{Index: 0}}
		c.Decorate(&st)
		n := 0
		if c.Scheduling(0) {
			n = 1
		}
		done <- [2]int{len(st.GPUs[0].ComputeShares), n}
	}()
	select {
	case got := <-done:
		if got != [2]int{2, 1} {
			t.Errorf("read while the lock was held: %d shares shown, scheduling %d; want 2 and 1", got[0], got[1])
		}
	case <-time.After(5 * time.Second):
		t.Error("Decorate or Scheduling waited for the scheduler's lock")
		c.mu.Unlock()
		<-done
		return
	}
	c.mu.Unlock()
}

// scheduledAndFrozen refreshes c and steps it for 10 slices from a fixed
// time, and returns a cgroup it froze and the time after them.
func scheduledAndFrozen(t *testing.T, c *Controller, fz *recFreezer) (Cgroup, time.Time) {
	t.Helper()
	now := time.Unix(1000, 0)
	c.refresh(now)
	now = tickFor(c, now, 10)
	for cg, f := range fz.frozen {
		if f {
			return cg, now
		}
	}
	t.Fatal("the scheduler froze no pod")
	return Cgroup{}, now
}

// A cgroup the scheduler holds frozen and someone else thaws (docker
// unpause, a tool, a lost freeze) is frozen again within a Period, not
// left to run until its next turn.
func TestControllerFreezesAgainWhatOthersThawed(t *testing.T) {
	c, fz, _ := newTestController(t, 10, 90)
	held, now := scheduledAndFrozen(t, c, fz)
	fz.frozen[held] = false // thawed behind the scheduler's back
	c.refresh(now)
	c.tick(now)
	holder := ""
	for _, m := range c.members[0] {
		if m.UID == c.scheds[0].Holder() {
			holder = m.cg.Path
		}
	}
	if !fz.frozen[held] && holder != held.Path {
		t.Errorf("%s, thawed by someone else while not its turn, is still thawed after a refresh", held.Path)
	}
	if c.thawedByOther.Load() != 1 {
		t.Errorf("thawed by others: %d, want 1", c.thawedByOther.Load())
	}
}
