package bpf

import (
	"log/slog"
	"strings"
	"time"
)

// PassedBound is the bound that holds for a GPU fd passed by SCM_RIGHTS:
// the hook that reports its receipt, or the sweep's interval (resync,
// --resync-interval; 0: never).
func (st HookStatus) PassedBound(resync time.Duration) string {
	if st.PassedFDs != PassedBySweep {
		return st.PassedFDs
	}
	if resync <= 0 {
		return PassedBySweep + ": never (--resync-interval 0)"
	}
	return PassedBySweep + ": within " + resync.String()
}

// PassedLabel is a PassedBound as a metric label: kprobe, sock, syscalls
// (each: at receipt) or sweep.
func PassedLabel(bound string) string {
	switch {
	case bound == PassedByKprobe:
		return "kprobe"
	case bound == PassedBySock:
		return "sock"
	case bound == PassedBySyscalls:
		return "syscalls"
	case strings.HasPrefix(bound, PassedBySweep):
		return "sweep"
	}
	return ""
}

// Log says at start-up how GPU fds are observed: what the syscalls mode
// costs, or which driver hooks are missing and what finds their changes
// instead (the holders' fd tables re-read every rescan, the periodic
// reconciliation every resync).
func (st HookStatus) Log(log *slog.Logger, rescan, resync time.Duration) {
	switch {
	case st.Mode == HooksSyscalls:
		log.Warn("kernel hooks: syscalls mode, every syscall of every process on the node pays for gpud's sys_enter/sys_exit hooks (--hooks driver avoids them)",
			"hooks_mode", st.Mode, "attached", st.Attached, "missing", st.Missing)
	case st.Complete:
		log.Info("kernel hooks: driver mode, nothing on the syscall path", "hooks_mode", st.Mode, "attached", st.Attached)
	default:
		log.Warn("kernel hooks: driver mode without some hooks: closes and passed fds are found by re-reading holders' fd tables and at the periodic reconciliation",
			"hooks_mode", st.Mode, "attached", st.Attached, "missing", st.Missing, "error", st.Err, "rescan_every", rescan,
			"passed_fds", st.PassedBound(resync))
	}
}

// DriverRetry attaches the driver hooks again when they may have changed:
// within a tick of a reloaded driver module (a driver upgrade), and every
// Every for a module that first appears (loaded after gpud).
type DriverRetry struct {
	Monitor *Monitor
	Every   time.Duration
	Log     *slog.Logger
	last    time.Time
}

// Tick tries again when it is time; it reports whether a hook was attached
// or dropped.
func (r *DriverRetry) Tick(now time.Time) bool {
	if r.last.IsZero() {
		r.last = now
	}
	if now.Sub(r.last) < r.Every && !r.Monitor.DriverModulesChanged() {
		return false
	}
	r.last = now
	if !r.Monitor.AttachDriver() {
		return false
	}
	st := r.Monitor.Hooks()
	r.Log.Info("kernel hooks: driver hooks changed", "hooks_mode", st.Mode, "attached", st.Attached, "missing", st.Missing)
	return true
}
