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
	"maps"
	"os"
	"slices"
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
	"github.com/gpud/gpud/internal/occupancy"
	"github.com/gpud/gpud/internal/preempt"
	"github.com/gpud/gpud/internal/sharing"
	"github.com/gpud/gpud/internal/workload"
	"github.com/gpud/gpud/internal/workload/cri"
	wdocker "github.com/gpud/gpud/internal/workload/docker"
	"github.com/gpud/gpud/internal/workload/kube"
	wnri "github.com/gpud/gpud/internal/workload/nri"
	"k8s.io/client-go/kubernetes"
)

// Config is what `gpud run` is told, and what tests inject.
type Config struct {
	config.Run
	// NVML overrides the driver's library (tests inject nvidia.NVML over
	// go-nvml's mock); used when set or when UseNVML is (then the file
	// NVMLLibrary names).
	NVML nvidia.Library
	// HTTPLimits bound the metrics port and the control socket (connection
	// cap, timeouts); zero fields take httpserve's defaults.
	HTTPLimits httpserve.Limits
	// Shares is the book of GPU memory shares gpud's DRA driver prepared
	// (nil: no sharing): the shared GPUs are judged against it on every
	// NVML sample and every change, and its pods are fenced to their GPUs.
	Shares *sharing.Book
	// ReloadsRefused, when set, reads how many settings reloads (SIGHUP)
	// were refused: whoever reads the settings refuses and counts them,
	// across the daemons of one gpud (gpud_config_reloads_refused_total).
	ReloadsRefused func() uint64
}

// Daemon is a running gpud.
type Daemon struct {
	cfg Config
	// lookalikes: processes found in cgroups named like a workload's
	// that no runtime made (the proc reader reports them).
	lookalikes cgroups.Lookalikes
	log        *slog.Logger
	mon        *bpf.Monitor
	ledger     *occupancy.Ledger
	tracker    *occupancy.Tracker
	writer     *occupancy.Writer
	nvml       nvidia.Library // nil without NVML
	nv         nvmlState
	// computeActivity: NVML sampling works, so activity is compute.
	computeActivity atomic.Bool
	migChanged      atomic.Bool
	monitoring      atomic.Bool
	gpus            []occupancy.GPU
	ready           atomic.Bool
	mu              sync.Mutex // serialises switch changes

	registry *workload.Registry
	journal  *preempt.Journal
	executor *preempt.Executor
	gate     *gate.Controller
	docker   *wdocker.Watcher
	pods     *kube.Pods
	cri      *cri.Source
	events   *kube.Events
	lender   *lending.Lender
	kube     kubernetes.Interface // nil without an API server
	dra      *dra.Driver          // nil without DRA
	plugin   *deviceplugin.Plugin
	sources  workload.Listings
	shares   *shares                 // nil without a share book
	runners  []func(context.Context) // the optional parts that run until gpud stops

	metrics                                          *metrics.Metrics
	opens                                            *metrics.Verdicts
	registrations                                    atomic.Uint64
	startResyncs, periodicResyncs, monitoringResyncs atomic.Uint64
	// kmaps is the kernel maps' use, sampled every kernelMapsEvery.
	kmaps kernelMaps
}

// ErrConfig marks errors in what gpud was told (exit status 2).
var ErrConfig = errors.New("config")

// ErrGPUsChanged is Run's answer when the device directory's GPU nodes
// are no longer the ones New found (a driver loaded or reloaded, a GPU
// added or gone): the ledger, the gate's maps and NVML's names are all
// built on that set, so the caller starts a new daemon on the new one, as
// a restart of gpud would.
var ErrGPUsChanged = errors.New("the GPU device nodes changed")

// rediscoverEvery is how often Run looks at the device directory for a
// changed GPU set: a directory read, nothing per process.
const rediscoverEvery = 5 * time.Second

