// Package nvidia knows the NVIDIA driver: it finds the GPU device nodes
// (/dev/nvidiaN) and reads NVML (UUIDs, per-process utilization). It is the
// only package that links cgo (go-nvml loads libnvidia-ml.so.1 with dlopen);
// built with CGO_ENABLED=0, New returns a library that says NVML is
// unavailable, and gpud runs on GPU opens alone.
package nvidia

import (
	"errors"
	"time"

	"github.com/gpud/gpud/internal/occupancy"
)

// ErrNVML wraps a failing NVML call.
var ErrNVML = errors.New("nvidia: nvml")

// ErrNoCgo is Init's error in a gpud built without cgo.
var ErrNoCgo = errors.New("nvidia: nvml: this gpud was built without cgo")

// Activity is a GPU's use since the previous sample.
type Activity struct {
	At   time.Time // the newest sample with SM or memory use
	PIDs []uint32  // the processes that used it
}

// Library is what gpud asks of NVML. *NVML is the real one (over go-nvml,
// or go-nvml's mock in tests).
type Library interface {
	// Init loads the library and lists its devices.
	Init() error
	// Annotate fills in the UUID and NVML's index of each GPU NVML knows by
	// its minor number and returns the indexes of those it does not know.
	Annotate(gpus []occupancy.GPU) (unknown []int)
	// Sample reports per GPU index the newest use since the previous call.
	Sample() (map[int]Activity, error)
	Shutdown()
}
