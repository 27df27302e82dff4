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
)

// ParseMode checks a --preempt-mode or gpud.io/preempt-mode value: exactly
// kill or freeze, nothing trimmed.
func ParseMode(v string) (Mode, error) {
	switch Mode(v) {
	case ModeKill, ModeFreeze:
		return Mode(v), nil
	}
	if len(v) > 64 {
		v = v[:64] + "…"
	}
	return "", fmt.Errorf("preempt: mode %q: want kill or freeze", v)
}

// Resumable is the rule for a suspended workload: it runs again once none
// of the GPUs it was suspended for is held by high priority (as the table
// sees a GPU: a lent GPU's idle owner does not hold it). It undoes the row
// "low | high" and nothing else: the gate goes on refusing the workload's
// opens of GPUs high priority holds.
func Resumable(held Holding) bool { return !held.High }
