package occupancy

import (
	"fmt"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// t0 is a fixed point in time for tests that control the clock entirely.
var t0 = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

func testGPUs(n int) []GPU {
	var gpus []GPU
	for i := 0; i < n; i++ {
		gpus = append(gpus, GPU{Index: i, Device: fmt.Sprintf("/dev/nvidia%d", i), Major: 195, Minor: uint32(i)})
	}
	return gpus
}

func pinfo(pid int, start uint64, comm string) ProcInfo {
	return ProcInfo{PID: pid, StartTime: start, Comm: comm, Priority: Unclassified}
}

// hookCounter counts OnChange calls. The hook reads the ledger's version,
// which deadlocks if the hook were called with the ledger's lock held.
type hookCounter struct {
	calls atomic.Int64
	last  atomic.Uint64
}

func watch(l *Ledger) *hookCounter {
	h := &hookCounter{}
	l.OnChange(func() {
		h.calls.Add(1)
		h.last.Store(l.Version())
	})
	return h
}

func states(s Snapshot) []State {
	var out []State
	for _, g := range s.GPUs {
		out = append(out, g.State)
	}
	return out
}

func TestAddFD(t *testing.T) {
	l := NewLedger(testGPUs(2), time.Minute)
	h := watch(l)
	p := pinfo(100, 7, "train")

	l.AddFD(p, 0, 3, t0)
	l.AddFD(p, 0, 3, t0.Add(time.Second)) // same fd again: still one fd
	l.AddFD(p, 0, 4, t0.Add(2*time.Second))
	l.AddFD(p, 1, 5, t0.Add(3*time.Second))
	want := map[int]map[int][]int32{100: {0: {3, 4}, 1: {5}}}
	if got := l.FDTable(); !reflect.DeepEqual(got, want) {
		t.Fatalf("FDTable = %v, want %v", got, want)
	}
	if int64(l.Version()) != h.calls.Load() || h.last.Load() != l.Version() {
		t.Errorf("hook calls %d (last saw version %d), ledger version %d", h.calls.Load(), h.last.Load(), l.Version())
	}
	s := l.Snapshot(t0.Add(3 * time.Second))
	if got := s.GPUs[0].Holders[0].OpenedAt; !got.Equal(t0) {
		t.Errorf("opened_at of GPU 0 = %v, want the first open %v", got, t0)
	}
	if got := s.GPUs[1].Holders[0].OpenedAt; !got.Equal(t0.Add(3 * time.Second)) {
		t.Errorf("opened_at of GPU 1 = %v, want %v", got, t0.Add(3*time.Second))
	}
	if got, ok := l.Has(100); !ok || got != p {
		t.Errorf("Has(100) = %+v %v, want %+v true", got, ok, p)
	}
	if _, ok := l.Has(101); ok {
		t.Error("Has(101) = true for a pid never added")
	}

	// A GPU the ledger does not know is ignored, without a change.
	v := l.Version()
	l.AddFD(pinfo(200, 1, "x"), 9, 3, t0)
	if l.Version() != v {
		t.Errorf("AddFD on unknown GPU bumped version %d → %d", v, l.Version())
	}
	if _, ok := l.Has(200); ok {
		t.Error("AddFD on an unknown GPU created a process record")
	}
}

func TestRemoveFD(t *testing.T) {
	now := time.Now()
	l := NewLedger(testGPUs(2), time.Hour)
	p := pinfo(100, 7, "train")
	l.AddFD(p, 0, 3, now)
	l.AddFD(p, 0, 4, now)
	l.AddFD(p, 1, 5, now)
	h := watch(l)
	v0 := l.Version()

	for _, tc := range []struct {
		name string
		pid  int
		gpu  int
		fd   int32
	}{
		{"unknown pid", 999, 0, 3},
		{"unknown gpu of known pid", 100, 7, 3},
		{"gpu not held by pid", 100, 1, 3},
		{"unknown fd", 100, 0, 42},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l.RemoveFD(tc.pid, tc.gpu, tc.fd)
			if l.Version() != v0 || h.calls.Load() != 0 {
				t.Errorf("no-op RemoveFD changed version %d → %d, hook calls %d", v0, l.Version(), h.calls.Load())
			}
		})
	}
	if got, want := l.FDTable(), map[int]map[int][]int32{100: {0: {3, 4}, 1: {5}}}; !reflect.DeepEqual(got, want) {
		t.Fatalf("FDTable after no-ops = %v, want %v", got, want)
	}

	l.RemoveFD(100, 0, 3)
	if got, want := l.FDTable(), map[int]map[int][]int32{100: {0: {4}, 1: {5}}}; !reflect.DeepEqual(got, want) {
		t.Errorf("FDTable = %v, want %v", got, want)
	}
	l.RemoveFD(100, 0, 4) // last fd on GPU 0: the GPU is free
	if got := states(l.Snapshot(time.Now())); !slices.Equal(got, []State{Free, Busy}) {
		t.Errorf("states = %v, want [free busy]", got)
	}
	l.RemoveFD(100, 0, 4) // again: no-op
	l.RemoveFD(100, 1, 5) // last fd of the process: it is forgotten
	if _, ok := l.Has(100); ok {
		t.Error("process still known after its last fd closed")
	}
	if got := l.FDTable(); len(got) != 0 {
		t.Errorf("FDTable = %v, want empty", got)
	}
	if got, want := l.Version(), v0+3; got != want {
		t.Errorf("version = %d, want %d (3 real changes)", got, want)
	}
	if got := h.calls.Load(); got != 3 {
		t.Errorf("hook calls = %d, want 3", got)
	}
}

