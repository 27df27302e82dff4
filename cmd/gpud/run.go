package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/gpud/gpud/bpf"
	"github.com/gpud/gpud/internal/cgroups"
	"github.com/gpud/gpud/internal/config"
	"github.com/gpud/gpud/internal/daemon"
	"github.com/gpud/gpud/internal/httpserve"
	"github.com/gpud/gpud/internal/logging"
	"github.com/gpud/gpud/internal/metrics"
	"github.com/gpud/gpud/internal/nvidia"
	"github.com/gpud/gpud/internal/occupancy"
	"github.com/gpud/gpud/internal/selfmem"
	"github.com/gpud/gpud/internal/sharing/compute"
	"github.com/gpud/gpud/internal/uninstall"
	"github.com/gpud/gpud/internal/workload"
)

func defaultNode() string {
	if n := os.Getenv("NODE_NAME"); n != "" {
		return n
	}
	h, _ := os.Hostname()
	return h
}

// runOptions is what `gpud run` is told, from every source.
type runOptions struct {
	cfg        daemon.Config
	logLevel   string
	level      slog.Level
	nvml       string
	lendMinMem string
	draMem     [4]string // reserve, min, step, default
	defPrio    string
	monitoring bool
	configFile string
	uninstall  bool
}

// runFlags defines every `gpud run` setting: the flag's name is also its
// GPUD_* environment variable and its key in the --config file, and its
// default and help are the only ones (see internal/config).
func runFlags() (*pflag.FlagSet, *runOptions) {
	fs := pflag.NewFlagSet("run", pflag.ContinueOnError)
	fs.SetOutput(io.Discard) // errors are reported once, by exitCode
	fs.SortFlags = false     // help lists them in this order
	o := &runOptions{}
	cfg := &o.cfg
	def := config.Defaults()
	fs.StringVar(&o.configFile, config.FileFlag, "", "YAML settings file (version: v1, keys: these flags' names)")
	fs.StringVar(&cfg.DevDir, "dev-dir", def.DevDir, "directory holding the nvidiaN device nodes")
	fs.StringVar(&cfg.StateFile, "state-file", def.StateFile, "state file (JSON, rewritten atomically on every change)")
	fs.StringVar(&cfg.StateDir, "state-dir", def.StateDir, "durable data (journal, settings)")
	fs.StringVar(&cfg.ControlSocket, "control-socket", def.ControlSocket, "control API socket (empty disables)")
	fs.DurationVar(&cfg.IdleAfter, "idle-after", def.IdleAfter, "a held GPU with no activity for this long is idle (reloadable)")
	fs.DurationVar(&cfg.ResyncInterval, "resync-interval", def.ResyncInterval, "safety-net reconciliation from /proc (0 disables)")
	fs.StringVar(&cfg.NodeName, "node-name", defaultNode(), "node name in the state file ($NODE_NAME or the hostname)")
	fs.StringVar(&cfg.CgroupRoot, "cgroup-root", "", "cgroup v2 mount point (default: detected)")
	fs.Var(config.NewList(&cfg.CgroupParents, def.CgroupParents, cgroups.CheckParent), "cgroup-parents", "more cgroup v2 parents where runtimes make workload cgroups")
	fs.Var(config.NewEnum(&o.nvml, "auto", "auto", "off"), "nvml", "NVML for UUIDs, utilization, memory, MIG and health: `auto|off`")
	fs.StringVar(&cfg.NVMLLibrary, "nvml-library", def.NVMLLibrary, "libnvidia-ml's path under --driver-root (empty: searched)")
	fs.StringVar(&cfg.DriverRoot, "driver-root", def.DriverRoot, "the NVIDIA driver's files as gpud sees them (/ on a host)")
	fs.StringVar(&cfg.MIGMinorsFile, "mig-minors-file", def.MIGMinorsFile, "MIG capability table: each MIG slice a GPU, by its nvidia-caps node")
	fs.Var(config.NewEnum(&o.logLevel, "info", "debug", "info", "warn", "error"), "log-level", "log level: `debug|info|warn|error` (reloadable)")
	fs.BoolVar(&o.monitoring, "monitoring", true, "the monitoring switch at start (unset: the last one stays; reloadable)")
	fs.BoolVar(&cfg.Enforce, "enforce", def.Enforce, "enforce the priority rules in the kernel gate (false: observe only)")
	fs.DurationVar(&cfg.FailOpenAfter, "fail-open-after", def.FailOpenAfter, "the gate allows everything after this long without gpud")
	fs.Var(config.NewEnum(&o.defPrio, string(def.DefaultPriority), "unmanaged", "low", "high"), "default-priority", "class of unlabelled workloads: `unmanaged|low|high` (reloadable)")
	fs.DurationVar(&cfg.PreemptGrace, "preempt-grace", 0, "SIGTERM → SIGKILL delay of preempted processes (reloadable)")
	fs.Var(config.NewEnum(&cfg.PreemptMode, def.PreemptMode, "kill", "freeze", "checkpoint"), "preempt-mode", "how low-priority holders are preempted: `kill|freeze|checkpoint`")
	fs.Var(config.NewList(&cfg.PreemptModeNamespaces, def.PreemptModeNamespaces, workload.CheckPreemptModeNamespace), "preempt-mode-namespaces", "modes pods may choose by label: namespace=mode,... (\"\": only kill)")
	fs.Var(config.NewList(&cfg.PreemptModeContainers, def.PreemptModeContainers, workload.CheckPreemptModeChoice), "preempt-mode-containers", "modes Docker containers may choose by label (\"\": only kill)")
	fs.Var(config.NewEnum(&cfg.CheckpointFallback, def.CheckpointFallback, "freeze", "kill"), "checkpoint-fallback", "where the CUDA checkpoint cannot be done: `freeze|kill`")
	fs.DurationVar(&cfg.CheckpointTimeout, "checkpoint-timeout", def.CheckpointTimeout, "bound on one process's CUDA lock in --preempt-mode checkpoint")
	fs.StringVar(&cfg.CUDALibrary, "cuda-library", "", "libcuda's path under --driver-root (empty: searched)")
	fs.DurationVar(&cfg.MaxFrozen, "max-frozen", def.MaxFrozen, "a workload frozen this long is killed and reclaimed (0: never)")
	fs.Var(config.NewEnum(&cfg.Reclaim, def.Reclaim, "stop", "remove", "evict", "delete", "none"), "reclaim", "fate of a preempted or refused workload: `stop|remove|evict|delete|none`")
	fs.DurationVar(&cfg.ReservationTTL, "reservation-ttl", def.ReservationTTL, "how long a freed GPU waits for its earliest refused requester")
	fs.StringVar(&cfg.CheckpointRoot, "checkpoint-root", def.CheckpointRoot, "where gpud-preempted.json notices go, one directory per task")
	fs.StringVar(&cfg.HostCheckpointRoot, "host-checkpoint-root", "", "--checkpoint-root as the host sees it (default: the same)")
	fs.StringVar(&cfg.KubeConfig, "kubeconfig", "", "API server for pod labels (default: in-cluster in a pod, else none)")
	fs.StringVar(&cfg.CRIEndpoint, "cri-endpoint", "", "runtime socket for pod labels without an API server (none disables)")
	fs.StringVar(&cfg.NRISocket, "nri-socket", def.NRISocket, "the runtime's NRI socket, to classify pods first (none disables)")
	fs.Var(config.NewList(&cfg.AgentComms, def.AgentComms, workload.CheckComm), "agent-comms", "process names of the host's system agents (\"\": none)")
	fs.Var(config.NewList(&cfg.AgentNamespaces, def.AgentNamespaces, workload.CheckNamespace), "agent-namespaces", "namespaces whose pods may be system agents (\"\": none)")
	fs.Var(config.NewList(&cfg.AgentLabels, def.AgentLabels, workload.CheckLabel), "agent-labels", "key=glob labels of agent pods in --agent-namespaces (\"\": all)")
	fs.Var(config.NewList(&cfg.PriorityClasses, def.PriorityClasses, workload.CheckPriorityClass), "priority-classes",
		"pod priority to class, over the label: high>=1000,low<1000 (\"\": label only)")
	fs.BoolVar(&cfg.DevicePlugin, "device-plugin", false, "lend idle GPUs to kubelet as --resource-name (device plugin)")
	fs.StringVar(&cfg.ResourceName, "resource-name", def.ResourceName, "extended resource of lent GPUs")
	fs.StringVar(&cfg.OwnerResource, "owner-resource", def.OwnerResource, "resource through which pods own GPUs (their owners)")
	fs.StringVar(&cfg.KubeletDir, "kubelet-dir", def.KubeletDir, "kubelet's device-plugin directory (kubelet.sock)")
	fs.StringVar(&cfg.PodResourcesSocket, "pod-resources-socket", def.PodResourcesSocket, "kubelet's PodResources socket")
	fs.StringVar(&cfg.HostDevDir, "host-dev-dir", "", "--dev-dir as the host sees it (default: the same)")
	fs.BoolVar(&cfg.LendFree, "lend-free", false, "also lend GPUs nobody holds (not only idle ones)")
	fs.StringVar(&o.lendMinMem, "lend-min-free-memory", resource.NewQuantity(int64(def.LendMinFreeMemory), resource.BinarySI).String(), "lend a GPU only with this much free memory, e.g. 4Gi (0: any)")
	fs.Var(config.NewList(&cfg.CDISpecDirs, def.CDISpecDirs, config.CheckAbsPath), "cdi-spec-dirs", "the container runtime's CDI spec directories")
	fs.StringVar(&cfg.CDIKind, "cdi-kind", def.CDIKind, "CDI kind lent GPUs are named under, as KIND=<UUID> (empty: none)")
	fs.BoolVar(&cfg.DRA, "dra", false, "share GPUs by memory through DRA (kubelet plugin, driver gpud.io)")
	fs.Var(config.NewList(&cfg.DRASharedGPUs, def.DRASharedGPUs, checkShared), "dra-shared-gpus", "GPUs shared by memory: all, none, or UUIDs and indexes")
	size := func(p *string, name string, v uint64, help string) {
		fs.StringVar(p, name, resource.NewQuantity(int64(v), resource.BinarySI).String(), help)
	}
	size(&o.draMem[0], "dra-memory-reserve", def.DRAMemoryReserve, "memory of each shared GPU kept out of its shares")
	size(&o.draMem[1], "dra-memory-min", def.DRAMemoryMin, "smallest share of a GPU's memory a claim may ask")
	size(&o.draMem[2], "dra-memory-step", def.DRAMemoryStep, "shares are rounded up to a multiple of this (0: any size)")
	size(&o.draMem[3], "dra-memory-default", def.DRAMemoryDefault, "the share of a request that asks no memory")
	fs.DurationVar(&cfg.ComputeSlice, "compute-slice", def.ComputeSlice, "a compute-sharing pod's shortest run with the token")
	fs.DurationVar(&cfg.ComputePeriod, "compute-period", def.ComputePeriod, "a busy compute-sharing pod is frozen at most this long in a row")
	fs.StringVar(&cfg.DRAPluginDir, "dra-plugin-dir", def.DRAPluginDir, "the DRA plugin's directory as the host sees it")
	fs.StringVar(&cfg.DRARegistryDir, "dra-registry-dir", def.DRARegistryDir, "kubelet's plugin registration directory as the host sees it")
	fs.StringVar(&cfg.DRACDIDir, "dra-cdi-dir", def.DRACDIDir, "where the CDI specs of prepared claims are written")
	fs.StringVar(&cfg.MetricsAddr, "metrics-addr", def.MetricsAddr, "Prometheus /metrics, /healthz and /readyz address (empty disables)")
	fs.StringVar(&cfg.MetricsWebConfig, "metrics-web-config", def.MetricsWebConfig, "TLS and basic auth of --metrics-addr: a web config file")
	fs.StringVar(&cfg.HealthAddr, "health-addr", def.HealthAddr, "/healthz and /readyz alone, plain HTTP, e.g. 127.0.0.1:9408")
	fs.StringVar(&cfg.PprofAddr, "pprof-addr", def.PprofAddr, "Go profiles on this loopback address, e.g. 127.0.0.1:6060")
	fs.StringVar(&cfg.PinDir, "bpf-pin-dir", def.PinDir, "bpffs directory keeping the gate pinned across restarts")
	fs.Var(config.NewEnum(&cfg.Hooks, def.Hooks, "driver", "syscalls"), "hooks", "how the kernel side sees GPU fds: `driver|syscalls`")
	fs.StringVar(&cfg.DriverSymbols, "driver-symbols", "", "kernel functions --hooks driver probes: `SYMS`, release=a,b;receive=c")
	fs.BoolVar(&cfg.KeepEnforcing, "keep-enforcing", def.KeepEnforcing, "on stop, the pinned gate enforces until --fail-open-after")
	fs.BoolVar(&o.uninstall, "uninstall", false, "deprecated: gpud uninstall")
	fs.StringVar(&cfg.DockerHost, "docker-host", "", "Docker engine for labels and reclaim (none disables)")
	// gpud uninstall is the one command that removes gpud from a node:
	// --uninstall stays for the scripts that use it, out of the help.
	_ = fs.MarkHidden("uninstall")
	groupRunFlags(fs)
	return fs, o
}

