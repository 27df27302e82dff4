package daemon

import "github.com/gpud/gpud/internal/sharing/compute"

// ComputeSnapshot is the compute scheduler's view, for tests.
func (d *Daemon) ComputeSnapshot() []compute.GPUStatus { return d.compute.Snapshot() }