// hooksRetry is how often missing driver hooks are tried again.
const hooksRetry = 30 * time.Second

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
	d := &Daemon{cfg: cfg, log: log}
	d.monitoring.Store(occupancy.LastMonitoring(cfg.StateFile, log))
	d.gpus = d.openNVML(gpus)
	gpus = d.gpus

	root := cfg.CgroupRoot
	mode := cgroups.Mode("given")
	if root == "" {
		if root, mode, err = cgroups.V2Root(); err != nil {
			return nil, err
		}
	}
	// Before anything reads a cgroup path: the parse, the pod sources and
	// the kernel's expectations all judge by these places.
	if _, err := cgroups.SetParents(cfg.CgroupParents); err != nil {
		return nil, fmt.Errorf("%w: --cgroup-parents: %w", ErrConfig, err)
	}
	log.Info("cgroups: workloads are believed only in their runtime's places; a workload's name elsewhere is a look-alike, its processes host processes",
		"default_parents", cgroups.DefaultParents, "cgroup_parents", cgroups.Parents(),
		"docker", "also where the engine reports a container's cgroup")
	syms, err := bpf.ParseDriverSymbols(cfg.DriverSymbols)
	if err != nil {
		return nil, fmt.Errorf("%w: --driver-symbols: %w", ErrConfig, err)
	}
	hooks := cfg.Hooks
	if hooks == "" {
		hooks = config.Defaults().Hooks
	}
	opts := bpf.Options{CgroupRoot: root, RingBytes: cfg.RingBytes, PinDir: cfg.PinDir, Hooks: hooks, Driver: syms}
	if d.mon, err = gate.Attach(opts, gpus, d.monitoring.Load(), cfg.KeepEnforcing, log); err != nil {
		return nil, err
	}
	d.ledger = occupancy.NewLedger(gpus, cfg.IdleAfter)
	if err := d.setupWorkloads(root); err != nil {
		d.mon.Close()
		return nil, err
	}
	d.setupMetrics()
	d.lookalikes.Log = log
	proc := &occupancy.ProcFS{Root: cfg.ProcRoot, CgroupRoot: root, Devs: occupancy.Devs(gpus), Self: os.Getpid(),
		Lookalikes: &d.lookalikes, Containers: d.registry.ContainerAt}
	d.gate = &gate.Controller{
		Ledger: d.ledger, Registry: d.registry, Exec: d.executor, Kernel: d.mon, Log: log, TTL: cfg.ReservationTTL,
		Proc: proc, Enforce: cfg.Enforce, Reclaim: cfg.Reclaim, Monitoring: d.monitoring.Load,
	}
	d.tracker = &occupancy.Tracker{
		Ledger: d.ledger, Log: log, Proc: proc,
		Watch:    func(pid int) error { return d.mon.WatchProcess(uint32(pid)) },
		Classify: d.registry.ClassifyProc,
		Gate:     d.onGateEvent,
		Opened:   d.onOpened,
		Drained:  d.gate.Drained,
		// Holders found by a resync are judged at once (a no-op until
		// Judge has started judging at start-up).
		Resynced: func() { d.gate.Rejudge("found holding at a /proc resync") },
	}
	d.logHooks()
	d.gate.Identify, d.gate.Wall = d.tracker.Identify, d.tracker.Wall
	d.registry.OnChange = d.gate.ClassChanged
	if cfg.DRA {
		// The DRA driver fills the share book the share rule judges.
		if err := d.setupDRA(); err != nil {
			d.mon.Close()
			return nil, err
		}
	}
	d.setupShares()
	if d.shares != nil {
		d.registry.OnChange = d.registryChanged
	}
	d.registry.OnExpect = (&gate.Expectations{Kernel: d.mon, CgroupRoot: root, Log: log}).Set
	if err := d.mon.MkdirHook(); err != nil {
		log.Warn("cgroups are not classified as they are made: a workload's opens before gpud finds its cgroup are judged after the fact", "error", err)
	}
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
	d.ledger.OnChange(d.ledgerChanged)
	// Attached first, scanned second: whatever changes during the scan is
	// also in the ring buffer, and applying it again is idempotent.
	if err := d.tracker.Resync(); err != nil {
		d.mon.Close()
		return nil, err
	}
	d.startResyncs.Add(1)
	d.gate.Drained(bpf.MonotonicNow()) // nothing is queued before the first read
	if cfg.Enforce {
		if err := d.mon.SetEnforcing(true, cfg.FailOpenAfter); err != nil {
			d.mon.Close()
			return nil, err
		}
	}
	log.Info("gpud started", "gpus", len(gpus), "cgroup_root", root, "cgroup_mode", mode,
		"monitoring", d.monitoring.Load(), "enforcing", cfg.Enforce, "nvml", d.nvml != nil, "holders", len(d.ledger.FDTable()))
	return d, nil
}

