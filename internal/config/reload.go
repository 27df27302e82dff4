package config

import (
	"fmt"
	"time"

	v1 "github.com/gpud/gpud/api/v1"
)

// Reloadable is what a running gpud can change without a restart
// (SIGHUP). Every other setting is fixed at start.
type Reloadable struct {
	IdleAfter       time.Duration
	DefaultPriority v1.Priority
	PreemptGrace    time.Duration
	// Monitoring, when set, flips the monitoring switch; nil leaves it as it is
	// (as `gpud monitor` or the previous run left it).
	Monitoring *bool
}

// Check says why r cannot be applied: a running gpud takes none of it then.
func (r Reloadable) Check() error {
	if r.IdleAfter <= 0 {
		return fmt.Errorf("idle-after must be positive, got %s", r.IdleAfter)
	}
	if r.PreemptGrace < 0 {
		return fmt.Errorf("preempt-grace must not be negative, got %s", r.PreemptGrace)
	}
	switch r.DefaultPriority {
	case v1.High, v1.Low, v1.Unmanaged:
		return nil
	}
	return fmt.Errorf("priority: default %q: want high, low or unmanaged", r.DefaultPriority)
}
