package config

import (
	"fmt"
	"path/filepath"
	"strings"
	"time"

	v1 "github.com/gpud/gpud/api/v1"
	"github.com/gpud/gpud/internal/safefs"
)

// Run is every setting of `gpud run`, typed. Defaults is the one place its
// default values are written: the flags take their defaults from it, and
// Complete fills in from it what a caller that builds a Run by hand (tests)
// left empty.
type Run struct {
	DevDir         string
	StateFile      string
	StateDir       string
	ControlSocket  string // "" disables
	IdleAfter      time.Duration
	ResyncInterval time.Duration // safety-net full /proc reconciliation; 0 disables
	NodeName       string
	CgroupRoot     string // "" detects
	// CgroupParents are cgroup v2 paths where a runtime makes containers
	// (Docker's --cgroup-parent) or kubelet makes pods or their QoS levels
	// (below a kubelet --cgroup-root), trusted besides the default places
	// (cgroups.SetParents). Empty: the defaults alone.
	CgroupParents []string
	ProcRoot      string
	UseNVML       bool
	// NVMLLibrary is libnvidia-ml's path under DriverRoot; "" lets the
	// dynamic loader search for libnvidia-ml.so.1 (a host install).
	NVMLLibrary string
	// DriverRoot is where the driver's files are as gpud sees them: "/" on
	// a host, the host's driver root mounted into gpud's pod otherwise.
	DriverRoot string
	// MIGMinorsFile is the driver's table of MIG capability minors
	// (/proc/driver/nvidia-caps/mig-minors): with it, each MIG instance is a
	// GPU of its own, keyed by its capability node in DevDir/nvidia-caps.
	MIGMinorsFile string
	RingBytes     uint32 // kernel → user ring buffer size
	// Hooks is how the kernel side observes GPU fds: "driver", the
	// default (the gate reports opens; the driver's release and
	// receive_fd are probed where the kernel has kprobes; nothing on the
	// syscall path) or "syscalls" (sys_enter/sys_exit tracepoints: every
	// syscall of the node pays; for kernels whose gate cannot report opens).
	Hooks string
	// DriverSymbols names the driver functions --hooks driver probes
	// (bpf.ParseDriverSymbols: "release=a,b;receive=c"); "" is NVIDIA's.
	DriverSymbols string

	// The gate and preemption.
	Enforce         bool
	FailOpenAfter   time.Duration
	DefaultPriority v1.Priority
	PreemptGrace    time.Duration
	// PreemptMode is how low-priority holders are preempted: kill, or
	// freeze their workload's cgroup until the GPU is free of high
	// priority again (a workload's gpud.io/preempt-mode label overrides it).
	PreemptMode string
	// PreemptModeNamespaces (namespace=mode, namespace * for all) and
	// PreemptModeContainers (modes, for Docker containers) say which modes
	// a workload's gpud.io/preempt-mode label may choose; kill always, any
	// other mode only where named (workload.PreemptModes). Empty: only kill.
	PreemptModeNamespaces []string
	PreemptModeContainers []string
	// MaxFrozen: a workload frozen this long is killed and reclaimed (0:
	// never).
	MaxFrozen time.Duration
	// CheckpointFallback is what --preempt-mode checkpoint does where the
	// CUDA checkpoint cannot be done: freeze or kill.
	CheckpointFallback string
	// CheckpointTimeout bounds the CUDA lock of one process.
	CheckpointTimeout time.Duration
	// CUDALibrary is libcuda's path ("": libcuda.so.1 by the dynamic
	// loader's search).
	CUDALibrary    string
	Reclaim        string // stop | remove | evict | delete | none
	ReservationTTL time.Duration
	CheckpointRoot string
	// HostCheckpointRoot is CheckpointRoot as the host (the container
	// runtime) sees it, for a gpud in a pod: the source of the checkpoint
	// mounts NRI gives; "" is the same.
	HostCheckpointRoot string
	DockerHost         string // "" : $DOCKER_HOST or the default socket; "none" disables
	// KubeConfig names the API server for pod labels; "" uses the in-cluster
	// config when running in a pod, and no API server otherwise.
	KubeConfig string
	// CRIEndpoint is the container runtime's socket, for pod labels from
	// sandboxes when there is no API server; "" picks containerd's or
	// CRI-O's default socket when present, "none" disables.
	CRIEndpoint string
	// NRISocket is the runtime's NRI socket (containerd ≥ 1.7, CRI-O): pods
	// are classified synchronously, before their containers run, whenever
	// it is there; "none" disables.
	NRISocket string

	// System agents: NVIDIA's own daemons that keep GPUs open. They are
	// shown, never holders: no busy GPU, no activity, no owner, no victim,
	// no refusal because of them (workload.Agents, which has the trust
	// rule: a name counts only for a root host process outside every
	// workload, a pod label only in an agent namespace; a Docker container
	// is one by its own gpud.io/agent=true label).
	AgentComms      []string // process names (comm, ≤ 15 bytes)
	AgentNamespaces []string // namespaces whose pods may be agents
	AgentLabels     []string // key=glob: which pods of those namespaces are
	// PriorityClasses maps pods' priorities (their PriorityClass's value)
	// to high or low ("high>=1000", workload.ParsePriorityClasses); a
	// mapped priority wins over the pod's label. Empty: the label decides.
	PriorityClasses []string

	// Lending idle GPUs through a kubelet device plugin.
	DevicePlugin       bool
	ResourceName       string
	OwnerResource      string
	KubeletDir         string
	PodResourcesSocket string
	LendFree           bool
	// LendMinFreeMemory: a GPU is lent only with at least this much free
	// memory (bytes, from NVML; not applied where NVML does not say).
	LendMinFreeMemory uint64
	HostDevDir        string // --dev-dir as the host sees it (gpud in a pod); "" = the same
	// CDIKind is the CDI kind a lent GPU is named under to CDI-enabled
	// runtimes, as <kind>=<UUID> (NVIDIA's spec: nvidia.com/gpu); "" names
	// none (the device node and NVIDIA_VISIBLE_DEVICES only).
	CDIKind string
	// CDISpecDirs are the runtime's CDI spec directories: a lent GPU is
	// named by CDI only when a spec there defines it.
	CDISpecDirs []string

	// Sharing GPUs by memory through DRA (driver gpud.io).
	DRA bool
	// DRASharedGPUs says which GPUs are shared: "all", "none", or UUIDs
	// and gpud indexes (N of /dev/nvidiaN).
	DRASharedGPUs []string
	// DRAMemoryReserve is kept out of each shared GPU's capacity;
	// DRAMemoryMin and DRAMemoryStep are a share's request policy;
	// DRAMemoryDefault the share of a request that names no memory.
	DRAMemoryReserve, DRAMemoryMin, DRAMemoryStep, DRAMemoryDefault uint64
	// DRAPluginDir is the plugin's directory under kubelet's plugins
	// directory, DRARegistryDir kubelet's plugins_registry, both as the
	// host sees them; DRACDIDir where claim CDI specs go.
	DRAPluginDir, DRARegistryDir, DRACDIDir string
	// ComputeSlice and ComputePeriod time the compute scheduler of GPUs
	// shared by compute (internal/sharing/compute): the token's length,
	// and the longest a busy sharing pod is frozen in a row.
	ComputeSlice, ComputePeriod time.Duration

	// MetricsAddr serves /metrics, /healthz and /readyz; "" disables.
	MetricsAddr string
	// MetricsWebConfig is a Prometheus exporter-toolkit web config file
	// (TLS, basic auth) for the metrics port; "" serves plain HTTP.
	MetricsWebConfig string
	// HealthAddr serves /healthz and /readyz alone, plain HTTP, for
	// kubelet's probes when the metrics port asks for credentials; ""
	// serves them only on the metrics port.
	HealthAddr string
	// PprofAddr serves Go's profiles (net/http/pprof) on a loopback
	// address, for measuring gpud's own footprint; "" (the default)
	// disables. Never on other addresses: profiles show gpud's memory.
	PprofAddr string
	// Version is reported in gpud_build_info.
	Version string

	// PinDir (on a bpffs, e.g. /sys/fs/bpf/gpud) keeps the gate attached
	// across gpud restarts and crashes; "" pins nothing.
	PinDir string
	// KeepEnforcing leaves the pinned gate attached when gpud stops (it
	// fails open after FailOpenAfter without a heartbeat); false removes it.
	KeepEnforcing bool
}

