package daemon

import (
	"fmt"
	"time"

	"github.com/gpud/gpud/internal/occupancy"
	"github.com/gpud/gpud/internal/workload"
)

// Reloadable is what a running daemon can change without a restart
// (SIGHUP). Every other setting is fixed at start.
type Reloadable struct {
	IdleAfter       time.Duration
	DefaultPriority occupancy.Priority
	PreemptGrace    time.Duration
	// Monitoring, when set, flips the monitoring switch; nil leaves it as it is
	// (as `gpud monitor` or the previous run left it).
	Monitoring *bool
}

// Reload applies r to the running daemon. Nothing is changed when r is
// invalid. Holders are reclassified at once under a new default class, and
// the gate hears of it before Reload returns.
func (d *Daemon) Reload(r Reloadable) error {
	if r.IdleAfter <= 0 {
		return fmt.Errorf("%w: idle-after must be positive, got %s", ErrConfig, r.IdleAfter)
	}
	if r.PreemptGrace < 0 {
		return fmt.Errorf("%w: preempt-grace must not be negative, got %s", ErrConfig, r.PreemptGrace)
	}
	if _, err := workload.ParseDefault(string(r.DefaultPriority)); err != nil {
		return fmt.Errorf("%w: %w", ErrConfig, err)
	}
	d.ledger.SetIdleAfter(r.IdleAfter)
	d.executor.SetGrace(r.PreemptGrace)
	if old := d.registry.DefaultPriority(); old != r.DefaultPriority {
		d.registry.SetDefault(r.DefaultPriority)
		// Holders in containers gpud knows nothing of take the default too,
		// and are judged in their new class.
		d.gate.Reclassified("default priority changed")
	}
	if r.Monitoring != nil && *r.Monitoring != d.Monitoring() {
		if err := d.SetMonitoring(*r.Monitoring); err != nil {
			return fmt.Errorf("monitoring switch: %w", err)
		}
	}
	d.writer.Kick()
	d.log.Info("settings reloaded", "idle_after", r.IdleAfter, "default_priority", r.DefaultPriority,
		"preempt_grace", r.PreemptGrace, "monitoring", d.Monitoring())
	return nil
}