// checkShared accepts one element of --dra-shared-gpus.
func checkShared(s string) error {
	if s == "all" || s == "none" || strings.HasPrefix(s, "GPU-") || strings.HasPrefix(s, "MIG-") {
		return nil
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return fmt.Errorf("%q is neither all, none, a GPU UUID (GPU-...) nor an index", s)
		}
	}
	return nil
}

// flagOnly are actions, not settings: never from the environment or the
// file, where a forgotten GPUD_UNINSTALL=true would stop every start.
var flagOnly = []string{"uninstall"}

// notSettings are the GPUD_* variables gpud gives workloads (lending's
// GPUD_GPU and GPUD_OWNER, NRI's GPUD_RESUME_FROM, DRA's GPUD_GPU_UUID and
// GPUD_GPU_MEMORY_LIMIT_MIB): no setting, and no misspelt one either.
var notSettings = []string{"GPUD_GPU", "GPUD_OWNER", "GPUD_RESUME_FROM", "GPUD_GPU_UUID", "GPUD_GPU_MEMORY_LIMIT_MIB"}

// reloadable are the settings SIGHUP applies to the running daemon.
var reloadable = map[string]bool{
	"idle-after": true, "default-priority": true, "preempt-grace": true, "monitoring": true, "log-level": true,
	config.FileFlag: true, // where the file is: only what it says matters
}

