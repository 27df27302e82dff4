//go:build !cgo

package nvidia

import (
	"context"

	"github.com/gpud/gpud/internal/nvidia/gpumon"
	"github.com/gpud/gpud/internal/occupancy"
)

// New returns a library whose Init says NVML is unavailable: go-nvml needs
// cgo.
func New(Load) Library { return noNVML{} }

type noNVML struct{}

func (noNVML) Init() error                                          { return ErrNoCgo }
func (noNVML) Annotate([]occupancy.GPU) []int                       { return nil }
func (noNVML) Missing() map[int]error                               { return nil }
func (noNVML) SampleGPU(int, gpumon.Source) Reading                 { return Reading{} }
func (noNVML) WatchHealth(context.Context, func(HealthEvent)) error { return ErrNoCgo }
func (noNVML) Info() Info                                           { return Info{} }
func (noNVML) Shutdown()                                            {}
