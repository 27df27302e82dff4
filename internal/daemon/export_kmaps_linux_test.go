package daemon

import "github.com/gpud/gpud/bpf"

// KernelMonitor is the daemon's kernel side, for tests that fill its maps.
func (d *Daemon) KernelMonitor() *bpf.Monitor { return d.mon }
