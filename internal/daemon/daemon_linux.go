// Package daemon wires gpud's parts together for `gpud run`: the kernel
// programs, the tracker and ledger, the state file writer, the control
// socket and the periodic work (heartbeat, idle detection, NVML, resync).
package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/docker/docker/client"
	"github.com/gpud/gpud/bpf"
	"github.com/gpud/gpud/internal/cgroups"
	"github.com/gpud/gpud/internal/deviceplugin"
	"github.com/gpud/gpud/internal/httpserve"
	"github.com/gpud/gpud/internal/metrics"
	"github.com/gpud/gpud/internal/occupancy"
	"github.com/gpud/gpud/internal/preempt"
	"github.com/gpud/gpud/internal/priority"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// Config is everything `gpud run` is told.
type Config struct {
	DevDir         string
	StateFile      string
	StateDir       string
	ControlSocket  string
	IdleAfter      time.Duration
	ResyncInterval time.Duration // safety-net full /proc reconciliation; 0 disables
	NodeName       string
	CgroupRoot     string // "" detects
	ProcRoot       string
	UseNVML        bool
	RingBytes      uint32 // kernel → user ring buffer size; 0: 4 MiB

	// The gate and preemption (claim 1, 5, 6).
	Enforce         bool
	FailOpenAfter   time.Duration
	DefaultPriority occupancy.Priority
	PreemptGrace    time.Duration
	Reclaim         string // stop | remove | none
	ReservationTTL  time.Duration
	CheckpointRoot  string
	DockerHost      string // "" : $DOCKER_HOST or the default socket; "none" disables
	// KubeConfig names the API server for pod labels; "" uses the in-cluster
	// config when running in a pod, and no API server otherwise.
	KubeConfig string
	// CRIEndpoint is the container runtime's socket, for pod labels from
	// sandboxes when there is no API server; "" picks containerd's or
	// CRI-O's default socket when present, "none" disables.
	CRIEndpoint string

	// Lending idle GPUs through a kubelet device plugin (claim 1).
	DevicePlugin       bool
	ResourceName       string // default gpud.io/idle-gpu
	OwnerResource      string // default nvidia.com/gpu
	KubeletDir         string // default /var/lib/kubelet/device-plugins
	PodResourcesSocket string // default /var/lib/kubelet/pod-resources/kubelet.sock
	LendFree           bool
	HostDevDir         string // --dev-dir as the host sees it (gpud in a pod); "" = the same
	// NVML overrides the library (tests inject go-nvml's mock).
	NVML nvml.Interface

	// MetricsAddr serves /metrics, /healthz and /readyz; "" disables.
	MetricsAddr string
	// HTTPLimits bound the metrics port and the control socket (connection
	// cap, timeouts); zero fields take httpserve.Defaults.
	HTTPLimits httpserve.Limits
	// Version is reported in gpud_build_info.
	Version string

	// PinDir (on a bpffs, e.g. /sys/fs/bpf/gpud) keeps the gate attached
	// across gpud restarts and crashes; "" pins nothing.
	PinDir string
	// KeepEnforcing leaves the pinned gate attached when gpud stops (it
	// fails open after FailOpenAfter without a heartbeat); false removes it.
	KeepEnforcing bool
}

// Daemon is a running gpud.
type Daemon struct {
	cfg        Config
	log        *slog.Logger
	mon        *bpf.Monitor
	ledger     *occupancy.Ledger
	tracker    *occupancy.Tracker
	writer     *occupancy.Writer
	nvml       *occupancy.NVML
	monitoring atomic.Bool
	gpus       []occupancy.GPU
	ready      atomic.Bool
	mu         sync.Mutex // serialises switch changes

	registry *priority.Registry
	journal  *preempt.Journal
	executor *preempt.Executor
	enforcer *enforcer
	docker   *priority.Docker
	pods     *priority.Pods
	cri      *priority.CRI
	events   *podEvents
	lender   *lender
	plugin   *deviceplugin.Plugin
	denials  atomic.Uint64

	sources                                          []chan struct{} // closed at each workload source's first full listing
	metrics                                          *metrics.Metrics
	registrations                                    atomic.Uint64
	startResyncs, periodicResyncs, monitoringResyncs atomic.Uint64
}