func TestRemoveProcess(t *testing.T) {
	now := time.Now()
	l := NewLedger(testGPUs(3), time.Hour)
	l.AddFD(pinfo(100, 1, "a"), 0, 3, now)
	l.AddFD(pinfo(100, 1, "a"), 2, 4, now)
	l.AddFD(pinfo(200, 1, "b"), 2, 3, now)
	h := watch(l)
	v := l.Version()

	l.RemoveProcess(300)
	if l.Version() != v || h.calls.Load() != 0 {
		t.Fatalf("RemoveProcess of unknown pid: version %d → %d, hook calls %d", v, l.Version(), h.calls.Load())
	}
	l.RemoveProcess(100)
	if got, want := l.FDTable(), map[int]map[int][]int32{200: {2: {3}}}; !reflect.DeepEqual(got, want) {
		t.Errorf("FDTable = %v, want %v", got, want)
	}
	if got := states(l.Snapshot(time.Now())); !slices.Equal(got, []State{Free, Free, Busy}) {
		t.Errorf("states = %v, want [free free busy]", got)
	}
	if l.Version() != v+1 || h.calls.Load() != 1 {
		t.Errorf("version %d → %d, hook calls %d: want one change", v, l.Version(), h.calls.Load())
	}
	l.RemoveProcess(100)
	if l.Version() != v+1 {
		t.Errorf("second RemoveProcess bumped version to %d", l.Version())
	}
}

