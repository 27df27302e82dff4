package daemon_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpud/gpud/internal/preempt"
	"github.com/gpud/gpud/internal/testutil"
)

// Issue 13: low containers whose first instruction opens a GPU that a high
// container holds. Each container's class is known at its create event and
// its cgroup is classified as runc makes it, so the gate refuses the very
// first open: none of them may get a usable fd (none prints OPENED), and
// the high holder is untouched. Before classification at cgroup creation,
// such opens got in before gpud classified the container.
func TestGateFirstOpen(t *testing.T) {
	e := enforcingEnv(t, preempt.ReclaimNone)
	e.start()
	high := e.container("high", "gpud.io/priority=high")
	highPID := high.hold(1) // 10:229: not on Docker's default device allow-list

	n := testutil.Count(t, "GPUD_FIRST_OPEN_CONTAINERS", 200)
	const workers = 6
	var (
		mu                      sync.Mutex
		opened, refused, others int
		odd                     []string
	)
	jobs := make(chan int)
	var wg sync.WaitGroup
	start := time.Now()
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range jobs {
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
				name := fmt.Sprintf("gpud-firstopen-%d-%d", os.Getpid(), i)
				out, _ := exec.CommandContext(ctx, "docker", "run", "--rm", "--network", "none", "--name", name,
					"--label", "gpud.io/priority=low", "--device", e.gpus[1].Path+":/dev/nvidia1",
					"gpud-test-busybox:latest", "sh", "-c", "exec 3<>/dev/nvidia1 && echo OPENED").CombinedOutput()
				cancel()
				s := strings.TrimSpace(string(out))
				mu.Lock()
				switch {
				case strings.Contains(s, "OPENED"):
					opened++
					t.Logf("%s opened at %s; gpud's holder counts then: %+v", name, time.Now().Format("15:04:05.000000"), e.d.Ledger().Counts())
				case strings.Contains(s, "not permitted"):
					refused++
				default:
					others++
					if len(odd) < 5 {
						odd = append(odd, s)
					}
				}
				mu.Unlock()
			}
		}()
	}
	for i := 0; i < n; i++ {
		jobs <- i
	}
	close(jobs)
	wg.Wait()
	elapsed := time.Since(start)

	// Opens that got past the gate and were killed after the fact.
	afterTheFact := 0
	for _, r := range records(e, preempt.ActionKill) {
		if strings.Contains(r.Rule, "after the open") {
			afterTheFact++
		}
	}
	t.Logf("%d low containers (first instruction opens a high-held GPU) in %v: %d refused in the kernel, %d opened (%d killed after the fact), %d other",
		n, elapsed.Round(time.Millisecond), refused, opened, afterTheFact, others)
	if opened != 0 {
		t.Errorf("%d of %d low containers got a usable fd on a GPU high priority holds", opened, n)
		for _, r := range e.d.Journal().Recent() {
			t.Logf("record %+v", r)
		}
		t.Logf("gpud's log:\n%s", e.logs.String())
	}
	if others != 0 {
		t.Errorf("%d containers neither opened nor were refused, e.g. %q", others, odd)
	}
	if !testutil.Alive(highPID) || !high.running() {
		t.Error("the high holder was harmed")
	}
	if fds, _ := e.truth.GPUFDs(highPID); len(fds[1]) == 0 {
		t.Error("the high holder no longer holds GPU 1")
	}
}
