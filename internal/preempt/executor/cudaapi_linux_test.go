package executor

import (
	"testing"

	"github.com/gpud/gpud/internal/preempt"
)

func TestWantsCheckpointAPI(t *testing.T) {
	if WantsCheckpointAPI(preempt.ModeKill, "", nil) {
		t.Fatal("kill mode, no library, nothing to restore: the API is not loaded")
	}
	if !WantsCheckpointAPI(preempt.ModeCheckpoint, "", nil) {
		t.Fatal("checkpoint mode loads the API")
	}
	if !WantsCheckpointAPI(preempt.ModeKill, "/usr/lib/libcuda.so.1", nil) {
		t.Fatal("a named library is loaded")
	}
	// A previous gpud's checkpointed workload, never restored: whatever
	// this one's mode, it needs the API to restore it.
	left := []preempt.Record{{Action: preempt.ActionFreeze, Cgroup: "/cg/a", Victim: preempt.Party{PID: 10},
		Checkpointed: true, Result: "done; CUDA checkpointed [10]"}}
	if !WantsCheckpointAPI(preempt.ModeKill, "", left) {
		t.Fatal("a checkpointed workload left frozen does not load the API")
	}
}
