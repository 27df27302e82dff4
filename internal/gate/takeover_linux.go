package gate

import (
	"context"
	"time"
)

// takeOverWait bounds how long a restarted gpud lets the previous gate run
// while its workload sources list what exists: a source that does not
// answer (dockerd down) must not keep the old gate, whose heartbeat has
// stopped, in place until it fails open.
const takeOverWait = 10 * time.Second

// Pinned is a kernel side that found a previous gpud's gate pinned.
type Pinned interface {
	TakeOver() error
}

// TakeOver replaces the previous gpud's gate (found pinned) with this one's
// once this gpud knows what the old one knew: the GPUs and holders (the
// start-up resync) and the workloads' classes (a first full listing from
// each source, whose channels close then). Until then the old program keeps
// deciding with its own maps, so a restart opens no window where a
// low-priority open gets past a high-priority holder.
func (c *Controller) TakeOver(ctx context.Context, k Pinned, listed []chan struct{}) {
	deadline := time.After(takeOverWait)
	for _, ch := range listed {
		select {
		case <-ch:
		case <-deadline:
			c.Log.Warn("taking over the gate before every workload source listed", "waited", takeOverWait)
		case <-ctx.Done():
			return
		}
	}
	c.Sync()
	if err := k.TakeOver(); err != nil {
		c.Log.Error("replacing the previous gate", "error", err)
		return
	}
	c.Log.Info("took over the gate from the previous gpud")
}
