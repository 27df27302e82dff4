package daemon

import (
	"fmt"

	"github.com/gpud/gpud/internal/config"
)

// Reloadable is what a running daemon changes without a restart (SIGHUP).
type Reloadable = config.Reloadable

// Reload applies r to the running daemon. Nothing is changed when r is
// invalid. Holders are reclassified at once under a new default class, and
// the gate hears of it before Reload returns.
func (d *Daemon) Reload(r Reloadable) error {
	if err := r.Check(); err != nil {
		return fmt.Errorf("%w: %w", ErrConfig, err)
	}
	d.ledger.SetIdleAfter(r.IdleAfter)
	d.executor.SetGrace(r.PreemptGrace)
	if old := d.registry.DefaultPriority(); old != r.DefaultPriority {
		d.registry.SetDefault(r.DefaultPriority)
		// Holders of unknown containers take it too, judged in their new class.
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
