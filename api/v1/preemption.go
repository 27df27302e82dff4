package v1

import "time"

// Party is one side of a preemption.
type Party struct {
	PID         int    `json:"pid,omitempty"`
	Comm        string `json:"comm,omitempty"`
	ContainerID string `json:"container_id,omitempty"`
	PodUID      string `json:"pod_uid,omitempty"`
	// Namespace is the pod's: a task's checkpoint goes only to pods of the
	// namespace the task was preempted in. Absent for containers and in
	// records of gpuds before it.
	Namespace string `json:"namespace,omitempty"`
	TaskID    string `json:"task_id,omitempty"`
	CgroupID  uint64 `json:"cgroup_id,omitempty"`
}

// Actions recorded.
const (
	ActionKill    = "kill"    // a low-priority holder was killed
	ActionDeny    = "deny"    // a low-priority open was refused
	ActionReclaim = "reclaim" // a container was reclaimed (stopped/removed)
	ActionFreeze  = "freeze"  // a low-priority holder's workload was frozen (--preempt-mode freeze)
	ActionThaw    = "thaw"    // a frozen workload was thawed: its GPUs have no high-priority holder again
)

// Preemption is one preemption record, as journaled (one JSON line in
// <state-dir>/preemptions.jsonl) and shown in the state file.
type Preemption struct {
	ID        string    `json:"id"`
	Time      time.Time `json:"time"`
	GPU       int       `json:"gpu"`
	Action    string    `json:"action"`
	Rule      string    `json:"rule,omitempty"`
	Victim    Party     `json:"victim"`
	Preemptor Party     `json:"preemptor"`
	Signal    string    `json:"signal,omitempty"`
	LatencyMS float64   `json:"latency_ms,omitempty"` // decision → victim confirmed dead (kill) or frozen (freeze)
	// Cgroup is the frozen or thawed cgroup's directory (freeze, thaw).
	Cgroup string `json:"cgroup,omitempty"`
	// Checkpointed (freeze): the victim's CUDA state was checkpointed to
	// host memory before the freeze (--preempt-mode checkpoint); it is
	// restored at the thaw, by a restarted gpud that adopts it too.
	Checkpointed bool `json:"checkpointed,omitempty"`
	// Reason says why the action was the one taken, where more than one
	// was possible (a freeze, a CUDA checkpoint, or a kill).
	Reason    string     `json:"reason,omitempty"`
	Result    string     `json:"result"`               // done, gone, or the error
	ResumedAt *time.Time `json:"resumed_at,omitempty"` // the task opened a GPU again
}

// Suspension is a workload gpud froze instead of killing its processes
// (--preempt-mode freeze): the state file's "suspended" list.
type Suspension struct {
	// Workload names it: pod/<uid>, a container id, or its cgroup.
	Workload    string    `json:"workload"`
	ContainerID string    `json:"container_id,omitempty"`
	PodUID      string    `json:"pod_uid,omitempty"`
	Namespace   string    `json:"namespace,omitempty"`
	Pod         string    `json:"pod,omitempty"`
	TaskID      string    `json:"task_id,omitempty"`
	Cgroup      string    `json:"cgroup"`  // the frozen cgroup's directory
	Freezer     string    `json:"freezer"` // cgroup.freeze (v2) or freezer.state (v1)
	PIDs        []int     `json:"pids"`    // its processes that held the GPUs
	GPUs        []int     `json:"gpus"`    // the GPUs it was frozen for
	Since       time.Time `json:"since"`
	Reason      string    `json:"reason"` // why it was frozen
	Preemptor   Party     `json:"preemptor"`
	// KillAt is when it is killed and reclaimed if still frozen
	// (--max-frozen); absent when never.
	KillAt *time.Time `json:"kill_at,omitempty"`
	// Paused: it was frozen by someone else (docker pause, an admin)
	// before gpud would have: gpud neither thaws nor kills it.
	Paused bool `json:"paused,omitempty"`
	// Checkpointed: its PIDs whose CUDA state was checkpointed to host
	// memory (--preempt-mode checkpoint): they hold no GPU while
	// suspended, released by the suspension, and are restored at the thaw.
	Checkpointed []int `json:"checkpointed,omitempty"`
	// ThawWhen says in words what thaws it.
	ThawWhen string `json:"thaw_when"`
}
