package occupancy

import (
	"sync"

	"github.com/gpud/gpud/bpf"
)

// Reasons of a full resync (gpud_resyncs_total's reason label).
const (
	ResyncStart      = "start"      // gpud's first reconciliation
	ResyncPeriodic   = "periodic"   // --resync-interval's safety net
	ResyncDropped    = "dropped"    // the kernel lost events (counted by the tracker)
	ResyncMonitoring = "monitoring" // monitoring switched back on
)

// resyncCounts counts the resyncs asked for a reason (ResyncFor).
type resyncCounts struct {
	mu sync.Mutex
	n  map[string]uint64
}

// ResyncFor resyncs (Resync) and, when that succeeds, counts it under
// reason (ResyncCounts).
func (t *Tracker) ResyncFor(reason string) error {
	if err := t.Resync(); err != nil {
		return err
	}
	t.reasons.mu.Lock()
	defer t.reasons.mu.Unlock()
	if t.reasons.n == nil {
		t.reasons.n = map[string]uint64{}
	}
	t.reasons.n[reason]++
	return nil
}

// ResyncCounts is how many full resyncs were done, by reason: those asked
// through ResyncFor for start, periodic and monitoring (0 when none), and
// those answering lost events (dropped).
func (t *Tracker) ResyncCounts() map[string]uint64 {
	t.reasons.mu.Lock()
	defer t.reasons.mu.Unlock()
	out := map[string]uint64{ResyncStart: 0, ResyncPeriodic: 0, ResyncMonitoring: 0}
	for r, n := range t.reasons.n {
		out[r] = n
	}
	out[ResyncDropped] = t.DropResyncs.Load()
	return out
}

// EventCounts is how many events were applied, by type name (every type,
// 0 when none).
func (t *Tracker) EventCounts() map[string]uint64 {
	out := map[string]uint64{}
	for e := bpf.EventType(1); e < bpf.EventTypes; e++ {
		out[e.String()] = t.ByType[e].Load()
	}
	return out
}
