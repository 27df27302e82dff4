package nvidia

import (
	"context"
	"log/slog"
	"time"

	"github.com/gpud/gpud/internal/occupancy"
)

// RediscoverEvery is how often gpud looks at the device directory for a
// changed GPU set: a directory read, nothing per process.
const RediscoverEvery = 5 * time.Second

// WatchGPUSet watches the device directory (WatchNodes, every interval:
// RediscoverEvery in gpud) and reports true when gpud must start again on a new
// GPU set: the GPU nodes are no longer gpus (warned, with the managed
// count before), or restart reports that NVML's view changed (which it
// says itself); false when ctx ends first.
func WatchGPUSet(ctx context.Context, devDir string, gpus []occupancy.GPU, managed int, interval time.Duration, restart func() bool, log *slog.Logger) bool {
	now, ok := WatchNodes(ctx, devDir, gpus, interval, restart)
	if ok && !restart() {
		log.Warn("the GPU device nodes changed: starting again on the new set", "gpus_before", managed, "gpus_now", len(now))
	}
	return ok
}
