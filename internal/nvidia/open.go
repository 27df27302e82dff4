package nvidia

import (
	"log/slog"

	"github.com/gpud/gpud/internal/occupancy"
)

// Open initializes lib and names gpus by UUID; it returns nil, having said
// why, when NVML is unavailable: activity is then GPU opens only.
func Open(lib Library, gpus []occupancy.GPU, log *slog.Logger) Library {
	if err := lib.Init(); err != nil {
		log.Warn("NVML unavailable: activity is GPU opens only; no memory, MIG or health", "error", err)
		return nil
	}
	info := lib.Info()
	log.Info("NVML loaded", "library", info.Library, "driver", info.DriverVersion)
	if unknown := lib.Annotate(gpus); len(unknown) > 0 {
		log.Warn("device nodes NVML does not know", "gpus", unknown)
	}
	return lib
}
