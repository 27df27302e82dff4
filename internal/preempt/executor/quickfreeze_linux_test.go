package executor

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gpud/gpud/internal/cgroups"
	"github.com/gpud/gpud/internal/preempt"
	"github.com/gpud/gpud/internal/preempt/journal"
	"github.com/gpud/gpud/internal/testutil"
)

// A freeze that completes at once is seen frozen on the action's own
// thread: the "frozen" step comes before the worker goroutine's, and the
// record's decision → frozen is that moment, not the worker's start (which
// a busy node delays). The worker is held until PreemptNow has returned,
// so a frozen time taken by the worker would be later than that return.
// The victim's tasks are stopped (SIGSTOP) before the freeze: a stopped
// task counts as frozen, so the freeze completes within the write however
// busy the CPUs are, and the test depends on no scheduling.
func TestFreezeSeenFrozenBeforeTheWorker(t *testing.T) {
	j, _, err := journal.OpenJournal(filepath.Join(t.TempDir(), "preemptions.jsonl"), 50)
	if err != nil {
		t.Fatal(err)
	}
	v, _ := counterVictim(t, preempt.ModeFreeze)
	stopAlone(t, v.PID)

	var (
		mu    sync.Mutex
		steps []string
	)
	release := make(chan struct{})
	released := sync.OnceFunc(func() { close(release) })
	t.Cleanup(released) // a failed test does not leave the worker blocked
	preempt.SetHooks(&preempt.Hooks{Step: func(step string, _ uint64) {
		mu.Lock()
		steps = append(steps, step)
		mu.Unlock()
		if step == "worker" {
			<-release
		}
	}})
	defer preempt.SetHooks(nil)
	e := &Executor{ProcRoot: "/proc", Journal: j, Mode: preempt.ModeFreeze}
	decided := time.Now()
	e.PreemptNow(context.Background(), 0, "test rule", preempt.Party{PID: 1}, nil, []preempt.Victim{v}, decided)
	returned := time.Now()
	mu.Lock()
	before := slices.Clone(steps)
	mu.Unlock()
	released()
	e.Wait()
	defer e.ThawAll("test over")

	frozen, worker := slices.Index(before, "frozen"), slices.Index(before, "worker")
	if frozen < 0 || (worker >= 0 && worker < frozen) {
		t.Errorf("steps when PreemptNow returned: %v, want \"frozen\" (seen on the action's thread) before any \"worker\"", before)
	}
	fr := actions(j, preempt.ActionFreeze)
	if len(fr) != 1 || fr[0].Result != "done" {
		t.Fatalf("freeze records: %+v", fr)
	}
	got := time.Duration(fr[0].LatencyMS * float64(time.Millisecond))
	if limit := returned.Sub(decided); got <= 0 || got > limit {
		t.Errorf("decision → frozen recorded as %v, PreemptNow returned %v after the decision: the frozen time was taken after the action, by the worker", got, limit)
	}
}

// stopAlone stops pid (SIGSTOP) and waits until it is stopped and alone in
// its cgroup (the counter's short-lived children gone), and lets it go on
// when the test ends.
func stopAlone(t *testing.T, pid int) {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		t.Fatal(err)
	}
	var rel string
	for _, line := range strings.Split(string(b), "\n") {
		if r, ok := strings.CutPrefix(line, "0::"); ok {
			rel = r
		}
	}
	root, _, err := cgroups.V2Root()
	if err != nil || rel == "" {
		t.Fatalf("the victim's cgroup v2: %q, %v", rel, err)
	}
	procs := filepath.Join(root, rel, "cgroup.procs")
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Kill(pid, syscall.SIGCONT) })
	testutil.Eventually(t, 10*time.Second, "the victim stopped, alone in its cgroup", func() bool {
		st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return false
		}
		// State is the field after the command's closing parenthesis.
		_, after, ok := strings.Cut(string(st), ") ")
		b, err := os.ReadFile(procs)
		return ok && strings.HasPrefix(after, "T") && err == nil && strings.TrimSpace(string(b)) == fmt.Sprint(pid)
	})
}
