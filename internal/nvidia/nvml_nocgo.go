//go:build !cgo

package nvidia

import "github.com/gpud/gpud/internal/occupancy"

// New returns a library whose Init says NVML is unavailable: go-nvml needs
// cgo.
func New() Library { return noNVML{} }

type noNVML struct{}

func (noNVML) Init() error                       { return ErrNoCgo }
func (noNVML) Annotate([]occupancy.GPU) []int    { return nil }
func (noNVML) Sample() (map[int]Activity, error) { return nil, ErrNoCgo }
func (noNVML) Shutdown()                         {}
