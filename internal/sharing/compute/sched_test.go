package compute

import (
	"math"
	"testing"
	"time"
)

var testSettings = Settings{Slice: 20 * time.Millisecond, Period: time.Second}

// gpu simulates one GPU on a simulated clock: each pod has a demand (the
// fraction of the GPU it would use alone: 1 busy, 0 idle); the thawed
// pods share the GPU by water-filling (as busy processes share a real
// GPU's time, and the NVML double's utilization follows their run time).
type gpu struct {
	t      *testing.T
	s      *Sched
	now    time.Time
	pods   []Pod
	demand map[string]float64
	use    map[string]float64 // last step's, fed to the next Step
	run    map[string]bool
	// window accounting
	acc    map[string]float64
	accDur float64
	// frozen streaks
	frozenFor map[string]time.Duration
	maxFrozen map[string]time.Duration
	// sampled: the scheduler sees NVML-like samples: each pod's average
	// over the last sample period, held until the next one.
	sampled             bool
	sampleAcc, sampled_ map[string]float64
	sampleN             int
}

// samplePeriod is the NVML double's (and gpumon's) sampling period.
const samplePeriod = 200 * time.Millisecond

func newGPU(t *testing.T, pods ...Pod) *gpu {
	g := &gpu{t: t, s: NewSched(testSettings), now: time.Unix(1000, 0), pods: pods, demand: map[string]float64{},
		use: map[string]float64{}, acc: map[string]float64{}, frozenFor: map[string]time.Duration{}, maxFrozen: map[string]time.Duration{}}
	g.run = g.s.Step(g.now, g.pods, g.use)
	return g
}

// step runs one slice: the GPU is shared among the thawed pods with
// demand, then the scheduler sees the use.
func (g *gpu) step() {
	dt := testSettings.Slice
	use := map[string]float64{}
	left := 1.0
	var want []string
	for _, p := range g.pods {
		if g.run[p.UID] && g.demand[p.UID] > 0 {
			want = append(want, p.UID)
		}
	}
	// water-filling: the smallest demands first
	for len(want) > 0 {
		fair := left / float64(len(want))
		minI := 0
		for i, u := range want {
			if g.demand[u] < g.demand[want[minI]] {
				minI = i
			}
		}
		u := want[minI]
		got := min(g.demand[u], fair)
		use[u] = got
		left -= got
		want = append(want[:minI], want[minI+1:]...)
	}
	for _, p := range g.pods {
		g.acc[p.UID] += use[p.UID] * dt.Seconds()
		if g.run[p.UID] {
			g.frozenFor[p.UID] = 0
		} else {
			g.frozenFor[p.UID] += dt
			g.maxFrozen[p.UID] = max(g.maxFrozen[p.UID], g.frozenFor[p.UID])
		}
	}
	g.accDur += dt.Seconds()
	g.now = g.now.Add(dt)
	if g.sampled {
		if g.sampleAcc == nil {
			g.sampleAcc, g.sampled_ = map[string]float64{}, map[string]float64{}
		}
		for u, x := range use {
			g.sampleAcc[u] += x
		}
		g.sampleN++
		if g.sampleN == int(samplePeriod/dt) {
			g.sampled_ = map[string]float64{}
			for u, x := range g.sampleAcc {
				g.sampled_[u] = x / float64(g.sampleN)
			}
			g.sampleAcc, g.sampleN = map[string]float64{}, 0
		}
		use = g.sampled_
	}
	g.run = g.s.Step(g.now, g.pods, use)
}

// run steps for d and returns each pod's share of it, percent.
func (g *gpu) runFor(d time.Duration) map[string]float64 {
	g.acc, g.accDur = map[string]float64{}, 0
	for range int(d / testSettings.Slice) {
		g.step()
	}
	out := map[string]float64{}
	for _, p := range g.pods {
		out[p.UID] = 100 * g.acc[p.UID] / g.accDur
	}
	return out
}

func (g *gpu) busy(uids ...string) {
	for _, u := range uids {
		g.demand[u] = 1
	}
}

// within asserts every pod's share within tol points of want over
// consecutive windows of w, for d.
func (g *gpu) within(d, w time.Duration, tol float64, want map[string]float64) {
	g.t.Helper()
	for i := range int(d / w) {
		got := g.runFor(w)
		for u, x := range want {
			if math.Abs(got[u]-x) > tol {
				g.t.Fatalf("window %d of %s: %s has %.1f%%, want %.0f±%.0f (all %v)", i, w, u, got[u], x, tol, got)
			}
		}
	}
}

