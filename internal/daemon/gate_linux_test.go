package daemon_test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/gpud/gpud/api/v1"

	"github.com/gpud/gpud/internal/occupancy"
	"github.com/gpud/gpud/internal/preempt"
	"github.com/gpud/gpud/internal/preempt/journal"
	"github.com/gpud/gpud/internal/testutil"
)

func requireDocker(t *testing.T) {
	t.Helper()
	if out, err := exec.Command("docker", "info", "--format", "{{.ServerVersion}}").CombinedOutput(); err != nil {
		testutil.Skip(t, fmt.Sprintf("no Docker engine (make test starts one): %v %s", err, out))
	}
}

// enforcingEnv is an env whose daemon enforces the rules with Docker labels.
func enforcingEnv(t *testing.T, reclaim string) *env {
	requireDocker(t)
	e := newEnv(t)
	e.cfg.Enforce = true
	e.cfg.FailOpenAfter = 30 * time.Second
	e.cfg.Reclaim = reclaim
	e.cfg.ReservationTTL = 30 * time.Second
	e.cfg.CheckpointRoot = filepath.Join(e.dir, "checkpoints")
	e.cfg.DefaultPriority = occupancy.Unmanaged
	return e
}

// ctr is a running test container that maps the fake GPUs in as /dev/nvidia0 and /dev/nvidia1.
type ctr struct {
	t  *testing.T
	e  *env
	id string
}

// runContainer starts a labelled test container with the fake GPUs; it
// does not wait for gpud to classify it.
func runContainer(t *testing.T, e *env, name string, labels ...string) *ctr {
	t.Helper()
	args := []string{"run", "-d", "--network", "none", "--name", name + "-" + fmt.Sprint(time.Now().UnixNano()%1e9),
		"--device", e.gpus[0].Path + ":/dev/nvidia0", "--device", e.gpus[1].Path + ":/dev/nvidia1"}
	for _, l := range labels {
		args = append(args, "--label", l)
	}
	// Trap TERM so that a stop does not wait out a grace period.
	args = append(args, "gpud-test-busybox:latest", "sh", "-c", "trap 'exit 0' TERM; sleep 600 & wait")
	out, err := exec.Command("docker", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("docker run: %v %s", err, out)
	}
	c := &ctr{t: t, e: e, id: strings.TrimSpace(string(out))}
	t.Cleanup(func() { exec.Command("docker", "rm", "-f", c.id).Run() })
	return c
}