func TestSetProcess(t *testing.T) {
	l := NewLedger(testGPUs(3), time.Hour)
	p := pinfo(100, 7, "train")
	l.AddFD(p, 0, 3, t0)
	h := watch(l)

	t1 := t0.Add(10 * time.Second)
	// /proc shows fd 3 on GPU 0 (known), fd 4 on GPU 0 and fd 9 on GPU 1 (new).
	l.SetProcess(ProcFDs{Info: p, FDs: map[int][]int32{0: {4, 3}, 1: {9}, 5: {1}, 2: {}}}, t1)
	if got, want := l.FDTable(), map[int]map[int][]int32{100: {0: {3, 4}, 1: {9}}}; !reflect.DeepEqual(got, want) {
		t.Fatalf("FDTable = %v, want %v (unknown GPU and empty fd lists ignored)", got, want)
	}
	s := l.Snapshot(t1)
	if got := s.GPUs[0].Holders[0].OpenedAt; !got.Equal(t0) {
		t.Errorf("GPU 0 opened_at = %v, want the known %v", got, t0)
	}
	if got := s.GPUs[1].Holders[0].OpenedAt; !got.Equal(t1) {
		t.Errorf("GPU 1 opened_at = %v, want %v", got, t1)
	}
	if got := states(s); !slices.Equal(got, []State{Busy, Busy, Free}) {
		t.Errorf("states = %v, want [busy busy free]", got)
	}
	if h.calls.Load() != 1 {
		t.Fatalf("hook calls = %d, want 1", h.calls.Load())
	}

	// The same content again is no change.
	v := l.Version()
	l.SetProcess(ProcFDs{Info: p, FDs: map[int][]int32{0: {3, 4}, 1: {9}}}, t1.Add(time.Second))
	if l.Version() != v || h.calls.Load() != 1 {
		t.Errorf("identical SetProcess: version %d → %d, hook calls %d", v, l.Version(), h.calls.Load())
	}

	// A changed identity (e.g. priority classified) is a change.
	p2 := p
	p2.Priority = High
	l.SetProcess(ProcFDs{Info: p2, FDs: map[int][]int32{0: {3, 4}, 1: {9}}}, t1)
	if got, _ := l.Has(100); got.Priority != High {
		t.Errorf("priority = %q, want high", got.Priority)
	}
	if l.Version() != v+1 {
		t.Errorf("version = %d, want %d", l.Version(), v+1)
	}

	// No fds left: the process is forgotten; again: no-op.
	l.SetProcess(ProcFDs{Info: p2}, t1)
	if _, ok := l.Has(100); ok {
		t.Error("process with no GPU fds still known")
	}
	if l.Version() != v+2 {
		t.Errorf("version = %d, want %d", l.Version(), v+2)
	}
	l.SetProcess(ProcFDs{Info: p2, FDs: map[int][]int32{}}, t1)
	l.SetProcess(ProcFDs{Info: pinfo(555, 1, "nothing")}, t1)
	if l.Version() != v+2 {
		t.Errorf("SetProcess without fds of unknown processes bumped version to %d", l.Version())
	}
	if got := states(l.Snapshot(t1)); !slices.Equal(got, []State{Free, Free, Free}) {
		t.Errorf("states = %v, want all free", got)
	}
}

func TestSetProcessKeepsCommWhenUnknown(t *testing.T) {
	l := NewLedger(testGPUs(1), time.Hour)
	l.AddFD(pinfo(100, 7, "train"), 0, 3, t0)
	l.SetProcess(ProcFDs{Info: ProcInfo{PID: 100, StartTime: 7}, FDs: map[int][]int32{0: {3, 5}}}, t0)
	if got, _ := l.Has(100); got.Comm != "train" {
		t.Errorf("comm = %q, want the known \"train\"", got.Comm)
	}
}

