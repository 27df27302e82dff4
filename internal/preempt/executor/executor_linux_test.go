package executor

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpud/gpud/internal/cgroups"
	"github.com/gpud/gpud/internal/occupancy"
	"github.com/gpud/gpud/internal/preempt"
	"github.com/gpud/gpud/internal/preempt/journal"
	"github.com/gpud/gpud/internal/testutil"
)

// ownCgroup returns the id of the cgroup pid is in (v2).
func ownCgroup(t *testing.T, pid int) uint64 {
	t.Helper()
	root, _, err := cgroups.V2Root()
	if err != nil {
		testutil.Skip(t, "no cgroup v2 hierarchy: "+err.Error())
	}
	info, err := cgroups.ReadProc(pid)
	if err != nil {
		t.Fatal(err)
	}
	id, err := cgroups.ID(filepath.Join(root, info.V2Path))
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// startSleep starts a process to preempt and returns it as the ledger
// would know it.
func startSleep(t *testing.T, script string) occupancy.ProcInfo {
	t.Helper()
	cmd := exec.Command("sh", "-c", script)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	st, err := occupancy.StartTime("/proc", cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	return occupancy.ProcInfo{PID: cmd.Process.Pid, StartTime: st, PidfdIno: occupancy.PidfdIno(cmd.Process.Pid)}
}

func preemptOne(t *testing.T, e *Executor, v preempt.Victim) preempt.Record {
	t.Helper()
	done := make(chan struct{})
	e.Preempt(context.Background(), 0, "test rule", preempt.Party{}, []preempt.Victim{v}, time.Now(), done)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the kill never finished")
	}
	e.Wait()
	for _, r := range e.Journal.Recent() {
		if r.Action == preempt.ActionKill && r.Victim.PID == v.PID && r.Result != preempt.ResultPending {
			return r
		}
	}
	t.Fatalf("no kill record for %d", v.PID)
	return preempt.Record{}
}

// The checkpoint notice never costs the kill two fsyncs: with a
// grace period the task reads it in its SIGTERM handler (visible before
// the signal); without one it is written after the kill. Either way it is
// on disk once the kill is recorded, and a victim that was not signalled
// (it moved out of its workload) gets none.
func TestCheckpointNoticeAroundTheKill(t *testing.T) {
	dir := t.TempDir()
	root := filepath.Join(dir, "checkpoints")
	j, _, err := journal.OpenJournal(filepath.Join(dir, "preemptions.jsonl"), 50)
	if err != nil {
		t.Fatal(err)
	}
	e := &Executor{ProcRoot: "/proc", CheckpointRoot: root, Journal: j}
	notice := func(task string) string {
		b, _ := os.ReadFile(filepath.Join(root, journal.DockerScope, task, journal.CheckpointFile)) // no pod: the Docker scope
		return string(b)
	}

	// With a grace period: the task's TERM handler copies the notice out.
	seen := filepath.Join(dir, "seen")
	e.SetGrace(5 * time.Second)
	script := `trap 'cat "$NOTICE" > "$SEEN"; exit 0' TERM; : > "$SEEN.ready"; while :; do sleep 0.01; done`
	cmd := exec.Command("sh", "-c", script)
	cmd.Env = append(os.Environ(), "NOTICE="+filepath.Join(root, journal.DockerScope, "task-1", journal.CheckpointFile), "SEEN="+seen)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		if _, err := os.Stat(seen + ".ready"); err == nil {
			break // the TERM handler is installed
		}
		if time.Now().After(deadline) {
			t.Fatal("the task never installed its TERM handler")
		}
	}
	st, err := occupancy.StartTime("/proc", cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	info := occupancy.ProcInfo{PID: cmd.Process.Pid, StartTime: st, CgroupID: ownCgroup(t, cmd.Process.Pid)}
	r := preemptOne(t, e, preempt.Victim{ProcInfo: info, TaskID: "task-1"})
	if r.Result != "done" || r.Signal != "SIGTERM" {
		t.Fatalf("record: %+v, want done by SIGTERM", r)
	}
	b, err := os.ReadFile(seen)
	if err != nil || !strings.Contains(string(b), `"task_id": "task-1"`) || !strings.Contains(string(b), `"signal": "SIGTERM"`) {
		t.Fatalf("what the task read in its grace period: %q, %v", b, err)
	}
	if n := notice("task-1"); !strings.Contains(n, `"record_id": "`+r.ID+`"`) {
		t.Fatalf("notice after the kill: %q", n)
	}

	// Without one: SIGKILL at once, the notice follows the kill.
	e.SetGrace(0)
	info = startSleep(t, "exec sleep 600")
	info.CgroupID = ownCgroup(t, info.PID)
	r = preemptOne(t, e, preempt.Victim{ProcInfo: info, TaskID: "task-2"})
	if r.Result != "done" || r.Signal != "SIGKILL" {
		t.Fatalf("record: %+v, want done by SIGKILL", r)
	}
	if n := notice("task-2"); !strings.Contains(n, `"signal": "SIGKILL"`) || !strings.Contains(n, `"grace_seconds": 0`) {
		t.Fatalf("notice after a kill without grace: %q", n)
	}

	// Not signalled (not in the cgroup it was judged in): no notice.
	info = startSleep(t, "exec sleep 600")
	info.CgroupID = 0xdead_beef_0000 // no ancestor of the process has this id
	r = preemptOne(t, e, preempt.Victim{ProcInfo: info, TaskID: "task-3"})
	if r.Result != "gone" || r.Signal != "" || !testutil.Alive(info.PID) {
		t.Fatalf("record of a moved victim: %+v (alive %v)", r, testutil.Alive(info.PID))
	}
	if _, err := os.Stat(filepath.Join(root, journal.DockerScope, "task-3")); !os.IsNotExist(err) {
		t.Fatalf("a victim never signalled got a notice: %v", err)
	}
}
