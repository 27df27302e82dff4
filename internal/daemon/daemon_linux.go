// Package daemon wires gpud's parts together for `gpud run`: it builds them
// (the kernel programs, the tracker and ledger, the workload sources, the
// gate controller, the lender), runs them, and stops them. The decisions
// are made in the parts; docs/architecture.md says which part decides what.
package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	v1 "github.com/gpud/gpud/api/v1"
	"github.com/gpud/gpud/bpf"
	"github.com/gpud/gpud/internal/cgroups"
	"github.com/gpud/gpud/internal/config"
	"github.com/gpud/gpud/internal/control"
	"github.com/gpud/gpud/internal/deviceplugin"
	"github.com/gpud/gpud/internal/deviceplugin/lending"
	"github.com/gpud/gpud/internal/dra"
	"github.com/gpud/gpud/internal/gate"
	"github.com/gpud/gpud/internal/httpserve"
	"github.com/gpud/gpud/internal/metrics"
	"github.com/gpud/gpud/internal/nvidia"
	"github.com/gpud/gpud/internal/nvidia/gpumon"
	"github.com/gpud/gpud/internal/occupancy"
	"github.com/gpud/gpud/internal/preempt"
	"github.com/gpud/gpud/internal/preempt/executor"
	"github.com/gpud/gpud/internal/preempt/journal"
	"github.com/gpud/gpud/internal/preempt/kill"
	"github.com/gpud/gpud/internal/sharing"
	"github.com/gpud/gpud/internal/sharing/compute"
	"github.com/gpud/gpud/internal/workload"
	"github.com/gpud/gpud/internal/workload/sources"
)

// Config is what `gpud run` is told, and what tests inject.
type Config struct {
	config.Run
	// NVML overrides the driver's library (tests inject nvidia.NVML over
	// go-nvml's mock); else UseNVML loads the file NVMLLibrary names.
	NVML nvidia.Library
	// HTTPLimits bound the HTTP servers; zero fields take httpserve's defaults.
	HTTPLimits httpserve.Limits
	// Shares is the book of GPU memory shares gpud's DRA driver prepared
	// (nil: no sharing), judged and fenced by sharing.Enforcer.
	Shares *sharing.Book
	// ReloadsRefused, when set, counts the refused settings reloads of the
	// gpud whose daemon this is (gpud_config_reloads_refused_total).
	ReloadsRefused func() uint64
}

// Daemon is a running gpud.
type Daemon struct {
	cfg        Config
	lookalikes cgroups.Lookalikes // cgroups named like a workload's that no runtime made
	log        *slog.Logger
	mon        *bpf.Monitor
	ledger     *occupancy.Ledger
	tracker    *occupancy.Tracker
	writer     *occupancy.Writer
	nvml       nvidia.Library  // nil without NVML
	nvmon      *gpumon.Monitor // samples NVML per GPU, watches health
	gpus       []occupancy.GPU
	monitoring atomic.Bool
	ready      atomic.Bool
	mu         sync.Mutex // serialises switch changes

	registry *workload.Registry
	journal  *journal.Journal
	executor *executor.Executor
	gate     *gate.Controller
	lender   *lending.Lender
	loans    gate.Loans       // the lender; nil without lending
	src      *sources.Sources // the workload sources: Kube, Pods and Events nil without an API server
	dra      *dra.Driver      // nil without DRA
	plugin   *deviceplugin.Plugin
	sources  workload.Listings
	shares   *sharing.Enforcer       // nil without a share book
	compute  *compute.Controller     // the compute shares' scheduler; nil without a share book
	runners  []func(context.Context) // the optional parts that run until gpud stops

	metrics *metrics.Metrics
	kmaps   *bpf.MapWatch // the kernel maps' use
	// holderNames names a holder's workload (state file, metric labels).
	holderNames func(v1.StateHolder) (namespace, pod, container string)
}

// ErrConfig marks errors in what gpud was told (exit status 2).
var ErrConfig = errors.New("config")

// ErrGPUsChanged is Run's answer when the GPU device nodes are no longer
// the ones New found (a driver loaded or reloaded, a GPU added or gone):
// the caller starts a new daemon on the new set, as a restart would.
var ErrGPUsChanged = errors.New("the GPU device nodes changed")

