// Package nvidia knows the NVIDIA driver: it finds the GPU device nodes
// (/dev/nvidiaN) and reads NVML (UUIDs, per-process utilization and memory,
// MIG mode, XID and ECC events). It is the only package that links cgo
// (go-nvml loads libnvidia-ml.so.1 with dlopen); built with CGO_ENABLED=0,
// New returns a library that says NVML is unavailable, and gpud runs on GPU
// opens alone.
package nvidia

import (
	"errors"
	"slices"

	"github.com/gpud/gpud/internal/nvidia/gpumon"
)

// ErrNVML wraps a failing NVML call.
var ErrNVML = errors.New("nvidia: nvml")

// ErrNoCgo is Init's error in a gpud built without cgo.
var ErrNoCgo = errors.New("nvidia: nvml: this gpud was built without cgo")

// The data NVML answers with, and Library, are gpumon's: the monitor
// asks, this package answers (gpumon links no cgo).
type (
	Memory      = gpumon.Memory
	Reading     = gpumon.Reading
	HealthEvent = gpumon.HealthEvent
	Info        = gpumon.Info
	// Library is what gpud asks of NVML. *NVML is the real one (over
	// go-nvml; tests load it from the NVML double, or use go-nvml's mock).
	Library = gpumon.NVML
)

// ApplicationXIDs are XIDs that report a fault of the application on the
// GPU, not of the GPU (NVIDIA's device plugin skips the same ones): 13
// graphics engine exception, 31 memory page fault, 43 stopped channel, 45
// preemptive cleanup, 68 video processor exception, 109 context switch
// timeout.
var ApplicationXIDs = []uint64{13, 31, 43, 45, 68, 109}

// Critical reports whether an XID makes a GPU unhealthy.
func CriticalXID(xid uint64) bool { return !slices.Contains(ApplicationXIDs, xid) }

// CUDA process states (cuCheckpointProcessGetState), in every build: a
// gpud without cgo has no checkpoint API but names the states.
const (
	CUDARunning      = "running"
	CUDALocked       = "locked"
	CUDACheckpointed = "checkpointed"
	CUDAFailed       = "failed"
)
