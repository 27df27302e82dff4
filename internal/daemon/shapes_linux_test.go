package daemon_test

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpud/gpud/internal/occupancy"
	"github.com/gpud/gpud/internal/preempt"
	"github.com/gpud/gpud/internal/testutil"
	"github.com/gpud/gpud/internal/workload"
)

// anyThreadAlive reports whether some thread of pid is still running (a
// process whose leader exited reads as a zombie in /proc/<pid>/stat).
func anyThreadAlive(pid int) bool {
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return false
	}
	for _, e := range ents {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/stat", pid, e.Name()))
		if err != nil {
			continue
		}
		s := string(b)
		if f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:]); len(f) > 0 && f[0] != "Z" {
			return true
		}
	}
	return false
}

// Process shapes: a low-priority holder whose GPU fd is kept by a thread
// other than its leader (the leader exited with exit(2) and is a zombie
// without an fd table) stays in the ledger across the safety-net resync,
// and a high-priority open kills it with a kill record. Before, the resync
// dropped it: the kill still happened (the gate's counts), with no record.
// (A thread with an unshared fd table: occupancy.TestGPUFDsUnsharedThreadTable.)
func TestThreadHolderKeptAndKillRecorded(t *testing.T) {
	{
		const name = "leader-exited"
		t.Run(name, func(t *testing.T) {
			e := sourcelessEnv(t)
			e.start()
			ldir, lid := testutil.Cgroup(t, "low-"+name)
			hdir, hid := testutil.Cgroup(t, "high-"+name)
			e.d.Registry().Put(workload.Workload{CgroupID: lid, Priority: occupancy.Low, TaskID: "shape-low"})
			e.d.Registry().Put(workload.Workload{CgroupID: hid, Priority: occupancy.High, TaskID: "shape-high"})
			low := testutil.StartThreadHolder(t, e.gpus[0].Path, false, func(pid int) { testutil.JoinCgroup(t, ldir, pid) })
			pid, fd := low.PID(), int32(low.FD)
			testutil.Eventually(t, 10*time.Second, "the holder in the ledger, classified low", func() bool {
				for _, h := range e.d.Ledger().Holders(0) {
					if h.PID == pid {
						return h.Priority == occupancy.Low
					}
				}
				return false
			})
			// The safety net every --resync-interval runs.
			for i := 0; i < 2; i++ {
				if err := e.d.Tracker().Resync(); err != nil {
					t.Fatal(err)
				}
				if got := e.d.Ledger().FDTable()[pid][0]; !slices.Equal(got, []int32{fd}) {
					t.Fatalf("after resync %d the ledger has %v for pid %d on GPU 0, want [%d]: the holder was dropped", i+1, got, pid, fd)
				}
			}
			hi := startHelper(t)
			testutil.JoinCgroup(t, hdir, hi.pid())
			hi.do("open %s", e.gpus[0].Path)
			testutil.Eventually(t, 10*time.Second, "the low holder is dead", func() bool { return !anyThreadAlive(pid) })
			var kills []preempt.Record
			testutil.Eventually(t, 10*time.Second, "a kill record for it", func() bool {
				kills = records(e, preempt.ActionKill)
				return len(kills) > 0
			})
			if len(kills) != 1 || kills[0].Victim.PID != pid || kills[0].Result != "done" || kills[0].Victim.TaskID != "shape-low" {
				t.Fatalf("kill records: %+v, want one for pid %d, done", kills, pid)
			}
		})
	}
}