// New discovers GPUs, loads and attaches the kernel programs and reconciles
// the ledger with /proc. Run starts the work.
func New(cfg Config, log *slog.Logger) (*Daemon, error) {
	cfg.Run = cfg.Run.Complete()
	gpus, err := nvidia.DiscoverGPUs(cfg.DevDir)
	if errors.Is(err, nvidia.ErrNoGPUs) {
		return nil, err // not yet, maybe: the caller may wait (nvidia.WaitGPUs)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	if err := cfg.CheckDirs(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	d := &Daemon{cfg: cfg, log: log, lookalikes: cgroups.Lookalikes{Log: log}}
	d.monitoring.Store(occupancy.LastMonitoring(cfg.StateFile, log))
	d.gpus = d.openNVML(gpus) // the GPUs gpud manages (a MIG GPU is left alone)

	root, mode, err := cgroups.Setup(cfg.CgroupRoot, cfg.CgroupParents, log)
	if errors.Is(err, cgroups.ErrParents) {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	} else if err != nil {
		return nil, err
	}
	syms, err := bpf.ParseDriverSymbols(cfg.DriverSymbols)
	if err != nil {
		return nil, fmt.Errorf("%w: --driver-symbols: %w", ErrConfig, err)
	}
	opts := bpf.Options{CgroupRoot: root, RingBytes: cfg.RingBytes, PinDir: cfg.PinDir, Hooks: cfg.Hooks, Driver: syms}
	if d.mon, err = gate.Attach(opts, d.gpus, d.monitoring.Load(), cfg.KeepEnforcing, log); err != nil {
		return nil, err
	}
	d.kmaps = &bpf.MapWatch{Read: d.mon.MapUsage, Log: log, Changed: func() { d.writer.Kick() }}
	d.ledger = occupancy.NewLedger(d.gpus, cfg.IdleAfter)
	d.nvmon.Start(d.ledger)
	opens := d.setupMetrics() // before the executor: it counts thaws
	if err := d.setupWorkloads(root); err != nil {
		d.mon.Close()
		return nil, err
	}
	proc := &occupancy.ProcFS{Root: cfg.ProcRoot, CgroupRoot: root, Devs: occupancy.Devs(d.gpus), Self: os.Getpid(),
		Lookalikes: &d.lookalikes, Containers: d.registry.ContainerAt}
	d.gate = &gate.Controller{
		Ledger: d.ledger, Registry: d.registry, Exec: d.executor, Journal: d.journal, Kernel: d.mon, Log: log, TTL: cfg.ReservationTTL,
		Proc: proc, Enforce: cfg.Enforce, Reclaim: cfg.Reclaim, Monitoring: d.monitoring.Load,
	}
	d.tracker = &occupancy.Tracker{
		Ledger: d.ledger, Log: log, Proc: proc,
		Watch:    func(pid int) error { return d.mon.WatchProcess(uint32(pid)) },
		Classify: d.registry.ClassifyProc,
		Drained:  d.gate.Drained,
		Resynced: func() { d.gate.Rejudge("found holding at a /proc resync") }, // judged at once (once Judge started)
		Thread:   kill.NewEventThread(log),
	}
	d.tracker.Opened, d.tracker.Gate = d.gate.Counting(opens.Count)
	st := d.mon.Hooks() // what the kernel does not report, the tracker re-reads
	d.tracker.RescanHolders = st.Rescan()
	st.Log(log, bpf.HolderRescan, cfg.ResyncInterval)
	d.gate.Identify, d.gate.Wall = d.tracker.Identify, d.tracker.Wall
	d.registry.OnChange = d.gate.ClassChanged
	if cfg.DRA { // the DRA driver fills the share book the share rule judges
		if err := d.setupDRA(); err != nil {
			d.mon.Close()
			return nil, err
		}
	}
	d.setupShares()
	d.registry.OnExpect = (&gate.Expectations{Kernel: d.mon, CgroupRoot: root, Log: log}).Set
	d.mon.LogMkdirHook(log)
	d.writer = &occupancy.Writer{
		Path: cfg.StateFile, Node: cfg.NodeName, Ledger: d.ledger, Log: log,
		Monitoring: d.monitoring.Load, Preemptions: d.journal.RecentRaw, Decorate: d.decorate,
	}
	d.gate.Changed = d.writer.Kick
	d.writer.Health = d.journal.FillHealth // failed writes (a full disk), in the state file
	d.journal.OnFlushed(d.writer.Kick)
	if cfg.DevicePlugin {
		d.setupLending(proc)
	}
	d.ledger.OnChange(func() { d.writer.Kick(); d.lender.LedgerChanged() }) // the state file and the lender's devices
	// Attached first, scanned second: whatever changes during the scan is
	// also in the ring buffer, and applying it again is idempotent.
	if err := d.tracker.ResyncFor(occupancy.ResyncStart); err != nil {
		d.mon.Close()
		return nil, err
	}
	d.gate.Drained(bpf.MonotonicNow()) // nothing is queued before the first read
	if cfg.Enforce {
		if err := d.mon.SetEnforcing(true, cfg.FailOpenAfter); err != nil {
			d.mon.Close()
			return nil, err
		}
	}
	log.Info("gpud started", "gpus", len(d.gpus), "cgroup_root", root, "cgroup_mode", mode,
		"monitoring", d.monitoring.Load(), "enforcing", cfg.Enforce, "nvml", d.nvml != nil, "holders", len(d.ledger.FDTable()))
	return d, nil
}

// The parts, for tests and benchmarks.
func (d *Daemon) Ledger() *occupancy.Ledger          { return d.ledger }
func (d *Daemon) Tracker() *occupancy.Tracker        { return d.tracker }
func (d *Daemon) Writer() *occupancy.Writer          { return d.writer }
func (d *Daemon) Monitor() *bpf.Monitor              { return d.mon }
func (d *Daemon) Registry() *workload.Registry       { return d.registry }
func (d *Daemon) Journal() *journal.Journal          { return d.journal }
func (d *Daemon) Plugin() *deviceplugin.Plugin       { return d.plugin }
func (d *Daemon) Executor() *executor.Executor       { return d.executor }
func (d *Daemon) Metrics() *metrics.Metrics          { return d.metrics }
func (d *Daemon) Reservation(gpu int) (uint64, bool) { return d.gate.Reservation(gpu) }
func (d *Daemon) Shares() *sharing.Book              { return d.cfg.Shares } // nil without DRA
func (d *Daemon) DRA() *dra.Driver                   { return d.dra }        // nil without DRA

// Explain says which rule would apply to process pid now.
func (d *Daemon) Explain(pid int) (*v1.Explanation, error) { return d.gate.Explain(pid) }

// State is the state document, as the state file shows it.
func (d *Daemon) State() v1.StateFile {
	f := occupancy.Render(d.ledger.Snapshot(time.Now()), d.cfg.NodeName, d.monitoring.Load())
	d.decorate(&f)
	return f
}

// decorate adds to the state document what the ledger does not know: the
// rules' switch, the holders' workload names and the loans.
func (d *Daemon) decorate(f *v1.StateFile) {
	d.gate.Decorate(f, d.mon)
	d.nvmon.Decorate(f)
	workload.NameHolders(f, d.holderNames)
	d.lender.Decorate(f)
	f.Hooks, f.KernelMaps = d.mon.Hooks().State(d.cfg.ResyncInterval), d.kmaps.NearlyFull()
	if s := d.executor.Suspensions(); len(s) > 0 {
		f.Suspended = s
	}
	d.dra.Decorate(f)
	d.shares.Decorate(f)
	d.compute.Decorate(f)
}

// Ready reports whether the first reconciliation is done and events flow.
func (d *Daemon) Ready() bool { return d.ready.Load() }

// SetMonitoring flips the monitoring switch on the running daemon. Turning
// it back on reconciles from /proc: nothing was observed while it was off.
func (d *Daemon) SetMonitoring(on bool) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.mon.SetMonitoring(on); err != nil {
		return err
	}
	was := d.monitoring.Swap(on)
	if on && !was {
		if err := d.tracker.ResyncFor(occupancy.ResyncMonitoring); err != nil {
			return err
		}
		// Whatever got in while the rules were off is judged now.
		d.gate.Rejudge("monitoring back on")
	}
	d.log.Info("monitoring switched", "monitoring", on)
	d.writer.Kick()
	return nil
}

