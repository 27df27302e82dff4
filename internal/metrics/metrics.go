// Package metrics exposes gpud to Prometheus: /metrics, /healthz and
// /readyz on one listener.
//
// Gauges are read from a Source at scrape time (so a GPU or workload that
// went away never leaves a stale series behind); counters that only the
// event path sees are incremented as events happen. Labels follow
// dcgm-exporter (gpu: NVML's index, UUID, device: the node's name such as
// nvidia3, namespace, pod, container) so that PromQL can join the two
// exporters; a PID is never a label (unbounded cardinality).
package metrics

import (
	"fmt"
	"maps"
	"net/http"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"time"

	v1 "github.com/gpud/gpud/api/v1"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Namespace prefixes every metric.
const Namespace = "gpud"

// sharesOf is a GPU's shares, one per pod and claim: a claim's requests
// on one GPU add up (one series each, never two of the same labels); the
// pod's use is the same on each.
func sharesOf(in []v1.StateShare) []Share {
	var out []Share
	at := map[[3]string]int{}
	for _, s := range in {
		k := [3]string{s.PodNamespace, s.PodName, s.ClaimName}
		if s.ClaimNamespace != s.PodNamespace {
			k[2] = s.ClaimNamespace + "/" + s.ClaimName
		}
		i, ok := at[k]
		if !ok {
			at[k] = len(out)
			out = append(out, Share{Namespace: k[0], Pod: k[1], Claim: k[2]})
			i = len(out) - 1
		}
		out[i].RequestedBytes += s.RequestedBytes
		out[i].UsedBytes = max(out[i].UsedBytes, s.UsedBytes)
		out[i].Over = out[i].Over || s.Over
	}
	return out
}

// computeOf is a GPU's compute shares, one per pod (the first of two
// with the same name: one series each).
func computeOf(in []v1.StateComputeShare) []ComputeShare {
	var out []ComputeShare
	seen := map[[2]string]bool{}
	for _, c := range in {
		k := [2]string{c.PodNamespace, c.PodName}
		if seen[k] {
			continue
		}
		seen[k] = true
		out = append(out, ComputeShare{Namespace: c.PodNamespace, Pod: c.PodName, TargetPercent: float64(c.TargetPercent),
			UsedPercent: c.UsedPercent, ThrottledSeconds: c.ThrottledSeconds, Frozen: c.Frozen})
	}
	return out
}

// Verdicts of a GPU open and actions of a preemption record (label values).
const (
	VerdictAllow = "allow"
	VerdictDeny  = "deny"
)

// GPU is one GPU as the Source sees it at scrape time.
type GPU struct {
	Index       int  // gpud's index: N of /dev/nvidiaN
	NVMLIndex   *int // NVML's index; nil without NVML
	UUID        string
	Device      string // its node, /dev/nvidiaN
	State       string // free | busy | idle | lent
	IdleSeconds float64
	Holders     []Holder // one per process holding the GPU
	Enforced    bool     // the gate applies the priority rules to its opens
	// From NVML; Memory nil and Healthy nil without it.
	Memory       *v1.StateMemory
	Healthy      *bool
	HealthEvents uint64
	// NVMLFailing are the NVML sources failing on this GPU (state file
	// gpus[].nvml.failing: utilization, memory, ..., device).
	NVMLFailing []string
	Lendable    *bool // nil without lending
	Shares      []Share
	Compute     []ComputeShare
}

// ComputeShare is one pod's share of a GPU's compute under the time-slice
// scheduler.
type ComputeShare struct {
	Namespace, Pod   string
	TargetPercent    float64
	UsedPercent      float64
	ThrottledSeconds float64
	Frozen           bool // frozen by the scheduler now
}

// Share is one claim's share of a GPU's memory, for one pod.
type Share struct {
	Namespace, Pod, Claim string // the pod's namespace and name, the claim's name
	RequestedBytes        uint64
	UsedBytes             uint64
	Over                  bool
}

// Holder is one process holding a GPU, named by its workload.
type Holder struct {
	Namespace, Pod, Container string
	Priority                  string  // high | low | unmanaged | unclassified
	MemoryBytes               *uint64 // its GPU memory (NVML); nil when not known
}

// Snapshot is everything the gauges and cumulative counters show.
type Snapshot struct {
	GPUs          []GPU
	Events        map[string]uint64 // events received, by type
	Dropped       uint64            // events the kernel could not queue
	Resyncs       map[string]uint64 // full /proc reconciliations, by reason
	Registered    bool              // device plugin registered with kubelet
	Registrations uint64
	Lent          int
	Malformed     uint64 // malformed gpud.io/priority labels seen

	// IgnoredLabels: workloads whose gpud.io/ labels were ignored, by
	// reason: "image" (declared by the container's image, not given to
	// it), "preempt_mode" (a mode its namespace may not choose); each once.
	IgnoredLabels map[string]uint64

	// LookalikeCgroups: cgroups named like a workload's that no runtime
	// made, found holding or opening a GPU (each once).
	LookalikeCgroups uint64
	// ShareRefusals: opens of a GPU shared by memory the kernel refused to
	// a workload without a share of it.
	ShareRefusals uint64
	Monitoring    bool
	Enforcing     bool
	// ConfigReloadsRefused: SIGHUPs whose settings were refused (a bad
	// value, an unsafe or unreadable settings file): the running ones stay.
	ConfigReloadsRefused uint64
	// Writes that failed (a full disk): each is retried until it succeeds.
	StateWriteFailures   uint64
	JournalWriteFailures uint64
	JournalPending       int // preemption records waiting to be written
	// NVML is 1 while gpud reads NVML (activity, memory, health); LeftAlone
	// counts GPUs gpud does not manage, by reason.
	NVML      bool
	LeftAlone map[string]int
	// ShareOvers counts pods going over their GPU memory share (each going
	// over once); SharePreemptions the pods the share rule preempted.
	ShareOvers, SharePreemptions uint64
	// HooksMode is how GPU fds are observed (driver, syscalls);
	// HooksComplete: every change is reported by an event.
	HooksMode     string
	HooksComplete bool
	// HooksPassedFDs is when a GPU fd passed by SCM_RIGHTS is seen: at
	// receipt by the "kprobe", the "sock" tracepoints or the "syscalls"
	// hooks, or at the "sweep".
	HooksPassedFDs string
	// KernelMaps is the use of the kernel maps that grow with the node's
	// workloads and processes (sampled every few seconds).
	KernelMaps []KernelMap
}

// KernelMap is one kernel map's use.
type KernelMap struct {
	Name              string
	Entries, Capacity int
}

// GPULabels are a GPU's labels, as dcgm-exporter names them.
type GPULabels struct {
	GPU    string // NVML's index (nvidia-smi's), else gpud's own index when NVML is unavailable
	UUID   string // "" without NVML
	Device string // the node's name: nvidia3
}

// LabelsOf names a GPU: its NVML index when known (nvidia-smi's and
// dcgm-exporter's gpu, which need not be N of /dev/nvidiaN), else gpud's
// index, so that a node without NVML still has one series per GPU.
func LabelsOf(index int, nvmlIndex *int, uuid, device string) GPULabels {
	l := GPULabels{GPU: strconv.Itoa(index), UUID: uuid, Device: filepath.Base(device)}
	if nvmlIndex != nil {
		l.GPU = strconv.Itoa(*nvmlIndex)
	}
	if device == "" {
		l.Device = ""
	}
	return l
}

// Labels are the GPU's labels.
func (g GPU) Labels() GPULabels { return LabelsOf(g.Index, g.NVMLIndex, g.UUID, g.Device) }

// Source returns the current snapshot; it is called once per scrape.
type Source func() Snapshot

// States a GPU can be in; every one is exported (0 or 1) so that a state
// change never leaves an old series at 1.
var States = []string{"free", "busy", "idle", "lent"}

// Priorities a holder can have.
var Priorities = []string{"high", "low", "unmanaged", "unclassified"}

// Metrics is gpud's Prometheus registry.
type Metrics struct {
	reg         *prometheus.Registry
	src         Source
	opens       *prometheus.CounterVec
	preemptions *prometheus.CounterVec
	// thawedByOther: suspended workloads found thawed by someone else
	// while their GPUs were still held, by what gpud did.
	thawedByOther *prometheus.CounterVec
	latency       prometheus.Histogram
	buildInfo     prometheus.Gauge

	// Descriptions of the scrape-time metrics.
	gpuInfo, gpuState, idle, holders, workloadHolders *prometheus.Desc
	events, dropped, resyncs, registered, regs        *prometheus.Desc
	lent, malformed, monitoring, enforcing            *prometheus.Desc
	lookalikes, ignoredLabels, shareRefusals          *prometheus.Desc
	reloadsRefused                                    *prometheus.Desc
	stateFailures, journalFailures, journalPending    *prometheus.Desc
	gpuEnforced                                       *prometheus.Desc
	memTotal, memUsed, workloadMem, healthy, healthEv *prometheus.Desc
	nvmlDegraded                                      *prometheus.Desc
	nvml, leftAlone, lendable                         *prometheus.Desc
	shareBytes, shareOver, shareOvers, sharePreempts  *prometheus.Desc
	cShareTarget, cShareUsed, cShareThrottle          *prometheus.Desc
	cShareFrozen                                      *prometheus.Desc
	hooks                                             *prometheus.Desc
	kmapEntries, kmapCapacity                         *prometheus.Desc
}

func desc(name, help string, labels ...string) *prometheus.Desc {
	return prometheus.NewDesc(prometheus.BuildFQName(Namespace, "", name), help, labels, nil)
}

// New builds the registry; src is read at every scrape.
func New(version string, src Source) *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		src: src,
		opens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Name: "gpu_opens_total",
			Help: "GPU opens seen by the kernel, by verdict. deny counts refusals as reported by the gate: at most one per workload and GPU every 100 ms (a retry loop is not counted per try).",
		}, []string{"gpu", "UUID", "device", "verdict"}),
		preemptions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Name: "preemptions_total",
			Help: "Preemption records, by action: kill (a low-priority holder killed), reclaim (its container or pod stopped or evicted), deny (a low-priority open refused).",
		}, []string{"action"}),
		thawedByOther: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Name: "suspended_thawed_externally_total",
			Help: "Workloads gpud froze found thawed by someone else (docker unpause, a write to cgroup.freeze) while the GPU they were frozen for was still held, by what gpud did: refreeze (the first time), kill (thawed again soon after).",
		}, []string{"action"}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: Namespace, Name: "preemption_latency_seconds",
			Help:    "From the high-priority open being observed to each low-priority victim confirmed dead.",
			Buckets: []float64{.0005, .001, .002, .003, .005, .0075, .01, .025, .05, .1, .25, .5, 1, 2.5},
		}),
		buildInfo: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: Namespace, Name: "build_info", Help: "Always 1; the version label says which gpud runs.",
			ConstLabels: prometheus.Labels{"version": version},
		}),
		gpuInfo:         desc("gpu_info", "Always 1 for each GPU gpud tracks. gpu is NVML's index (gpud's, N of /dev/nvidiaN, without NVML), device the node's name (nvidia3).", "gpu", "UUID", "device"),
		gpuState:        desc("gpu_state", "1 for the GPU's current state, 0 for the others (free, busy, idle, lent).", "gpu", "UUID", "device", "state"),
		idle:            desc("gpu_idle_seconds", "Seconds since the GPU's last activity while it is idle; 0 otherwise.", "gpu", "UUID", "device"),
		holders:         desc("gpu_holders", "Processes holding the GPU open, by priority class.", "gpu", "UUID", "device", "priority"),
		workloadHolders: desc("workload_gpu_holders", "Processes of a workload holding the GPU open (host processes have empty namespace, pod and container).", "gpu", "UUID", "device", "namespace", "pod", "container", "priority"),
		events:          desc("events_received_total", "Kernel events read from the ring buffer, by type.", "type"),
		dropped:         desc("events_dropped_total", "Kernel events lost because the ring buffer was full (each loss is followed by a full resync)."),
		resyncs:         desc("resyncs_total", "Full reconciliations of the ledger with /proc, by reason.", "reason"),
		registered:      desc("device_plugin_registered", "1 while the device plugin is registered with kubelet."),
		regs:            desc("device_plugin_registrations_total", "Successful registrations with kubelet (one more after each kubelet restart)."),
		lent:            desc("lent_gpus", "GPUs currently lent to a borrower pod."),
		malformed:       desc("malformed_labels_total", "Workloads seen with a malformed gpud.io/priority label (each once)."),
		ignoredLabels:   desc("ignored_labels_total", "Workloads whose gpud.io/ label was ignored (each once), by reason: image (declared by the container's image, not given to the container), preempt_mode (a preempt mode its namespace may not choose).", "reason"),
		shareRefusals:   desc("gpu_share_refusals_total", "Opens of a GPU shared by memory (DRA) the kernel refused to a workload without a share of it."),
		lookalikes:      desc("identity_lookalike_cgroups_total", "Cgroups named like a container's or pod's but not made by root where its runtime makes one (each once): their processes are host processes, never high, never killed for the workload they imitate."),
		reloadsRefused:  desc("config_reloads_refused_total", "Settings reloads (SIGHUP) refused since gpud started: a bad value, or a settings file that is unreadable or that someone other than root could change; the running settings stay (see gpud's log)."),
		monitoring:      desc("monitoring_enabled", "1 while kernel monitoring is switched on."),
		enforcing:       desc("enforcing", "1 while the kernel gate enforces the priority rules."),
		stateFailures:   desc("state_write_failures_total", "State file writes that failed (a full disk, say); each failure is retried on a timer until a write succeeds."),
		journalFailures: desc("journal_write_failures_total", "Preemption journal writes that failed; a record cut short is truncated away and the record kept and retried until written."),
		journalPending:  desc("journal_pending_records", "Preemption records waiting to be written to the journal after a failed write."),
		memTotal:        desc("gpu_memory_total_bytes", "The GPU's memory (NVML).", "gpu", "UUID", "device"),
		memUsed:         desc("gpu_memory_used_bytes", "The GPU's memory in use (NVML), by every process and the driver.", "gpu", "UUID", "device"),
		workloadMem:     desc("workload_gpu_memory_bytes", "GPU memory of a workload's processes on the GPU (NVML's process list).", "gpu", "UUID", "device", "namespace", "pod", "container", "priority"),
		healthy:         desc("gpu_healthy", "1 while no critical NVML event (an XID not of an application's fault, a double-bit ECC error, the GPU fallen off the bus) was seen since gpud started; an unhealthy GPU is not lent.", "gpu", "UUID", "device"),
		healthEv:        desc("gpu_health_events_total", "XID and ECC events NVML reported for the GPU since gpud started, critical or not.", "gpu", "UUID", "device"),
		nvmlDegraded:    desc("gpu_nvml_degraded", "1 for each NVML source failing on the GPU (retried with backoff), by source: utilization (its activity falls back to GPU opens), memory, processes, mig, events, device (the GPU is lost or unknown to NVML), library (NVML unavailable). Each GPU degrades alone.", "gpu", "UUID", "device", "source"),
		lendable:        desc("gpu_lendable", "1 while the GPU may be lent (idle, healthy, enough free memory); the state file's not_lendable says why not. Only with lending on.", "gpu", "UUID", "device"),
		nvml:            desc("nvml_available", "1 while gpud reads NVML (activity from compute, memory, MIG, health); 0: activity from GPU opens only."),
		leftAlone:       desc("gpus_left_alone", "GPUs gpud found and does not manage (neither gate nor lending), by reason.", "reason"),
		shareBytes:      desc("gpu_memory_share_bytes", "A DRA claim's share of the GPU's memory for one of its pods: kind=requested is what the claim was given, kind=used what the pod's processes use (NVML).", "gpu", "UUID", "device", "namespace", "pod", "claim", "kind"),
		shareOver:       desc("gpu_memory_share_over", "1 while the pod uses more of the GPU's memory than its claim's share.", "gpu", "UUID", "device", "namespace", "pod", "claim"),
		shareOvers:      desc("gpu_memory_share_overs_total", "Pods that went over their GPU memory share (each going over counted once)."),
		sharePreempts:   desc("gpu_memory_share_preemptions_total", "Pods the share rule preempted: low priority, over their share, while a pod within its share needed the memory."),
		cShareTarget:    desc("share_compute_target_percent", "A pod's share of the GPU's compute its DRA claims asked (percent of the GPU), under gpud's time-slice scheduler.", "gpu", "UUID", "device", "namespace", "pod"),
		cShareUsed:      desc("share_compute_used_percent", "A pod's measured share of the GPU's compute (NVML per-process utilization, percent of the GPU), averaged over about a scheduling period.", "gpu", "UUID", "device", "namespace", "pod"),
		cShareThrottle:  desc("share_compute_throttled_seconds_total", "Time the compute scheduler held the pod frozen on this GPU (since it began sharing it under this gpud).", "gpu", "UUID", "device", "namespace", "pod"),
		cShareFrozen:    desc("share_compute_frozen", "1 while the compute scheduler holds the pod frozen (waiting for its turn, or over its hard cap).", "gpu", "UUID", "device", "namespace", "pod"),
		hooks:           desc("kernel_hooks", "1 for the way GPU fds are observed: mode driver (nothing on the syscall path) or syscalls (every syscall on the node pays); complete false: some changes are found only by re-reading holders' fd tables; passed_fds: when a GPU fd passed by SCM_RIGHTS is seen, at receipt (kprobe, sock, syscalls) or at the periodic sweep (sweep).", "mode", "complete", "passed_fds"),
		kmapEntries:     desc("kernel_map_entries", "Entries of a kernel map the protection depends on (cgroup_prio, expect_cgroup, share_fence, pending, holder_tgids), read every few seconds; a full one fails safe as docs/reliability.md says.", "map"),
		kmapCapacity:    desc("kernel_map_capacity", "The entries a kernel map can hold (see gpud_kernel_map_entries).", "map"),
		gpuEnforced:     desc("gpu_enforced", "1 while the kernel gate applies the priority rules to the GPU's opens; 0 under --enforce=false, with monitoring off, or when the gate cannot protect this GPU (see gpud's log).", "gpu", "UUID", "device"),
	}
	m.reg.MustRegister(m.opens, m.preemptions, m.thawedByOther, m.latency, m.buildInfo, collector{m},
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m.buildInfo.Set(1)
	// Every action's series exists from the start at 0, so that rate() and
	// increase() see the first preemption of each kind.
	for _, a := range []string{"kill", "reclaim", "deny"} {
		m.preemptions.WithLabelValues(a)
	}
	for _, a := range []string{"refreeze", "kill"} {
		m.thawedByOther.WithLabelValues(a)
	}
	return m
}