// holderRescan is how often the holders' fd tables are re-read in --hooks
// driver: the longest a closed GPU fd stays in the ledger when no hook
// reports it (no kprobe on the driver's release, or a close that is not
// the file's last reference, which the release never sees; a dup is found
// the same way).
const holderRescan = 2 * time.Second

// logHooks says how GPU fds are observed, and sets the tracker up for
// what the kernel does not report.
func (d *Daemon) logHooks() {
	st := d.mon.Hooks()
	if st.Mode == bpf.HooksDriver {
		d.tracker.RescanHolders = holderRescan
	}
	switch {
	case st.Mode == bpf.HooksSyscalls:
		d.log.Warn("kernel hooks: syscalls mode, every syscall of every process on the node pays for gpud's sys_enter/sys_exit hooks (--hooks driver avoids them)",
			"hooks_mode", st.Mode, "attached", st.Attached, "missing", st.Missing)
	case st.Complete:
		d.log.Info("kernel hooks: driver mode, nothing on the syscall path", "hooks_mode", st.Mode, "attached", st.Attached)
	default:
		d.log.Warn("kernel hooks: driver mode without some hooks: closes and passed fds are found by re-reading holders' fd tables and at the periodic reconciliation",
			"hooks_mode", st.Mode, "attached", st.Attached, "missing", st.Missing, "error", st.Err, "rescan_every", holderRescan,
			"passed_fds", d.passedFDs(st))
	}
}

// retryHooks attaches the driver hooks that were missing (the driver
// module loaded after gpud), and again those whose module was reloaded.
func (d *Daemon) retryHooks() {
	if d.mon.AttachDriver() {
		st := d.mon.Hooks()
		d.log.Info("kernel hooks: driver hooks changed", "hooks_mode", st.Mode, "attached", st.Attached, "missing", st.Missing)
		d.writer.Kick()
	}
}

// enforced reports whether the gate applies the rules to gpu's opens now.
func (d *Daemon) enforced(gpu int) bool { return d.enforcing() && d.mon.Protected(uint32(gpu)) }

// ledgerChanged is the ledger's change hook: the state file and the
// lender's device list follow it.
func (d *Daemon) ledgerChanged() {
	d.writer.Kick()
	if d.lender != nil {
		d.lender.LedgerChanged()
	}
}

// The parts, for tests and benchmarks.
func (d *Daemon) Ledger() *occupancy.Ledger          { return d.ledger }
func (d *Daemon) Tracker() *occupancy.Tracker        { return d.tracker }
func (d *Daemon) Writer() *occupancy.Writer          { return d.writer }
func (d *Daemon) Monitor() *bpf.Monitor              { return d.mon }
func (d *Daemon) Registry() *workload.Registry       { return d.registry }
func (d *Daemon) Journal() *preempt.Journal          { return d.journal }
func (d *Daemon) Plugin() *deviceplugin.Plugin       { return d.plugin }
func (d *Daemon) Executor() *preempt.Executor        { return d.executor }
func (d *Daemon) Metrics() *metrics.Metrics          { return d.metrics }
func (d *Daemon) Reservation(gpu int) (uint64, bool) { return d.gate.Reservation(gpu) }

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
	f.Enforcing = d.gateEnforcing()
	d.decorateNVML(f)
	workload.NameHolders(f, d.holderNames)
	for i := range f.GPUs {
		e := d.enforced(f.GPUs[i].Index)
		f.GPUs[i].Enforced = &e
	}
	if d.lender != nil {
		d.lender.Decorate(f)
	}
	st := d.mon.Hooks()
	f.Hooks = &v1.StateHooks{Mode: st.Mode, Complete: st.Complete, Attached: st.Attached, Missing: st.Missing, PassedFDs: d.passedFDs(st)}
	f.KernelMaps = d.kmaps.nearlyFull()
	if s := d.executor.Suspensions(); len(s) > 0 {
		f.Suspended = s
	}
	if d.dra != nil {
		d.decorateDRA(f)
	}
	d.decorateShares(f)
}

