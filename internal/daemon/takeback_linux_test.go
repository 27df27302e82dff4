package daemon

import (
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/gpud/gpud/internal/cgroups"
	"github.com/gpud/gpud/internal/occupancy"
	"github.com/gpud/gpud/internal/preempt"
	"github.com/gpud/gpud/internal/testutil"
	"github.com/gpud/gpud/internal/workload"
)

// A loan's take-back preempts the holders classified low at that instant.
// A borrower whose class reached gpud only afterwards (its pod listed by
// PodResources, or seen by the informer, after the owner came back: CI
// caught it) must still lose the GPU: reclaimTakenBack preempts it, by its
// pod, whatever its class says yet, while the owner holds the GPU; the
// owner and a bystander holding the same GPU are untouched, and a second
// sweep records nothing twice.
func TestTakenBackGPUPreemptsLateClassifiedBorrower(t *testing.T) {
	testutil.RequireRoot(t)
	root, _, err := cgroups.V2Root()
	if err != nil {
		testutil.Skip(t, "no cgroup v2 hierarchy: "+err.Error())
	}
	base := filepath.Join(root, fmt.Sprintf("gpud-takeback-test-%d", os.Getpid()))
	proc := &occupancy.ProcFS{Root: "/proc"}
	start := func(name, podUID string, class occupancy.Priority) occupancy.ProcInfo {
		t.Helper()
		dir := base + "-" + name
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command("sleep", "600")
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan struct{})
		go func() { cmd.Wait(); close(exited) }()
		t.Cleanup(func() {
			cmd.Process.Kill()
			<-exited
			for i := 0; i < 100 && os.Remove(dir) != nil; i++ {
				time.Sleep(20 * time.Millisecond)
			}
		})
		if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(cmd.Process.Pid)), 0o644); err != nil {
			t.Fatal(err)
		}
		info, err := proc.Info(cmd.Process.Pid)
		if err != nil {
			t.Fatal(err)
		}
		if info.CgroupID, err = cgroups.ID(dir); err != nil {
			t.Fatal(err)
		}
		info.PodUID, info.Priority = podUID, class
		return info
	}
	owner := start("owner", "owner-uid", occupancy.High)
	// The borrower's class is not known yet: the default, not low.
	borrower := start("borrower", "borrower-uid", occupancy.Unmanaged)
	bystander := start("bystander", "other-uid", occupancy.Unmanaged)

	logs := &testutil.Buffer{}
	d := &Daemon{log: slog.New(slog.NewJSONHandler(logs, nil)),
		ledger:   occupancy.NewLedger([]occupancy.GPU{{Index: 0, Device: "/dev/nvidia0"}}, time.Minute),
		registry: &workload.Registry{Default: occupancy.Unmanaged}}
	now := time.Now()
	for _, h := range []occupancy.ProcInfo{owner, borrower, bystander} {
		d.ledger.AddFD(h, 0, 3, now)
	}
	j, _, err := preempt.OpenJournal(filepath.Join(t.TempDir(), "preemptions.jsonl"), 50)
	if err != nil {
		t.Fatal(err)
	}
	exec := &preempt.Executor{ProcRoot: "/proc", Journal: j, Log: d.log}
	d.enforcer = newEnforcer(d, d.registry, exec, time.Second)
	l := newLender(d, "gpud.io/idle-gpu", "nvidia.com/gpu", filepath.Join(t.TempDir(), "none.sock"), false)
	l.owners[0] = podRef{Namespace: "default", Name: "owner", UID: "owner-uid"}
	l.borrowers[0] = podRef{Namespace: "default", Name: "borrower", UID: "borrower-uid"}

	// Still lent: the sweep leaves the borrower alone.
	l.reclaimTakenBack()
	time.Sleep(100 * time.Millisecond)
	if !alive(borrower.PID) || len(j.Recent()) != 0 {
		t.Fatalf("a GPU still lent was taken from its borrower: alive %v, records %d", alive(borrower.PID), len(j.Recent()))
	}

	// Taken back, but the owner has let go of the GPU: nothing to end.
	l.takenBack[0] = true
	d.ledger.RemoveProcess(owner.PID)
	l.reclaimTakenBack()
	time.Sleep(100 * time.Millisecond)
	if !alive(borrower.PID) || len(j.Recent()) != 0 {
		t.Fatalf("the borrower was preempted with no owner holding the GPU: alive %v, records %d", alive(borrower.PID), len(j.Recent()))
	}

	d.ledger.AddFD(owner, 0, 3, time.Now())
	l.reclaimTakenBack()
	deadline := time.Now().Add(5 * time.Second)
	for alive(borrower.PID) {
		if time.Now().After(deadline) {
			t.Fatalf("the borrower still runs after the sweep; log:\n%s", logs.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
	exec.Wait()
	if !alive(owner.PID) || !alive(bystander.PID) {
		t.Fatalf("owner alive %v, bystander alive %v: only the borrower may die", alive(owner.PID), alive(bystander.PID))
	}
	recs := j.Recent()
	if len(recs) != 1 {
		t.Fatalf("%d records, want 1: %+v", len(recs), recs)
	}
	r := recs[0]
	if r.Action != preempt.ActionKill || r.Victim.PID != borrower.PID || r.Victim.PodUID != "borrower-uid" ||
		r.Preemptor.PID != owner.PID || r.Preemptor.PodUID != "owner-uid" || r.Result != "done" {
		t.Fatalf("record: %+v", r)
	}
	// The dead borrower is still in this ledger (no tracker here): a
	// second sweep must not kill or record it again.
	l.reclaimTakenBack()
	exec.Wait()
	if n := len(j.Recent()); n != 1 {
		t.Fatalf("%d records after a second sweep, want 1", n)
	}
}

func alive(pid int) bool {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return false
	}
	// A zombie (state Z) is dead for this purpose: its parent reaps later.
	s := string(b)
	for i := len(s) - 1; i >= 0; i-- {
		if s[i] == ')' {
			return i+2 < len(s) && s[i+2] != 'Z'
		}
	}
	return true
}