func TestPIDReuse(t *testing.T) {
	t1 := t0.Add(time.Minute)
	for _, tc := range []struct {
		name      string
		oldStart  uint64
		newStart  uint64
		replaced  bool
		viaSetPrc bool
	}{
		{"AddFD, new start time", 7, 8, true, false},
		{"AddFD, same start time", 7, 7, false, false},
		{"AddFD, new start unknown", 7, 0, false, false},
		{"AddFD, old start unknown", 0, 8, false, false},
		{"SetProcess, new start time", 7, 8, true, true},
		{"SetProcess, same start time", 7, 7, false, true},
		{"SetProcess, new start unknown", 7, 0, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := NewLedger(testGPUs(2), time.Hour)
			l.AddFD(pinfo(100, tc.oldStart, "old"), 0, 3, t0)
			l.AddFD(pinfo(100, tc.oldStart, "old"), 1, 4, t0)
			newInfo := pinfo(100, tc.newStart, "new")
			if tc.viaSetPrc {
				l.SetProcess(ProcFDs{Info: newInfo, FDs: map[int][]int32{0: {3}}}, t1)
			} else {
				l.AddFD(newInfo, 0, 3, t1)
			}
			got, ok := l.Has(100)
			if !ok {
				t.Fatal("process 100 unknown")
			}
			s := l.Snapshot(t1)
			opened := s.GPUs[0].Holders[0].OpenedAt
			table := l.FDTable()
			if tc.replaced {
				if got.StartTime != tc.newStart || got.Comm != "new" {
					t.Errorf("info = %+v, want the new process", got)
				}
				if want := map[int]map[int][]int32{100: {0: {3}}}; !reflect.DeepEqual(table, want) {
					t.Errorf("FDTable = %v, want %v: the old process's fds must go", table, want)
				}
				if !opened.Equal(t1) {
					t.Errorf("opened_at = %v, want the new process's %v", opened, t1)
				}
				return
			}
			if !opened.Equal(t0) {
				t.Errorf("opened_at = %v, want the same process's %v", opened, t0)
			}
			if !tc.viaSetPrc {
				// AddFD to the same process keeps its record and its other fds.
				if got.Comm != "old" {
					t.Errorf("info = %+v, want the first record kept", got)
				}
				if want := map[int]map[int][]int32{100: {0: {3}, 1: {4}}}; !reflect.DeepEqual(table, want) {
					t.Errorf("FDTable = %v, want %v", table, want)
				}
			}
		})
	}
}

func TestReplaceAll(t *testing.T) {
	l := NewLedger(testGPUs(2), time.Hour)
	l.AddFD(pinfo(1, 1, "a"), 0, 3, t0)
	l.AddFD(pinfo(2, 2, "b"), 1, 3, t0)
	l.AddFD(pinfo(4, 4, "d"), 1, 3, t0)
	h := watch(l)
	v := l.Version()

	t1 := t0.Add(time.Minute)
	scan := []ProcFDs{
		{Info: pinfo(2, 2, "b"), FDs: map[int][]int32{1: {3}}},    // unchanged
		{Info: pinfo(3, 3, "c"), FDs: map[int][]int32{0: {5, 6}}}, // new
		{Info: pinfo(4, 4, "d"), FDs: map[int][]int32{}},          // closed everything
	}
	l.ReplaceAll(scan, t1)
	if got, want := l.FDTable(), map[int]map[int][]int32{2: {1: {3}}, 3: {0: {5, 6}}}; !reflect.DeepEqual(got, want) {
		t.Fatalf("FDTable = %v, want %v", got, want)
	}
	if l.Version() != v+1 || h.calls.Load() != 1 {
		t.Errorf("ReplaceAll: version %d → %d, hook calls %d; want exactly one change", v, l.Version(), h.calls.Load())
	}
	s := l.Snapshot(t1)
	if got := s.GPUs[1].Holders[0].OpenedAt; !got.Equal(t0) {
		t.Errorf("pid 2 opened_at = %v, want kept %v", got, t0)
	}
	if got := s.GPUs[0].Holders[0].OpenedAt; !got.Equal(t1) {
		t.Errorf("pid 3 opened_at = %v, want %v", got, t1)
	}

	l.ReplaceAll(scan, t1.Add(time.Second))
	if l.Version() != v+1 {
		t.Errorf("ReplaceAll with the same scan bumped version to %d", l.Version())
	}
	l.ReplaceAll(nil, t1)
	if got := l.FDTable(); len(got) != 0 {
		t.Errorf("FDTable after empty scan = %v", got)
	}
	if got := states(l.Snapshot(t1)); !slices.Equal(got, []State{Free, Free}) {
		t.Errorf("states = %v, want all free", got)
	}
	if l.Version() != v+2 || h.calls.Load() != 2 {
		t.Errorf("version %d, hook calls %d; want %d and 2", l.Version(), h.calls.Load(), v+2)
	}
}