// loadRun reads `gpud run`'s settings from flags, the environment and the
// file, and checks them. Errors are one line naming the setting and where
// its value came from.
func loadRun(args []string, src config.Sources) (*runOptions, *config.Settings, error) {
	fs, o := runFlags()
	src.FlagOnly = flagOnly
	src.NotSettings = notSettings
	s, err := config.Load(fs, args, src)
	if err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return nil, nil, err
		}
		return nil, nil, usagef("run: %v", err)
	}
	cfg := &o.cfg
	bad := func(name, format string, args ...any) error {
		return usagef("run: %v", s.Invalid(name, format, args...))
	}
	if err := o.level.UnmarshalText([]byte(o.logLevel)); err != nil {
		return nil, nil, bad("log-level", "%v", err)
	}
	cfg.UseNVML = o.nvml == "auto"
	q, err := resource.ParseQuantity(o.lendMinMem)
	if err != nil || q.Sign() < 0 {
		return nil, nil, bad("lend-min-free-memory", "want a size such as 4Gi or 512Mi, got %q", o.lendMinMem)
	}
	cfg.LendMinFreeMemory = uint64(q.Value())
	for i, name := range []string{"dra-memory-reserve", "dra-memory-min", "dra-memory-step", "dra-memory-default"} {
		q, err := resource.ParseQuantity(o.draMem[i])
		if err != nil || q.Sign() < 0 || (i != 0 && i != 2 && q.Sign() == 0) {
			return nil, nil, bad(name, "want a positive size such as 4Gi or 256Mi, got %q", o.draMem[i])
		}
		*[]*uint64{&cfg.DRAMemoryReserve, &cfg.DRAMemoryMin, &cfg.DRAMemoryStep, &cfg.DRAMemoryDefault}[i] = uint64(q.Value())
	}
	cfg.DefaultPriority = occupancy.Priority(o.defPrio)
	for name, v := range map[string]time.Duration{"fail-open-after": cfg.FailOpenAfter, "reservation-ttl": cfg.ReservationTTL, "idle-after": cfg.IdleAfter,
		"compute-slice": cfg.ComputeSlice, "compute-period": cfg.ComputePeriod} {
		if v <= 0 {
			return nil, nil, bad(name, "must be positive, got %s", v)
		}
	}
	for name, v := range map[string]time.Duration{"preempt-grace": cfg.PreemptGrace, "resync-interval": cfg.ResyncInterval, "max-frozen": cfg.MaxFrozen} {
		if v < 0 {
			return nil, nil, bad(name, "must not be negative, got %s", v)
		}
	}
	if cfg.ComputeSlice >= cfg.ComputePeriod {
		return nil, nil, bad("compute-slice", "must be shorter than --compute-period (%s), got %s", cfg.ComputePeriod, cfg.ComputeSlice)
	}
	if err := checkLoopback(cfg.PprofAddr); err != nil {
		return nil, nil, bad("pprof-addr", "%v", err)
	}
	if err := httpserve.CheckWebConfig(cfg.MetricsWebConfig); err != nil {
		return nil, nil, bad("metrics-web-config", "%v", err)
	}
	if err := config.CheckCDIKind(cfg.CDIKind); err != nil {
		return nil, nil, bad("cdi-kind", "%v", err)
	}
	if _, err := bpf.ParseDriverSymbols(cfg.DriverSymbols); err != nil {
		return nil, nil, bad("driver-symbols", "%v", err)
	}
	if strings.TrimSpace(cfg.StateFile) == "" {
		return nil, nil, bad("state-file", "is empty")
	}
	cfg.Version = version
	return o, s, nil
}

