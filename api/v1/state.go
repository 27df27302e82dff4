package v1

import (
	"encoding/json"
	"time"
)

// StateVersion is the state file's schema version.
const StateVersion = 1

// Priority is a holder's class.
type Priority string

// The classes of a GPU holder.
const (
	High         Priority = "high"
	Low          Priority = "low"
	Unmanaged    Priority = "unmanaged"
	Unclassified Priority = "unclassified"
)

// State is a GPU's occupancy state.
type State string

// The states of a GPU.
const (
	Free State = "free" // no holder
	Busy State = "busy" // holders, active within idle-after
	Idle State = "idle" // holders, no activity for idle-after
	Lent State = "lent" // lent to a borrower through the device plugin
)

// StateFile is the JSON document at --state-file (and GET /v1/state).
type StateFile struct {
	Version    int       `json:"version"`
	Node       string    `json:"node"`
	UpdatedAt  time.Time `json:"updated_at"`
	Monitoring bool      `json:"monitoring"`
	// Enforcing: the kernel gate applies the rule table now (--enforce, and
	// monitoring on: with monitoring off gpud neither observes nor rules).
	Enforcing   bool            `json:"enforcing"`
	GPUs        []StateGPU      `json:"gpus"`
	Preemptions []RawPreemption `json:"preemptions"`
	// Suspended are the workloads frozen instead of killed
	// (--preempt-mode freeze), until their GPUs are free of high priority
	// again. Absent when none (and in files of gpuds before it).
	Suspended []Suspension `json:"suspended,omitempty"`
	// Health reports failed writes (a full disk); absent while none failed.
	Health *Health `json:"health,omitempty"`
	// ActivitySource says what tells gpud a GPU is in use: "nvml" (its
	// per-process utilization samples; a holder's first open starts its
	// use), "opens" (every open, without NVML) or "mixed" (some GPUs each:
	// gpus[].nvml.activity_source). Absent in files of gpuds before it.
	ActivitySource string `json:"activity_source,omitempty"`
	// NVML says which library gpud loaded, or why none; absent in files
	// of gpuds before it.
	NVML *StateNVML `json:"nvml,omitempty"`
	// LeftAlone are GPUs gpud found and does not manage (MIG enabled):
	// neither judged by the gate nor lent. Absent when none.
	LeftAlone []StateLeftAlone `json:"left_alone,omitempty"`
	// DRA is gpud's DRA driver (GPUs shared by memory, --dra); absent
	// without it.
	DRA *StateDRA `json:"dra,omitempty"`
	// Hooks says how the kernel side observes GPU fds (--hooks); absent in
	// files of gpuds before it.
	Hooks *StateHooks `json:"hooks,omitempty"`
	// KernelMaps are the kernel maps gpud depends on that are 80 % full
	// or more, with what a full one costs; absent when none.
	KernelMaps []StateKernelMap `json:"kernel_maps,omitempty"`
}

// StateKernelMap is a kernel map nearing full.
type StateKernelMap struct {
	Name     string `json:"name"` // as in bpf/gpud.bpf.c: cgroup_prio, expect_cgroup, ...
	Entries  int    `json:"entries"`
	Capacity int    `json:"capacity"`
	// Full says what gpud does when the map is full (how it fails safe).
	Full string `json:"full"`
}

// StateDRA is what gpud's DRA driver offers and has prepared.
type StateDRA struct {
	Driver string `json:"driver"` // gpud.io
	// Offered is the number of GPUs in the node's ResourceSlice;
	// NotOffered the others, and why.
	Offered    int               `json:"offered"`
	NotOffered []StateNotOffered `json:"not_offered,omitempty"`
	Claims     int               `json:"claims"` // claims prepared on this node
}

// StateNotOffered is a GPU kept out of the ResourceSlice.
type StateNotOffered struct {
	Index  int    `json:"index"`
	UUID   string `json:"uuid,omitempty"`
	Reason string `json:"reason"`
}

