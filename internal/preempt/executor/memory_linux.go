package executor

import (
	"fmt"

	"github.com/gpud/gpud/internal/preempt"
)

// memoryModes turns the freezes of one decision into CUDA checkpoints or
// kills when they would keep the GPU memory the preemptor needs. A frozen
// workload keeps its device memory; the preemptor is taken to need as much
// as the freeze-mode victims hold on the GPU (what a kill would free; its
// own need is not known when it opens). So they are frozen only when the
// GPU's free memory (NVML) is at least that; else CUDA-checkpointed (which
// moves their device memory to host memory) where the CUDA checkpoint API
// is loaded, else killed. Memory NVML does not report changes nothing. Each
// victim changed carries the reason into its records (Victim.Why).
func (e *Executor) memoryModes(gpu int, victims []preempt.Victim) []preempt.Victim {
	if e.GPUMemory == nil {
		return victims
	}
	var pids []int
	for _, v := range victims {
		if e.mode(v) == preempt.ModeFreeze {
			pids = append(pids, v.PID)
		}
	}
	if len(pids) == 0 {
		return victims
	}
	free, held, ok := e.GPUMemory(gpu, pids)
	if !ok || held <= free {
		return victims
	}
	to := preempt.ModeCheckpoint
	why := fmt.Sprintf("a freeze would keep %d MiB of GPU %d's memory with %d MiB free: CUDA-checkpointed instead (frees it)", held>>20, gpu, free>>20)
	if e.CUDA == nil {
		to = preempt.ModeKill
		why = fmt.Sprintf("a freeze would keep %d MiB of GPU %d's memory with %d MiB free, and there is no CUDA checkpoint API: killed instead", held>>20, gpu, free>>20)
	}
	out := make([]preempt.Victim, len(victims))
	for i, v := range victims {
		if e.mode(v) == preempt.ModeFreeze {
			v.Mode, v.Why = to, why
		}
		out[i] = v
	}
	e.log().Info("not frozen: the preemptor needs the memory a freeze keeps", "gpu", gpu, "free_mib", free>>20,
		"victims_mib", held>>20, "instead", to)
	return out
}
