package occupancy

import "time"

// PeriodicResync is the safety net for lost events (--resync-interval):
// Tick resyncs the tracker (ResyncPeriodic) once Every has passed since
// Last, while On (monitoring) holds; Every 0 never does.
type PeriodicResync struct {
	Tracker *Tracker
	Every   time.Duration
	On      func() bool
	Last    time.Time // the last periodic resync, or the start
}

// Tick resyncs when it is time, at now; a failed resync is logged and
// waits for the next interval.
func (p *PeriodicResync) Tick(now time.Time) {
	if p.Every <= 0 || now.Sub(p.Last) < p.Every || !p.On() {
		return
	}
	p.Last = now
	if err := p.Tracker.ResyncFor(ResyncPeriodic); err != nil {
		p.Tracker.logger().Error("periodic resync", "error", err)
	}
}