func TestStates(t *testing.T) {
	const idle = 10 * time.Second
	l := NewLedger(testGPUs(2), idle)
	h := watch(l)

	if got := states(l.Snapshot(t0)); !slices.Equal(got, []State{Free, Free}) {
		t.Fatalf("new ledger states = %v, want all free", got)
	}
	l.AddFD(pinfo(100, 1, "a"), 0, 3, t0)
	calls := h.calls.Load()

	steps := []struct {
		name       string
		do         func()
		at         time.Time
		want       State
		changed    bool
		lastActive time.Time
	}{
		{"just opened", func() { l.Refresh(t0) }, t0, Busy, false, t0},
		{"within idle-after", func() { l.Refresh(t0.Add(idle - 1)) }, t0.Add(idle - 1), Busy, false, t0},
		{"idle at exactly idle-after", func() { l.Refresh(t0.Add(idle)) }, t0.Add(idle), Idle, true, t0},
		{"still idle later", func() { l.Refresh(t0.Add(time.Hour)) }, t0.Add(time.Hour), Idle, false, t0},
		{"older activity does not wake", func() { l.Activity(0, t0.Add(-time.Second)) }, t0.Add(time.Hour), Idle, false, t0},
		{"activity wakes", func() { l.Activity(0, t0.Add(time.Hour)) }, t0.Add(time.Hour), Busy, true, t0.Add(time.Hour)},
		{"same activity again", func() { l.Activity(0, t0.Add(time.Hour)) }, t0.Add(time.Hour), Busy, false, t0.Add(time.Hour)},
		{"idle again", func() { l.Refresh(t0.Add(time.Hour + idle)) }, t0.Add(time.Hour + idle), Idle, true, t0.Add(time.Hour)},
		{"a new open is activity", func() { l.AddFD(pinfo(100, 1, "a"), 0, 4, t0.Add(2*time.Hour)) }, t0.Add(2 * time.Hour), Busy, true, t0.Add(2 * time.Hour)},
		{"activity on unknown GPU", func() { l.Activity(7, t0.Add(3*time.Hour)) }, t0.Add(2 * time.Hour), Busy, false, t0.Add(2 * time.Hour)},
	}
	for _, st := range steps {
		before := h.calls.Load()
		st.do()
		s := l.Snapshot(st.at)
		if s.GPUs[0].State != st.want {
			t.Errorf("%s: state = %s, want %s", st.name, s.GPUs[0].State, st.want)
		}
		if !s.GPUs[0].LastActive.Equal(st.lastActive) {
			t.Errorf("%s: last active = %v, want %v", st.name, s.GPUs[0].LastActive, st.lastActive)
		}
		if s.GPUs[1].State != Free {
			t.Errorf("%s: GPU 1 state = %s, want free", st.name, s.GPUs[1].State)
		}
		// AddFD is always a change (an fd was added); others only when the state moved.
		if got := h.calls.Load() - before; (got == 1) != st.changed || got > 1 {
			t.Errorf("%s: hook calls = %d, want changed=%v", st.name, got, st.changed)
		}
	}
	if h.calls.Load() <= calls || int64(l.Version()) != h.calls.Load() {
		t.Errorf("version %d, hook calls %d: want equal", l.Version(), h.calls.Load())
	}

	// Activity on a free GPU is remembered but no state change.
	v := l.Version()
	at := t0.Add(2*time.Hour + time.Second) // GPU 0 still busy then
	l.Activity(1, at)
	if l.Version() != v {
		t.Errorf("activity on a free GPU bumped version")
	}
	if got := l.Snapshot(at).GPUs[1]; got.State != Free || !got.LastActive.Equal(at) {
		t.Errorf("GPU 1 = %s last active %v, want free, %v", got.State, got.LastActive, at)
	}
}

