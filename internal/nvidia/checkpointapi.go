package nvidia

import (
	"log/slog"
	"time"
)

// CheckpointAPI loads the CUDA checkpoint API when it is wanted (checkpoint
// mode, or a library named), and says at start-up what preemptions get:
// where the driver has no checkpoint API, checkpoint-mode preemptions take
// the fallback. nil when not wanted or not there.
func CheckpointAPI(want bool, load Load, fallback string, lockTimeout time.Duration, log *slog.Logger) *CUDACheckpoint {
	if !want {
		return nil
	}
	c, err := LoadCUDACheckpoint(load)
	if err != nil {
		log.Warn("no CUDA checkpoint API: --preempt-mode checkpoint uses its fallback", "fallback", fallback, "error", err)
		return nil
	}
	log.Info("CUDA checkpoint API loaded", "driver_api_version", c.Driver, "lock_timeout", lockTimeout)
	return c
}