func TestTargetsHeldWhenAllBusy(t *testing.T) {
	for _, tc := range []struct {
		name string
		pods []Pod
		want map[string]float64
	}{
		{"10/90", []Pod{{UID: "a", Target: 10}, {UID: "b", Target: 90}}, map[string]float64{"a": 10, "b": 90}},
		{"20/30/50", []Pod{{UID: "a", Target: 20}, {UID: "b", Target: 30}, {UID: "c", Target: 50}}, map[string]float64{"a": 20, "b": 30, "c": 50}},
		// Targets summing under 100: the rest is shared in proportion.
		{"30/50", []Pod{{UID: "a", Target: 30}, {UID: "b", Target: 50}}, map[string]float64{"a": 37.5, "b": 62.5}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := newGPU(t, tc.pods...)
			g.sampled = true
			for _, p := range tc.pods {
				g.busy(p.UID)
			}
			g.runFor(time.Second) // converging: the issue allows 5 s
			g.within(10*time.Second, time.Second, 3, tc.want)
			for _, p := range tc.pods {
				if g.maxFrozen[p.UID] > testSettings.Period {
					t.Errorf("%s frozen %s in a row, over the period %s", p.UID, g.maxFrozen[p.UID], testSettings.Period)
				}
			}
		})
	}
}

// A pod going idle gives its share to the others within 2 s; busy again,
// it gets its share back.
func TestIdleShareGoesToOthersAndComesBack(t *testing.T) {
	for _, sampled := range []bool{false, true} {
		t.Run(map[bool]string{false: "exact", true: "sampled"}[sampled], func(t *testing.T) { idleShare(t, sampled) })
	}
}

func idleShare(t *testing.T, sampled bool) {
	g := newGPU(t, Pod{UID: "a", Target: 20}, Pod{UID: "b", Target: 30}, Pod{UID: "c", Target: 50})
	g.sampled = sampled
	g.busy("a", "b", "c")
	g.runFor(2 * time.Second)
	g.within(3*time.Second, time.Second, 3, map[string]float64{"a": 20, "b": 30, "c": 50})
	g.demand["c"] = 0
	g.runFor(2 * time.Second)
	g.within(5*time.Second, time.Second, 3, map[string]float64{"a": 40, "b": 60, "c": 0})
	for _, st := range g.s.Snapshot() {
		if st.UID == "c" && st.State != Idle {
			t.Errorf("c is %s, want idle", st.State)
		}
	}
	// Back at the busy pods' level, c settles within the bound for
	// 1 s windows (±5 points; ±3 over 10 s).
	g.busy("c")
	g.runFor(2 * time.Second)
	g.within(5*time.Second, time.Second, 5, map[string]float64{"a": 20, "b": 30, "c": 50})
	g.within(10*time.Second, 10*time.Second, 3, map[string]float64{"a": 20, "b": 30, "c": 50})
}

// A hard-capped pod alone on the GPU stays at its cap; a pod without one
// takes the whole GPU.
func TestHardCapHeldOnAnIdleGPU(t *testing.T) {
	g := newGPU(t, Pod{UID: "capped", Target: 30, HardCap: true}, Pod{UID: "free", Target: 20})
	g.busy("capped")
	g.runFor(2 * time.Second)
	g.within(5*time.Second, time.Second, 3, map[string]float64{"capped": 30})
	st := g.s.Snapshot()
	if st[0].UID != "capped" || st[0].Throttled < 3*time.Second {
		t.Errorf("snapshot %+v: the capped pod throttled less than 3 s", st)
	}
	g.demand["capped"] = 0
	g.busy("free")
	g.runFor(2 * time.Second)
	g.within(3*time.Second, time.Second, 3, map[string]float64{"free": 100})
}

// An exempt (high-priority) pod is never frozen; the others share what it
// leaves.
func TestExemptNeverFrozen(t *testing.T) {
	g := newGPU(t, Pod{UID: "high", Target: 50, Exempt: true}, Pod{UID: "a", Target: 25}, Pod{UID: "b", Target: 25})
	g.busy("high", "a", "b")
	for range 200 {
		g.step()
		if !g.run["high"] {
			t.Fatal("the exempt pod was frozen")
		}
	}
}

// Without measurement every pod is busy and the token's time is charged.
func TestUnmeasuredChargesTokenTime(t *testing.T) {
	s := NewSched(testSettings)
	pods := []Pod{{UID: "a", Target: 25}, {UID: "b", Target: 75}}
	now := time.Unix(0, 0)
	held := map[string]int{}
	for range 1000 {
		run := s.Step(now, pods, nil)
		if len(run) != 1 {
			t.Fatalf("%d pods running, want one", len(run))
		}
		held[s.Holder()]++
		now = now.Add(testSettings.Slice)
	}
	if held["a"] < 240 || held["a"] > 260 {
		t.Errorf("a held %d of 1000 slices, want 250", held["a"])
	}
}

// BenchmarkStep4Pods is one slice's decision for four busy pods (50 a
// second per shared GPU at the default slice).
func BenchmarkStep4Pods(b *testing.B) {
	s := NewSched(testSettings)
	pods := []Pod{{UID: "a", Target: 10}, {UID: "b", Target: 20}, {UID: "c", Target: 30}, {UID: "d", Target: 40}}
	use := map[string]float64{"a": 1}
	now := time.Unix(0, 0)
	for b.Loop() {
		run := s.Step(now, pods, use)
		clear(use)
		for u := range run {
			use[u] = 1
		}
		now = now.Add(testSettings.Slice)
	}
}
