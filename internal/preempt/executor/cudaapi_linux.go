package executor

import "github.com/gpud/gpud/internal/preempt"

// WantsCheckpointAPI reports whether gpud loads the CUDA checkpoint API:
// in checkpoint mode, when a library is named, and whatever the mode when
// the journal names workloads a previous gpud checkpointed and never
// restored (UnthawedCheckpoints).
func WantsCheckpointAPI(mode preempt.Mode, library string, recs []preempt.Record) bool {
	return mode == preempt.ModeCheckpoint || library != "" || UnthawedCheckpoints(recs)
}
