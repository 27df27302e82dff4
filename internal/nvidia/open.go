package nvidia

import (
	"log/slog"

	"github.com/gpud/gpud/internal/occupancy"
)

// Open initializes lib (nil: the driver's, New) and names gpus by UUID; it
// returns nil, having said why, when NVML is unavailable: activity is then
// GPU opens only.
func Open(lib Library, gpus []occupancy.GPU, log *slog.Logger) Library {
	if lib == nil {
		lib = New()
	}
	if err := lib.Init(); err != nil {
		log.Warn("NVML unavailable: activity is GPU opens only", "error", err)
		return nil
	}
	if unknown := lib.Annotate(gpus); len(unknown) > 0 {
		log.Warn("device nodes NVML does not know", "gpus", unknown)
	}
	return lib
}