// Monitoring reports the switch.
func (d *Daemon) Monitoring() bool { return d.monitoring.Load() }

// Close releases what New set up, for a daemon that will not Run (stopped
// during start-up): the gate is detached and unpinned unless KeepEnforcing.
func (d *Daemon) Close() error { return errors.Join(d.journal.Close(), d.mon.Close()) }

// Run works until ctx ends, then detaches everything.
func (d *Daemon) Run(ctx context.Context) error {
	defer d.mon.Close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	goRun := func(f func(context.Context)) {
		wg.Add(1)
		go func() { defer wg.Done(); f(ctx) }()
	}
	defer d.executor.Wait()
	defer d.journal.Close()
	if d.cfg.ControlSocket != "" {
		ctl, err := control.Serve(d.cfg.ControlSocket, d, d.cfg.HTTPLimits, d.log)
		if err != nil {
			return err
		}
		defer ctl.Close()
	}
	d.gate.Start(ctx, d.loans)
	for _, run := range append(d.runners, d.writer.Run) {
		goRun(run)
	}
	goRun(httpserve.Runner(d.cfg.MetricsAddr, d.metrics.Handler(d.Ready), d.cfg.HTTPLimits, d.cfg.MetricsWebConfig, "metrics", d.log))
	goRun(httpserve.Runner(d.cfg.HealthAddr, metrics.HealthHandler(d.Ready), d.cfg.HTTPLimits, "", "health", d.log))
	errc := make(chan error, 1)
	goRun(func(ctx context.Context) { errc <- d.tracker.Run(ctx, d.mon) })
	goRun(d.periodic)
	goRun(d.nvmon.Run)
	changed := make(chan struct{})
	goRun(func(ctx context.Context) {
		if nvidia.WatchGPUSet(ctx, d.cfg.DevDir, d.nvmon.AllGPUs(d.gpus), len(d.gpus), nvidia.RediscoverEvery, d.nvmon.Restart, d.log) {
			close(changed)
		}
	})
	if d.mon.Adopted() {
		goRun(d.gate.TakeOverThenResync(d.mon, d.sources.Done(), d.tracker.Resync))
	}
	goRun(func(ctx context.Context) { d.gate.JudgeWhenKnown(ctx, d.sources.Done(), d.lender.Synced()) })
	d.ready.Store(true)

	var err error
	select {
	case <-ctx.Done():
	case err = <-errc:
		if err != nil {
			err = fmt.Errorf("reading kernel events: %w", err)
		}
	case <-changed:
		err = ErrGPUsChanged
	}
	cancel()
	wg.Wait()
	// Nothing stays frozen with no gpud to thaw or kill it: the next gpud
	// judges the holders again and freezes what the rules say.
	d.executor.Wait()
	d.executor.ThawAll("gpud stopped")
	d.log.Info("gpud stopped")
	return err
}