// ErrConfig marks errors in what gpud was told (exit status 2).
var ErrConfig = errors.New("config")

// New discovers GPUs, loads and attaches the kernel programs and reconciles
// the ledger with /proc. Run starts the work.
func New(cfg Config, log *slog.Logger) (*Daemon, error) {
	gpus, err := occupancy.DiscoverGPUs(cfg.DevDir)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	if cfg.FailOpenAfter <= 0 {
		cfg.FailOpenAfter = 30 * time.Second
	}
	d := &Daemon{cfg: cfg, log: log, gpus: gpus}
	d.monitoring.Store(true)
	if prev, err := occupancy.ReadStateFile(cfg.StateFile); err == nil {
		d.monitoring.Store(prev.Monitoring)
	} else if !errors.Is(err, os.ErrNotExist) {
		// A damaged file is set aside and rebuilt from the kernel and /proc.
		aside := cfg.StateFile + ".corrupt"
		_ = os.Rename(cfg.StateFile, aside)
		log.Warn("state file unreadable; rebuilding it from the kernel and /proc",
			"path", cfg.StateFile, "moved_to", aside, "error", err)
	}

	if cfg.UseNVML || cfg.NVML != nil {
		lib := cfg.NVML
		if lib == nil {
			lib = nvml.New()
		}
		n := &occupancy.NVML{Lib: lib}
		if err := n.Init(); err != nil {
			log.Warn("NVML unavailable: activity is GPU opens only", "error", err)
		} else {
			d.nvml = n
			if unknown := n.Annotate(d.gpus); len(unknown) > 0 {
				log.Warn("device nodes NVML does not know", "gpus", unknown)
			}
		}
	}

	root := cfg.CgroupRoot
	mode := cgroups.Mode("given")
	if root == "" {
		if root, mode, err = cgroups.V2Root(); err != nil {
			return nil, err
		}
	}
	d.mon, err = bpf.Load(bpf.Options{CgroupRoot: root, RingBytes: cfg.RingBytes, PinDir: cfg.PinDir})
	if err != nil {
		return nil, err
	}
	d.mon.KeepGate(cfg.KeepEnforcing)
	devs := map[uint32]uint32{}
	for _, g := range gpus {
		if len(g.Aliases) > 0 {
			log.Warn("device nodes of one GPU merged", "gpu", g.Index, "device", g.Device, "aliases", g.Aliases)
		}
		if dev, ok := bpf.KernelDev(g.Major, g.Minor); ok {
			devs[dev] = uint32(g.Index)
		}
	}
	if err := d.mon.SetGPUs(devs); errors.Is(err, bpf.ErrUnprotected) {
		// Shown as not enforced (state file, status, gpud_gpu_enforced).
		log.Error("GPUs the gate cannot protect: their opens are not judged", "error", err)
	} else if err != nil {
		d.mon.Close()
		return nil, err
	}
	if err := d.mon.SetMonitoring(d.monitoring.Load()); err != nil {
		d.mon.Close()
		return nil, err
	}
	// Registration (claim 3): gpud's own opens (NVML) are exempt; its cgroup
	// too unless it is the root, which would exempt the whole host.
	selfCgroup := uint64(0)
	if info, err := cgroups.ReadProc(os.Getpid()); err == nil && info.V2Path != "/" && info.V2Path != "" {
		if id, err := cgroups.ID(filepath.Join(root, info.V2Path)); err == nil {
			selfCgroup = id
		}
	}
	if err := d.mon.Register(uint32(os.Getpid()), selfCgroup); err != nil {
		d.mon.Close()
		return nil, err
	}

	d.ledger = occupancy.NewLedger(gpus, cfg.IdleAfter)
	if err := d.setupEnforcement(root); err != nil {
		d.mon.Close()
		return nil, err
	}
	procRoot := cfg.ProcRoot
	if procRoot == "" {
		procRoot = "/proc"
	}
	d.tracker = &occupancy.Tracker{
		Ledger: d.ledger, Log: log,
		Proc:     &occupancy.ProcFS{Root: procRoot, CgroupRoot: root, Devs: occupancy.Devs(gpus), Self: os.Getpid()},
		Watch:    func(pid int) error { return d.mon.WatchProcess(uint32(pid)) },
		Classify: d.registry.ClassifyProc,
		Gate:     d.enforcer.gate,
		Opened:   d.enforcer.opened,
		Drained:  d.enforcer.drained,
	}
	d.writer = &occupancy.Writer{
		Path: cfg.StateFile, Node: cfg.NodeName, Ledger: d.ledger, Log: log,
		Monitoring: d.monitoring.Load, Enforced: d.enforced,
		Preemptions: func() []occupancy.Preemption {
			var out []occupancy.Preemption
			for _, r := range d.journal.Recent() {
				if b, err := json.Marshal(r); err == nil {
					out = append(out, b)
				}
			}
			return out
		},
	}
	d.ledger.OnChange(d.writer.Kick)
	if cfg.DevicePlugin {
		d.setupLending()
	}
	d.setupMetrics()
	// Attached first, scanned second: whatever changes during the scan is
	// also in the ring buffer, and applying it again is idempotent.
	if err := d.tracker.Resync(); err != nil {
		d.mon.Close()
		return nil, err
	}
	d.startResyncs.Add(1)
	d.enforcer.drained(bpf.MonotonicNow()) // nothing is queued before the first read
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

// enforced reports whether the gate applies the rules to gpu's opens.
func (d *Daemon) enforced(gpu int) bool { return d.cfg.Enforce && d.mon.Protected(uint32(gpu)) }

// Ledger exposes the ledger (tests and benchmarks).
func (d *Daemon) Ledger() *occupancy.Ledger { return d.ledger }

// Tracker exposes the tracker (tests and benchmarks).
func (d *Daemon) Tracker() *occupancy.Tracker { return d.tracker }

// Writer exposes the state file writer (tests and benchmarks).
func (d *Daemon) Writer() *occupancy.Writer { return d.writer }

// Monitor exposes the kernel side (tests and benchmarks).
func (d *Daemon) Monitor() *bpf.Monitor { return d.mon }

// Ready reports whether the first reconciliation is done and events flow.
func (d *Daemon) Ready() bool { return d.ready.Load() }

// SetMonitoring flips the switch of patent claim 2 on the running daemon.
// Turning it back on reconciles from /proc, since nothing was observed
// while it was off.
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
	wg.Add(1)
	go func() { defer wg.Done(); d.writer.Run(ctx) }()

	d.enforcer.ctx = ctx
	if d.docker != nil {
		wg.Add(1)
		go func() { defer wg.Done(); d.docker.Run(ctx) }()
	}
	if d.cri != nil {
		wg.Add(1)
		go func() { defer wg.Done(); d.cri.Run(ctx) }()
	}
	if d.plugin != nil {
		wg.Add(2)
		go func() { defer wg.Done(); d.lender.run(ctx) }()
		go func() { defer wg.Done(); d.plugin.Run(ctx) }()
	}
	if d.pods != nil {
		wg.Add(2)
		go func() { defer wg.Done(); d.pods.Run(ctx) }()
		go func() { defer wg.Done(); d.events.run(ctx) }()
	}
	defer d.executor.Wait()
	defer d.journal.Close()

	if d.cfg.MetricsAddr != "" {
		wg.Add(1)
		go func() { defer wg.Done(); d.serveMetrics(ctx) }()
	}

	var ctl *controlServer
	if d.cfg.ControlSocket != "" {
		var err error
		ctl, err = d.serveControl(d.cfg.ControlSocket)
		if err != nil {
			cancel()
			wg.Wait()
			return err
		}
		defer ctl.Close()
	}

	errc := make(chan error, 1)
	wg.Add(1)
	go func() {
		defer wg.Done()
		errc <- d.tracker.Run(ctx, d.mon)
	}()
	wg.Add(1)
	go func() { defer wg.Done(); d.periodic(ctx) }()
	if d.mon.Adopted() {
		wg.Add(1)
		go func() { defer wg.Done(); d.takeOver(ctx) }()
	}
	d.ready.Store(true)

	var err error
	select {
	case <-ctx.Done():
	case err = <-errc:
		if err != nil {
			err = fmt.Errorf("reading kernel events: %w", err)
		}
	}
	cancel()
	wg.Wait()
	d.log.Info("gpud stopped")
	return err
}

