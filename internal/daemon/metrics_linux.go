package daemon

import (
	"context"
	"time"

	"github.com/gpud/gpud/bpf"
	"github.com/gpud/gpud/internal/httpserve"
	"github.com/gpud/gpud/internal/metrics"
	"github.com/gpud/gpud/internal/occupancy"
	"github.com/gpud/gpud/internal/preempt"
	"github.com/prometheus/client_golang/prometheus"
)

// Reasons of a full resync (gpud_resyncs_total's reason label).
const (
	resyncStart      = "start"
	resyncPeriodic   = "periodic"
	resyncDropped    = "dropped"
	resyncMonitoring = "monitoring"
)

// setupMetrics builds the registry and hooks its event-path counters into
// the tracker and executor; it runs before either starts.
func (d *Daemon) setupMetrics() {
	d.metrics = metrics.New(d.cfg.Version, d.metricsSnapshot)
	// Counters per GPU index, looked up once: the open path is hot. Maps,
	// not slices: an index is any minor number (nvidia1048575).
	allow := map[int]prometheus.Counter{}
	deny := map[int]prometheus.Counter{}
	for _, g := range d.gpus {
		allow[g.Index] = d.metrics.Opens(g.Index, g.UUID, metrics.VerdictAllow)
		deny[g.Index] = d.metrics.Opens(g.Index, g.UUID, metrics.VerdictDeny)
	}
	opened, gate := d.tracker.Opened, d.tracker.Gate
	d.tracker.Opened = func(info occupancy.ProcInfo, gpu int, ev *bpf.Event) {
		if c := allow[gpu]; c != nil {
			c.Inc()
		}
		if opened != nil {
			opened(info, gpu, ev)
		}
	}
	d.tracker.Gate = func(ev *bpf.Event) {
		if c := deny[int(ev.GPU)]; ev.Type == bpf.EventDeny && c != nil {
			c.Inc()
		}
		if gate != nil {
			gate(ev)
		}
	}
	recorded := d.executor.Recorded
	d.executor.Recorded = func(r preempt.Record) {
		var lat time.Duration
		if r.Action == preempt.ActionKill && r.Result == "done" {
			lat = time.Duration(r.LatencyMS * float64(time.Millisecond))
		}
		d.metrics.Preemption(r.Action, lat)
		if recorded != nil {
			recorded(r)
		}
	}
	if d.plugin != nil {
		registered := d.plugin.Registered
		d.plugin.Registered = func() {
			d.registrations.Add(1)
			if registered != nil {
				registered()
			}
		}
	}
}

// Metrics exposes the registry (tests gather from it).
func (d *Daemon) Metrics() *metrics.Metrics { return d.metrics }

// metricsSnapshot is read at every scrape: the same document the state
// file shows (loans included), named by workload.
func (d *Daemon) metricsSnapshot() metrics.Snapshot {
	now := time.Now()
	f := occupancy.Render(d.ledger.Snapshot(now), d.cfg.NodeName, d.monitoring.Load())
	if d.lender != nil {
		d.lender.decorate(&f)
	}
	s := metrics.Snapshot{
		Events:     map[string]uint64{},
		Resyncs:    map[string]uint64{},
		Malformed:  d.registry.MalformedSeen.Load(),
		Monitoring: d.monitoring.Load(),
		Enforcing:  d.cfg.Enforce,
	}
	for _, g := range f.GPUs {
		mg := metrics.GPU{Index: g.Index, UUID: g.UUID, Device: g.Device, State: string(g.State), Enforced: d.enforced(g.Index)}
		if g.IdleSince != nil {
			mg.IdleSeconds = now.Sub(*g.IdleSince).Seconds()
		}
		if g.State == occupancy.Lent {
			s.Lent++
		}
		for _, h := range g.Holders {
			mh := metrics.Holder{Priority: string(h.Priority)}
			if w, ok := d.registry.Lookup(occupancy.ProcInfo{CgroupID: h.CgroupID, ContainerID: h.ContainerID, PodUID: h.PodUID}); ok {
				if w.PodUID != "" {
					mh.Namespace, mh.Pod = w.Namespace, w.Name
					if d.pods != nil {
						mh.Container = d.pods.ContainerName(w.Namespace, w.Name, h.ContainerID)
					}
				} else {
					mh.Container = w.Name
				}
			}
			mg.Holders = append(mg.Holders, mh)
		}
		s.GPUs = append(s.GPUs, mg)
	}
	for t := bpf.EventType(1); t < bpf.EventTypes; t++ {
		s.Events[t.String()] = d.tracker.ByType[t].Load()
	}
	if n, err := d.mon.Dropped(); err == nil {
		s.Dropped = n
	}
	drops := d.tracker.DropResyncs.Load()
	s.Resyncs[resyncDropped] = drops
	s.Resyncs[resyncStart] = d.startResyncs.Load()
	s.Resyncs[resyncMonitoring] = d.monitoringResyncs.Load()
	s.Resyncs[resyncPeriodic] = d.periodicResyncs.Load()
	if d.plugin != nil {
		s.Registered = d.plugin.IsRegistered()
		s.Registrations = d.registrations.Load()
	}
	return s
}

// serveMetrics serves /metrics until ctx ends. A port that cannot be bound
// (another gpud still shutting down, a clash) is retried rather than fatal:
// the node agent's enforcement matters more than its scrape endpoint.
func (d *Daemon) serveMetrics(ctx context.Context) {
	for wait := time.Second; ; wait = min(2*wait, 30*time.Second) {
		srv, err := httpserve.Listen(d.cfg.MetricsAddr, d.metrics.Handler(d.Ready), d.cfg.HTTPLimits, "metrics", d.log)
		if err == nil {
			d.log.Info("serving metrics", "addr", srv.Addr.String())
			<-ctx.Done()
			srv.Close()
			return
		}
		d.log.Error("metrics endpoint unavailable, retrying", "addr", d.cfg.MetricsAddr, "retry_in", wait, "error", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}