// periodic runs the kernel side's upkeep, idle detection, the gate's sync
// and the safety resync every second (gpumon samples NVML on its own).
func (d *Daemon) periodic(ctx context.Context) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	kernel := &bpf.Upkeep{Monitor: d.mon, Maps: d.kmaps, Log: d.log, Changed: d.writer.Kick}
	resync := &occupancy.PeriodicResync{Tracker: d.tracker, Every: d.cfg.ResyncInterval, On: d.monitoring.Load, Last: time.Now()}
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-tick.C:
			kernel.Tick(now)
			d.ledger.Refresh(now)
			d.tracker.RefreshComms(now)
			d.gate.Sync()
			d.shares.Kick() // after the sample: the memory it judges
			resync.Tick(now)
		}
	}
}

// setupWorkloads builds the workload registry, the sources that fill it,
// the preemption journal, and the executor with each source's reclaim.
func (d *Daemon) setupWorkloads(cgroupRoot string) error {
	cfg := d.cfg
	var err error
	d.registry, err = workload.NewRegistry(cfg.DefaultPriority,
		workload.Agents{Comms: cfg.AgentComms, Namespaces: cfg.AgentNamespaces, Labels: cfg.AgentLabels},
		workload.PreemptModes{Namespaces: cfg.PreemptModeNamespaces, Containers: cfg.PreemptModeContainers}, cfg.PriorityClasses, d.log)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrConfig, err)
	}
	j, ckpt, err := journal.Open(cfg.StateDir, cfg.CheckpointRoot, cfg.HostCheckpointRoot, d.log)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrConfig, err)
	}
	d.journal = j
	var runtimes preempt.Runtimes // filled by the sources below
	sc := sources.Config{DockerHost: cfg.DockerHost, KubeConfig: cfg.KubeConfig, NodeName: cfg.NodeName,
		CRIEndpoint: cfg.CRIEndpoint, NRISocket: cfg.NRISocket, CgroupRoot: cgroupRoot}
	if ckpt != nil {
		sc.Checkpoint = ckpt.Mount
	}
	src, err := sources.New(sc, d.registry, &d.sources, d.log)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrConfig, err)
	}
	d.src, runtimes, d.holderNames = src, src.Runtimes, d.registry.HolderNames(src.Pods.ContainerName)
	d.runners = append(d.runners, src.Runners...)
	d.executor = &executor.Executor{
		ProcRoot: cfg.ProcRoot, Grace: cfg.PreemptGrace, CheckpointRoot: cfg.CheckpointRoot,
		Mode: preempt.Mode(cfg.PreemptMode), MaxFrozen: cfg.MaxFrozen, CgroupRoot: cgroupRoot,
		CheckpointTimeout: cfg.CheckpointTimeout, CheckpointFallback: preempt.Mode(cfg.CheckpointFallback),
		Suspended: func() { d.writer.Kick() }, ThawedByOther: d.metrics.ThawedByOther,
		Journal: j, Log: d.log, Recorded: d.onRecorded, Reclaimer: &executor.Reclaimer{Mode: cfg.Reclaim, Log: d.log,
			Runtime: &runtimes, Done: func(key string, err error) { d.gate.Reclaimed(key, err) }},
		GPUMemory: d.ledger.MemoryHeld, Holds: func(pid, gpu int) bool { return d.tracker.Holds(pid, gpu) },
	}
	if c := nvidia.CheckpointAPI(executor.WantsCheckpointAPI(preempt.Mode(cfg.PreemptMode), cfg.CUDALibrary, j.Recent()),
		nvidia.Load{Library: cfg.CUDALibrary, DriverRoot: cfg.DriverRoot}, cfg.CheckpointFallback, cfg.CheckpointTimeout, d.log); c != nil {
		d.executor.CUDA = c // not a nil *CUDACheckpoint in the interface
	}
	return nil
}