// warnUnknownEnv logs each GPUD_* variable no setting reads: a misspelt
// setting (GPUD_IDEL_AFTER) would otherwise be ignored without a word.
func warnUnknownEnv(log *slog.Logger, s *config.Settings) {
	for _, u := range s.UnknownEnv {
		attrs := []any{"variable", u.Name}
		if u.Suggestion != "" {
			attrs = append(attrs, "did_you_mean", u.Suggestion)
		}
		log.Warn(u.String(), attrs...)
	}
}

// newLogger is gpud run's logger: JSON lines on w, client-go's and gRPC's
// included (one stream a log collector can parse).
func newLogger(w io.Writer, level *slog.LevelVar) *slog.Logger {
	log := slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: level}))
	logging.Route(log)
	return log
}

// compared are a load's values as a reload compares them: monitoring counts
// only when set, so that an unset switch leaves `gpud monitor`'s alone.
func compared(s *config.Settings) map[string]string {
	v := s.Values()
	if !s.Explicit("monitoring") {
		v["monitoring"] = ""
	}
	return v
}

const runAbout = `Runs the node daemon (as root).

Every setting can also be set with GPUD_<FLAG> (e.g. GPUD_IDLE_AFTER=10m) or as
a key of the --config file (idle-after: 10m, after version: v1). A flag wins
over the environment, which wins over the file. SIGHUP reloads the file and the
environment and applies the settings marked reloadable.`