func TestSetProcessFirstSightIsActivity(t *testing.T) {
	l := NewLedger(testGPUs(1), 10*time.Second)
	l.SetProcess(ProcFDs{Info: pinfo(100, 1, "a"), FDs: map[int][]int32{0: {3}}}, t0)
	s := l.Snapshot(t0.Add(5 * time.Second))
	if s.GPUs[0].State != Busy || !s.GPUs[0].LastActive.Equal(t0) {
		t.Errorf("GPU 0 = %s last active %v, want busy since %v", s.GPUs[0].State, s.GPUs[0].LastActive, t0)
	}
	if got := l.Snapshot(t0.Add(10 * time.Second)).GPUs[0].State; got != Idle {
		t.Errorf("state after idle-after = %s, want idle", got)
	}
}

func TestSetIdleAfter(t *testing.T) {
	now := time.Now()
	l := NewLedger(testGPUs(1), 2*time.Hour)
	l.AddFD(pinfo(100, 1, "a"), 0, 3, now.Add(-time.Hour))
	l.Refresh(time.Now())
	if got := l.Snapshot(time.Now()).GPUs[0].State; got != Busy {
		t.Fatalf("state = %s, want busy (1h < 2h)", got)
	}
	h := watch(l)
	l.SetIdleAfter(30 * time.Minute)
	if got := l.Snapshot(time.Now()).GPUs[0].State; got != Idle {
		t.Errorf("state after SetIdleAfter(30m) = %s, want idle", got)
	}
	if h.calls.Load() != 1 {
		t.Errorf("hook calls = %d, want 1 (busy → idle)", h.calls.Load())
	}
	l.SetIdleAfter(3 * time.Hour)
	if got := l.Snapshot(time.Now()).GPUs[0].State; got != Busy {
		t.Errorf("state after SetIdleAfter(3h) = %s, want busy", got)
	}
	l.SetIdleAfter(4 * time.Hour)
	if h.calls.Load() != 2 {
		t.Errorf("hook calls = %d, want 2 (no change for 3h → 4h)", h.calls.Load())
	}
}

func TestSnapshotOrder(t *testing.T) {
	gpus := []GPU{{Index: 2, Device: "/dev/nvidia2"}, {Index: 0, Device: "/dev/nvidia0"}, {Index: 1, Device: "/dev/nvidia1", UUID: "GPU-1"}}
	l := NewLedger(gpus, time.Hour)
	for _, pid := range []int{300, 100, 200} {
		l.AddFD(pinfo(pid, uint64(pid), fmt.Sprint("p", pid)), 1, 9, t0)
		l.AddFD(pinfo(pid, uint64(pid), fmt.Sprint("p", pid)), 1, 4, t0)
	}
	l.AddFD(pinfo(50, 50, "p50"), 2, 3, t0)

	s := l.Snapshot(t0.Add(time.Second))
	if s.Version != l.Version() || !s.Taken.Equal(t0.Add(time.Second)) {
		t.Errorf("snapshot version %d taken %v, want %d %v", s.Version, s.Taken, l.Version(), t0.Add(time.Second))
	}
	var idx []int
	for _, g := range s.GPUs {
		idx = append(idx, g.Index)
	}
	if !slices.Equal(idx, []int{0, 1, 2}) {
		t.Fatalf("GPU order = %v, want [0 1 2]", idx)
	}
	if s.GPUs[1].UUID != "GPU-1" || s.GPUs[1].Device != "/dev/nvidia1" {
		t.Errorf("GPU 1 = %+v, identity lost", s.GPUs[1].GPU)
	}
	if len(s.GPUs[0].Holders) != 0 {
		t.Errorf("GPU 0 holders = %v, want none", s.GPUs[0].Holders)
	}
	var pids []int
	for _, h := range s.GPUs[1].Holders {
		pids = append(pids, h.PID)
		if !slices.Equal(h.FDs, []int32{4, 9}) {
			t.Errorf("pid %d fds = %v, want sorted [4 9]", h.PID, h.FDs)
		}
		if h.Comm != fmt.Sprint("p", h.PID) {
			t.Errorf("pid %d comm = %q", h.PID, h.Comm)
		}
	}
	if !slices.Equal(pids, []int{100, 200, 300}) {
		t.Errorf("holder order = %v, want [100 200 300]", pids)
	}
	if len(s.GPUs[2].Holders) != 1 || s.GPUs[2].Holders[0].PID != 50 {
		t.Errorf("GPU 2 holders = %+v, want pid 50", s.GPUs[2].Holders)
	}

	// The snapshot is a copy: later changes do not show in it.
	l.RemoveProcess(100)
	if len(s.GPUs[1].Holders) != 3 {
		t.Errorf("snapshot changed after the ledger did")
	}
	table := l.FDTable()
	table[200][1][0] = 99
	if got := l.FDTable()[200][1]; !slices.Equal(got, []int32{4, 9}) {
		t.Errorf("FDTable shares memory with the ledger: %v", got)
	}
	want := map[int]map[int][]int32{200: {1: {4, 9}}, 300: {1: {4, 9}}, 50: {2: {3}}}
	if got := l.FDTable(); !reflect.DeepEqual(got, want) {
		t.Errorf("FDTable = %v, want %v", got, want)
	}
}