// StateHooks is the kernel hooks' mode and what is attached.
type StateHooks struct {
	// Mode: "driver" (the gate, process events and the driver's release:
	// nothing on the syscall path) or "syscalls" (sys_enter/sys_exit:
	// every syscall of the node pays).
	Mode string `json:"mode"`
	// Complete: every change of a GPU fd is reported by an event; false
	// when some hook is missing, whose changes are found by re-reading
	// holders' fd tables (Missing says which and why).
	Complete bool     `json:"complete"`
	Attached []string `json:"attached,omitempty"`
	Missing  []string `json:"missing,omitempty"`
	// PassedFDs is how soon a GPU fd passed into a process (SCM_RIGHTS)
	// is seen, and so judged: "receive_fd kprobe: at receipt", "sock
	// tracepoints: at receipt", "syscall tracepoints: at receipt (...)",
	// or "sweep only: within <--resync-interval>" ("sweep only: never"
	// with the sweep off).
	PassedFDs string `json:"passed_fds,omitempty"`
}

// StateNVML is where NVML came from.
type StateNVML struct {
	Library       string `json:"library,omitempty"`
	DriverVersion string `json:"driver_version,omitempty"`
	Error         string `json:"error,omitempty"` // why NVML is not used
}

// StateGPUNVML is one GPU's NVML condition.
type StateGPUNVML struct {
	// State is "ok" (every source answers), "degraded" (a source fails and
	// is retried with backoff, or NVML is unavailable) or "lost" (the GPU
	// answers NVML_ERROR_GPU_IS_LOST: fallen off the bus); Reason says why.
	State  string `json:"state"`
	Reason string `json:"reason,omitempty"`
	// ActivitySource is this GPU's: "nvml" (per-process utilization
	// samples) or "opens" (every open: NVML cannot sample it).
	ActivitySource string             `json:"activity_source"`
	Failing        []StateNVMLFailure `json:"failing,omitempty"`
}

// StateNVMLFailure is one failing NVML source of a GPU: utilization,
// memory, processes, mig, events, device (lost or unknown to NVML) or
// library (NVML unavailable).
type StateNVMLFailure struct {
	Source string `json:"source"`
	Error  string `json:"error"`
}

// StateLeftAlone is a GPU gpud does not manage, and why.
type StateLeftAlone struct {
	Device string `json:"device"`
	UUID   string `json:"uuid,omitempty"`
	Reason string `json:"reason"`
}

// StateMemory is a GPU's memory, from NVML.
type StateMemory struct {
	TotalBytes uint64 `json:"total_bytes"`
	UsedBytes  uint64 `json:"used_bytes"`
	FreeBytes  uint64 `json:"free_bytes"`
}

// StateGPUHealth is what NVML's events said of a GPU.
type StateGPUHealth struct {
	Healthy bool       `json:"healthy"`
	Reason  string     `json:"reason,omitempty"` // the first critical event, e.g. "XID 79"
	Since   *time.Time `json:"since,omitempty"`
	Events  uint64     `json:"events"` // XID and ECC events seen since gpud started
}