// periodic runs the heartbeat, idle detection, NVML sampling and the safety
// resync.
func (d *Daemon) periodic(ctx context.Context) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	lastResync := time.Now()
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
				act, err := d.nvml.Sample()
				if err != nil && !nvmlFailing {
					d.log.Warn("NVML sampling failing: activity falls back to GPU opens", "error", err)
				}
				nvmlFailing = err != nil
				for gpu, a := range act {
					d.ledger.Activity(gpu, a.At)
					if d.lender != nil {
						d.lender.activity(gpu, a.PIDs)
					}
				}
			}
			d.ledger.Refresh(now)
			d.ledger.RefreshComms(d.tracker.Proc.Comm)
			d.enforcer.sync()
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

// setupEnforcement builds the priority registry (fed by Docker), the
// preemption journal and executor, and the enforcer.
func (d *Daemon) setupEnforcement(cgroupRoot string) error {
	cfg := d.cfg
	d.registry = &priority.Registry{Default: cfg.DefaultPriority, Log: d.log}
	d.registry.OnChange = func(cgroupID uint64, p occupancy.Priority) {
		var err error
		switch p {
		case occupancy.High:
			err = d.mon.SetCgroupPriority(cgroupID, bpf.PrioHigh)
		case occupancy.Low:
			err = d.mon.SetCgroupPriority(cgroupID, bpf.PrioLow)
		default:
			err = d.mon.ForgetCgroup(cgroupID)
		}
		if err != nil {
			d.log.Error("updating the gate's cgroups", "cgroup_id", cgroupID, "error", err)
		}
		if d.ledger != nil {
			d.ledger.Reclassify(d.registry.ClassifyProc)
		}
	}
	stateDir := cfg.StateDir
	if stateDir == "" {
		stateDir = "/var/lib/gpud"
	}
	j, skipped, err := preempt.OpenJournal(filepath.Join(stateDir, "preemptions.jsonl"), 50)
	if err != nil {
		return fmt.Errorf("%w: --state-dir: %w", ErrConfig, err)
	}
	if skipped > 0 {
		d.log.Warn("preemption journal: skipped unreadable lines", "lines", skipped)
	}
	d.journal = j
	// Kills a previous gpud started but did not live to record.
	if n, err := j.Resolve(func(r preempt.Record) string {
		if _, err := os.Stat(filepath.Join("/proc", strconv.Itoa(r.Victim.PID))); errors.Is(err, os.ErrNotExist) {
			return "gone (gpud restarted during the kill)"
		}
		return "interrupted (gpud restarted before confirming the kill)"
	}); err != nil {
		return fmt.Errorf("preemption journal: %w", err)
	} else if n > 0 {
		d.log.Warn("preemption journal: resolved kills a previous gpud left pending", "records", n)
	}
	reclaim := cfg.Reclaim
	if reclaim == "" {
		reclaim = preempt.ReclaimStop
	}
	var runtimes preempt.Runtimes
	rc := &preempt.Reclaimer{Mode: reclaim, Log: d.log, Runtime: &runtimes,
		// A reclaimed container's waiting requests go with it (claim 5).
		Done: func(key string, err error) {
			if err != nil {
				d.log.Warn("reclaim failed", "workload", key, "error", err)
			} else if d.enforcer != nil {
				d.enforcer.dropWaiters(key)
			}
		}}
	if cfg.DockerHost != "none" {
		opts := []client.Opt{client.FromEnv, client.WithAPIVersionNegotiation()}
		if cfg.DockerHost != "" {
			opts = append(opts, client.WithHost(cfg.DockerHost))
		}
		cli, err := client.NewClientWithOpts(opts...)
		if err != nil {
			return fmt.Errorf("%w: docker: %w", ErrConfig, err)
		}
		runtimes.Containers = preempt.DockerRuntime{Client: cli}
		d.docker = &priority.Docker{Client: cli, Registry: d.registry, CgroupRoot: cgroupRoot, Log: d.log, Synced: d.source()}
	}
	if kc, err := kubeClient(cfg.KubeConfig); err != nil {
		return fmt.Errorf("%w: --kubeconfig: %w", ErrConfig, err)
	} else if kc != nil {
		if cfg.NodeName == "" {
			return fmt.Errorf("%w: --node-name (or NODE_NAME) is required with an API server", ErrConfig)
		}
		d.pods = &priority.Pods{Client: kc, Node: cfg.NodeName, Registry: d.registry, CgroupRoot: cgroupRoot, Log: d.log, Synced: d.source()}
		runtimes.Pods = preempt.PodRuntime{Client: kc}
		d.events = newPodEvents(kc, d.registry, cfg.NodeName, d.log)
	} else if ep := criEndpoint(cfg.CRIEndpoint); ep != "" {
		// No API server: pod labels from the runtime's sandboxes; pods are
		// not reclaimed (only the API server can evict).
		d.cri = &priority.CRI{Endpoint: ep, Registry: d.registry, CgroupRoot: cgroupRoot, Log: d.log, Synced: d.source()}
	}
	d.executor = &preempt.Executor{
		ProcRoot: "/proc", Grace: cfg.PreemptGrace, CheckpointRoot: cfg.CheckpointRoot,
		Journal: j, Reclaimer: rc, Log: d.log,
		Recorded: func(r preempt.Record) {
			d.writer.Kick()
			if d.events != nil {
				d.events.record(r)
			}
		},
		Holds: func(pid, gpu int) bool {
			return d.tracker.Proc.HoldsGPU(pid, gpu, d.ledger.FDs(pid, gpu))
		},
	}
	ttl := cfg.ReservationTTL
	if ttl == 0 {
		ttl = 30 * time.Second
	}
	d.enforcer = newEnforcer(d, d.registry, d.executor, ttl)
	return nil
}

