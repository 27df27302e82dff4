package daemon

// ComputeOps is the compute scheduler's freezes and thaws so far
// (BenchmarkComputeShare); 0 without one.
func (d *Daemon) ComputeOps() uint64 {
	if d.compute == nil {
		return 0
	}
	return d.compute.Ops()
}