// StateGPU is one GPU in the state file.
type StateGPU struct {
	Index int    `json:"index"` // N of its node /dev/nvidiaN
	UUID  string `json:"uuid"`
	// NVMLIndex is NVML's index of the GPU (nvidia-smi's, dcgm-exporter's
	// gpu label), which need not be Index. Absent without NVML (and in
	// files of gpuds before it).
	NVMLIndex *int          `json:"nvml_index,omitempty"`
	Device    string        `json:"device"`
	State     State         `json:"state"`
	IdleSince *time.Time    `json:"idle_since"` // last activity, set while idle
	Owner     string        `json:"owner"`
	Borrower  string        `json:"borrower"`
	Holders   []StateHolder `json:"holders"`
	// Agents are processes of NVIDIA's own system agents (persistence
	// daemon, DCGM, device plugin, ...) that hold the GPU: shown here, never
	// in holders, because they never make it busy, never own it, are never
	// preempted and never block an open. Their priority is "unmanaged".
	// Absent when none (and in files of gpuds before it).
	Agents []StateHolder `json:"agents,omitempty"`
	// Aliases are other device nodes of this GPU (same major:minor).
	Aliases []string `json:"aliases,omitempty"`
	// MIG is set when this entry is a MIG instance (a slice) of a GPU in
	// MIG mode: Device is then its capability node, UUID its MIG UUID.
	// Each slice is a GPU of its own to the rules and lending; the parent
	// is listed in left_alone. Absent for a whole GPU.
	MIG *StateMIG `json:"mig,omitempty"`
	// Enforced says whether the kernel gate applies the priority rules to
	// this GPU's opens now: false under --enforce=false or with monitoring
	// off, and for a GPU the gate cannot protect. Absent in files of
	// gpuds before it.
	Enforced *bool `json:"enforced,omitempty"`
	// Memory is the GPU's memory (NVML); absent without NVML.
	Memory *StateMemory `json:"memory,omitempty"`
	// Health is absent without NVML; an unhealthy GPU is not lent.
	Health *StateGPUHealth `json:"health,omitempty"`
	// NVML is how NVML answers for this GPU (each GPU degrades alone);
	// absent when gpud does not use NVML (and in files of gpuds before it).
	NVML *StateGPUNVML `json:"nvml,omitempty"`
	// Lendable says, with lending on, whether the GPU may be lent now, and
	// NotLendable why not (unhealthy, below the free-memory floor, its
	// holders active, ...). Absent without lending.
	Lendable    *bool  `json:"lendable,omitempty"`
	NotLendable string `json:"not_lendable,omitempty"`
	// Shared: DRA claims were given parts of this GPU's memory (gpud's
	// DRA driver); Shares are those parts, one per claim and pod, with
	// what the pod uses. Absent when the GPU is not shared.
	Shared bool         `json:"shared,omitempty"`
	Shares []StateShare `json:"shares,omitempty"`
	// ShareConflicts are holders of a shared GPU that belong to no share:
	// a whole-GPU owner another device plugin gave the GPU, or a host
	// process. Shown and logged, never preempted by the share rule.
	ShareConflicts []StateShareConflict `json:"share_conflicts,omitempty"`
	// ComputeShares are the pods sharing this GPU's compute under gpud's
	// time-slice scheduler, one per pod: absent when none is.
	ComputeShares []StateComputeShare `json:"compute_shares,omitempty"`
}

// StateComputeShare is one pod's share of a GPU's compute: what its claims
// asked, what it used, and what the scheduler does with it now.
type StateComputeShare struct {
	PodNamespace string `json:"pod_namespace"`
	PodName      string `json:"pod_name"`
	PodUID       string `json:"pod_uid"`
	// TargetPercent is the percent of the GPU its claims were given;
	// HardCap: never more, even with the GPU otherwise idle.
	TargetPercent int  `json:"target_percent"`
	HardCap       bool `json:"hard_cap,omitempty"`
	// UsedPercent is its measured share of the GPU (NVML's per-process
	// utilization), averaged over about a scheduling period.
	UsedPercent float64 `json:"used_percent"`
	// ThrottledSeconds is the time the scheduler has held it frozen on
	// this GPU since it began sharing it under this gpud.
	ThrottledSeconds float64 `json:"throttled_seconds"`
	// State is the scheduler's: running (holds the token), waiting (busy,
	// frozen until its turn), capped (over its hard cap, frozen), idle (no
	// work seen: thawed, its share to the others) or exempt (high priority:
	// never frozen, only measured).
	State string `json:"state"`
	// Frozen: the scheduler holds its cgroup frozen now; Why says why it
	// is or is not, in words.
	Frozen bool   `json:"frozen,omitempty"`
	Why    string `json:"why,omitempty"`
}