// newRunCmd is `gpud run`. cobra does not parse its flags: internal/config
// does, from the command line, the environment and the file alike, with
// errors naming the setting and its source. cobra is given the same flag
// set for -h and completion only.
func newRunCmd() *cobra.Command {
	c := &cobra.Command{
		Use:                "run [flags]",
		Short:              "run the node daemon (root); settings also from GPUD_* and --config FILE",
		Long:               runAbout,
		DisableFlagParsing: true,
		RunE: ran(func(c *cobra.Command, args []string) error {
			err := cmdRun(args)
			if errors.Is(err, pflag.ErrHelp) {
				return c.Help()
			}
			return err
		}),
	}
	fs, _ := runFlags()
	c.Flags().SortFlags = false
	c.Flags().AddFlagSet(fs)
	c.SetUsageFunc(runUsage)
	// Flag values to complete: cobra completes flag names of a command
	// that parses its own flags, values are this function's.
	values := map[string][]string{
		"nvml": {"auto", "off"}, "log-level": {"debug", "info", "warn", "error"},
		"default-priority": {"unmanaged", "low", "high"}, "reclaim": {"stop", "remove", "evict", "delete", "none"},
	}
	c.ValidArgsFunction = func(_ *cobra.Command, args []string, _ string) ([]cobra.Completion, cobra.ShellCompDirective) {
		if len(args) > 0 {
			if v, ok := values[strings.TrimLeft(args[len(args)-1], "-")]; ok {
				return v, cobra.ShellCompDirectiveNoFileComp
			}
		}
		return nil, cobra.ShellCompDirectiveDefault
	}
	return c
}