// Registry exposes the registry (tests gather from it).
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Opens returns the counter of opens of one GPU with one verdict; callers
// on the event path keep it rather than look it up per event.
func (m *Metrics) Opens(gpu GPULabels, verdict string) prometheus.Counter {
	return m.opens.WithLabelValues(gpu.GPU, gpu.UUID, gpu.Device, verdict)
}

// ThawedByOther counts a suspended workload found thawed by someone else,
// by what gpud did (refreeze, kill).
func (m *Metrics) ThawedByOther(action string) {
	m.thawedByOther.WithLabelValues(action).Inc()
}

// Preemption counts one preemption record; latency > 0 is observed (kills).
func (m *Metrics) Preemption(action string, latency time.Duration) {
	m.preemptions.WithLabelValues(action).Inc()
	if latency > 0 {
		m.latency.Observe(latency.Seconds())
	}
}

// Recorded counts one preemption record (Preemption): action, and the
// latency of a kill that was done (result "done"; latencyMS its
// milliseconds); any other record's latency is not observed.
func (m *Metrics) Recorded(action, result string, latencyMS float64) {
	var lat time.Duration
	if action == v1.ActionKill && result == "done" {
		lat = time.Duration(latencyMS * float64(time.Millisecond))
	}
	m.Preemption(action, lat)
}

