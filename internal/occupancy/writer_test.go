package occupancy

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	v1 "github.com/gpud/gpud/api/v1"
)

// startWriter runs w until the test ends and waits for Run to return.
func startWriter(t *testing.T, w *Writer) (cancel func()) {
	t.Helper()
	ctx, cancelCtx := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		w.Run(ctx)
	}()
	var once sync.Once
	cancel = func() {
		once.Do(func() {
			cancelCtx()
			select {
			case <-done:
			case <-time.After(2 * time.Second):
				t.Error("Run did not return after cancel")
			}
		})
	}
	t.Cleanup(cancel)
	return cancel
}

func waitClosed(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(2 * time.Second):
		t.Fatalf("%s: not written within 2s", what)
	}
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// waitFile waits until path exists and parses.
func waitFile(t *testing.T, path string) *v1.StateFile {
	t.Helper()
	deadline := time.Now().Add(2 * time.Second)
	for {
		f, err := ReadStateFile(path)
		if err == nil {
			return f
		}
		if time.Now().After(deadline) {
			t.Fatalf("state file: %v", err)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestWriterWritesChanges(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.json")
	l := NewLedger(testGPUs(2), time.Hour)
	var monitoring atomic.Bool
	monitoring.Store(true)
	w := &Writer{Path: path, Node: "node-a", Ledger: l, Monitoring: monitoring.Load}
	l.OnChange(w.Kick)
	startWriter(t, w)

	f := waitFile(t, path)
	if f.Node != "node-a" || !f.Monitoring || len(f.GPUs) != 2 || f.GPUs[0].State != Free || f.GPUs[1].State != Free {
		t.Fatalf("initial file = %+v", f)
	}

	l.AddFD(pinfo(100, 1, "train"), 1, 3, time.Now())
	v := l.Version()
	future := w.Written(v + 1)
	waitClosed(t, w.Written(v), "AddFD")
	f, err := ReadStateFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if f.GPUs[1].State != Busy || len(f.GPUs[1].Holders) != 1 || f.GPUs[1].Holders[0].PID != 100 || f.GPUs[1].Holders[0].Comm != "train" {
		t.Errorf("after AddFD: GPU 1 = %+v", f.GPUs[1])
	}
	if isClosed(future) {
		t.Error("Written(v+1) closed before version v+1 existed")
	}
	// An already-written version is closed at once.
	if !isClosed(w.Written(v)) {
		t.Error("Written of an already written version not closed")
	}

	monitoring.Store(false)
	l.RemoveProcess(100)
	waitClosed(t, future, "RemoveProcess")
	f, err = ReadStateFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if f.GPUs[1].State != Free || len(f.GPUs[1].Holders) != 0 || f.Monitoring {
		t.Errorf("after RemoveProcess: %+v", f)
	}
}

func TestWriterFinalWriteOnCancel(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.json")
	l := NewLedger(testGPUs(1), time.Hour)
	w := &Writer{Path: path, Node: "n", Ledger: l,
		Preemptions: func() []v1.RawPreemption { return []v1.RawPreemption{v1.RawPreemption(`{"pid":7}`)} }}
	// No change hook: only the initial and the final write happen.
	cancel := startWriter(t, w)
	waitFile(t, path)
	l.AddFD(pinfo(100, 1, "a"), 0, 3, time.Now())
	ch := w.Written(l.Version())
	cancel()
	if !isClosed(ch) {
		t.Fatal("the final write did not happen")
	}
	f, err := ReadStateFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if f.GPUs[0].State != Busy || len(f.GPUs[0].Holders) != 1 {
		t.Errorf("final file GPU 0 = %+v, want busy, pid 100", f.GPUs[0])
	}
	var pre bytes.Buffer
	if len(f.Preemptions) != 1 || json.Compact(&pre, f.Preemptions[0]) != nil || pre.String() != `{"pid":7}` {
		t.Errorf("final file preemptions = %q", f.Preemptions)
	}
}

// TestWriterCoalesces holds a write in progress while 10 000 changes
// happen: they must all end up in one more write.
func TestWriterCoalesces(t *testing.T) {
	const changes = 10000
	path := filepath.Join(t.TempDir(), "state.json")
	l := NewLedger(testGPUs(2), time.Hour)
	var writes atomic.Int64
	gate := make(chan struct{})
	w := &Writer{Path: path, Ledger: l, Preemptions: func() []v1.RawPreemption {
		n := writes.Add(1)
		if n == 2 {
			<-gate // the write of the first change blocks here
		}
		return nil
	}}
	l.OnChange(w.Kick)
	startWriter(t, w)
	var release sync.Once
	t.Cleanup(func() { release.Do(func() { close(gate) }) }) // runs before the writer's cleanup
	waitFile(t, path)

	info := pinfo(100, 1, "a")
	l.AddFD(info, 0, 3, time.Now()) // write #2 starts and blocks
	deadline := time.Now().Add(2 * time.Second)
	for writes.Load() < 2 {
		if time.Now().After(deadline) {
			t.Fatal("write #2 did not start")
		}
		time.Sleep(time.Millisecond)
	}
	for i := 0; i < changes; i++ {
		fd := int32(4 + (i/2)%50) // added, then removed by the next change
		if i%2 == 0 {
			l.AddFD(info, 1, fd, time.Now())
		} else {
			l.RemoveFD(100, 1, fd)
		}
	}
	l.AddFD(pinfo(200, 1, "last"), 1, 9, time.Now())
	last := l.Version()
	if last < changes {
		t.Fatalf("version %d after %d changes", last, changes)
	}
	release.Do(func() { close(gate) })
	waitClosed(t, w.Written(last), "last change")
	// Writes: the initial one, the blocked one, one for everything since.
	time.Sleep(20 * time.Millisecond) // a stray extra write would show now
	if got := writes.Load(); got != 3 {
		t.Errorf("%d writes for %d changes, want 3", got, changes)
	}
	f, err := ReadStateFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if h := f.GPUs[1].Holders; len(h) != 1 || h[0].PID != 200 || h[0].Comm != "last" {
		t.Errorf("final GPU 1 holders = %+v, want pid 200 alone", h)
	}
	if h := f.GPUs[0].Holders; len(h) != 1 || h[0].PID != 100 || h[0].FDs != 1 {
		t.Errorf("final GPU 0 holders = %+v, want pid 100 with one fd", h)
	}
}

// TestWriterCoalescesFreeRunning makes changes as fast as possible with the
// writer unhindered: far fewer writes than changes, and the file ends equal
// to the ledger.
func TestWriterCoalescesFreeRunning(t *testing.T) {
	const changes = 10000
	path := filepath.Join(t.TempDir(), "state.json")
	l := NewLedger(testGPUs(4), time.Hour)
	var writes atomic.Int64
	w := &Writer{Path: path, Node: "n", Ledger: l, Preemptions: func() []v1.RawPreemption { writes.Add(1); return nil }}
	l.OnChange(w.Kick)
	startWriter(t, w)

	for i := 0; i < changes; i++ {
		pid := 100 + i%7
		gpu := i % 4
		fd := int32(3 + i%11)
		if i%3 == 2 {
			l.RemoveProcess(pid)
		} else {
			l.AddFD(pinfo(pid, 1, "p"), gpu, fd, time.Now())
		}
	}
	last := l.Version()
	waitClosed(t, w.Written(last), "last change")
	if got := writes.Load(); got > int64(last)/2 {
		t.Errorf("%d writes for %d changes: not coalesced", got, last)
	}
	t.Logf("%d writes for %d changes", writes.Load(), last)

	f, err := ReadStateFile(path)
	if err != nil {
		t.Fatal(err)
	}
	want := Render(l.Snapshot(time.Now()), "n", true)
	for i := range want.GPUs {
		g, wg := f.GPUs[i], want.GPUs[i]
		if g.State != wg.State || len(g.Holders) != len(wg.Holders) {
			t.Fatalf("GPU %d = %s %d holders, ledger %s %d holders", i, g.State, len(g.Holders), wg.State, len(wg.Holders))
		}
		for j := range g.Holders {
			if g.Holders[j].PID != wg.Holders[j].PID || g.Holders[j].FDs != wg.Holders[j].FDs {
				t.Errorf("GPU %d holder %d = %+v, ledger %+v", i, j, g.Holders[j], wg.Holders[j])
			}
		}
	}
}

func TestWriterWriteError(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	var mu sync.Mutex
	l := NewLedger(testGPUs(1), time.Hour)
	w := &Writer{
		Path: filepath.Join(file, "state.json"), Ledger: l,
		Log: slog.New(slog.NewTextHandler(&lockedWriter{w: &logs, mu: &mu}, nil)),
	}
	l.OnChange(w.Kick)
	cancel := startWriter(t, w)
	l.AddFD(pinfo(100, 1, "a"), 0, 3, time.Now())
	ch := w.Written(l.Version())
	cancel()
	if isClosed(ch) {
		t.Error("Written closed although no write succeeded")
	}
	mu.Lock()
	defer mu.Unlock()
	if !strings.Contains(logs.String(), "writing state file") {
		t.Errorf("no error logged; log = %q", logs.String())
	}
}

type lockedWriter struct {
	w  *bytes.Buffer
	mu *sync.Mutex
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// TestWriterSyncsApart: a change is on disk (visible) without waiting for
// an fsync, and the fsyncs (syncFile) are made apart, at most one per
// syncEvery however many writes, the last write among them.
func TestWriterSyncsApart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.json")
	l := NewLedger(testGPUs(1), time.Hour)
	var syncs atomic.Int64
	block := make(chan struct{})
	w := &Writer{Path: path, Node: "n", Ledger: l}
	w.sync = func(p string) error {
		if p != path {
			t.Errorf("synced %s, want %s", p, path)
		}
		if syncs.Add(1) == 1 {
			<-block // the first sync hangs (a slow disk)
		}
		return nil
	}
	l.OnChange(w.Kick)
	cancel := startWriter(t, w)
	var release sync.Once
	t.Cleanup(func() { release.Do(func() { close(block) }) })
	waitFile(t, path)
	for i := 0; i < 20; i++ {
		l.AddFD(pinfo(100+i, 1, "a"), 0, 3, time.Now())
		waitClosed(t, w.Written(l.Version()), "a change while the disk hangs in fsync")
	}
	if f, err := ReadStateFile(path); err != nil || len(f.GPUs[0].Holders) != 20 {
		t.Fatalf("state file while the fsync hangs: %v, %v", f, err)
	}
	release.Do(func() { close(block) })
	// The writes since the hung sync are made durable once, syncEvery later.
	deadline := time.Now().Add(syncEvery + 2*time.Second)
	for syncs.Load() < 2 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := syncs.Load(); n != 2 {
		t.Fatalf("%d syncs for 21 writes over about %v, want 2", n, syncEvery)
	}
	cancel() // the final write: durable itself
}
