package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	v1 "github.com/gpud/gpud/api/v1"
	"github.com/gpud/gpud/internal/nvidia"
	"github.com/gpud/gpud/internal/occupancy"
)

// nvmlState is what the daemon learnt of NVML at start.
type nvmlState struct {
	info      nvidia.Info
	err       string                // why NVML is not used; "" when it is or was not asked for
	mig       map[int]bool          // MIG mode at start, by gpud index (left-alone GPUs too)
	leftAlone []v1.StateLeftAlone   // GPUs not managed, and why
	byIndex   map[int]occupancy.GPU // every GPU found, managed or not
}

// Reasons a GPU is left alone.
const leftAloneMIG = "MIG enabled: its slices share the GPU's device node, so the gate and lending cannot tell their workloads apart"

// openNVML loads NVML (the driver's library, or the one the test injects)
// and names the GPUs; it returns the GPUs gpud manages: a GPU in MIG mode
// is left alone (neither judged by the gate nor lent), since every slice
// uses its parent's /dev/nvidiaN and a rule on the node would hit other
// slices' workloads.
func (d *Daemon) openNVML(gpus []occupancy.GPU) []occupancy.GPU {
	cfg := d.cfg
	d.nv.byIndex = map[int]occupancy.GPU{}
	if !cfg.UseNVML && cfg.NVML == nil {
		return gpus
	}
	lib := cfg.NVML
	if lib == nil {
		lib = nvidia.New(nvidia.Load{Library: cfg.NVMLLibrary, DriverRoot: cfg.DriverRoot})
	}
	if err := lib.Init(); err != nil {
		d.nv.err = err.Error()
		d.log.Warn("NVML unavailable: activity is GPU opens only; no memory, MIG or health", "error", err)
		return gpus
	}
	d.nvml, d.nv.info = lib, lib.Info()
	d.log.Info("NVML loaded", "library", d.nv.info.Library, "driver", d.nv.info.DriverVersion)
	if unknown := lib.Annotate(gpus); len(unknown) > 0 {
		d.log.Warn("device nodes NVML does not know", "gpus", unknown)
	}
	readings, err := lib.Sample()
	if err != nil {
		d.log.Warn("NVML's first reading failed", "error", err)
	}
	d.nv.mig = map[int]bool{}
	var managed []occupancy.GPU
	for _, g := range gpus {
		d.nv.byIndex[g.Index] = g
		r := readings[g.Index]
		d.nv.mig[g.Index] = r.MIG
		if r.MIG {
			d.log.Warn("GPU left alone: MIG is enabled", "gpu", g.Index, "device", g.Device, "uuid", g.UUID)
			d.nv.leftAlone = append(d.nv.leftAlone, v1.StateLeftAlone{Device: g.Device, UUID: g.UUID, Reason: leftAloneMIG})
			continue
		}
		managed = append(managed, g)
	}
	return managed
}

// sampleNVML reads NVML once: activity, memory, lost GPUs, MIG changes.
// It reports whether sampling works (activity from compute) and whether a
// GPU's MIG mode changed (gpud starts again on the new set).
func (d *Daemon) sampleNVML(wasFailing bool) (ok, migChanged bool) {
	readings, err := d.nvml.Sample()
	if err != nil && !wasFailing {
		d.log.Warn("NVML sampling failing: activity falls back to GPU opens", "error", err)
	}
	now := time.Now()
	for gpu, r := range readings {
		if r.MIG != d.nv.mig[gpu] {
			d.log.Warn("a GPU's MIG mode changed: starting again", "gpu", gpu, "mig", r.MIG)
			migChanged = true
		}
		if !r.At.IsZero() {
			d.ledger.ActivityBy(gpu, r.At, r.PIDs) // agents' use is none
			if d.lender != nil {
				d.lender.Activity(gpu, r.PIDs)
			}
		}
		var m *occupancy.Memory
		if r.Memory != nil {
			m = &occupancy.Memory{Total: r.Memory.Total, Used: r.Memory.Used}
		}
		d.ledger.SetMemory(gpu, m, r.ProcessMemory)
		if d.lender != nil && r.ProcessMemory != nil {
			d.lender.Memory(gpu, r.ProcessMemory)
		}
		if r.Lost {
			d.ledger.SetUnhealthy(gpu, "fallen off the bus (NVML: GPU is lost)", true, now)
		}
	}
	d.ledger.SetComputeActivity(err == nil)
	return err == nil, migChanged
}

// watchHealth turns NVML's XID and ECC events into the ledger's health.
func (d *Daemon) watchHealth(ctx context.Context) {
	err := d.nvml.WatchHealth(ctx, func(e nvidia.HealthEvent) {
		reason := e.Kind
		if e.Kind == "xid" {
			reason = fmt.Sprintf("XID %d", e.XID)
		}
		lvl := slog.LevelInfo
		if e.Critical {
			lvl = slog.LevelWarn
		}
		d.log.Log(ctx, lvl, "GPU health event", "gpu", e.GPU, "event", reason, "critical", e.Critical)
		d.ledger.SetUnhealthy(e.GPU, reason, e.Critical, time.Now())
		if d.dra != nil && e.Critical {
			d.dra.Changed() // an unhealthy GPU leaves the slice now, not at the next tick
		}
	})
	if err != nil && ctx.Err() == nil {
		d.log.Warn("no GPU health events: XID and ECC errors are not watched", "error", err)
	}
}

// decorateNVML adds what the state file says of NVML.
func (d *Daemon) decorateNVML(f *v1.StateFile) {
	f.ActivitySource = "opens"
	if d.nvml != nil && d.computeActivity.Load() {
		f.ActivitySource = "nvml"
	}
	switch {
	case d.nvml != nil:
		f.NVML = &v1.StateNVML{Library: d.nv.info.Library, DriverVersion: d.nv.info.DriverVersion}
	case d.nv.err != "":
		f.NVML = &v1.StateNVML{Error: d.nv.err}
	}
	f.LeftAlone = d.nv.leftAlone
}
