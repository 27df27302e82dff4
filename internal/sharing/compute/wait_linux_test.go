package compute

import (
	"context"
	"runtime"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The thread's wait sleeps its time, and stop ends it (and every later
// one) at once; a stop after close writes nowhere.
func TestThreadWaiter(t *testing.T) {
	w, err := newThreadWaiter()
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if !w.wait(30*time.Millisecond) || time.Since(start) < 30*time.Millisecond {
		t.Errorf("wait(30 ms): back after %v", time.Since(start))
	}
	go func() { time.Sleep(20 * time.Millisecond); w.stop() }()
	start = time.Now()
	if w.wait(time.Minute) {
		t.Error("a stopped wait slept its time")
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("stopped after %v", d)
	}
	if w.wait(time.Minute) {
		t.Error("a wait after stop slept")
	}
	w.close()
	w.stop()
}

// fakeThread records the threads Enter and Tick run on; Enter locks the
// goroutine to its thread as kill.EventThread does.
type fakeThread struct {
	mu            sync.Mutex
	entered, left int
	tid           int
	ticks         int
	elsewhere     int // ticks on another thread than Enter's
}

func (f *fakeThread) Enter() {
	runtime.LockOSThread()
	f.mu.Lock()
	defer f.mu.Unlock()
	f.entered++
	f.tid = unix.Gettid()
}

func (f *fakeThread) Tick(time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ticks++
	if unix.Gettid() != f.tid {
		f.elsewhere++
	}
}

func (f *fakeThread) Leave() {
	f.mu.Lock()
	f.left++
	f.mu.Unlock()
	runtime.UnlockOSThread()
}

// With a Thread, Run steps on the raised thread (each step's Tick on the
// thread Enter raised), waits there (its wait ends when ctx does) and
// leaves it once everything is thawed.
func TestControllerRunsOnItsThread(t *testing.T) {
	c, fz, _ := newTestController(t, 25, 75)
	th := &fakeThread{}
	c.cfg.Thread = th
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c.Run(ctx); close(done) }()
	time.Sleep(500 * time.Millisecond)
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not end with its context")
	}
	th.mu.Lock()
	defer th.mu.Unlock()
	if th.entered != 1 || th.left != 1 || th.ticks < 2 || th.elsewhere > 0 {
		t.Errorf("entered %d, left %d, %d ticks (%d on another thread); want 1, 1, at least 2, 0", th.entered, th.left, th.ticks, th.elsewhere)
	}
	if c.Ops() == 0 {
		t.Error("nothing frozen or thawed: no step ran")
	}
	for cg, f := range fz.frozen {
		if f {
			t.Errorf("%s frozen after Run", cg.Path)
		}
	}
}
