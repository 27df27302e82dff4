//go:build !cgo

package nvidia

import (
	"errors"
	"time"
)

// MinCheckpointDriver: see cudackpt.go.
const MinCheckpointDriver = 12080

// ErrNoCheckpoint: the driver has no CUDA checkpoint API (and a build
// without cgo cannot load libcuda).
var ErrNoCheckpoint = errors.New("nvidia: no CUDA checkpoint API (built without cgo)")

// CUDACheckpoint is unusable without cgo.
type CUDACheckpoint struct{ Driver int }

// OpenCUDACheckpoint always fails without cgo.
func OpenCUDACheckpoint(string) (*CUDACheckpoint, error) { return nil, ErrNoCheckpoint }

// State always fails without cgo.
func (*CUDACheckpoint) State(int) (string, error) { return "", ErrNoCheckpoint }

// Suspend always fails without cgo.
func (*CUDACheckpoint) Suspend(int, time.Duration) error { return ErrNoCheckpoint }

// Resume always fails without cgo.
func (*CUDACheckpoint) Resume(int) error { return ErrNoCheckpoint }
