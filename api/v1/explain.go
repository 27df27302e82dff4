package v1

// Explanation is which rule applies to one process now: the answer of the
// control socket's GET /v1/explain?pid=N, shown by `gpud explain`.
type Explanation struct {
	PID         int       `json:"pid"`
	Comm        string    `json:"comm"`
	Cgroup      string    `json:"cgroup"` // cgroup v2 path
	CgroupID    uint64    `json:"cgroup_id"`
	ContainerID string    `json:"container_id,omitempty"`
	PodUID      string    `json:"pod_uid,omitempty"`
	Workload    *Workload `json:"workload,omitempty"` // nil: gpud knows no workload for it
	Priority    Priority  `json:"priority"`
	Reason      string    `json:"reason"` // label | override | default | host | agent
	Why         string    `json:"why"`    // the reason in words
	Monitoring  bool      `json:"monitoring"`
	Enforcing   bool      `json:"enforcing"`
	Holds       []int     `json:"holds"` // GPUs it holds, by index
	// BeforeClassified says, for a process that opened a GPU before gpud
	// knew its workload, that it did and what was done about it.
	BeforeClassified string `json:"before_classified,omitempty"`
	// Suspended: its workload is frozen (--preempt-mode freeze); the
	// suspension says since when, why, and what thaws it.
	Suspended *Suspension  `json:"suspended,omitempty"`
	GPUs      []ExplainGPU `json:"gpus"`
}

// Workload is the container or pod a process belongs to, as gpud knows it.
type Workload struct {
	Kind        string `json:"kind"` // pod | container | cgroup
	Namespace   string `json:"namespace,omitempty"`
	Name        string `json:"name,omitempty"`
	PodUID      string `json:"pod_uid,omitempty"`
	ContainerID string `json:"container_id,omitempty"`
	TaskID      string `json:"task_id,omitempty"`
	CgroupID    uint64 `json:"cgroup_id,omitempty"`
}

// ExplainGPU is what would happen if the process opened one GPU now.
type ExplainGPU struct {
	Index int `json:"index"`
	// MIG names a MIG slice: its parent, instance, profile and MIG UUID,
	// e.g. "GPU 0 gi1 3g.40gb MIG-..."; absent for a whole GPU.
	MIG         string   `json:"mig,omitempty"`
	State       State    `json:"state"`
	Holds       bool     `json:"holds"`        // the process holds it already
	HighHolders int      `json:"high_holders"` // other processes, by class
	LowHolders  int      `json:"low_holders"`
	Lent        bool     `json:"lent"`
	Shared      bool     `json:"shared,omitempty"`       // shared by DRA claims: the rule table's shared rows
	ReservedFor uint64   `json:"reserved_for,omitempty"` // cgroup id of the earliest refused request
	Allow       bool     `json:"allow"`
	Rule        string   `json:"rule"`
	Effects     []string `json:"effects,omitempty"` // what the verdict sets off
	// Compute is its pod's share of the GPU's compute, when the time-slice
	// scheduler shares it: target, measured share, throttled time, and
	// whether (and why) the scheduler holds it frozen now.
	Compute *StateComputeShare `json:"compute,omitempty"`
}