// Registry exposes the priority registry (tests classify cgroups with it).
func (d *Daemon) Registry() *priority.Registry { return d.registry }

// Journal exposes the preemption journal.
func (d *Daemon) Journal() *preempt.Journal { return d.journal }

// Reservation reports whom gpu is reserved for (claim 5), by cgroup id.
func (d *Daemon) Reservation(gpu int) (uint64, bool) { return d.enforcer.reservation(gpu) }

// kubeClient returns a client for the API server named by kubeconfig, or
// the in-cluster one when gpud runs in a pod, or nil without either.
func kubeClient(kubeconfig string) (kubernetes.Interface, error) {
	var rc *rest.Config
	var err error
	switch {
	case kubeconfig != "":
		rc, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	case os.Getenv("KUBERNETES_SERVICE_HOST") != "":
		rc, err = rest.InClusterConfig()
	default:
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	rc.UserAgent = "gpud"
	return kubernetes.NewForConfig(rc)
}

// criEndpoint resolves --cri-endpoint: "none" disables, "" picks the first
// default runtime socket that exists.
func criEndpoint(v string) string {
	switch v {
	case "none":
		return ""
	case "":
		for _, p := range []string{"/run/containerd/containerd.sock", "/run/crio/crio.sock"} {
			if st, err := os.Stat(p); err == nil && st.Mode()&os.ModeSocket != 0 {
				return p
			}
		}
		return ""
	}
	return v
}

func orDefault(v, def string) string {
	if v == "" {
		return def
	}
	return v
}

// setupLending builds the lender and its device plugin.
func (d *Daemon) setupLending() {
	cfg := d.cfg
	d.lender = newLender(d, orDefault(cfg.ResourceName, "gpud.io/idle-gpu"), orDefault(cfg.OwnerResource, "nvidia.com/gpu"),
		orDefault(cfg.PodResourcesSocket, "/var/lib/kubelet/pod-resources/kubelet.sock"), cfg.LendFree)
	d.plugin = &deviceplugin.Plugin{
		ResourceName: d.lender.resource, KubeletDir: orDefault(cfg.KubeletDir, "/var/lib/kubelet/device-plugins"),
		Endpoint: "gpud.sock", Backend: d.lender, Log: d.log,
	}
	d.ledger.OnChange(func() { d.writer.Kick(); d.lender.ledgerChanged() })
	d.writer.Decorate = d.lender.decorate
}

// Plugin exposes the device plugin (tests).
func (d *Daemon) Plugin() *deviceplugin.Plugin { return d.plugin }
