package main

import (
	"context"
	"errors"
	"flag"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/gpud/gpud/internal/daemon"
	"github.com/gpud/gpud/internal/preempt"
	"github.com/gpud/gpud/internal/priority"
)

func newFlagSet(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard) // errors are reported once, by exitCode
	return fs
}

// parse parses args, turning flag errors into one-line usage errors.
func parse(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fs.SetOutput(os.Stdout)
			fs.PrintDefaults()
			os.Exit(0)
		}
		return usagef("%s: %v", fs.Name(), err)
	}
	if fs.NArg() > 0 {
		return usagef("%s: unexpected argument %q", fs.Name(), fs.Arg(0))
	}
	return nil
}

func defaultNode() string {
	if n := os.Getenv("NODE_NAME"); n != "" {
		return n
	}
	h, _ := os.Hostname()
	return h
}

func cmdRun(args []string) error {
	fs := newFlagSet("run")
	var cfg daemon.Config
	var logLevel, nvmlMode, defPrio string
	fs.StringVar(&cfg.DevDir, "dev-dir", "/dev", "directory holding the nvidiaN device nodes")
	fs.StringVar(&cfg.StateFile, "state-file", "/run/gpud/state.json", "state file (JSON, rewritten atomically on every change)")
	fs.StringVar(&cfg.StateDir, "state-dir", "/var/lib/gpud", "durable data (journal, settings)")
	fs.StringVar(&cfg.ControlSocket, "control-socket", "/run/gpud/gpud.sock", "control API socket (empty disables)")
	fs.DurationVar(&cfg.IdleAfter, "idle-after", 5*time.Minute, "a held GPU with no activity for this long is idle")
	fs.DurationVar(&cfg.ResyncInterval, "resync-interval", time.Minute, "safety-net reconciliation from /proc (0 disables)")
	fs.StringVar(&cfg.NodeName, "node-name", defaultNode(), "node name in the state file (default $NODE_NAME or the hostname)")
	fs.StringVar(&cfg.CgroupRoot, "cgroup-root", "", "cgroup v2 mount point (default: detected)")
	fs.StringVar(&nvmlMode, "nvml", "auto", "use NVML for UUIDs and utilization: auto|off")
	fs.StringVar(&logLevel, "log-level", "info", "debug|info|warn|error")
	fs.BoolVar(&cfg.Enforce, "enforce", true, "enforce the priority rules in the kernel gate (false: observe only)")
	fs.DurationVar(&cfg.FailOpenAfter, "fail-open-after", 30*time.Second, "the gate allows everything once gpud has not heartbeated for this long")
	fs.StringVar(&defPrio, "default-priority", "unmanaged", "class of workloads without the gpud.io/priority label: unmanaged|low|high")
	fs.DurationVar(&cfg.PreemptGrace, "preempt-grace", 0, "SIGTERM → SIGKILL delay for preempted processes (0: SIGKILL at once)")
	fs.StringVar(&cfg.Reclaim, "reclaim", "stop", "what happens to a preempted or refused low-priority workload: stop|remove|none for containers, evict|delete|none for pods (stop=evict, remove=delete)")
	fs.DurationVar(&cfg.ReservationTTL, "reservation-ttl", 30*time.Second, "how long a freed GPU waits for its earliest refused low-priority requester")
	fs.StringVar(&cfg.CheckpointRoot, "checkpoint-root", "/var/lib/gpud/checkpoints", "where gpud-preempted.json notices go, one directory per task id")
	fs.StringVar(&cfg.KubeConfig, "kubeconfig", "", "API server for pod labels (default: in-cluster config when in a pod, else none)")
	fs.StringVar(&cfg.CRIEndpoint, "cri-endpoint", "", "container runtime socket for pod labels when there is no API server (default: containerd's or CRI-O's if present; none disables)")
	fs.BoolVar(&cfg.DevicePlugin, "device-plugin", false, "lend idle GPUs to kubelet as --resource-name through a device plugin")
	fs.StringVar(&cfg.ResourceName, "resource-name", "gpud.io/idle-gpu", "extended resource of lent GPUs")
	fs.StringVar(&cfg.OwnerResource, "owner-resource", "nvidia.com/gpu", "resource through which pods own GPUs (their owners)")
	fs.StringVar(&cfg.KubeletDir, "kubelet-dir", "/var/lib/kubelet/device-plugins", "kubelet's device-plugin directory (kubelet.sock)")
	fs.StringVar(&cfg.PodResourcesSocket, "pod-resources-socket", "/var/lib/kubelet/pod-resources/kubelet.sock", "kubelet's PodResources socket")
	fs.StringVar(&cfg.HostDevDir, "host-dev-dir", "", "--dev-dir as the host sees it, for lent device nodes when gpud runs in a pod (default: the same)")
	fs.BoolVar(&cfg.LendFree, "lend-free", false, "also lend GPUs nobody holds (not only idle ones)")
	fs.StringVar(&cfg.MetricsAddr, "metrics-addr", ":9407", "Prometheus /metrics, /healthz and /readyz listen address (empty disables)")
	fs.StringVar(&cfg.DockerHost, "docker-host", "", "Docker engine for labels and reclaim (default $DOCKER_HOST or the local socket; none disables)")
	if err := parse(fs, args); err != nil {
		return err
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(logLevel)); err != nil {
		return usagef("run: --log-level %q: want debug, info, warn or error", logLevel)
	}
	switch nvmlMode {
	case "auto":
		cfg.UseNVML = true
	case "off":
	default:
		return usagef("run: --nvml %q: want auto or off", nvmlMode)
	}
	p, err := priority.ParseDefault(defPrio)
	if err != nil {
		return usagef("run: --default-priority %q: want unmanaged, low or high", defPrio)
	}
	cfg.DefaultPriority = p
	if _, err := preempt.ParseReclaim(cfg.Reclaim); err != nil {
		return usagef("run: --reclaim %q: want stop, remove, evict, delete or none", cfg.Reclaim)
	}
	for name, v := range map[string]time.Duration{"--fail-open-after": cfg.FailOpenAfter, "--reservation-ttl": cfg.ReservationTTL} {
		if v <= 0 {
			return usagef("run: %s must be positive, got %s", name, v)
		}
	}
	if cfg.PreemptGrace < 0 {
		return usagef("run: --preempt-grace must not be negative")
	}
	if cfg.IdleAfter <= 0 {
		return usagef("run: --idle-after must be positive, got %s", cfg.IdleAfter)
	}
	if cfg.ResyncInterval < 0 {
		return usagef("run: --resync-interval must not be negative")
	}
	if strings.TrimSpace(cfg.StateFile) == "" {
		return usagef("run: --state-file is empty")
	}
	cfg.Version = version
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: level}))

	d, err := daemon.New(cfg, log)
	if err != nil {
		if errors.Is(err, daemon.ErrConfig) {
			return usagef("run: %v", strings.TrimPrefix(err.Error(), "config: "))
		}
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	return d.Run(ctx)
}
