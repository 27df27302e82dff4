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
	fs.StringVar(&o.configFile, config.FileFlag, "", "YAML settings file (version: v1, keys: these flags' names); flags and GPUD_* variables override it")
	fs.StringVar(&cfg.DevDir, "dev-dir", def.DevDir, "directory holding the nvidiaN device nodes")
	fs.StringVar(&cfg.StateFile, "state-file", def.StateFile, "state file (JSON, rewritten atomically on every change)")
	fs.StringVar(&cfg.StateDir, "state-dir", def.StateDir, "durable data (journal, settings)")
	fs.StringVar(&cfg.ControlSocket, "control-socket", def.ControlSocket, "control API socket (empty disables)")
	fs.DurationVar(&cfg.IdleAfter, "idle-after", def.IdleAfter, "a held GPU with no activity for this long is idle (reloadable)")
	fs.DurationVar(&cfg.ResyncInterval, "resync-interval", def.ResyncInterval, "safety-net reconciliation from /proc (0 disables)")
	fs.StringVar(&cfg.NodeName, "node-name", defaultNode(), "node name in the state file (default $NODE_NAME or the hostname)")
	fs.StringVar(&cfg.CgroupRoot, "cgroup-root", "", "cgroup v2 mount point (default: detected)")
	fs.Var(config.NewList(&cfg.CgroupParents, def.CgroupParents, cgroups.CheckParent), "cgroup-parents", "cgroup v2 paths, comma-separated, where a runtime makes containers (Docker's --cgroup-parent, e.g. /mycontainers or /my.slice) or kubelet makes pods (below its --cgroup-root, e.g. /kubelet/kubepods or /kubelet.slice/kubelet-kubepods.slice), trusted besides /docker, /system.slice and /kubepods[.slice]: a workload's cgroup elsewhere is a look-alike, its processes host processes (\"\": the defaults alone)")
	fs.Var(config.NewEnum(&o.nvml, "auto", "auto", "off"), "nvml", "use NVML for UUIDs, utilization, memory, MIG and health: `auto|off`")
	fs.StringVar(&cfg.NVMLLibrary, "nvml-library", def.NVMLLibrary, "libnvidia-ml's path under --driver-root, e.g. /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1; only a file root owns and only root can change is loaded (empty: the dynamic loader's search)")
	fs.StringVar(&cfg.DriverRoot, "driver-root", def.DriverRoot, "where the NVIDIA driver's files are as gpud sees them: / on a host, the host's driver root mounted into gpud's pod (e.g. /driver-root)")
	fs.Var(config.NewEnum(&o.logLevel, "info", "debug", "info", "warn", "error"), "log-level", "log level: `debug|info|warn|error` (reloadable)")
	fs.BoolVar(&o.monitoring, "monitoring", true, "the monitoring switch at start; unset, the last run's (or gpud monitor's) setting stays (reloadable)")
	fs.BoolVar(&cfg.Enforce, "enforce", def.Enforce, "enforce the priority rules in the kernel gate (false: observe only)")
	fs.DurationVar(&cfg.FailOpenAfter, "fail-open-after", def.FailOpenAfter, "the gate allows everything once gpud has not heartbeated for this long")
	fs.Var(config.NewEnum(&o.defPrio, string(def.DefaultPriority), "unmanaged", "low", "high"), "default-priority", "class of workloads without the gpud.io/priority label: `unmanaged|low|high` (reloadable)")
	fs.DurationVar(&cfg.PreemptGrace, "preempt-grace", 0, "SIGTERM → SIGKILL delay for preempted processes (0: SIGKILL at once; reloadable)")
	fs.Var(config.NewEnum(&cfg.PreemptMode, def.PreemptMode, "kill", "freeze", "checkpoint"), "preempt-mode", "how low-priority holders are preempted: `kill|freeze|checkpoint` (freeze: their workload's cgroup is frozen, nothing lost, and thawed once no high-priority process holds the GPU; checkpoint: each CUDA process's GPU memory is first moved to host memory through the driver's checkpoint API, releasing the GPU; a workload's gpud.io/preempt-mode label overrides it where --preempt-mode-namespaces or --preempt-mode-containers allows)")
	fs.Var(config.NewList(&cfg.PreemptModeNamespaces, def.PreemptModeNamespaces, workload.CheckPreemptModeNamespace), "preempt-mode-namespaces", "which preempt modes pods may choose with their gpud.io/preempt-mode label: namespace=mode entries (namespace * for every namespace), comma-separated; kill may always be chosen, a mode not allowed here is ignored and --preempt-mode applies (\"\": only kill)")
	fs.Var(config.NewList(&cfg.PreemptModeContainers, def.PreemptModeContainers, workload.CheckPreemptModeChoice), "preempt-mode-containers", "which preempt modes Docker containers may choose with their gpud.io/preempt-mode label (freeze, checkpoint), comma-separated; kill may always be chosen (\"\": only kill)")
	fs.Var(config.NewEnum(&cfg.CheckpointFallback, def.CheckpointFallback, "freeze", "kill"), "checkpoint-fallback", "what --preempt-mode checkpoint does where the CUDA checkpoint is unsupported or fails: `freeze|kill`")
	fs.DurationVar(&cfg.CheckpointTimeout, "checkpoint-timeout", def.CheckpointTimeout, "bound on the CUDA lock of one process in --preempt-mode checkpoint (a multi-process or NCCL job's lock can hang)")
	fs.StringVar(&cfg.CUDALibrary, "cuda-library", "", "libcuda's path under --driver-root for --preempt-mode checkpoint, loaded only when root's and only root can change it (empty: the first libcuda.so.1 in the library directories under --driver-root, or the dynamic loader's search on /)")
	fs.DurationVar(&cfg.MaxFrozen, "max-frozen", def.MaxFrozen, "a workload frozen by --preempt-mode freeze this long is killed and reclaimed (0: never)")
	fs.Var(config.NewEnum(&cfg.Reclaim, def.Reclaim, "stop", "remove", "evict", "delete", "none"), "reclaim", "what happens to a preempted or refused low-priority workload: `stop|remove|evict|delete|none` (stop/remove for containers, evict/delete for pods, stop=evict, remove=delete)")
	fs.DurationVar(&cfg.ReservationTTL, "reservation-ttl", def.ReservationTTL, "how long a freed GPU waits for its earliest refused low-priority requester")
	fs.StringVar(&cfg.CheckpointRoot, "checkpoint-root", def.CheckpointRoot, "where gpud-preempted.json notices go, one directory per task: <namespace>/<task id> (_docker/<task id> for a Docker container)")
	fs.StringVar(&cfg.HostCheckpointRoot, "host-checkpoint-root", "", "--checkpoint-root as the host sees it, for the checkpoint mounts NRI gives when gpud runs in a pod (default: the same)")
	fs.StringVar(&cfg.KubeConfig, "kubeconfig", "", "API server for pod labels (default: in-cluster config when in a pod, else none)")
	fs.StringVar(&cfg.CRIEndpoint, "cri-endpoint", "", "container runtime socket for pod labels when there is no API server (default: containerd's or CRI-O's if present; none disables)")
	fs.StringVar(&cfg.NRISocket, "nri-socket", def.NRISocket, "the container runtime's NRI socket: pods classified before their containers start, whenever it is there (none disables)")
	fs.Var(config.NewList(&cfg.AgentComms, def.AgentComms, workload.CheckComm), "agent-comms", "system agents by process name (comm, at most 15 bytes), comma-separated: a root host process outside every container and pod with one of these names is an agent (a container is one by its label gpud.io/agent=true), shown but never a holder (\"\" for none)")
	fs.Var(config.NewList(&cfg.AgentNamespaces, def.AgentNamespaces, workload.CheckNamespace), "agent-namespaces", "namespaces whose pods may be system agents (the GPU Operator's), comma-separated (\"\" for none)")
	fs.Var(config.NewList(&cfg.AgentLabels, def.AgentLabels, workload.CheckLabel), "agent-labels", "pods of --agent-namespaces with one of these labels (key=value, value may hold * and ?) are system agents, comma-separated (\"\": every pod of those namespaces)")
	fs.BoolVar(&cfg.DevicePlugin, "device-plugin", false, "lend idle GPUs to kubelet as --resource-name through a device plugin")
	fs.StringVar(&cfg.ResourceName, "resource-name", def.ResourceName, "extended resource of lent GPUs")
	fs.StringVar(&cfg.OwnerResource, "owner-resource", def.OwnerResource, "resource through which pods own GPUs (their owners)")
	fs.StringVar(&cfg.KubeletDir, "kubelet-dir", def.KubeletDir, "kubelet's device-plugin directory (kubelet.sock)")
	fs.StringVar(&cfg.PodResourcesSocket, "pod-resources-socket", def.PodResourcesSocket, "kubelet's PodResources socket")
	fs.StringVar(&cfg.HostDevDir, "host-dev-dir", "", "--dev-dir as the host sees it, for lent device nodes when gpud runs in a pod (default: the same)")
	fs.BoolVar(&cfg.LendFree, "lend-free", false, "also lend GPUs nobody holds (not only idle ones)")
	fs.StringVar(&o.lendMinMem, "lend-min-free-memory", resource.NewQuantity(int64(def.LendMinFreeMemory), resource.BinarySI).String(), "lend a GPU only with at least this much free memory, from NVML, e.g. 4Gi (0: any)")
	fs.Var(config.NewList(&cfg.CDISpecDirs, def.CDISpecDirs, config.CheckAbsPath), "cdi-spec-dirs", "the container runtime's CDI spec directories, comma-separated: a lent GPU is named by CDI only when a spec there defines it (a CDI-enabled runtime refuses an undefined device)")
	fs.StringVar(&cfg.CDIKind, "cdi-kind", def.CDIKind, "CDI kind a lent GPU is named under to CDI-enabled runtimes, as KIND=<UUID> when NVML gives the UUID (empty: no CDI device, only the node and NVIDIA_VISIBLE_DEVICES)")
	fs.BoolVar(&cfg.DRA, "dra", false, "share GPUs by memory through DRA: a kubelet plugin (driver gpud.io) publishes each shared GPU with its memory as a consumable capacity and prepares the claims the scheduler allocates on it")
	fs.Var(config.NewList(&cfg.DRASharedGPUs, def.DRASharedGPUs, checkShared), "dra-shared-gpus", "GPUs shared by memory: all, none, or UUIDs and indexes (N of /dev/nvidiaN), comma-separated")
	size := func(p *string, name string, v uint64, help string) {
		fs.StringVar(p, name, resource.NewQuantity(int64(v), resource.BinarySI).String(), help)
	}
	size(&o.draMem[0], "dra-memory-reserve", def.DRAMemoryReserve, "memory of each shared GPU kept out of its shares (the driver's and CUDA contexts' own)")
	size(&o.draMem[1], "dra-memory-min", def.DRAMemoryMin, "smallest share of a GPU's memory a claim may ask")
	size(&o.draMem[2], "dra-memory-step", def.DRAMemoryStep, "shares are rounded up to a multiple of this (0: any size)")
	size(&o.draMem[3], "dra-memory-default", def.DRAMemoryDefault, "the share of a request that asks no memory, e.g. each device of the gpud.io/gpu-mem extended resource")
	fs.StringVar(&cfg.DRAPluginDir, "dra-plugin-dir", def.DRAPluginDir, "the DRA plugin's directory as the host sees it (its socket; kubelet connects there)")
	fs.StringVar(&cfg.DRARegistryDir, "dra-registry-dir", def.DRARegistryDir, "kubelet's plugin registration directory as the host sees it")
	fs.StringVar(&cfg.DRACDIDir, "dra-cdi-dir", def.DRACDIDir, "where the CDI specs of prepared claims are written: one of the container runtime's CDI spec directories")
	fs.StringVar(&cfg.MetricsAddr, "metrics-addr", def.MetricsAddr, "Prometheus /metrics, /healthz and /readyz listen address (empty disables)")
	fs.StringVar(&cfg.MetricsWebConfig, "metrics-web-config", def.MetricsWebConfig, "TLS and basic auth for the metrics port: a Prometheus exporter-toolkit web config file, root's, that only root can change (empty: plain HTTP)")
	fs.StringVar(&cfg.HealthAddr, "health-addr", def.HealthAddr, "also serve /healthz and /readyz alone, plain HTTP, on this address, e.g. 127.0.0.1:9408 for kubelet's probes, where no pod without hostNetwork can reach or starve it (the chart always sets it; empty: metrics port only)")
	fs.StringVar(&cfg.PprofAddr, "pprof-addr", def.PprofAddr, "serve Go profiles (/debug/pprof/) on this loopback address, e.g. 127.0.0.1:6060 (empty disables; loopback only)")
	fs.StringVar(&cfg.PinDir, "bpf-pin-dir", def.PinDir, "bpffs directory where the gate stays pinned across gpud restarts and crashes (empty: the gate goes with the process)")
	fs.Var(config.NewEnum(&cfg.Hooks, def.Hooks, "driver", "syscalls"), "hooks", "how the kernel side observes GPU file descriptors: `driver|syscalls` (driver: the gate reports GPU opens, process events and kprobes on the GPU driver's release and receive_fd report the rest, nothing runs on the syscall path; where the kernel has no kprobes, closes are found by re-reading the holders' fd tables every 2s; syscalls: tracepoints on every syscall's entry and exit, which every syscall of every process on the node pays for, for kernels where the gate cannot report opens)")
	fs.StringVar(&cfg.DriverSymbols, "driver-symbols", "", "kernel functions --hooks driver probes: `release=SYM[,SYM...];receive=SYM[,SYM...]` (empty or a role left out: NVIDIA's, release=nvidia_close,nvidia_frontend_close;receive=receive_fd,__receive_fd)")
	fs.BoolVar(&cfg.KeepEnforcing, "keep-enforcing", def.KeepEnforcing, "on stop, leave the pinned gate enforcing the last decisions until --fail-open-after (false: remove it)")
	fs.BoolVar(&o.uninstall, "uninstall", false, "remove the pinned gate and its directory left by a previous gpud, then exit")
	fs.StringVar(&cfg.DockerHost, "docker-host", "", "Docker engine for labels and reclaim (default $DOCKER_HOST or the local socket; none disables)")
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
	for name, v := range map[string]time.Duration{"fail-open-after": cfg.FailOpenAfter, "reservation-ttl": cfg.ReservationTTL, "idle-after": cfg.IdleAfter} {
		if v <= 0 {
			return nil, nil, bad(name, "must be positive, got %s", v)
		}
	}
	for name, v := range map[string]time.Duration{"preempt-grace": cfg.PreemptGrace, "resync-interval": cfg.ResyncInterval, "max-frozen": cfg.MaxFrozen} {
		if v < 0 {
			return nil, nil, bad(name, "must not be negative, got %s", v)
		}
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
		if o.cfg.PinDir == "" {
			return usagef("run: --uninstall needs --bpf-pin-dir")
		}
		if err := bpf.Uninstall(o.cfg.PinDir); err != nil {
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
