package daemon

import (
	"strings"
	"time"

	v1 "github.com/gpud/gpud/api/v1"
	"github.com/gpud/gpud/bpf"
	"github.com/gpud/gpud/internal/metrics"
	"github.com/gpud/gpud/internal/occupancy"
	"github.com/gpud/gpud/internal/preempt"
)

// Reasons of a full resync (gpud_resyncs_total's reason label).
const (
	resyncStart      = "start"
	resyncPeriodic   = "periodic"
	resyncDropped    = "dropped"
	resyncMonitoring = "monitoring"
)

// setupMetrics builds the registry and the counters the event path
// increments (onOpened, onGateEvent, onRecorded); it runs before the
// tracker and the executor start.
func (d *Daemon) setupMetrics() {
	d.metrics = metrics.New(d.cfg.Version, d.metricsSnapshot)
	labels := map[int]metrics.GPULabels{}
	for _, g := range d.gpus {
		labels[g.Index] = metrics.LabelsOf(g.Index, g.NVMLIndex, g.UUID, g.Device)
	}
	d.opens = d.metrics.Verdicts(labels)
}

// onOpened is the tracker's hook for a recorded GPU open.
func (d *Daemon) onOpened(info occupancy.ProcInfo, gpu int, ev *bpf.Event) {
	d.opens.Count(gpu, true)
	d.gate.Opened(info, gpu, ev)
}

// onGateEvent is the tracker's hook for the gate's decisions.
func (d *Daemon) onGateEvent(ev *bpf.Event) {
	if ev.Type == bpf.EventDeny {
		d.opens.Count(int(ev.GPU), false)
	}
	d.gate.HandleEvent(ev)
}

// onRecorded is the executor's hook for each preemption record.
func (d *Daemon) onRecorded(r preempt.Record) {
	d.writer.Kick()
	if d.events != nil {
		d.events.Record(r)
	}
	var lat time.Duration
	if r.Action == preempt.ActionKill && r.Result == "done" {
		lat = time.Duration(r.LatencyMS * float64(time.Millisecond))
	}
	d.metrics.Preemption(r.Action, lat)
}

// metricsSnapshot is read at every scrape: the same document the state
// file shows (loans included), named by workload.
func (d *Daemon) metricsSnapshot() metrics.Snapshot {
	now := time.Now()
	f := d.State()
	s := metrics.Snapshot{
		Events:           map[string]uint64{},
		Resyncs:          map[string]uint64{},
		Malformed:        d.registry.MalformedSeen.Load(),
		LookalikeCgroups: d.lookalikes.Count.Load(),
		ShareRefusals:    d.gate.ShareRefusals.Load(),
		Monitoring:       d.monitoring.Load(),
		Enforcing:        d.gateEnforcing(),

		StateWriteFailures: d.writer.Failures.Load(),
		IgnoredLabels: map[string]uint64{"image": d.registry.ImageLabelsDropped.Load(),
			"preempt_mode": d.registry.ModesRefused.Load()},
	}
	if d.cfg.ReloadsRefused != nil {
		s.ConfigReloadsRefused = d.cfg.ReloadsRefused()
	}
	jh := d.journal.Health()
	s.JournalWriteFailures, s.JournalPending = jh.Failures, jh.Pending
	s.GPUs, s.Lent = metrics.GPUsOf(f, now, d.holderNames)
	s.NVML = d.nvml != nil
	if d.shares != nil {
		s.ShareOvers, s.SharePreemptions = d.shares.overs.Load(), d.shares.preemptions.Load()
	}
	if f.Hooks != nil {
		s.HooksMode, s.HooksComplete = f.Hooks.Mode, f.Hooks.Complete
		s.HooksPassedFDs = passedFDsLabel(f.Hooks.PassedFDs)
	}
	for _, u := range d.kmaps.usage() {
		s.KernelMaps = append(s.KernelMaps, metrics.KernelMap{Name: u.Name, Entries: u.Entries, Capacity: u.Capacity})
	}
	s.LeftAlone = map[string]int{}
	for _, g := range f.LeftAlone {
		s.LeftAlone[g.Reason]++
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

// holderNames names a holder's workload for its metric labels.
func (d *Daemon) holderNames(h v1.StateHolder) (namespace, pod, container string) {
	var containerName func(namespace, name, containerID string) string
	if d.pods != nil {
		containerName = d.pods.ContainerName
	}
	return d.registry.Names(occupancy.ProcInfo{CgroupID: h.CgroupID, ContainerID: h.ContainerID, PodUID: h.PodUID}, containerName)
}

// passedFDsLabel is the state file's passed_fds bound as a metric label:
// kprobe, sock, syscalls (each: at receipt) or sweep.
func passedFDsLabel(bound string) string {
	switch {
	case bound == bpf.PassedByKprobe:
		return "kprobe"
	case bound == bpf.PassedBySock:
		return "sock"
	case bound == bpf.PassedBySyscalls:
		return "syscalls"
	case strings.HasPrefix(bound, bpf.PassedBySweep):
		return "sweep"
	}
	return ""
}
