package gpumon

import (
	"context"
	"errors"
	"time"

	"github.com/gpud/gpud/internal/occupancy"
)

// NVML is what the monitor asks of NVML. internal/nvidia's NVML (over
// go-nvml, the only code that links cgo) is the real one; tests use a fake
// or load the NVML double through it.
type NVML interface {
	// Init loads the library and lists its devices. A device NVML cannot
	// reach (fallen off the bus) does not fail it: Missing lists it.
	Init() error
	// Annotate fills in the UUID and NVML's index of each GPU NVML knows by
	// its minor number and returns the indexes of those it does not know.
	Annotate(gpus []occupancy.GPU) (unknown []int)
	// Missing asks again each device Init could not reach, and returns
	// those still unreachable: NVML's index → why (wrapping ErrGPUIsLost
	// for a GPU fallen off the bus).
	Missing() map[int]error
	// SampleGPU reads the sources asked of one GPU (gpud's index).
	SampleGPU(gpu int, sources Source) Reading
	// WatchHealth reports health events until ctx ends (nil) or waiting
	// fails (an error; a GPU_IS_LOST of a known device is first reported
	// as a "lost" event).
	WatchHealth(ctx context.Context, report func(HealthEvent)) error
	Info() Info
	Shutdown()
}

// Source is one thing NVML is read for, per GPU; failing, it is retried
// with backoff while the others go on.
type Source uint8

// The sources of a sample.
const (
	SrcUtilization Source = 1 << iota // per-process utilization: activity from compute
	SrcMemory                         // the GPU's memory
	SrcProcesses                      // the processes' memory
	SrcMIG                            // MIG mode
	// SrcShares is per-process utilization as each process's share of the
	// GPU (Monitor.Utilization), sampled apart from the others, faster,
	// and only for the GPUs Monitor.ShareGPUs asks: it is not in
	// AllSources.
	SrcShares
	AllSources = SrcUtilization | SrcMemory | SrcProcesses | SrcMIG
)

// Sources in the order they are shown.
var Sources = []Source{SrcUtilization, SrcMemory, SrcProcesses, SrcMIG, SrcShares}

func (s Source) String() string {
	switch s {
	case SrcUtilization:
		return "utilization"
	case SrcMemory:
		return "memory"
	case SrcProcesses:
		return "processes"
	case SrcMIG:
		return "mig"
	case SrcShares:
		return "shares"
	}
	return "sources"
}

// ErrNotSupported: NVML answered NVML_ERROR_NOT_SUPPORTED (per-process
// utilization on a MIG-enabled GPU, for one).
var ErrNotSupported = errors.New("not supported by this GPU")

// ErrGPUIsLost: NVML answered NVML_ERROR_GPU_IS_LOST ("the target GPU has
// fallen off the bus or is otherwise inaccessible", XID 79).
var ErrGPUIsLost = errors.New("GPU is lost (fallen off the bus)")

// Memory is a GPU's memory in bytes, as NVML reports it.
type Memory struct {
	Total, Used uint64
}

// Reading is one GPU as NVML saw it at one sample.
type Reading struct {
	At   time.Time // the newest utilization sample with SM or memory use since the previous reading; zero if none
	PIDs []uint32  // the processes those samples name
	// Memory is nil when NVML could not say (a GPU that does not report
	// it, NVML_VALUE_NOT_AVAILABLE); ProcessMemory is each compute
	// process's use, by PID, without those whose use NVML does not know.
	Memory        *Memory
	ProcessMemory map[uint32]uint64
	// Shares is each process's SM utilization (percent), by PID, over
	// the samples since the previous reading of SrcShares (their mean
	// per sample period); a process that did not use the GPU has none.
	// SharesAt is the newest sample's time (zero when there was none:
	// nothing used the GPU).
	Shares   map[uint32]uint32
	SharesAt time.Time
	MIG      bool // MIG mode is enabled
	Lost     bool // the GPU answers NVML_ERROR_GPU_IS_LOST (fallen off the bus)
	// Failed are the sources asked that failed, and why.
	Failed map[Source]error
}

// HealthEvent is an NVML event that says something about a GPU's health.
type HealthEvent struct {
	GPU  int    // gpud's index
	Kind string // "xid", "double-bit-ecc", "single-bit-ecc", "lost"
	XID  uint64 // the XID, for Kind "xid"
	// Critical events make the GPU unhealthy: every XID but those that
	// report an application's own fault, double-bit ECC errors, a lost GPU.
	Critical bool
}

// Info says where NVML came from.
type Info struct {
	Library       string // the file loaded; "libnvidia-ml.so.1" when the dynamic loader searched for it
	DriverVersion string
}
