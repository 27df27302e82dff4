package executor

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/gpud/gpud/internal/preempt"
)

// Checkpointer is the CUDA checkpoint driver API (*nvidia.CUDACheckpoint):
// Suspend locks a process's CUDA work (bounded by timeout) and moves its
// device memory to host memory, releasing the GPU; Resume restores and
// unlocks it.
type Checkpointer interface {
	Suspend(pid int, timeout time.Duration) error
	Resume(pid int) error
}

// DefaultCheckpointTimeout bounds a CUDA lock (--checkpoint-timeout 0).
const DefaultCheckpointTimeout = 10 * time.Second

func (e *Executor) checkpointTimeout() time.Duration {
	if e.CheckpointTimeout > 0 {
		return e.CheckpointTimeout
	}
	return DefaultCheckpointTimeout
}

// checkpointFallback is what a checkpoint-mode victim gets when its
// checkpoint cannot be done: ModeFreeze (the default) or ModeKill.
func (e *Executor) checkpointFallback() preempt.Mode {
	if e.CheckpointFallback == preempt.ModeKill {
		return preempt.ModeKill
	}
	return preempt.ModeFreeze
}

// checkpointGroup checkpoints the CUDA state of a workload's checkpoint-
// mode victims, one process at a time (the driver's API takes one). It
// returns the PIDs checkpointed, and kill when a checkpoint failed and the
// fallback is kill (those checkpointed are restored first). With the
// fallback freeze a victim whose checkpoint failed is frozen as it is.
func (e *Executor) checkpointGroup(victims []preempt.Victim) (done []int, kill bool, note string) {
	var want []preempt.Victim
	for _, v := range victims {
		if e.mode(v) == preempt.ModeCheckpoint {
			want = append(want, v)
		}
	}
	if len(want) == 0 {
		return nil, false, ""
	}
	fallback := e.checkpointFallback()
	if slices.ContainsFunc(want, func(v preempt.Victim) bool { return v.Why != "" }) {
		// Checkpointed because a freeze would keep the memory the
		// preemptor needs (memoryModes): a freeze is no fallback.
		fallback = preempt.ModeKill
	}
	if e.CUDA == nil {
		return nil, fallback == preempt.ModeKill, "no CUDA checkpoint API on this node: " + string(fallback)
	}
	var errs []error
	for _, v := range want {
		if err := e.CUDA.Suspend(v.PID, e.checkpointTimeout()); err != nil {
			errs = append(errs, fmt.Errorf("pid %d: %w", v.PID, err))
			e.log().Warn("CUDA checkpoint failed", "victim_pid", v.PID, "fallback", fallback, "error", err)
			continue
		}
		done = append(done, v.PID)
	}
	if len(errs) == 0 {
		return done, false, fmt.Sprintf("CUDA checkpointed %v", done)
	}
	if fallback == preempt.ModeKill {
		e.restore(done)
		return nil, true, fmt.Sprintf("CUDA checkpoint failed (%v): kill", errors.Join(errs...))
	}
	return done, false, fmt.Sprintf("CUDA checkpointed %v; failed (%v): frozen as it is", done, errors.Join(errs...))
}

// restore restores and unlocks checkpointed processes; it returns what
// failed ("" when nothing did).
func (e *Executor) restore(pids []int) string {
	if len(pids) == 0 {
		return ""
	}
	if e.CUDA == nil {
		e.log().Error("cannot restore CUDA-checkpointed processes: no CUDA checkpoint API on this node", "pids", pids)
		return fmt.Sprintf("CUDA restore impossible (no CUDA checkpoint API): %v stay checkpointed", pids)
	}
	var errs []error
	for _, pid := range pids {
		if err := e.CUDA.Resume(pid); err != nil {
			errs = append(errs, fmt.Errorf("pid %d: %w", pid, err))
			e.log().Error("CUDA restore failed", "pid", pid, "error", err)
		}
	}
	if len(errs) == 0 {
		return ""
	}
	return "CUDA restore failed: " + errors.Join(errs...).Error()
}
