package daemon

import (
	"context"
	"sync"
	"time"
)

// takeOverWait bounds how long a restarted gpud lets the previous gate run
// while its workload sources list what exists: a source that does not
// answer (dockerd down) must not keep the old gate, whose heartbeat has
// stopped, in place until it fails open.
const takeOverWait = 10 * time.Second

// takeOver replaces the previous gpud's gate (found pinned) with this one's
// once this gpud knows what the old one knew: the GPUs and holders (New's
// resync) and the workloads' classes (a first full listing from each
// source). Until then the old program keeps deciding with its own maps, so
// a restart opens no window where a low-priority open gets past a
// high-priority holder.
func (d *Daemon) takeOver(ctx context.Context) {
	deadline := time.After(takeOverWait)
	for _, ch := range d.sources {
		select {
		case <-ch:
		case <-deadline:
			d.log.Warn("taking over the gate before every workload source listed", "waited", takeOverWait)
		case <-ctx.Done():
			return
		}
	}
	d.enforcer.sync()
	if err := d.mon.TakeOver(); err != nil {
		d.log.Error("replacing the previous gate", "error", err)
		return
	}
	d.log.Info("took over the gate from the previous gpud")
}

// source registers a workload source; the returned hook (its Synced) marks
// its first full listing.
func (d *Daemon) source() func() {
	ch := make(chan struct{})
	d.sources = append(d.sources, ch)
	var once sync.Once
	return func() { once.Do(func() { close(ch) }) }
}