// setupLending builds the lender and its device plugin.
func (d *Daemon) setupLending(proc *occupancy.ProcFS) {
	cfg := d.cfg
	n := lending.Node{Config: lending.Config{
		Resource: cfg.ResourceName, OwnerResource: cfg.OwnerResource, LendFree: cfg.LendFree,
		DevDir: cfg.DevDir, HostDevDir: cfg.HostDevDir, CDIKind: cfg.CDIKind, GPUs: d.gpus,
		MinFreeMemory: cfg.LendMinFreeMemory,
	}, PodResourcesSocket: cfg.PodResourcesSocket, KubeletDir: cfg.KubeletDir, CDISpecDirs: cfg.CDISpecDirs}
	if cfg.Shares != nil {
		n.HasShares, n.Offered = func(gpu int) bool { return len(cfg.Shares.OnGPU(gpu)) > 0 }, d.dra.Offers
	}
	d.lender, d.plugin = lending.NewNode(n, d.ledger, d.registry, d.gate, d.log)
	d.loans = d.lender
	d.lender.ProcInfo, d.lender.Suspended = proc.Info, d.executor.SuspendedPod
	if d.src.Pods != nil { // not a nil *kube.Pods in the interfaces
		d.lender.Pods, d.lender.Events = d.src.Pods, d.src.Events
	}
	d.lender.Changed = func() { d.gate.Reclassified("loans changed"); d.writer.Kick() }
	d.runners = append(d.runners, d.lender.Run, lending.RunPlugin(d.plugin, d.log))
}