func cmdRun(args []string) error {
	// Before anything slow: SIGHUP's default action would end gpud.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	// Caught from here on, not only once gpud runs: a SIGTERM's default
	// action during start-up would end gpud with its gate attached and
	// pinned (with --keep-enforcing=false nothing may outlive gpud). A stop
	// asked for while starting is honoured once start-up returns.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	o, s, err := loadRun(args, config.Sources{})
	if err != nil {
		return err
	}
	if o.uninstall {
		// What it always did (the gate alone), by gpud uninstall's code.
		fmt.Fprintln(os.Stderr, "gpud: run --uninstall is deprecated: use gpud uninstall (it removes gpud's files too; --keep-records keeps the journal)")
		if o.cfg.PinDir == "" {
			return usagef("run: --uninstall needs --bpf-pin-dir")
		}
		if err := uninstall.Node(uninstall.Paths{PinDir: o.cfg.PinDir}, slog.New(slog.DiscardHandler)); err != nil {
			return fmt.Errorf("run: uninstall: %w", err)
		}
		fmt.Printf("gpud: removed the gate pinned under %s (if any)\n", o.cfg.PinDir)
		return nil
	}
	level := new(slog.LevelVar)
	level.Set(o.level)
	log := newLogger(os.Stderr, level)
	if s.File != "" {
		log.Info("settings file read", "file", s.File)
	}
	warnUnknownEnv(log, s)

	if o.cfg.PprofAddr != "" {
		if err := servePprof(ctx, o.cfg.PprofAddr, log); err != nil {
			return fmt.Errorf("run: --pprof-addr: %w", err)
		}
	}
	r := &reloader{args: args, log: log, level: level}
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
				r.reload(config.Sources{})
			}
		}
	}()
	for started := false; ; started = true {
		if started {
			// A new daemon on a changed GPU set starts as a restarted gpud
			// would: from the settings as they are now.
			if o2, s2, err := loadRun(args, config.Sources{}); err != nil {
				log.Error("settings now unreadable: starting again with the ones in force", "error", strings.TrimPrefix(err.Error(), "run: "))
			} else {
				o, s = o2, s2
				level.Set(o.level)
			}
		}
		if err := waitForGPUs(ctx, o.cfg, log); err != nil {
			if ctx.Err() != nil {
				log.Info("stopped while waiting for GPU device nodes")
				return nil
			}
			return usagef("run: %v", err)
		}
		o.cfg.ReloadsRefused = configRefused.Load
		compute.GuardExe = "/proc/self/exe" // this binary, even if replaced on disk since: its thaw-guard
		d, err := daemon.New(o.cfg, log)
		if errors.Is(err, nvidia.ErrNoGPUs) {
			continue // gone again since the wait saw them
		}
		if err != nil {
			if errors.Is(err, daemon.ErrConfig) {
				return usagef("run: %v", strings.TrimPrefix(err.Error(), "config: "))
			}
			return err
		}
		if ctx.Err() != nil {
			log.Info("stopped during start-up")
			return d.Close()
		}
		// Start-up's garbage (the kernel's BTF decoded for the programs'
		// relocations, the first /proc scan) goes back to the OS now, not over
		// the scavenger's minutes: most of an idle gpud's heap was that.
		debug.FreeOSMemory()
		// And the executable's pages that start-up alone touched (most of
		// its RSS: internal/selfmem), once start-up's code has run.
		go selfmem.ReleaseAfter(ctx, selfmem.After, log)
		if s.Explicit("monitoring") && d.Monitoring() != o.monitoring {
			if err := d.SetMonitoring(o.monitoring); err != nil {
				return errors.Join(fmt.Errorf("run: monitoring switch: %w", err), d.Close())
			}
		}
		r.set(d, compared(s))
		err = d.Run(ctx)
		r.set(nil, nil)
		if !errors.Is(err, daemon.ErrGPUsChanged) {
			return err
		}
	}
}

