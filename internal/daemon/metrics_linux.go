package daemon

import (
	"time"

	"github.com/gpud/gpud/internal/metrics"
	"github.com/gpud/gpud/internal/preempt"
)

// setupMetrics builds the registry and returns the open counters the
// event path increments (gate.Counting); it runs before the tracker and
// the executor are built.
func (d *Daemon) setupMetrics() *metrics.Verdicts {
	d.metrics = metrics.New(d.cfg.Version, d.metricsSnapshot)
	labels := map[int]metrics.GPULabels{}
	for _, g := range d.gpus {
		labels[g.Index] = metrics.LabelsOf(g.Index, g.NVMLIndex, g.UUID, g.Device)
	}
	return d.metrics.Verdicts(labels)
}

// onRecorded is the executor's hook for each preemption record.
func (d *Daemon) onRecorded(r preempt.Record) {
	d.writer.Kick()
	d.src.Events.Record(r)
	d.metrics.Recorded(r.Action, r.Result, r.LatencyMS)
}

// metricsSnapshot is read at every scrape: the same document the state
// file shows (loans included), named by workload, and each part's counters.
func (d *Daemon) metricsSnapshot() metrics.Snapshot {
	s := metrics.Snapshot{Events: d.tracker.EventCounts(), Resyncs: d.tracker.ResyncCounts(),
		Malformed: d.registry.MalformedSeen.Load(), IgnoredLabels: d.registry.IgnoredLabels(),
		LookalikeCgroups: d.lookalikes.Count.Load(), ShareRefusals: d.gate.ShareRefusals.Load(),
		StateWriteFailures: d.writer.Failures.Load(), NVML: d.nvml != nil, KernelMaps: metrics.KernelMapsOf(d.kmaps.Usage()),
		ShareOvers: d.shares.Overs(), SharePreemptions: d.shares.Preemptions(),
		Registered: d.plugin.IsRegistered(), Registrations: d.plugin.Registrations()}
	s.FromState(d.State(), time.Now(), d.holderNames)
	if d.cfg.ReloadsRefused != nil {
		s.ConfigReloadsRefused = d.cfg.ReloadsRefused()
	}
	jh := d.journal.Health()
	s.JournalWriteFailures, s.JournalPending = jh.Failures, jh.Pending
	if n, err := d.mon.Dropped(); err == nil {
		s.Dropped = n
	}
	return s
}