// collector turns the Source's snapshot into const metrics at scrape time.
type collector struct{ m *Metrics }

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	m := c.m
	for _, d := range []*prometheus.Desc{m.gpuInfo, m.gpuState, m.idle, m.holders, m.workloadHolders,
		m.events, m.dropped, m.resyncs, m.registered, m.regs, m.lent, m.malformed, m.lookalikes, m.shareRefusals, m.ignoredLabels, m.reloadsRefused, m.monitoring, m.enforcing, m.gpuEnforced,
		m.stateFailures, m.journalFailures, m.journalPending,
		m.memTotal, m.memUsed, m.workloadMem, m.healthy, m.healthEv, m.nvmlDegraded, m.nvml, m.leftAlone, m.lendable,
		m.shareBytes, m.shareOver, m.shareOvers, m.sharePreempts, m.cShareTarget, m.cShareUsed, m.cShareThrottle, m.cShareFrozen, m.hooks, m.kmapEntries, m.kmapCapacity} {
		ch <- d
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	m := c.m
	s := m.src()
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	for _, g := range s.GPUs {
		l := g.Labels()
		gauge(m.gpuInfo, 1, l.GPU, l.UUID, l.Device)
		for _, st := range States {
			gauge(m.gpuState, b2f(g.State == st), l.GPU, l.UUID, l.Device, st)
		}
		gauge(m.idle, g.IdleSeconds, l.GPU, l.UUID, l.Device)
		gauge(m.gpuEnforced, b2f(g.Enforced), l.GPU, l.UUID, l.Device)
		if g.Memory != nil {
			gauge(m.memTotal, float64(g.Memory.TotalBytes), l.GPU, l.UUID, l.Device)
			gauge(m.memUsed, float64(g.Memory.UsedBytes), l.GPU, l.UUID, l.Device)
		}
		if g.Lendable != nil {
			gauge(m.lendable, b2f(*g.Lendable), l.GPU, l.UUID, l.Device)
		}
		if g.Healthy != nil {
			gauge(m.healthy, b2f(*g.Healthy), l.GPU, l.UUID, l.Device)
			counter(m.healthEv, g.HealthEvents, l.GPU, l.UUID, l.Device)
		}
		for _, src := range g.NVMLFailing {
			gauge(m.nvmlDegraded, 1, l.GPU, l.UUID, l.Device, src)
		}
		for _, sh := range g.Shares {
			gauge(m.shareBytes, float64(sh.RequestedBytes), l.GPU, l.UUID, l.Device, sh.Namespace, sh.Pod, sh.Claim, "requested")
			gauge(m.shareBytes, float64(sh.UsedBytes), l.GPU, l.UUID, l.Device, sh.Namespace, sh.Pod, sh.Claim, "used")
			gauge(m.shareOver, b2f(sh.Over), l.GPU, l.UUID, l.Device, sh.Namespace, sh.Pod, sh.Claim)
		}
		for _, c := range g.Compute {
			gauge(m.cShareTarget, c.TargetPercent, l.GPU, l.UUID, l.Device, c.Namespace, c.Pod)
			gauge(m.cShareUsed, c.UsedPercent, l.GPU, l.UUID, l.Device, c.Namespace, c.Pod)
			ch <- prometheus.MustNewConstMetric(m.cShareThrottle, prometheus.CounterValue, c.ThrottledSeconds, l.GPU, l.UUID, l.Device, c.Namespace, c.Pod)
			gauge(m.cShareFrozen, b2f(c.Frozen), l.GPU, l.UUID, l.Device, c.Namespace, c.Pod)
		}
		byPrio := map[string]int{}
		type wl struct{ ns, pod, ctr, prio string }
		byWorkload := map[wl]int{}
		memByWorkload := map[wl]uint64{}
		for _, h := range g.Holders {
			byPrio[h.Priority]++
			w := wl{h.Namespace, h.Pod, h.Container, h.Priority}
			byWorkload[w]++
			if h.MemoryBytes != nil {
				memByWorkload[w] += *h.MemoryBytes
			}
		}
		for w, b := range memByWorkload {
			gauge(m.workloadMem, float64(b), l.GPU, l.UUID, l.Device, w.ns, w.pod, w.ctr, w.prio)
		}
		for _, p := range Priorities {
			gauge(m.holders, float64(byPrio[p]), l.GPU, l.UUID, l.Device, p)
		}
		for w, n := range byWorkload {
			gauge(m.workloadHolders, float64(n), l.GPU, l.UUID, l.Device, w.ns, w.pod, w.ctr, w.prio)
		}
	}
	for _, t := range sortedKeys(s.Events) {
		counter(m.events, s.Events[t], t)
	}
	counter(m.dropped, s.Dropped)
	for _, r := range sortedKeys(s.Resyncs) {
		counter(m.resyncs, s.Resyncs[r], r)
	}
	gauge(m.registered, b2f(s.Registered))
	counter(m.regs, s.Registrations)
	gauge(m.lent, float64(s.Lent))
	counter(m.malformed, s.Malformed)
	counter(m.lookalikes, s.LookalikeCgroups)
	counter(m.shareRefusals, s.ShareRefusals)
	counter(m.reloadsRefused, s.ConfigReloadsRefused)
	for _, r := range []string{"image", "preempt_mode"} {
		counter(m.ignoredLabels, s.IgnoredLabels[r], r)
	}
	gauge(m.monitoring, b2f(s.Monitoring))
	gauge(m.enforcing, b2f(s.Enforcing))
	counter(m.stateFailures, s.StateWriteFailures)
	counter(m.journalFailures, s.JournalWriteFailures)
	gauge(m.journalPending, float64(s.JournalPending))
	gauge(m.nvml, b2f(s.NVML))
	counter(m.shareOvers, s.ShareOvers)
	counter(m.sharePreempts, s.SharePreemptions)
	if s.HooksMode != "" {
		gauge(m.hooks, 1, s.HooksMode, strconv.FormatBool(s.HooksComplete), s.HooksPassedFDs)
	}
	for _, k := range s.KernelMaps {
		gauge(m.kmapEntries, float64(k.Entries), k.Name)
		gauge(m.kmapCapacity, float64(k.Capacity), k.Name)
	}
	for _, r := range slices.Sorted(maps.Keys(s.LeftAlone)) {
		gauge(m.leftAlone, float64(s.LeftAlone[r]), r)
	}
}