// waitForGPUs returns once cfg.DevDir has GPU device nodes (at once when
// it has). While it waits gpud is alive but not ready: /healthz answers
// 200 and /readyz 503 on the metrics and health addresses, so kubelet
// neither restarts it nor counts it ready, and the wait is logged once.
func waitForGPUs(ctx context.Context, cfg daemon.Config, log *slog.Logger) error {
	wctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	_, err := nvidia.WaitGPUs(wctx, cfg.DevDir, gpuWaitInterval, func(err error) {
		log.Warn("no GPU device nodes yet: waiting for them (the driver may still be installing)", "dev_dir", cfg.DevDir, "error", err)
		notReady := metrics.HealthHandler(func() bool { return false })
		for _, a := range []struct{ addr, webConfig, name string }{
			{cfg.MetricsAddr, cfg.MetricsWebConfig, "metrics"}, {cfg.HealthAddr, "", "health"},
		} {
			if a.addr == "" {
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				httpserve.Run(wctx, a.addr, notReady, cfg.HTTPLimits, a.webConfig, a.name+" (waiting for GPUs)", log)
			}()
		}
	})
	return err
}

// gpuWaitInterval is how often a gpud with no GPU device node looks again.
const gpuWaitInterval = 2 * time.Second

// configRefused counts the SIGHUPs whose settings were refused (a bad
// value, an unsafe or unreadable file) since gpud started: the daemon
// serves it as gpud_config_reloads_refused_total.
var configRefused atomic.Uint64

// reloader applies SIGHUP: the settings are loaded again from the same
// command line, the environment and the file, and what may change at run
// time is applied; the rest is reported as needing a restart.
type reloader struct {
	args  []string
	log   *slog.Logger
	level *slog.LevelVar

	mu      sync.Mutex // a SIGHUP against a daemon being replaced
	d       interface{ Reload(daemon.Reloadable) error }
	running map[string]string // the values in force, as compared
}

// set names the running daemon and the settings it started with (nil
// between daemons: a SIGHUP then is only logged).
func (r *reloader) set(d interface{ Reload(daemon.Reloadable) error }, running map[string]string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.d, r.running = d, running
}

func (r *reloader) reload(src config.Sources) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.d == nil {
		r.log.Warn("reload: gpud is not running yet (waiting for GPUs); the settings are read when it starts")
		return
	}
	o, s, err := loadRun(r.args, src)
	if err != nil {
		// An unsafe settings file (another user could change it) lands
		// here too: nothing of it is taken.
		n := configRefused.Add(1)
		r.log.Error("reload: bad settings; the running ones stay", "error", strings.TrimPrefix(err.Error(), "run: "), "reloads_refused", n)
		return
	}
	now := compared(s)
	var applied, restart []string
	rl := daemon.Reloadable{IdleAfter: o.cfg.IdleAfter, DefaultPriority: o.cfg.DefaultPriority, PreemptGrace: o.cfg.PreemptGrace}
	for _, k := range config.Changed(r.running, now) {
		if !reloadable[k] {
			restart = append(restart, k)
			continue
		}
		applied = append(applied, k)
		if k == "monitoring" && s.Explicit("monitoring") {
			on := o.monitoring
			rl.Monitoring = &on
		}
	}
	if err := r.d.Reload(rl); err != nil {
		if errors.Is(err, daemon.ErrConfig) {
			configRefused.Add(1) // a value the daemon refuses: refused too
		}
		r.log.Error("reload: not applied; the running settings stay", "error", err)
		return
	}
	r.level.Set(o.level)
	for _, k := range applied {
		r.running[k] = now[k]
	}
	if len(restart) > 0 {
		r.log.Warn("reload: these settings changed but take effect only after a restart", "keys", restart)
	}
	r.log.Info("reload: done", "file", s.File, "changed", applied)
}
