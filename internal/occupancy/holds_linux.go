package occupancy

// Holds reports whether process pid holds gpu now, read from /proc with
// the ledger's fds of it as the hint (ProcFS.HoldsGPU): the executor asks
// for every victim just before its signal.
func (t *Tracker) Holds(pid, gpu int) bool {
	return t.Proc.HoldsGPU(pid, gpu, t.Ledger.FDs(pid, gpu))
}