// StateMIG is a MIG instance's place: its parent GPU and its profile.
type StateMIG struct {
	Parent       int    `json:"parent"`        // the parent's index (N of /dev/nvidiaN)
	ParentUUID   string `json:"parent_uuid"`   // the parent's UUID
	ParentDevice string `json:"parent_device"` // the parent's node, which the slice's processes open too
	GI           int    `json:"gpu_instance"`
	CI           int    `json:"compute_instance"`
	Profile      string `json:"profile"` // e.g. "1g.10gb"
}

// StateShare is one claim's share of a GPU's memory, for one of the pods
// the claim is reserved for.
type StateShare struct {
	ClaimNamespace string   `json:"claim_namespace"`
	ClaimName      string   `json:"claim_name"`
	Request        string   `json:"request,omitempty"` // the claim's request this share answers
	PodNamespace   string   `json:"pod_namespace"`
	PodName        string   `json:"pod_name"`
	PodUID         string   `json:"pod_uid"`
	Priority       Priority `json:"priority,omitempty"` // its pod's processes' class; absent while none holds the GPU
	// RequestedBytes is what the claim was given; UsedBytes what its pods'
	// processes use on the GPU (NVML). A pod named by several claims on
	// one GPU is judged against their sum, shown on each.
	RequestedBytes uint64 `json:"requested_bytes"`
	UsedBytes      uint64 `json:"used_bytes"`
	Over           bool   `json:"over,omitempty"` // used > requested
	// Preempted: the share rule preempted the pod (it was low priority,
	// over its share, and a pod within its share needed the memory).
	Preempted bool `json:"preempted,omitempty"`
}

// StateShareConflict is a holder of a shared GPU in no share.
type StateShareConflict struct {
	PID         int     `json:"pid"`
	PodUID      string  `json:"pod_uid,omitempty"`
	ContainerID string  `json:"container_id,omitempty"`
	MemoryBytes *uint64 `json:"memory_bytes,omitempty"`
}

// StateHolder is one process holding a GPU.
type StateHolder struct {
	PID         int       `json:"pid"`
	Comm        string    `json:"comm"`
	CgroupID    uint64    `json:"cgroup_id"`
	ContainerID string    `json:"container_id"`
	PodUID      string    `json:"pod_uid"`
	Priority    Priority  `json:"priority"`
	OpenedAt    time.Time `json:"opened_at"`
	FDs         int       `json:"fds"`
	// Namespace and Pod name the holder's pod; Container names its Docker
	// container, or its container within the pod. Each as far as gpud knows
	// it, absent otherwise (and in files of gpuds before them).
	Namespace string `json:"namespace,omitempty"`
	Pod       string `json:"pod,omitempty"`
	Container string `json:"container,omitempty"`
	// OpenedBeforeClassified: it opened the GPU before gpud knew its
	// workload, so the gate could not judge that open by class; the rules
	// judged it when its class became known (see preemptions[]).
	OpenedBeforeClassified bool `json:"opened_before_classified,omitempty"`
	// LastActive is the holder's newest use (its first open, then NVML's
	// samples naming it); MemoryBytes its GPU memory (NVML). Absent when
	// not known.
	LastActive  *time.Time `json:"last_active,omitempty"`
	MemoryBytes *uint64    `json:"memory_bytes,omitempty"`
}

// RawPreemption is a Preemption as the state file carries it: kept as the
// journal wrote it, so that a reader of an older or newer gpud loses no
// field it does not know.
type RawPreemption = json.RawMessage

// Health is the state file's "health" section: writes that failed (a full
// disk, say). Counts are since gpud started. Absent while nothing failed.
type Health struct {
	StateWriteFailures   uint64     `json:"state_write_failures"`
	JournalWriteFailures uint64     `json:"journal_write_failures"`
	JournalPending       int        `json:"journal_pending"` // records waiting to be written
	LastError            string     `json:"last_error,omitempty"`
	LastErrorAt          *time.Time `json:"last_error_at,omitempty"`
}