// Defaults returns gpud run's defaults.
func Defaults() Run {
	return Run{
		DevDir:             "/dev",
		StateFile:          "/run/gpud/state.json",
		StateDir:           "/var/lib/gpud",
		ControlSocket:      v1.DefaultSocket,
		IdleAfter:          5 * time.Minute,
		ResyncInterval:     time.Minute,
		ProcRoot:           "/proc",
		UseNVML:            true,
		DriverRoot:         "/",
		MIGMinorsFile:      "/proc/driver/nvidia-caps/mig-minors",
		RingBytes:          1 << 20, // 16 384 events of 64 bytes; counted twice in RSS (mapped twice)
		Hooks:              "driver",
		Enforce:            true,
		FailOpenAfter:      30 * time.Second,
		DefaultPriority:    v1.Unmanaged,
		Reclaim:            "stop",
		PreemptMode:        "kill",
		MaxFrozen:          30 * time.Minute,
		CheckpointFallback: "freeze",
		CheckpointTimeout:  10 * time.Second,
		ReservationTTL:     30 * time.Second,
		CheckpointRoot:     "/var/lib/gpud/checkpoints",
		ResourceName:       "gpud.io/idle-gpu",
		OwnerResource:      "nvidia.com/gpu",
		CDIKind:            "nvidia.com/gpu",
		CDISpecDirs:        []string{"/etc/cdi", "/var/run/cdi"},
		CgroupParents:      []string{},
		KubeletDir:         "/var/lib/kubelet/device-plugins",
		PodResourcesSocket: "/var/lib/kubelet/pod-resources/kubelet.sock",
		LendMinFreeMemory:  1 << 30,
		DRASharedGPUs:      []string{"all"},
		DRAMemoryReserve:   512 << 20,
		DRAMemoryMin:       256 << 20,
		DRAMemoryStep:      256 << 20,
		DRAMemoryDefault:   4 << 30,
		DRAPluginDir:       "/var/lib/kubelet/plugins/gpud.io",
		DRARegistryDir:     "/var/lib/kubelet/plugins_registry",
		DRACDIDir:          "/var/run/cdi",
		// 20 ms: a 10 % pod within ±2 points over any second; 50 token
		// changes a second cost well under 1 % of a core. 1 s: under a
		// liveness probe's default 1 s timeout plus its period (a probe
		// is late once at most, never failureThreshold times in a row)
		// and far under NCCL's watchdog (10 min).
		ComputeSlice:  20 * time.Millisecond,
		ComputePeriod: time.Second,
		NRISocket:     "/var/run/nri/nri.sock",
		AgentComms: []string{
			"nvidia-persiste", // nvidia-persistenced (a comm keeps 15 bytes)
			"nv-hostengine",   // DCGM
			"dcgm-exporter",
			"nvidia-device-p", // nvidia-device-plugin
			"gpu-feature-dis", // gpu-feature-discovery: NVML init every 60 s
			"nv-fabricmanage", // nv-fabricmanager
			"nvidia-imex",
			"nvc:[driver]", // nvidia-container-cli, at each container start
			"nvidia-smi",
			"nvidia-validato", // the GPU Operator's nvidia-validator
			"nvidia-mig-mana", // nvidia-mig-manager
			"nvidia-cuda-mps", // nvidia-cuda-mps-control and -server
			"gpud",
		},
		AgentNamespaces: []string{"gpu-operator", "nvidia-gpu-operator"},
		AgentLabels:     []string{"app=nvidia-*", "app=gpu-feature-discovery"},
		MetricsAddr:     ":9407",
		PinDir:          "/sys/fs/bpf/gpud",
		KeepEnforcing:   true,

		// Freeze and checkpoint keep memory a high workload may need:
		// a workload chooses them only where the operator allows.
		PreemptModeNamespaces: []string{},
		PreemptModeContainers: []string{},
		// Off: which priorities are "high" is the cluster's own choice.
		PriorityClasses: []string{},
	}
}