// TestConcurrent is meant for -race: goroutines add and remove fds while
// others take snapshots, refresh and report activity.
func TestConcurrent(t *testing.T) {
	const workers, rounds = 8, 300
	l := NewLedger(testGPUs(4), 50*time.Millisecond)
	var hooks atomic.Int64
	l.OnChange(func() { hooks.Add(1) })

	stop := make(chan struct{})
	var readers sync.WaitGroup
	var bad atomic.Value
	readers.Add(2)
	go func() {
		defer readers.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			s := l.Snapshot(time.Now())
			for _, g := range s.GPUs {
				if (g.State == Free) != (len(g.Holders) == 0) {
					bad.Store(fmt.Sprintf("GPU %d state %s with %d holders", g.Index, g.State, len(g.Holders)))
				}
				if !slices.IsSortedFunc(g.Holders, func(a, b HolderView) int { return a.PID - b.PID }) {
					bad.Store(fmt.Sprintf("GPU %d holders not by pid", g.Index))
				}
				for _, h := range g.Holders {
					if len(h.FDs) == 0 {
						bad.Store(fmt.Sprintf("GPU %d pid %d holds no fd", g.Index, h.PID))
					}
				}
			}
			for pid, m := range l.FDTable() {
				if len(m) == 0 {
					bad.Store(fmt.Sprintf("pid %d in FDTable with no GPU", pid))
				}
			}
		}
	}()
	go func() {
		defer readers.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			l.Refresh(time.Now())
			l.Activity(i%4, time.Now())
			l.Has(1000 + i%workers)
			_ = l.Version()
		}
	}()

	var writers sync.WaitGroup
	for w := 0; w < workers; w++ {
		writers.Add(1)
		go func(pid int) {
			defer writers.Done()
			info := pinfo(pid, 1, "w")
			for r := 0; r < rounds; r++ {
				gpu := (pid + r) % 4
				fd := int32(3 + r%5)
				l.AddFD(info, gpu, fd, time.Now())
				if r%7 == 0 {
					l.SetProcess(ProcFDs{Info: info, FDs: map[int][]int32{gpu: {fd, fd + 10}}}, time.Now())
					l.RemoveFD(pid, gpu, fd+10)
				}
				l.RemoveFD(pid, gpu, fd)
			}
		}(1000 + w)
	}
	writers.Wait()
	close(stop)
	readers.Wait()

	if msg := bad.Load(); msg != nil {
		t.Fatal(msg)
	}
	if got := l.FDTable(); len(got) != 0 {
		t.Errorf("FDTable = %v, want empty: every fd added was removed", got)
	}
	l.Refresh(time.Now())
	if got := states(l.Snapshot(time.Now())); !slices.Equal(got, []State{Free, Free, Free, Free}) {
		t.Errorf("states = %v, want all free", got)
	}
	if got := hooks.Load(); got != int64(l.Version()) {
		t.Errorf("hook calls %d != version %d", got, l.Version())
	}
	if min := uint64(workers * rounds * 2); l.Version() < min {
		t.Errorf("version %d, want at least %d", l.Version(), min)
	}
}