func (e *env) container(name string, labels ...string) *ctr {
	e.t.Helper()
	c := runContainer(e.t, e, name, labels...)
	// Classified (and its cgroup known to the gate) before any open.
	deadline := time.Now().Add(5 * time.Second)
	for {
		if w, ok := e.d.Registry().Lookup(occupancy.ProcInfo{ContainerID: c.id}); ok && w.CgroupID != 0 {
			break
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("container %s never classified", name)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return c
}

// hold starts a process in the container that holds /dev/nvidiaN, and
// returns its host PID once it holds it.
func (c *ctr) hold(gpu int) int {
	c.t.Helper()
	marker := fmt.Sprintf("/tmp/held%d", gpu)
	cmd := fmt.Sprintf("exec 3<>/dev/nvidia%d && touch %s && exec sleep 600", gpu, marker)
	if out, err := exec.Command("docker", "exec", "-d", c.id, "sh", "-c", cmd).CombinedOutput(); err != nil {
		c.t.Fatalf("docker exec: %v %s", err, out)
	}
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if exec.Command("docker", "exec", c.id, "test", "-e", marker).Run() == nil {
			for _, pid := range c.pids() {
				if fds, _ := c.e.truth.GPUFDs(pid); len(fds[gpu]) > 0 {
					return pid
				}
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	c.t.Fatalf("container %s: no process holds GPU %d", c.id[:12], gpu)
	return 0
}

// tryOpen opens /dev/nvidiaN inside the container and returns the shell's verdict.
func (c *ctr) tryOpen(gpu int) string {
	c.t.Helper()
	out, _ := exec.Command("docker", "exec", c.id, "sh", "-c",
		fmt.Sprintf("exec 3<>/dev/nvidia%d && echo opened", gpu)).CombinedOutput()
	return strings.TrimSpace(string(out))
}

func (c *ctr) pids() []int {
	out, err := exec.Command("docker", "top", c.id, "-o", "pid").Output()
	if err != nil {
		return nil
	}
	var pids []int
	for _, l := range strings.Split(string(out), "\n")[1:] {
		var p int
		if _, err := fmt.Sscan(l, &p); err == nil {
			pids = append(pids, p)
		}
	}
	return pids
}

func (c *ctr) running() bool {
	out, err := exec.Command("docker", "inspect", "-f", "{{.State.Running}}", c.id).Output()
	return err == nil && strings.TrimSpace(string(out)) == "true"
}

func records(e *env, action string) []preempt.Record {
	var out []preempt.Record
	for _, r := range e.d.Journal().Recent() {
		// A kill's intent (pending) is journaled before the signal; tests
		// read outcomes.
		if r.Action == action && r.Result != preempt.ResultPending {
			out = append(out, r)
		}
	}
	return out
}

// Row "nobody | any", then row "low | high": the low holder is killed and
// its container stopped; the high open succeeds.
func TestGateLowHeldHighOpens(t *testing.T) {
	e := enforcingEnv(t, preempt.ReclaimStop)
	e.start()
	low := e.container("low", "gpud.io/priority=low")
	lowPID := low.hold(0) // free GPU: allowed
	high := e.container("high", "gpud.io/priority=high")
	if got := high.tryOpen(0); got != "opened" {
		t.Fatalf("high open on a low-held GPU: %q", got)
	}
	testutil.Eventually(t, 10*time.Second, "the low holder is dead", func() bool { return !testutil.Alive(lowPID) })
	testutil.Eventually(t, 10*time.Second, "the low container is stopped", func() bool { return !low.running() })
	if !high.running() {
		t.Fatal("the high container was stopped")
	}
	testutil.Eventually(t, 10*time.Second, "a kill record", func() bool { return len(records(e, preempt.ActionKill)) > 0 })
	r := records(e, preempt.ActionKill)[0]
	if r.Victim.PID != lowPID || r.Victim.ContainerID != low.id || r.Preemptor.ContainerID != high.id || r.GPU != 0 || r.Result != "done" {
		t.Errorf("kill record: %+v", r)
	}
	testutil.WaitStateFile(t, e.cfg.StateFile, 3*time.Second, func(f *v1.StateFile) bool {
		for _, raw := range f.Preemptions {
			var r preempt.Record
			if json.Unmarshal(raw, &r) == nil && r.Action == preempt.ActionKill && r.Victim.PID == lowPID {
				return true
			}
		}
		return false
	})
}

// Row "high | low": the low open fails with EPERM inside the container, and
// the low container is reclaimed.
func TestGateHighHeldLowDenied(t *testing.T) {
	e := enforcingEnv(t, preempt.ReclaimStop)
	e.start()
	high := e.container("high", "gpud.io/priority=high")
	highPID := high.hold(1)
	low := e.container("low", "gpud.io/priority=low")
	got := low.tryOpen(1)
	if !strings.Contains(got, "Operation not permitted") {
		t.Fatalf("low open on a high-held GPU: %q, want EPERM", got)
	}
	testutil.Eventually(t, 10*time.Second, "the refused low container is reclaimed", func() bool { return !low.running() })
	if !testutil.Alive(highPID) || !high.running() {
		t.Fatal("the high holder was harmed")
	}
	if d := records(e, preempt.ActionDeny); len(d) == 0 || d[0].Victim.ContainerID != low.id || d[0].GPU != 1 {
		t.Errorf("deny records: %+v", d)
	}
	// The other GPU is free: a low open there is fine.
	low2 := e.container("low2", "gpud.io/priority=low")
	if got := low2.tryOpen(0); got != "opened" {
		t.Fatalf("low open of a free GPU: %q", got)
	}
}

// Rows "high | high" and "low | low": sharing, nobody harmed.
func TestGateSameClassShares(t *testing.T) {
	e := enforcingEnv(t, preempt.ReclaimStop)
	e.start()
	h1, h2 := e.container("h1", "gpud.io/priority=high"), e.container("h2", "gpud.io/priority=high")
	p1, p2 := h1.hold(0), h2.hold(0)
	l1, l2 := e.container("l1", "gpud.io/priority=low"), e.container("l2", "gpud.io/priority=low")
	q1, q2 := l1.hold(1), l2.hold(1)
	time.Sleep(300 * time.Millisecond)
	for _, pid := range []int{p1, p2, q1, q2} {
		if !testutil.Alive(pid) {
			t.Fatalf("pid %d died while sharing with its own class", pid)
		}
	}
	e.settle("shared", all(holds(p1, 0, 3), holds(p2, 0, 3), holds(q1, 1, 3), holds(q2, 1, 3)))
	f := testutil.WaitStateFile(t, e.cfg.StateFile, 3*time.Second, func(f *v1.StateFile) bool {
		return len(f.GPUs[0].Holders) >= 2 && len(f.GPUs[1].Holders) >= 2
	})
	for _, g := range f.GPUs {
		for _, h := range g.Holders {
			want := occupancy.High
			if g.Index == 1 {
				want = occupancy.Low
			}
			if h.PID == p1 || h.PID == p2 || h.PID == q1 || h.PID == q2 {
				if h.Priority != want {
					t.Errorf("GPU %d holder %d priority %s, want %s", g.Index, h.PID, h.Priority, want)
				}
			}
		}
	}
	if n := len(records(e, preempt.ActionKill)) + len(records(e, preempt.ActionDeny)); n != 0 {
		t.Fatalf("%d preemption records for same-class sharing", n)
	}
}

// Unlabeled and malformed-label containers are unmanaged: never killed,
// never refused, never blocking; the malformed label is reported.
func TestGateUnmanagedNeverTouched(t *testing.T) {
	e := enforcingEnv(t, preempt.ReclaimStop)
	e.start()
	plain := e.container("plain")
	odd := e.container("odd", "gpud.io/priority=urgent")
	pp, po := plain.hold(0), odd.hold(0)
	high := e.container("high", "gpud.io/priority=high")
	if got := high.tryOpen(0); got != "opened" {
		t.Fatalf("high open: %q", got)
	}
	high.hold(1)
	if got := plain.tryOpen(1); got != "opened" {
		t.Fatalf("unlabeled open of a high-held GPU: %q", got)
	}
	time.Sleep(500 * time.Millisecond)
	if !testutil.Alive(pp) || !testutil.Alive(po) || !plain.running() || !odd.running() {
		t.Fatal("an unmanaged container was harmed")
	}
	if n := e.d.Registry().MalformedSeen.Load(); n != 1 {
		t.Errorf("malformed labels seen = %d, want 1", n)
	}
	if !strings.Contains(e.logs.String(), "malformed priority label") {
		t.Error("malformed label not logged")
	}
}

// Earliest request first: two refused low requests; when the high holder leaves, the GPU
// is reserved for the earliest, the later one is refused until the earliest
// has opened, then it is its turn.
func TestGateEarliestRequestFirst(t *testing.T) {
	e := enforcingEnv(t, preempt.ReclaimNone)
	e.start()
	high := e.container("high", "gpud.io/priority=high")
	hp := high.hold(0)
	first, second := e.container("first", "gpud.io/priority=low"), e.container("second", "gpud.io/priority=low")
	if got := first.tryOpen(0); !strings.Contains(got, "not permitted") {
		t.Fatalf("first low open: %q", got)
	}
	time.Sleep(20 * time.Millisecond)
	if got := second.tryOpen(0); !strings.Contains(got, "not permitted") {
		t.Fatalf("second low open: %q", got)
	}
	exec.Command("kill", "-9", fmt.Sprint(hp)).Run() // the high holder leaves
	testutil.Eventually(t, 10*time.Second, "GPU 0 reserved", func() bool { _, ok := e.d.Reservation(0); return ok })
	if got := second.tryOpen(0); !strings.Contains(got, "not permitted") {
		t.Fatalf("the later waiter got in before the earliest: %q", got)
	}
	if got := first.tryOpen(0); got != "opened" {
		t.Fatalf("the earliest waiter was refused its reservation: %q", got)
	}
	// Then the next waiter's turn.
	testutil.Eventually(t, 10*time.Second, "reserved for the second", func() bool {
		id, ok := e.d.Reservation(0)
		w, _ := e.d.Registry().Lookup(occupancy.ProcInfo{ContainerID: second.id})
		return ok && id == w.CgroupID
	})
	if got := second.tryOpen(0); got != "opened" {
		t.Fatalf("the second waiter's turn: %q", got)
	}
}

// Checkpoints: the notice is written before the kill into the task's checkpoint
// directory; the task opening a GPU again marks the record resumed.
func TestGateCheckpointAndResume(t *testing.T) {
	e := enforcingEnv(t, preempt.ReclaimStop)
	e.cfg.PreemptGrace = 300 * time.Millisecond
	e.start()
	low := e.container("train", "gpud.io/priority=low", "gpud.io/task-id=train-42")
	lp := low.hold(0)
	high := e.container("high", "gpud.io/priority=high")
	high.tryOpen(0)
	testutil.Eventually(t, 10*time.Second, "the low holder is dead", func() bool { return !testutil.Alive(lp) })
	b, err := os.ReadFile(filepath.Join(e.cfg.CheckpointRoot, journal.DockerScope, "train-42", journal.CheckpointFile)) // a Docker container: the Docker scope
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"gpu": 0`, `"signal": "SIGTERM"`, `"grace_seconds": 0.3`, `"task_id": "train-42"`, `"reason"`} {
		if !strings.Contains(string(b), want) {
			t.Errorf("notice lacks %s:\n%s", want, b)
		}
	}
	// The record is journaled once the kill is confirmed, just after the
	// holder is seen dead.
	var kills []preempt.Record
	testutil.Eventually(t, 10*time.Second, "the kill record", func() bool { kills = records(e, preempt.ActionKill); return len(kills) > 0 })
	if len(kills) != 1 || kills[0].Signal != "SIGTERM" && kills[0].Signal != "SIGKILL" || kills[0].Victim.TaskID != "train-42" {
		t.Fatalf("kill records: %+v", kills)
	}
	// The task comes back (a new container, same task id) on the free GPU.
	again := e.container("train-again", "gpud.io/priority=low", "gpud.io/task-id=train-42")
	again.hold(1)
	testutil.Eventually(t, 10*time.Second, "record marked resumed", func() bool {
		for _, r := range records(e, preempt.ActionKill) {
			if r.Victim.TaskID == "train-42" && r.ResumedAt != nil {
				return true
			}
		}
		return false
	})
}

// A restart of gpud kills nobody: holders of both classes on their GPUs stay.
func TestGateRestartKillsNobody(t *testing.T) {
	e := enforcingEnv(t, preempt.ReclaimStop)
	e.start()
	low, high := e.container("low", "gpud.io/priority=low"), e.container("high", "gpud.io/priority=high")
	lp, hp := low.hold(0), high.hold(1)
	for i := 0; i < 3; i++ {
		e.restart()
		e.settle("after restart", all(holds(lp, 0, 3), holds(hp, 1, 3)))
	}
	time.Sleep(300 * time.Millisecond)
	if !testutil.Alive(lp) || !testutil.Alive(hp) || !low.running() || !high.running() {
		t.Fatal("a restart harmed a holder")
	}
	if n := len(records(e, preempt.ActionKill)); n != 0 {
		t.Fatalf("%d kills across restarts", n)
	}
}

// Label values are matched exactly: " high", "high\n", "low " and the like
// are malformed, so their containers get --default-priority (unmanaged
// here). A whitespace-"high" container's open of a low-held GPU kills
// nobody; a whitespace-"low" container's open of a high-held GPU is
// allowed and reclaims nothing. Each malformed container is counted and
// logged once. Before, the values were trimmed: the " high" container
// killed the low holder.
func TestGateLabelWhitespaceIsMalformed(t *testing.T) {
	e := enforcingEnv(t, preempt.ReclaimStop)
	e.start()
	low := e.container("low", "gpud.io/priority=low")
	lp := low.hold(0)
	high := e.container("high", "gpud.io/priority=high")
	hp := high.hold(1)
	odd := []*ctr{
		e.container("sp-high", "gpud.io/priority= high"),
		e.container("nl-high", "gpud.io/priority=high\n"),
		e.container("tab-high", "gpud.io/priority=\thigh"),
		e.container("sp-low", "gpud.io/priority=low "),
		e.container("crlf-low", "gpud.io/priority=low\r\n"),
	}
	for _, c := range odd {
		if got := c.tryOpen(0); got != "opened" {
			t.Errorf("container %s: open of the low-held GPU: %q", c.id[:12], got)
		}
		if got := c.tryOpen(1); got != "opened" {
			t.Errorf("container %s: open of the high-held GPU: %q (refused as low)", c.id[:12], got)
		}
		// Again: still one count and one log line per container.
		c.tryOpen(0)
		w, ok := e.d.Registry().Lookup(occupancy.ProcInfo{ContainerID: c.id})
		if !ok || w.Priority != occupancy.Unmanaged {
			t.Errorf("container %s classified %q, want the default (unmanaged)", c.id[:12], w.Priority)
		}
	}
	time.Sleep(500 * time.Millisecond) // a kill or reclaim would be under way by now
	if !testutil.Alive(lp) || !low.running() || !testutil.Alive(hp) || !high.running() {
		t.Fatal("a holder was harmed by a container with a malformed label")
	}
	for _, c := range odd {
		if !c.running() {
			t.Errorf("container %s was reclaimed", c.id[:12])
		}
	}
	if n := len(records(e, preempt.ActionKill)) + len(records(e, preempt.ActionDeny)); n != 0 {
		t.Fatalf("%d preemption records, want none: %+v", n, e.d.Journal().Recent())
	}
	if n := e.d.Registry().MalformedSeen.Load(); n != uint64(len(odd)) {
		t.Errorf("malformed labels counted %d, want %d (one per container)", n, len(odd))
	}
	if n := strings.Count(e.logs.String(), "malformed priority label"); n != len(odd) {
		t.Errorf("malformed label logged %d times, want %d (once per container)", n, len(odd))
	}
}