func sortedKeys(m map[string]uint64) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// Handler serves /metrics, /healthz (200 while the process serves) and
// /readyz (200 once ready reports true: programs attached, first
// reconciliation done).
func (m *Metrics) Handler(ready func() bool) http.Handler {
	mux := healthMux(ready)
	mux.Handle("GET /metrics", promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError}))
	return mux
}

// HealthHandler serves /healthz and /readyz alone (no metric, no pod
// name): the probes' port when the metrics port wants credentials.
func HealthHandler(ready func() bool) http.Handler { return healthMux(ready) }

func healthMux(ready func() bool) *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if ready != nil && !ready() {
			http.Error(w, "not ready: kernel programs or first reconciliation pending", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ready")
	})
	return mux
}

// GPUsOf turns the state document into the scrape's GPUs, each holder
// named by names (namespace, pod, container; "" where unknown), and counts
// the lent GPUs.
func GPUsOf(f v1.StateFile, now time.Time, names func(v1.StateHolder) (namespace, pod, container string)) (gpus []GPU, lent int) {
	for _, g := range f.GPUs {
		mg := GPU{Index: g.Index, NVMLIndex: g.NVMLIndex, UUID: g.UUID, Device: g.Device, State: string(g.State), Enforced: g.Enforced != nil && *g.Enforced,
			Memory: g.Memory, Lendable: g.Lendable}
		if g.Health != nil {
			h := g.Health.Healthy
			mg.Healthy, mg.HealthEvents = &h, g.Health.Events
		}
		if g.NVML != nil {
			for _, f := range g.NVML.Failing {
				mg.NVMLFailing = append(mg.NVMLFailing, f.Source)
			}
		}
		if g.IdleSince != nil {
			mg.IdleSeconds = now.Sub(*g.IdleSince).Seconds()
		}
		if g.State == v1.Lent {
			lent++
		}
		for _, h := range g.Holders {
			mh := Holder{Priority: string(h.Priority), MemoryBytes: h.MemoryBytes}
			mh.Namespace, mh.Pod, mh.Container = names(h)
			mg.Holders = append(mg.Holders, mh)
		}
		mg.Shares, mg.Compute = sharesOf(g.Shares), computeOf(g.ComputeShares)
		gpus = append(gpus, mg)
	}
	return gpus, lent
}

// Verdicts counts GPU opens by verdict with no label lookup per open (the
// open path is hot): one counter per GPU index and verdict.
type Verdicts struct {
	allow, deny map[int]prometheus.Counter
}

// Verdicts returns the open counters of GPUs given as gpud's index (the
// kernel's name of a GPU) → labels.
func (m *Metrics) Verdicts(gpus map[int]GPULabels) *Verdicts {
	v := &Verdicts{allow: map[int]prometheus.Counter{}, deny: map[int]prometheus.Counter{}}
	for idx, l := range gpus {
		v.allow[idx] = m.Opens(l, VerdictAllow)
		v.deny[idx] = m.Opens(l, VerdictDeny)
	}
	return v
}

// Count counts one open of gpu; GPUs it was not made for are not counted.
func (v *Verdicts) Count(gpu int, allowed bool) {
	c := v.deny
	if allowed {
		c = v.allow
	}
	if n := c[gpu]; n != nil {
		n.Inc()
	}
}
