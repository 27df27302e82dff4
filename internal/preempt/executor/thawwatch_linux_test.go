package executor

import (
	"context"
	"os"
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

// A workload gpud froze, thawed by someone else (0 written to its
// cgroup.freeze, as `docker unpause` does) while its GPU is still held by
// high priority: frozen again, with a freeze record that says why; thawed
// again soon after: killed, recorded and reclaimed; each counted by what
// was done.
func TestExecutorThawedBySomeoneElse(t *testing.T) {
	j, _, err := journal.OpenJournal(filepath.Join(t.TempDir(), "preemptions.jsonl"), 50)
	if err != nil {
		t.Fatal(err)
	}
	rt := &fakeRuntime{}
	var mu sync.Mutex
	var did []string
	e := &Executor{ProcRoot: "/proc", Journal: j, Mode: preempt.ModeFreeze, Reclaimer: &Reclaimer{Runtime: rt, Mode: preempt.ReclaimStop},
		ThawedByOther: func(a string) { mu.Lock(); did = append(did, a); mu.Unlock() }}
	done := func() []string { mu.Lock(); defer mu.Unlock(); return slices.Clone(did) }
	v, file := counterVictim(t, "")
	fin := make(chan struct{})
	e.Preempt(context.Background(), 0, "test rule", preempt.Party{PID: 1}, []preempt.Victim{v}, time.Now(), fin)
	<-fin
	fr := actions(j, preempt.ActionFreeze)
	if len(fr) != 1 {
		t.Fatalf("freeze records: %+v", fr)
	}
	freeze := filepath.Join(fr[0].Cgroup, "cgroup.freeze")
	high := func(int) preempt.Holding { return preempt.Holding{High: true, Low: true} }
	thawBySomeoneElse := func() {
		t.Helper()
		if err := os.WriteFile(freeze, []byte("0"), 0); err != nil {
			t.Fatal(err)
		}
		at := testutil.Counted(file)
		testutil.Eventually(t, 5*time.Second, "it runs, thawed", func() bool { return testutil.Counted(file) > at })
	}

	thawBySomeoneElse()
	testutil.Eventually(t, 5*time.Second, "frozen again, recorded with why", func() bool {
		e.Resume(high)
		fr := actions(j, preempt.ActionFreeze)
		return len(fr) == 2 && fr[1].Result == "done" && strings.Contains(fr[1].Reason, "thawed by someone else") && fr[1].Victim.PID == v.PID
	})
	from, to := testutil.Counted(file), 0
	time.Sleep(300 * time.Millisecond)
	if to = testutil.Counted(file); to != from {
		t.Fatalf("counted %d → %d after it was frozen again", from, to)
	}
	if s := e.Suspensions(); len(s) != 1 || s[0].Paused {
		t.Fatalf("suspensions after the refreeze: %+v", s)
	}

	thawBySomeoneElse()
	testutil.Eventually(t, 5*time.Second, "killed, thawed again", func() bool {
		e.Resume(high)
		return !testutil.Alive(v.PID)
	})
	testutil.Eventually(t, 5*time.Second, "a kill record that says why", func() bool {
		k := actions(j, preempt.ActionKill)
		return len(k) == 1 && k[0].Victim.PID == v.PID && k[0].Result == "done" && strings.Contains(k[0].Rule, "thawed by someone else again")
	})
	testutil.Eventually(t, 5*time.Second, "reclaimed", func() bool { return rt.calls() == 1 })
	e.Wait()
	if len(e.Suspensions()) != 0 {
		t.Fatal("still listed as suspended")
	}
	if got := done(); !slices.Equal(got, []string{"refreeze", "kill"}) {
		t.Fatalf("counted %v, want [refreeze kill]", got)
	}
}