// Complete fills in from Defaults the settings that have no meaning when
// empty or zero (a path, a resource name, a positive duration); settings
// whose empty value means "off" (ControlSocket, MetricsAddr, PprofAddr, PinDir,
// ResyncInterval, CheckpointRoot, CDIKind) are left as they are.
func (r Run) Complete() Run {
	d := Defaults()
	str := func(p *string, def string) {
		if *p == "" {
			*p = def
		}
	}
	dur := func(p *time.Duration, def time.Duration) {
		if *p <= 0 {
			*p = def
		}
	}
	str(&r.DevDir, d.DevDir)
	str(&r.StateDir, d.StateDir)
	str(&r.ProcRoot, d.ProcRoot)
	str(&r.DriverRoot, d.DriverRoot)
	str(&r.MIGMinorsFile, d.MIGMinorsFile)
	str(&r.Hooks, d.Hooks)
	str(&r.Reclaim, d.Reclaim)
	str(&r.PreemptMode, d.PreemptMode)
	str(&r.CheckpointFallback, d.CheckpointFallback)
	dur(&r.CheckpointTimeout, d.CheckpointTimeout)
	str(&r.ResourceName, d.ResourceName)
	str(&r.OwnerResource, d.OwnerResource)
	str(&r.KubeletDir, d.KubeletDir)
	str(&r.PodResourcesSocket, d.PodResourcesSocket)
	str(&r.NRISocket, d.NRISocket)
	str((*string)(&r.DefaultPriority), string(d.DefaultPriority))
	dur(&r.IdleAfter, d.IdleAfter)
	dur(&r.FailOpenAfter, d.FailOpenAfter)
	dur(&r.ReservationTTL, d.ReservationTTL)
	dur(&r.ComputeSlice, d.ComputeSlice)
	dur(&r.ComputePeriod, d.ComputePeriod)
	if r.RingBytes == 0 {
		r.RingBytes = d.RingBytes
	}
	// nil is "not given"; an empty, non-nil list is "none" (a flag set to "").
	list := func(p *[]string, def []string) {
		if *p == nil {
			*p = def
		}
	}
	list(&r.AgentComms, d.AgentComms)
	list(&r.AgentNamespaces, d.AgentNamespaces)
	list(&r.AgentLabels, d.AgentLabels)
	list(&r.PreemptModeNamespaces, d.PreemptModeNamespaces)
	list(&r.PreemptModeContainers, d.PreemptModeContainers)
	list(&r.PriorityClasses, d.PriorityClasses)
	list(&r.CDISpecDirs, d.CDISpecDirs)
	list(&r.CgroupParents, d.CgroupParents)
	list(&r.DRASharedGPUs, d.DRASharedGPUs)
	str(&r.DRAPluginDir, d.DRAPluginDir)
	str(&r.DRARegistryDir, d.DRARegistryDir)
	str(&r.DRACDIDir, d.DRACDIDir)
	u64 := func(p *uint64, def uint64) {
		if *p == 0 {
			*p = def
		}
	}
	u64(&r.DRAMemoryMin, d.DRAMemoryMin)
	u64(&r.DRAMemoryDefault, d.DRAMemoryDefault)
	return r
}

