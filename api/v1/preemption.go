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
)

// Preemption is one preemption record, as journaled (one JSON line in
// <state-dir>/preemptions.jsonl) and shown in the state file.
type Preemption struct {
	ID        string     `json:"id"`
	Time      time.Time  `json:"time"`
	GPU       int        `json:"gpu"`
	Action    string     `json:"action"`
	Rule      string     `json:"rule,omitempty"`
	Victim    Party      `json:"victim"`
	Preemptor Party      `json:"preemptor"`
	Signal    string     `json:"signal,omitempty"`
	LatencyMS float64    `json:"latency_ms,omitempty"` // decision → victim confirmed dead
	Result    string     `json:"result"`               // done, gone, or the error
	ResumedAt *time.Time `json:"resumed_at,omitempty"` // the task opened a GPU again
}