// passedFDs is the bound that holds for a GPU fd passed by SCM_RIGHTS:
// the hook that reports its receipt, or the periodic sweep's interval.
func (d *Daemon) passedFDs(st bpf.HookStatus) string {
	if st.PassedFDs != bpf.PassedBySweep {
		return st.PassedFDs
	}
	if d.cfg.ResyncInterval <= 0 {
		return bpf.PassedBySweep + ": never (--resync-interval 0)"
	}
	return bpf.PassedBySweep + ": within " + d.cfg.ResyncInterval.String()
}

// enforcing: the gate applies the rules now; monitoring off turns them off
// too (nothing is observed to rule on).
func (d *Daemon) enforcing() bool { return d.cfg.Enforce && d.monitoring.Load() }

// gateEnforcing is what the state file and the metrics call enforcing: the
// rules applied at open time, which a kernel that refuses the gate cannot
// (observe-only there: enforcing still applies them after the fact).
func (d *Daemon) gateEnforcing() bool { return d.enforcing() && d.mon.GateErr() == nil }

// Ready reports whether the first reconciliation is done and events flow.
func (d *Daemon) Ready() bool { return d.ready.Load() }

// SetMonitoring flips the monitoring switch on the running daemon. Turning
// it back on reconciles from /proc, since nothing was observed while it was
// off.
func (d *Daemon) SetMonitoring(on bool) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.mon.SetMonitoring(on); err != nil {
		return err
	}
	was := d.monitoring.Swap(on)
	if on && !was {
		if err := d.tracker.Resync(); err != nil {
			return err
		}
		d.monitoringResyncs.Add(1)
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
func (d *Daemon) Close() error {
	return errors.Join(d.journal.Close(), d.mon.Close())
}

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
	d.gate.Start(ctx, d.loans())
	for _, run := range append(d.runners, d.writer.Run) {
		goRun(run)
	}
	defer d.executor.Wait()
	defer d.journal.Close()
	if d.cfg.MetricsAddr != "" {
		goRun(func(ctx context.Context) {
			httpserve.Run(ctx, d.cfg.MetricsAddr, d.metrics.Handler(d.Ready), d.cfg.HTTPLimits, d.cfg.MetricsWebConfig, "metrics", d.log)
		})
	}
	if d.cfg.HealthAddr != "" {
		goRun(func(ctx context.Context) {
			httpserve.Run(ctx, d.cfg.HealthAddr, metrics.HealthHandler(d.Ready), d.cfg.HTTPLimits, "", "health", d.log)
		})
	}
	if d.cfg.ControlSocket != "" {
		ctl, err := control.Serve(d.cfg.ControlSocket, d, d.cfg.HTTPLimits, d.log)
		if err != nil {
			cancel()
			wg.Wait()
			return err
		}
		defer ctl.Close()
	}
	errc := make(chan error, 1)
	goRun(func(ctx context.Context) { errc <- d.tracker.Run(ctx, d.mon) })
	goRun(d.periodic)
	if d.nvml != nil {
		goRun(d.watchHealth)
		defer d.nvml.Shutdown()
	}
	changed := make(chan struct{})
	goRun(func(ctx context.Context) { d.watchGPUs(ctx, changed) })
	if d.mon.Adopted() {
		goRun(func(ctx context.Context) {
			// Opens between the start-up resync and the takeover went to
			// the previous gate's ring: find their holders in /proc (the
			// resync judges them).
			if d.gate.TakeOver(ctx, d.mon, d.sources.Done()) {
				if err := d.tracker.Resync(); err != nil {
					d.log.Error("resync after taking over the gate", "error", err)
				}
			}
		})
	}
	var loans <-chan struct{}
	if d.lender != nil {
		loans = d.lender.Synced()
	}
	goRun(func(ctx context.Context) { d.gate.JudgeWhenKnown(ctx, d.sources.Done(), loans) })
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

// watchGPUs closes changed when the device directory's GPU set is no
// longer d.gpus. A directory that cannot be read for a moment changes
// nothing; one with no GPU node left does (the driver was unloaded).
func (d *Daemon) watchGPUs(ctx context.Context, changed chan<- struct{}) {
	tick := time.NewTicker(rediscoverEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		now, err := nvidia.DiscoverGPUs(d.cfg.DevDir)
		if err != nil && !errors.Is(err, nvidia.ErrNoGPUs) {
			continue
		}
		if d.migChanged.Load() {
			close(changed)
			return
		}
		if nvidia.SameNodes(now, d.allGPUs()) {
			continue
		}
		d.log.Warn("the GPU device nodes changed: starting again on the new set", "gpus_before", len(d.gpus), "gpus_now", len(now))
		close(changed)
		return
	}
}

// allGPUs is every GPU found at start, those left alone included.
func (d *Daemon) allGPUs() []occupancy.GPU {
	if len(d.nv.leftAlone) == 0 {
		return d.gpus
	}
	out := make([]occupancy.GPU, 0, len(d.nv.byIndex))
	for _, idx := range slices.Sorted(maps.Keys(d.nv.byIndex)) {
		out = append(out, d.nv.byIndex[idx])
	}
	return out
}

// loans is the lender as the gate sees it; nil without lending.
func (d *Daemon) loans() gate.Loans {
	if d.lender == nil {
		return nil
	}
	return d.lender
}

// periodic runs the heartbeat, idle detection, NVML sampling and the safety
// resync.
func (d *Daemon) periodic(ctx context.Context) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	lastResync := time.Now()
	lastHooks := time.Now()
	nvmlFailing := false
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-tick.C:
			if err := d.mon.Heartbeat(); err != nil {
				d.log.Error("heartbeat", "error", err)
			}
			if d.nvml != nil && d.monitoring.Load() {
				ok, mig := d.sampleNVML(nvmlFailing)
				nvmlFailing = !ok
				d.computeActivity.Store(ok)
				if mig {
					d.migChanged.Store(true)
				}
			}
			d.ledger.Refresh(now)
			d.ledger.RefreshComms(d.tracker.Proc.Comm)
			// A reloaded driver module (a driver upgrade) is hooked again
			// within a tick; a module that first appears, within hooksRetry.
			if now.Sub(lastHooks) >= hooksRetry || d.mon.DriverModulesChanged() {
				lastHooks = now
				d.retryHooks()
			}
			d.gate.Sync()
			d.kickShares() // after the sample: the memory it judges
			d.sampleKernelMaps(now)
			if d.cfg.ResyncInterval > 0 && now.Sub(lastResync) >= d.cfg.ResyncInterval && d.monitoring.Load() {
				lastResync = now
				if err := d.tracker.Resync(); err != nil {
					d.log.Error("periodic resync", "error", err)
				} else {
					d.periodicResyncs.Add(1)
				}
			}
		}
	}
}

