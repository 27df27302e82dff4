package daemon

import (
	"path/filepath"

	"github.com/gpud/gpud/internal/nvidia"
	"github.com/gpud/gpud/internal/nvidia/gpumon"
	"github.com/gpud/gpud/internal/occupancy"
)

// openNVML builds the NVML monitor (gpumon samples each GPU and watches
// health) and returns the GPUs gpud manages (a MIG GPU is left alone).
func (d *Daemon) openNVML(gpus []occupancy.GPU) []occupancy.GPU {
	d.nvmon = &gpumon.Monitor{Log: d.log, Sampling: d.monitoring.Load,
		Activity: func(gpu int, pids []uint32) {
			if d.lender != nil {
				d.lender.Activity(gpu, pids)
			}
		},
		Memory: func(gpu int, byPID map[uint32]uint64) {
			if d.lender != nil {
				d.lender.Memory(gpu, byPID)
			}
		},
		Unhealthy: func(int) {
			if d.dra != nil {
				d.dra.Changed()
			}
		},
		Changed: func() {
			if d.writer != nil {
				d.writer.Kick()
			}
		},
	}
	switch {
	case d.cfg.NVML != nil:
		d.nvmon.Lib = d.cfg.NVML
	case d.cfg.UseNVML:
		d.nvmon.Lib = nvidia.New(nvidia.Load{Library: d.cfg.NVMLLibrary, DriverRoot: d.cfg.DriverRoot})
	}
	d.nvmon.MIGNodes = gpumon.MIGNodes{MinorsFile: d.cfg.MIGMinorsFile, CapDir: filepath.Join(d.cfg.DevDir, "nvidia-caps"), ProcDevices: filepath.Join(d.cfg.ProcRoot, "devices")}
	managed := d.nvmon.Open(gpus)
	if d.nvmon.Loaded() {
		d.nvml = d.nvmon.Lib
	}
	return managed
}
