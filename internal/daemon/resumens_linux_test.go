package daemon_test

import (
	"path/filepath"
	"testing"
	"time"

	v1 "github.com/gpud/gpud/api/v1"

	"github.com/gpud/gpud/internal/occupancy"
	"github.com/gpud/gpud/internal/preempt"
	"github.com/gpud/gpud/internal/testutil"
	"github.com/gpud/gpud/internal/workload"
)

// A preempted task is its namespace and its task id: a pod of namespace B
// labelled with the task id of A's preempted pod opening a GPU does not
// mark A's kill record resumed (which would hand A's checkpoint directory
// read-only to A's pod that resumes); A's next pod of the task does.
// Before, the journal looked the record up by task id alone: B's open
// marked it.
func TestGateResumeKeyedByNamespace(t *testing.T) {
	e := newEnv(t)
	e.cfg.Enforce, e.cfg.FailOpenAfter, e.cfg.DockerHost, e.cfg.Reclaim = true, 30*time.Second, "none", "none"
	e.cfg.CheckpointRoot = filepath.Join(e.dir, "checkpoints")
	e.start()
	reg := e.d.Registry()
	pod := func(name, uid, ns string, prio occupancy.Priority) *helper {
		dir, id := testutil.Cgroup(t, name)
		reg.Put(workload.Workload{PodUID: uid, Namespace: ns, Name: name, CgroupID: id, Priority: prio, TaskID: "train-42"})
		h := startHelper(t)
		testutil.JoinCgroup(t, dir, h.pid())
		return h
	}
	killOfA := func() (preempt.Record, bool) {
		for _, r := range records(e, preempt.ActionKill) {
			if r.Victim.Namespace == "team-a" && r.Victim.TaskID == "train-42" {
				return r, true
			}
		}
		return preempt.Record{}, false
	}

	a := pod("resume-a", "0a000000-0000-0000-0000-00000000000a", "team-a", occupancy.Low)
	a.do("open %s", e.gpus[0].Path)
	high, _ := classified(t, reg, "resume-high", occupancy.High, "resume-high")
	high.do("open %s", e.gpus[0].Path)
	testutil.Eventually(t, 10*time.Second, "team-a's kill record", func() bool { _, ok := killOfA(); return ok })

	b := pod("resume-b", "0b000000-0000-0000-0000-00000000000b", "team-b", occupancy.Low)
	b.do("open %s", e.gpus[1].Path)
	holds := func(pid int) func(*v1.StateFile) bool {
		return func(f *v1.StateFile) bool {
			if len(f.GPUs) < 2 {
				return false
			}
			for _, h := range f.GPUs[1].Holders {
				if h.PID == pid {
					return true
				}
			}
			return false
		}
	}
	testutil.WaitStateFile(t, e.cfg.StateFile, 5*time.Second, holds(b.pid()))
	time.Sleep(300 * time.Millisecond) // the open's hook has run by now
	if r, _ := killOfA(); r.ResumedAt != nil {
		t.Fatalf("team-b's pod with team-a's task id marked team-a's kill resumed: %+v", r)
	}

	a2 := pod("resume-a2", "0a000000-0000-0000-0000-0000000000a2", "team-a", occupancy.Low)
	a2.do("open %s", e.gpus[1].Path)
	testutil.Eventually(t, 10*time.Second, "team-a's kill record resumed by team-a's pod", func() bool {
		r, _ := killOfA()
		return r.ResumedAt != nil
	})
}
