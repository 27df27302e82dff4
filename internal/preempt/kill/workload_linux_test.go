package kill

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/gpud/gpud/internal/cgroups"
	"github.com/gpud/gpud/internal/occupancy"
	"github.com/gpud/gpud/internal/preempt"
	"github.com/gpud/gpud/internal/testutil"
)

func mkCgroup(t *testing.T, dir string) uint64 {
	t.Helper()
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for i := 0; i < 100 && os.Remove(dir) != nil; i++ {
			time.Sleep(20 * time.Millisecond) // members still exiting
		}
	})
	id, err := cgroups.ID(dir)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func moveTo(t *testing.T, dir string, pid int) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0o644); err != nil {
		t.Fatal(err)
	}
}

// A victim is in its workload while it stays in the cgroup it was judged in
// or below; moved anywhere else it is not, and Kill refuses it.
func TestInWorkload(t *testing.T) {
	testutil.RequireRoot(t)
	root, _, err := cgroups.V2Root()
	if err != nil {
		testutil.Skip(t, "no cgroup v2 hierarchy: "+err.Error())
	}
	base := filepath.Join(root, fmt.Sprintf("gpud-preempt-test-%d", os.Getpid()))
	a := base + "-a"
	aID := mkCgroup(t, a)
	b := base + "-b"
	mkCgroup(t, b)
	// Made after a's cleanup is registered, so removed before it.
	sub := filepath.Join(a, "sub")
	mkCgroup(t, sub)

	cmd, info := startSleep(t, "exec sleep 600")
	moveTo(t, a, cmd.Process.Pid)
	info.CgroupID = aID
	v := preempt.Victim{ProcInfo: info}
	check := InWorkload("/proc", v)
	if err := check(info.PID); err != nil {
		t.Fatalf("in the cgroup it was judged in: %v", err)
	}
	moveTo(t, sub, info.PID)
	if err := check(info.PID); err != nil {
		t.Fatalf("moved below it: %v", err)
	}
	moveTo(t, b, info.PID)
	if err := check(info.PID); !errors.Is(err, ErrMovedOut) {
		t.Fatalf("moved to another cgroup: %v, want ErrMovedOut", err)
	}
	if _, err := Kill("/proc", info, 0, check); !errors.Is(err, ErrNotSameProcess) || !errors.Is(err, ErrMovedOut) {
		t.Fatalf("Kill of a moved victim: %v", err)
	}
	if !processAlive(info.PID) {
		t.Fatal("a moved victim was signalled")
	}
	// Without a cgroup id: the container named by /proc/<pid>/cgroup.
	if err := InWorkload("/proc", preempt.Victim{ProcInfo: occupancy.ProcInfo{PID: info.PID, ContainerID: "c0ffee"}})(info.PID); !errors.Is(err, ErrMovedOut) {
		t.Fatalf("not in the container it was judged in: %v", err)
	}
	if err := InWorkload("/proc", preempt.Victim{ProcInfo: occupancy.ProcInfo{PID: info.PID}})(info.PID); !errors.Is(err, ErrMovedOut) {
		t.Fatalf("nothing to tell the workload by: %v, want a refusal", err)
	}
	moveTo(t, root, info.PID) // let the test cgroups go
}

func processAlive(pid int) bool {
	_, err := os.Stat(fmt.Sprintf("/proc/%d", pid))
	return err == nil
}
