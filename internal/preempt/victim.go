package preempt

import "github.com/gpud/gpud/internal/occupancy"

// Victim is a low-priority holder to kill.
type Victim struct {
	occupancy.ProcInfo
	TaskID string
	// Workload is what is reclaimed after the kill: its pod, else its container.
	Workload Target
	// Mode is how it is preempted (its workload's gpud.io/preempt-mode);
	// "": the executor's Mode.
	Mode Mode
	// WorkloadCgroup is the v2 id of its workload's cgroup (its pod's or
	// container's), the cgroup a freeze freezes; 0: its own cgroup.
	WorkloadCgroup uint64
	// Released: CUDA-checkpointed, it holds no GPU file any more while
	// suspended (a kill at --max-frozen does not ask that it hold one).
	Released bool
	// LivenessProbe: its pod has a liveness probe, so it is killed rather
	// than frozen (FreezeSafe).
	LivenessProbe bool
	// Why says why it is preempted the way it is where its mode was not
	// enough (a freeze that would keep GPU memory the preemptor needs):
	// its records' reason.
	Why string
}

// PartyOf is what a record says of a victim.
func PartyOf(v Victim) Party {
	return Party{PID: v.PID, Comm: v.Comm, ContainerID: v.ContainerID, PodUID: v.PodUID, Namespace: v.Workload.Namespace,
		TaskID: v.TaskID, CgroupID: v.CgroupID}
}

// AdoptCandidate is a GPU holder that a previous gpud may have frozen.
type AdoptCandidate struct {
	GPU    int
	Victim Victim
}