// CheckAbsPath accepts an absolute path (a list element of a path list).
func CheckAbsPath(p string) error {
	if !filepath.IsAbs(p) {
		return fmt.Errorf("%q is not an absolute path", p)
	}
	return nil
}

// CheckCDIKind accepts "" (no CDI device) or a CDI kind vendor/class as
// the CDI specification has them: each part a letter first, then
// letters, digits, '_', '-' or '.', ending with a letter or a digit
// (nvidia.com/gpu).
func CheckCDIKind(kind string) error {
	if kind == "" {
		return nil
	}
	vendor, class, ok := strings.Cut(kind, "/")
	if !ok {
		return fmt.Errorf("invalid CDI kind %q: want vendor/class, e.g. nvidia.com/gpu", kind)
	}
	for _, part := range []string{vendor, class} {
		if !cdiName(part) {
			return fmt.Errorf("invalid CDI kind %q: %q must start with a letter, end with a letter or digit and hold only letters, digits, '_', '-' and '.'", kind, part)
		}
	}
	return nil
}

func cdiName(s string) bool {
	if s == "" || len(s) > 253 {
		return false
	}
	alnum := func(c byte) bool { return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' }
	if c := s[0]; !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z') || !alnum(s[len(s)-1]) {
		return false
	}
	for i := 1; i < len(s)-1; i++ {
		if c := s[i]; !alnum(c) && c != '_' && c != '-' && c != '.' {
			return false
		}
	}
	return true
}

// CheckDirs checks that every directory gpud writes in is one only root
// can change (safefs), naming the setting of the first that is not.
func (r Run) CheckDirs() error {
	return safefs.CheckDirs(
		safefs.Need{Setting: "state-file", File: r.StateFile, Perm: 0o755},
		safefs.Need{Setting: "state-dir", Dir: r.StateDir, Perm: 0o755},
		safefs.Need{Setting: "control-socket", File: r.ControlSocket, Perm: 0o755},
		safefs.Need{Setting: "checkpoint-root", Dir: r.CheckpointRoot, Perm: 0o755},
	)
}
