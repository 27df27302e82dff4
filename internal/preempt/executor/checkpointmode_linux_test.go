package executor

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpud/gpud/internal/preempt"
	"github.com/gpud/gpud/internal/preempt/journal"
	"github.com/gpud/gpud/internal/testutil"
)

// fakeCUDA is a Checkpointer that records its calls; fail makes Suspend
// fail for a PID.
type fakeCUDA struct {
	mu      sync.Mutex
	calls   []string
	fail    map[int]bool
	timeout time.Duration
}

func (f *fakeCUDA) Suspend(pid int, timeout time.Duration) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, "suspend")
	f.timeout = timeout
	if f.fail[pid] {
		return errors.New("CUresult 909")
	}
	return nil
}

func (f *fakeCUDA) Resume(int) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, "resume")
	return nil
}

func (f *fakeCUDA) got() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.calls)
}

// --preempt-mode checkpoint in the executor, against a test double of the
// CUDA API: the victim is checkpointed (with the lock's timeout) and then
// frozen; thawed, it is restored after the thaw. A failed checkpoint falls
// back to freeze (frozen as it is) or to kill, as configured; with no
// CUDA API on the node, the fallback too.
func TestExecutorCheckpointMode(t *testing.T) {
	newExec := func(t *testing.T, cuda Checkpointer, fallback preempt.Mode) (*Executor, *journal.Journal) {
		j, _, err := journal.OpenJournal(filepath.Join(t.TempDir(), "preemptions.jsonl"), 50)
		if err != nil {
			t.Fatal(err)
		}
		e := &Executor{ProcRoot: "/proc", Journal: j, Mode: preempt.ModeCheckpoint, CheckpointTimeout: 3 * time.Second, CheckpointFallback: fallback}
		if cuda != nil {
			e.CUDA = cuda
		}
		return e, j
	}
	preemptOneAsync := func(e *Executor, v preempt.Victim) {
		done := make(chan struct{})
		e.Preempt(context.Background(), 0, "test rule", preempt.Party{PID: 1}, []preempt.Victim{v}, time.Now(), done)
		<-done
	}
	t.Run("checkpointed then frozen, restored after the thaw", func(t *testing.T) {
		cuda := &fakeCUDA{}
		e, j := newExec(t, cuda, preempt.ModeFreeze)
		v, file := counterVictim(t, "")
		preemptOneAsync(e, v)
		fr := actions(j, preempt.ActionFreeze)
		if len(fr) != 1 || !strings.HasPrefix(fr[0].Result, "done; CUDA checkpointed") || !testutil.Alive(v.PID) {
			t.Fatalf("freeze records %+v", fr)
		}
		if c := cuda.got(); !slices.Equal(c, []string{"suspend"}) || cuda.timeout != 3*time.Second {
			t.Fatalf("CUDA calls %v (timeout %s), want one suspend bounded by 3s", c, cuda.timeout)
		}
		at := testutil.Counted(file)
		time.Sleep(100 * time.Millisecond)
		if testutil.Counted(file) != at {
			t.Fatal("counting while checkpointed and frozen")
		}
		if s := e.Suspensions(); len(s) != 1 || !slices.Equal(s[0].Checkpointed, []int{v.PID}) {
			t.Fatalf("suspensions %+v, want the victim shown checkpointed", s)
		}
		if len(Unthawed(j.Recent())) != 1 {
			t.Error("a checkpoint-mode freeze is not adoptable")
		}
		e.ThawAll("test")
		if c := cuda.got(); !slices.Equal(c, []string{"suspend", "resume"}) {
			t.Fatalf("CUDA calls %v, want suspend then resume", c)
		}
		testutil.Eventually(t, 5*time.Second, "counting on", func() bool { return testutil.Counted(file) > at })
		e.Wait()
	})
	t.Run("failed checkpoint, fallback freeze", func(t *testing.T) {
		v, file := counterVictim(t, "")
		cuda := &fakeCUDA{fail: map[int]bool{v.PID: true}}
		e, j := newExec(t, cuda, preempt.ModeFreeze)
		preemptOneAsync(e, v)
		fr := actions(j, preempt.ActionFreeze)
		if len(fr) != 1 || !strings.Contains(fr[0].Result, "frozen as it is") || !testutil.Alive(v.PID) {
			t.Fatalf("freeze records %+v", fr)
		}
		at := testutil.Counted(file)
		time.Sleep(100 * time.Millisecond)
		if testutil.Counted(file) != at {
			t.Fatal("not frozen")
		}
		e.ThawAll("test")
		if c := cuda.got(); !slices.Equal(c, []string{"suspend"}) {
			t.Fatalf("CUDA calls %v: nothing to restore", c)
		}
		e.Wait()
	})
	t.Run("failed checkpoint, fallback kill", func(t *testing.T) {
		v, _ := counterVictim(t, "")
		cuda := &fakeCUDA{fail: map[int]bool{v.PID: true}}
		e, j := newExec(t, cuda, preempt.ModeKill)
		preemptOneAsync(e, v)
		testutil.Eventually(t, 5*time.Second, "killed", func() bool { return !testutil.Alive(v.PID) })
		if fr := actions(j, preempt.ActionFreeze); len(fr) != 0 || len(actions(j, preempt.ActionKill)) == 0 {
			t.Fatalf("freeze records %+v, kills %+v", fr, actions(j, preempt.ActionKill))
		}
		e.Wait()
	})
	t.Run("no CUDA API: fallback freeze", func(t *testing.T) {
		e, j := newExec(t, nil, "")
		v, _ := counterVictim(t, "")
		preemptOneAsync(e, v)
		fr := actions(j, preempt.ActionFreeze)
		if len(fr) != 1 || !strings.Contains(fr[0].Result, "no CUDA checkpoint API") || !testutil.Alive(v.PID) {
			t.Fatalf("freeze records %+v", fr)
		}
		e.ThawAll("test")
		e.Wait()
	})
}
