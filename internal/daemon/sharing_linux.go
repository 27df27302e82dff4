package daemon

import (
	"fmt"

	"github.com/gpud/gpud/internal/deviceplugin/lending"
	"github.com/gpud/gpud/internal/dra"
	"github.com/gpud/gpud/internal/preempt/kill"
	"github.com/gpud/gpud/internal/sharing"
	"github.com/gpud/gpud/internal/sharing/compute"
)

// setupDRA builds the DRA driver: GPU sharing by memory, when the node
// has what it needs (dra.ForNode says what is missing).
func (d *Daemon) setupDRA() error {
	cfg := d.cfg
	src := &dra.GPUSource{Ledger: d.ledger, Shared: cfg.DRASharedGPUs, DevDir: cfg.DevDir, HostDevDir: cfg.HostDevDir}
	if d.nvml != nil {
		src.DriverVersion = func() string { return d.nvml.Info().DriverVersion }
	}
	drv, err := dra.ForNode(dra.Node{Source: src, Metrics: d.metrics.Registry(), Config: dra.Config{
		NodeName: cfg.NodeName, Client: d.src.Kube,
		PluginDir: cfg.DRAPluginDir, RegistryDir: cfg.DRARegistryDir, CDIDir: cfg.DRACDIDir, StateDir: cfg.StateDir,
		Reserve: cfg.DRAMemoryReserve, Min: cfg.DRAMemoryMin, Step: cfg.DRAMemoryStep, Default: cfg.DRAMemoryDefault,
		NVIDIACDI: (&lending.CDISpecs{Dirs: cfg.CDISpecDirs}).Has, NVIDIAKind: cfg.CDIKind, Book: cfg.Shares, Log: d.log,
		Published: func() { d.writer.Kick() }, // what is offered, and why not, in the state file
	}})
	if err != nil {
		return fmt.Errorf("%w: %w", ErrConfig, err)
	}
	if drv != nil {
		d.dra, d.cfg.Shares = drv, drv.Book()
		d.runners = append(d.runners, drv.Serve)
	}
	return nil
}

// setupShares builds the share rule's enforcement when there is a share
// book; the registry's classes go through its fence.
func (d *Daemon) setupShares() {
	if d.cfg.Shares == nil {
		return
	}
	c := sharing.EnforcerConfig{Book: d.cfg.Shares, Holders: d.ledger, Workloads: d.registry, Fencer: d.gate, Preempter: d.gate,
		Enforcing: d.gate.Enforcing, Log: d.log, Events: d.src.Events, // nil-safe: no Events without an API server
		Changed: func() { d.writer.Kick(); d.lender.LedgerChanged() }} // a GPU shared or no longer: state file, lending
	d.shares = sharing.NewEnforcer(c)
	d.gate.SharedOpened, d.registry.OnChange = func(int) { d.shares.Kick() }, d.shares.ClassChanged
	d.compute = compute.New(compute.Config{Settings: compute.Settings{Slice: d.cfg.ComputeSlice, Period: d.cfg.ComputePeriod}, Book: d.cfg.Shares, Holders: d.ledger,
		Workloads: d.registry, Samples: d.nvmon.Busy, Thread: &kill.EventThread{Log: d.log, Name: "compute scheduler", Budget: kill.EventThreadBudget, Window: kill.EventThreadWindow}, Enforcing: d.gate.Enforcing, Log: d.log, StateDir: d.cfg.StateDir, ProcRoot: d.cfg.ProcRoot, CgroupRoot: d.executor.CgroupRoot, Preempted: d.executor.Preempting})
	d.nvmon.ShareGPUs, d.gate.ComputeShare, d.executor.Claim, d.executor.Unclaim = d.compute.Scheduling, d.compute.Share, d.compute.Preempt, d.compute.Unpreempt // utilization sampled while shared; a preemption's freeze never the scheduler's to thaw
	d.runners = append(d.runners, d.shares.Run, d.compute.Run, compute.NewNotifier(d.compute, d.src.Events).Run)
}
