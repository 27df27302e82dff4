// Package nvidia knows the NVIDIA driver: it finds the GPU device nodes
// (/dev/nvidiaN) and reads NVML (UUIDs, per-process utilization and memory,
// MIG mode, XID and ECC events). It is the only package that links cgo
// (go-nvml loads libnvidia-ml.so.1 with dlopen); built with CGO_ENABLED=0,
// New returns a library that says NVML is unavailable, and gpud runs on GPU
// opens alone.
package nvidia

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/gpud/gpud/internal/occupancy"
)

// ErrNVML wraps a failing NVML call.
var ErrNVML = errors.New("nvidia: nvml")

// ErrNoCgo is Init's error in a gpud built without cgo.
var ErrNoCgo = errors.New("nvidia: nvml: this gpud was built without cgo")

// Memory is a GPU's memory in bytes, as NVML reports it.
type Memory struct {
	Total, Used uint64
}

// Reading is one GPU as NVML saw it at one sample.
type Reading struct {
	At   time.Time // the newest utilization sample with SM or memory use since the previous reading; zero if none
	PIDs []uint32  // the processes those samples name
	// Memory is nil when NVML could not say (a GPU that does not report
	// it); ProcessMemory is each compute process's use, by PID.
	Memory        *Memory
	ProcessMemory map[uint32]uint64
	MIG           bool // MIG mode is enabled
	Lost          bool // the GPU answers NVML_ERROR_GPU_IS_LOST (fallen off the bus)
}

// HealthEvent is an NVML event that says something about a GPU's health.
type HealthEvent struct {
	GPU  int    // gpud's index
	Kind string // "xid", "double-bit-ecc", "single-bit-ecc"
	XID  uint64 // the XID, for Kind "xid"
	// Critical events make the GPU unhealthy: every XID but those that
	// report an application's own fault (ApplicationXIDs), and double-bit
	// ECC errors.
	Critical bool
}

// ApplicationXIDs are XIDs that report a fault of the application on the
// GPU, not of the GPU (NVIDIA's device plugin skips the same ones): 13
// graphics engine exception, 31 memory page fault, 43 stopped channel, 45
// preemptive cleanup, 68 video processor exception, 109 context switch
// timeout.
var ApplicationXIDs = []uint64{13, 31, 43, 45, 68, 109}

// Critical reports whether an XID makes a GPU unhealthy.
func CriticalXID(xid uint64) bool { return !slices.Contains(ApplicationXIDs, xid) }

// Info says where NVML came from.
type Info struct {
	Library       string // the file loaded; "libnvidia-ml.so.1" when the dynamic loader searched for it
	DriverVersion string
}

// Library is what gpud asks of NVML. *NVML is the real one (over go-nvml;
// tests load it from the NVML double, or use go-nvml's mock).
type Library interface {
	// Init loads the library and lists its devices.
	Init() error
	// Annotate fills in the UUID and NVML's index of each GPU NVML knows by
	// its minor number and returns the indexes of those it does not know.
	Annotate(gpus []occupancy.GPU) (unknown []int)
	// Sample reads every known GPU, keyed by gpud's index.
	Sample() (map[int]Reading, error)
	// WatchHealth reports health events until ctx ends; an error when the
	// driver offers no events.
	WatchHealth(ctx context.Context, report func(HealthEvent)) error
	Info() Info
	Shutdown()
}

// CUDA process states (cuCheckpointProcessGetState), in every build: a
// gpud without cgo has no checkpoint API but names the states.
const (
	CUDARunning      = "running"
	CUDALocked       = "locked"
	CUDACheckpointed = "checkpointed"
	CUDAFailed       = "failed"
)