// setupWorkloads builds the workload registry and the sources that fill
// it (Docker, the API server or CRI), the preemption journal, and the
// executor with each source's reclaim action.
func (d *Daemon) setupWorkloads(cgroupRoot string) error {
	cfg := d.cfg
	agents := workload.Agents{Comms: cfg.AgentComms, Namespaces: cfg.AgentNamespaces, Labels: cfg.AgentLabels}
	if err := agents.Check(); err != nil {
		return fmt.Errorf("%w: %w", ErrConfig, err)
	}
	modes := workload.PreemptModes{Namespaces: cfg.PreemptModeNamespaces, Containers: cfg.PreemptModeContainers}
	if err := modes.Check(); err != nil {
		return fmt.Errorf("%w: %w", ErrConfig, err)
	}
	d.registry = &workload.Registry{Default: cfg.DefaultPriority, Agents: agents, Modes: modes, Log: d.log}
	j, err := preempt.OpenStateJournal(cfg.StateDir, d.log)
	if err != nil {
		return fmt.Errorf("%w: --state-dir: %w", ErrConfig, err)
	}
	d.journal = j
	if cfg.CheckpointRoot != "" {
		// Before any notice or mount: the old layout's directories (keyed by
		// task id alone) are set aside, never handed to a namespace.
		if _, err := preempt.MigrateCheckpointRoot(cfg.CheckpointRoot, d.log); err != nil {
			return fmt.Errorf("%w: --checkpoint-root: %w", ErrConfig, err)
		}
	}
	var runtimes preempt.Runtimes
	rc := &preempt.Reclaimer{Mode: cfg.Reclaim, Log: d.log, Runtime: &runtimes,
		// A reclaimed workload's waiting requests go with it.
		Done: func(key string, err error) {
			if err != nil {
				d.log.Warn("reclaim failed", "workload", key, "error", err)
			} else {
				d.gate.DropWaiters(key)
			}
		}}
	if cfg.DockerHost != "none" {
		cli, err := wdocker.NewClient(cfg.DockerHost)
		if err != nil {
			return fmt.Errorf("%w: docker: %w", ErrConfig, err)
		}
		runtimes.Containers = wdocker.Runtime{Client: cli}
		d.docker = &wdocker.Watcher{Client: cli, Registry: d.registry, CgroupRoot: cgroupRoot, Log: d.log, Synced: d.sources.Add()}
		d.runners = append(d.runners, d.docker.Run)
	}
	if kc, err := kube.NewClient(cfg.KubeConfig); err != nil {
		return fmt.Errorf("%w: --kubeconfig: %w", ErrConfig, err)
	} else if kc != nil {
		if cfg.NodeName == "" {
			return fmt.Errorf("%w: --node-name (or NODE_NAME) is required with an API server", ErrConfig)
		}
		d.kube = kc
		d.pods = &kube.Pods{Client: kc, Node: cfg.NodeName, Registry: d.registry, CgroupRoot: cgroupRoot, Log: d.log, Synced: d.sources.Add()}
		runtimes.Pods = kube.PodRuntime{Client: kc}
		d.events = kube.NewEvents(kc, d.registry, cfg.NodeName, d.log)
		d.runners = append(d.runners, d.pods.Run, d.events.Run)
	} else if ep := cri.Endpoint(cfg.CRIEndpoint); ep != "" {
		// No API server: pod labels from the runtime's sandboxes; pods are
		// not reclaimed (only the API server can evict).
		d.cri = &cri.Source{Endpoint: ep, Registry: d.registry, CgroupRoot: cgroupRoot, Log: d.log, Synced: d.sources.Add()}
		d.runners = append(d.runners, d.cri.Run)
	}
	if cfg.NRISocket != "none" { // classifies pods before their containers start; waits for the socket
		ckpt := &preempt.Checkpoints{Root: cfg.CheckpointRoot, HostRoot: cfg.HostCheckpointRoot, Records: j}
		d.runners = append(d.runners, (&wnri.Plugin{Socket: cfg.NRISocket, Registry: d.registry, CgroupRoot: cgroupRoot, Log: d.log,
			Checkpoint: func(podUID, namespace, taskID string) (string, bool, bool) {
				m, ok := ckpt.For(podUID, namespace, taskID)
				return m.Dir, m.ReadOnly, ok
			}}).Run)
	} else if cfg.CheckpointRoot != "" {
		d.log.Info("no NRI (--nri-socket=none): preempted tasks' containers get no checkpoint mount; a task may mount its --checkpoint-root directory itself")
	}
	d.executor = &preempt.Executor{
		ProcRoot: cfg.ProcRoot, Grace: cfg.PreemptGrace, CheckpointRoot: cfg.CheckpointRoot,
		Mode: preempt.Mode(cfg.PreemptMode), MaxFrozen: cfg.MaxFrozen, CgroupRoot: cgroupRoot,
		CheckpointTimeout: cfg.CheckpointTimeout, CheckpointFallback: preempt.Mode(cfg.CheckpointFallback),
		Suspended: func() {
			if d.writer != nil {
				d.writer.Kick()
			}
		},
		Journal: j, Reclaimer: rc, Log: d.log, Recorded: d.onRecorded,
		Holds: func(pid, gpu int) bool {
			return d.tracker.Proc.HoldsGPU(pid, gpu, d.ledger.FDs(pid, gpu))
		},
	}
	if cfg.PreemptMode == string(preempt.ModeCheckpoint) || cfg.CUDALibrary != "" {
		// Said at start-up: where the driver has no checkpoint API,
		// checkpoint-mode preemptions take the fallback.
		if c, err := nvidia.LoadCUDACheckpoint(nvidia.Load{Library: cfg.CUDALibrary, DriverRoot: cfg.DriverRoot}); err != nil {
			d.log.Warn("no CUDA checkpoint API: --preempt-mode checkpoint uses its fallback", "fallback", cfg.CheckpointFallback, "error", err)
		} else {
			d.executor.CUDA = c
			d.log.Info("CUDA checkpoint API loaded", "driver_api_version", c.Driver, "lock_timeout", cfg.CheckpointTimeout)
		}
	}
	return nil
}