// With NVML's samples as activity, a holder's first open starts its use,
// its later opens do not; samples naming it do, and are its last activity.
// Without them, every open is activity.
func TestComputeActivity(t *testing.T) {
	t0 := time.Now().Add(-10 * time.Minute)
	l := NewLedger([]GPU{{Index: 0}}, time.Minute)
	l.SetComputeActivity(true)
	p := ProcInfo{PID: 7, Priority: Low}
	l.AddFD(p, 0, 3, t0)
	l.AddFD(p, 0, 4, t0.Add(5*time.Minute)) // a second open, later
	s := l.Snapshot(t0.Add(7 * time.Minute))
	if s.GPUs[0].State != Idle || !s.GPUs[0].Holders[0].LastActive.Equal(t0) {
		t.Fatalf("after a second open: %s, holder last active %v; want idle since the first open", s.GPUs[0].State, s.GPUs[0].Holders[0].LastActive)
	}
	l.ActivityBy(0, t0.Add(6*time.Minute+30*time.Second), []uint32{7})
	s = l.Snapshot(t0.Add(7 * time.Minute))
	if s.GPUs[0].State != Busy || !s.GPUs[0].Holders[0].LastActive.Equal(t0.Add(6*time.Minute+30*time.Second)) {
		t.Fatalf("after a sample: %s, holder last active %v", s.GPUs[0].State, s.GPUs[0].Holders[0].LastActive)
	}
	l.SetComputeActivity(false)
	l.AddFD(p, 0, 5, t0.Add(9*time.Minute))
	if s = l.Snapshot(t0.Add(9*time.Minute + time.Second)); !s.GPUs[0].Holders[0].LastActive.Equal(t0.Add(9 * time.Minute)) {
		t.Errorf("without NVML an open is no activity: %v", s.GPUs[0].Holders[0].LastActive)
	}
}

// Memory changes below a MiB are no change (no state file rewrite); a
// holder's memory is known only while NVML lists it.
func TestSetMemory(t *testing.T) {
	l := NewLedger([]GPU{{Index: 0}}, time.Minute)
	l.AddFD(ProcInfo{PID: 7}, 0, 3, time.Now())
	v := l.Version()
	l.SetMemory(0, &Memory{Total: 16 << 30, Used: 1 << 30}, map[uint32]uint64{7: 1 << 30})
	if l.Version() == v {
		t.Fatal("first memory reading is no change")
	}
	v = l.Version()
	l.SetMemory(0, &Memory{Total: 16 << 30, Used: 1<<30 + 4096}, map[uint32]uint64{7: 1<<30 + 4096})
	if l.Version() != v {
		t.Error("a 4 KiB change rewrote the ledger")
	}
	l.SetMemory(0, &Memory{Total: 16 << 30, Used: 1 << 30}, nil)
	s := l.Snapshot(time.Now())
	if s.GPUs[0].Memory == nil || s.GPUs[0].Memory.Free() != 15<<30 || s.GPUs[0].Holders[0].Memory != nil {
		t.Errorf("memory %+v holder %v", s.GPUs[0].Memory, s.GPUs[0].Holders[0].Memory)
	}
}
