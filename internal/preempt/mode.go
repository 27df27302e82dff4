package preempt

import "fmt"

// Mode is how the low-priority holders a verdict preempts are preempted
// (--preempt-mode, or a workload's gpud.io/preempt-mode label).
type Mode string

const (
	// ModeKill kills them (SIGKILL, or SIGTERM first with a grace period)
	// and reclaims their workloads.
	ModeKill Mode = "kill"
	// ModeFreeze freezes their workload's cgroup (nothing lost, GPU memory
	// kept) and thaws it once its GPUs have no high-priority holder again;
	// frozen longer than --max-frozen, it is killed and reclaimed.
	ModeFreeze Mode = "freeze"
	// ModeCheckpoint checkpoints each victim's CUDA state to host memory
	// (the driver's checkpoint API: the GPU is released) and then freezes
	// its workload as ModeFreeze does; restored after the thaw. Where the
	// checkpoint is unsupported or fails: the executor's fallback.
	ModeCheckpoint Mode = "checkpoint"
)

// ParseMode checks a --preempt-mode or gpud.io/preempt-mode value: exactly
// kill, freeze or checkpoint, nothing trimmed.
func ParseMode(v string) (Mode, error) {
	switch Mode(v) {
	case ModeKill, ModeFreeze, ModeCheckpoint:
		return Mode(v), nil
	}
	if len(v) > 64 {
		v = v[:64] + "…"
	}
	return "", fmt.Errorf("preempt: mode %q: want kill, freeze or checkpoint", v)
}

// Resumable is the rule for a suspended workload: it runs again once none
// of the GPUs it was suspended for is held by high priority (as the table
// sees a GPU: a lent GPU's idle owner does not hold it). It undoes the row
// "low | high" and nothing else: the gate goes on refusing the workload's
// opens of GPUs high priority holds.
func Resumable(held Holding) bool { return !held.High }

// LoanBack is what decides whether a loan its owner took back is lent
// again to the same borrower (Relend).
type LoanBack struct {
	// OwnerIdle: the GPU is idle again, its holders (the owner) have not
	// used it for --idle-after.
	OwnerIdle bool
	// BorrowerSuspended: the borrower was frozen by gpud at the take-back
	// and is frozen still (not killed, not paused by someone else), and
	// kubelet still lists it as the lent GPU's borrower.
	BorrowerSuspended bool
	// Healthy: the GPU has no critical health event.
	Healthy bool
}

// Relend is the rule for a suspended borrower: the GPU is lent to it again
// (and Resumable then thaws it, a lent GPU's idle owner not holding it for
// the rules) once the owner is idle again, the GPU healthy, and the
// borrower still suspended. A killed borrower's loan ends for good (the
// pod is reclaimed; a new pod gets a new loan through kubelet); the free
// memory floor is not asked: the borrower's memory is allocated already.
func Relend(s LoanBack) bool { return s.OwnerIdle && s.BorrowerSuspended && s.Healthy }

// FreezeSafe is the rule for a pod's probes: a workload whose pod has a
// liveness probe is killed rather than frozen, since kubelet's probe of a
// frozen container times out and, after failureThreshold failures, kubelet
// restarts the container: what the freeze kept would be lost anyway, later,
// and by a restart nobody asked for.
func FreezeSafe(m Mode, livenessProbe bool) Mode {
	if (m == ModeFreeze || m == ModeCheckpoint) && livenessProbe {
		return ModeKill
	}
	return m
}