// setupLending builds the lender and its device plugin.
func (d *Daemon) setupLending(proc *occupancy.ProcFS) {
	cfg := d.cfg
	d.lender = lending.New(lending.Config{
		Resource: cfg.ResourceName, OwnerResource: cfg.OwnerResource, LendFree: cfg.LendFree,
		DevDir: cfg.DevDir, HostDevDir: cfg.HostDevDir, CDIKind: cfg.CDIKind, GPUs: d.gpus,
		MinFreeMemory: cfg.LendMinFreeMemory,
	}, d.ledger, d.registry, d.gate, lending.Socket(cfg.PodResourcesSocket))
	d.lender.Log, d.lender.ProcInfo = d.log, proc.Info
	d.lender.CDI = &lending.CDISpecs{Dirs: cfg.CDISpecDirs}
	d.lender.Suspended = d.executor.SuspendedPod
	if d.cfg.Shares != nil {
		// A GPU with shares, or one the DRA driver offers for sharing, is
		// never lent whole.
		d.lender.Shared = func(gpu int) bool {
			return len(d.cfg.Shares.OnGPU(gpu)) > 0 || (d.dra != nil && d.dra.Offers(gpu))
		}
	}
	d.lender.Changed = func() {
		d.gate.Reclassified("loans changed")
		d.writer.Kick()
	}
	if d.pods != nil {
		d.lender.Pods, d.lender.Events = d.pods, d.events
	}
	d.plugin = &deviceplugin.Plugin{
		ResourceName: cfg.ResourceName, KubeletDir: cfg.KubeletDir,
		Endpoint: "gpud.sock", Backend: d.lender, Log: d.log,
		Registered: func() { d.registrations.Add(1) },
	}
	d.runners = append(d.runners, d.lender.Run, func(ctx context.Context) {
		if err := d.plugin.Run(ctx); err != nil {
			d.log.Error("device plugin stopped: no GPU is lent", "error", err)
		}
	})
}
