package bpf

import (
	"log/slog"
	"time"

	v1 "github.com/gpud/gpud/api/v1"
)

// HolderRescan is how often the holders' fd tables are re-read in --hooks
// driver: how long a closed GPU fd stays in the ledger when no hook
// reports it (no kprobe on the driver's release, or a close that is not
// the file's last reference, which the release never sees), for a holder
// whose fds changed lately; one unchanged for a while is checked less
// often, up to occupancy.RescanBackoff times this. Each re-read checks the
// fds the ledger knows, a statx each, and reads a holder's whole table
// only where one changed (occupancy.Tracker.RescanHolders).
const HolderRescan = 2 * time.Second

// Rescan is how often the holders' fd tables must be re-read for what the
// kernel side does not report: HolderRescan in HooksDriver, 0 (never)
// where the syscall hooks report every change.
func (st HookStatus) Rescan() time.Duration {
	if st.Mode == HooksDriver {
		return HolderRescan
	}
	return 0
}

// State is the hooks as the state file shows them (hooks): the mode, what
// is attached and missing, and the bound of a passed fd under a full
// resync every resync.
func (st HookStatus) State(resync time.Duration) *v1.StateHooks {
	return &v1.StateHooks{Mode: st.Mode, Complete: st.Complete, Attached: st.Attached, Missing: st.Missing, PassedFDs: st.PassedBound(resync)}
}

// LogMkdirHook says at start-up when cgroups are not classified as they
// are made (MkdirHook): a workload's opens before gpud finds its cgroup
// are then judged after the fact.
func (m *Monitor) LogMkdirHook(log *slog.Logger) {
	if err := m.MkdirHook(); err != nil {
		log.Warn("cgroups are not classified as they are made: a workload's opens before gpud finds its cgroup are judged after the fact", "error", err)
	}
}
