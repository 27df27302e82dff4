// Package gpumon samples NVML per GPU and watches GPU health, each GPU
// degrading alone: a GPU lost at start, a source one GPU does not support
// (per-process utilization on a MIG-enabled GPU), a slow or failing call
// touch that GPU only, and every failing source is retried with backoff.
// It asks NVML through the NVML interface (internal/nvidia's NVML is the
// real one), so it links no cgo and is tested with a fake.
package gpumon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	v1 "github.com/gpud/gpud/api/v1"
	"github.com/gpud/gpud/internal/occupancy"
)

// Ledger is what the monitor tells the ledger (occupancy.Ledger).
type Ledger interface {
	ActivityBy(gpu int, at time.Time, pids []uint32)
	SetMemory(gpu int, m *occupancy.Memory, byPID map[uint32]uint64)
	SetUnhealthy(gpu int, reason string, critical bool, at time.Time)
	SetComputeActivityOf(gpu int, on bool)
}

// Conditions of a GPU's NVML (the state file's gpus[].nvml.state).
const (
	StateOK       = "ok"       // every source answers
	StateDegraded = "degraded" // some source fails (retried with backoff), or NVML is unavailable
	StateLost     = "lost"     // the GPU answers GPU_IS_LOST: fallen off the bus
)

// LostReason is a lost GPU's health reason.
const LostReason = "fallen off the bus (NVML: GPU is lost)"

// leftAloneMIG is why a GPU in MIG mode whose slices could not be mapped
// to their capability nodes is left alone whole; the error that stopped
// the mapping follows it (mig.go). "MIG enabled" leads every MIG reason:
// gpud_gpus_left_alone groups by it.
const leftAloneMIG = "MIG enabled: its slices could not be mapped to their capability nodes, so the gate and lending cannot tell their workloads apart and the whole GPU is left alone"

// Monitor reads NVML for gpud: it names the GPUs at start (Open), then
// samples each GPU on its own (Run), so that a slow or failing call on one
// GPU delays nothing else.
type Monitor struct {
	Lib NVML // nil: no NVML (gpud runs on GPU opens alone)
	Log *slog.Logger
	// Interval is the time between two samples of a GPU (0: a second);
	// RetryMin and RetryMax bound the backoff of a failing source, of
	// the health watch and of a failed Init (0: 2 s and 1 min).
	Interval, RetryMin, RetryMax time.Duration
	// Sampling: GPUs are sampled only while it says so (the monitoring
	// switch); nil: always.
	Sampling func() bool
	// Hooks, each optional: activity and processes' memory (the lender),
	// a GPU made unhealthy (the DRA driver), a GPU's NVML condition
	// changed (the state file).
	Activity  func(gpu int, pids []uint32)
	Memory    func(gpu int, byPID map[uint32]uint64)
	Unhealthy func(gpu int)
	Changed   func()
	// MIGNodes says where MIG slices' capability nodes are found (mig.go):
	// a GPU in MIG mode is then judged and lent slice by slice.
	MIGNodes MIGNodes
	// ShareGPUs says whether a GPU's per-process utilization is sampled
	// for Utilization (the time-slice scheduler's measure), every
	// ShareInterval (0: 200 ms, above NVML's own sample period); nil:
	// none is. Asked at each tick: a GPU is sampled while it is shared.
	ShareGPUs     func(gpu int) bool
	ShareInterval time.Duration

	ledger    Ledger
	loaded    bool
	info      Info
	initErr   string
	mig       map[int]bool          // MIG mode at start, by gpud index (left-alone GPUs too)
	leftAlone []v1.StateLeftAlone   // GPUs not managed, and why
	byIndex   map[int]occupancy.GPU // every GPU found, managed or not
	sampled   map[int]Source        // the GPUs NVML knows, and what is sampled of each
	missing   map[int]error         // NVML devices unreachable at start, by NVML index
	restart   atomic.Bool           // NVML's view changed: gpud starts again

	mu     sync.Mutex
	conds  map[int]*cond
	events error // why the health watch is not watching; nil while it is
}

// cond is one GPU's NVML condition.
type cond struct {
	failed  map[Source]error
	retryAt map[Source]time.Time
	delay   map[Source]time.Duration
	lost    string // why it is lost; "" when it is not
	unknown string // why NVML cannot read it at all
	compute bool   // its utilization samples are its activity
	mem     *occupancy.Memory
	procMem map[uint32]uint64
	// shares is the last SrcShares reading, taken at sharesAt (zero:
	// none yet, or the source failed).
	shares   map[int32]uint32
	sharesAt time.Time
	busy     busyTotals
}

// busyTotals is the GPU time each process used, summed over the SrcShares
// readings since from (each reading's percent times the time it covers:
// since the one before), through the newest reading's time. A consumer
// stepping at its own times takes the difference since its last look, so
// that each sample is counted once even when several arrive between two
// looks: keeping only the last reading, two arriving between two steps
// lost the first and charged the second for both periods.
type busyTotals struct {
	byPID         map[int32]busyOf
	from, through time.Time // zero from: none yet, or a gap or failure ended them
}

// busyOf is one process's GPU time, and the last reading that named it.
type busyOf struct {
	busy time.Duration
	seen time.Time
}

// busyForget: a process no reading named for this long is dropped from
// busyTotals (gone, or idle: counted from 0 again if it comes back).
const busyForget = time.Minute

// busyGap: a reading more than this after the one before starts the
// totals again (what its percent covers of the gap is unknown: the
// driver keeps samples for seconds, not for ever): a second, or five
// ShareIntervals.
func (m *Monitor) busyGap() time.Duration {
	return max(time.Second, 5*orDefault(m.ShareInterval, 200*time.Millisecond))
}

// add takes one successful SrcShares reading into the totals: its
// percents for the time since the last reading's (at is the newest
// sample's time, or the reading's when there was none).
func (b *busyTotals) add(shares map[uint32]uint32, at time.Time, gap time.Duration) {
	if b.from.IsZero() || at.Sub(b.through) > gap {
		b.byPID, b.from, b.through = map[int32]busyOf{}, at, at
		return // the first reading: where the totals start
	}
	if !at.After(b.through) {
		return // a sample no newer than the totals: its time is counted
	}
	covers := at.Sub(b.through)
	b.through = at
	for pid, pct := range shares {
		o := b.byPID[int32(pid)]
		o.busy += covers * time.Duration(pct) / 100
		o.seen = at
		b.byPID[int32(pid)] = o
	}
	for pid, o := range b.byPID {
		if at.Sub(o.seen) > busyForget {
			delete(b.byPID, pid)
		}
	}
}

func newCond() *cond {
	return &cond{failed: map[Source]error{}, retryAt: map[Source]time.Time{}, delay: map[Source]time.Duration{}}
}

func (m *Monitor) log() *slog.Logger {
	if m.Log == nil {
		return slog.Default()
	}
	return m.Log
}

func orDefault(d, def time.Duration) time.Duration {
	if d <= 0 {
		return def
	}
	return d
}

// backoff doubles d within [RetryMin, RetryMax].
func (m *Monitor) backoff(d time.Duration) time.Duration {
	lo, hi := orDefault(m.RetryMin, 2*time.Second), orDefault(m.RetryMax, time.Minute)
	return min(max(2*d, lo), hi)
}

// Open loads NVML and names the GPUs; it returns the GPUs gpud manages: a
// GPU in MIG mode is left alone (neither judged by the gate nor lent),
// since every slice uses its parent's /dev/nvidiaN and a rule on the node
// would hit other slices' workloads; its slices are managed in its place,
// each keyed by its own capability node (mig.go). A GPU NVML cannot reach (lost at
// start) stays managed, marked lost; NVML failing entirely leaves every
// GPU managed on opens alone, and Run retries it.
func (m *Monitor) Open(gpus []occupancy.GPU) []occupancy.GPU {
	m.byIndex, m.conds, m.mig, m.sampled = map[int]occupancy.GPU{}, map[int]*cond{}, map[int]bool{}, map[int]Source{}
	for _, g := range gpus {
		m.byIndex[g.Index] = g
		m.conds[g.Index] = newCond()
	}
	if m.Lib == nil {
		return gpus
	}
	if err := m.Lib.Init(); err != nil {
		m.initErr = err.Error()
		m.log().Warn("NVML unavailable: activity is GPU opens only; no memory, MIG or health; retried with backoff", "error", err)
		return gpus
	}
	m.loaded, m.info = true, m.Lib.Info()
	m.log().Info("NVML loaded", "library", m.info.Library, "driver", m.info.DriverVersion)
	unknown := m.Lib.Annotate(gpus)
	m.missing = m.Lib.Missing()
	if len(unknown) > 0 {
		m.log().Warn("device nodes NVML does not know", "gpus", unknown, "nvml_unreachable", fmt.Sprint(m.missing))
	}
	for _, g := range gpus {
		m.byIndex[g.Index] = g // annotated
		if !slices.Contains(unknown, g.Index) {
			m.sampled[g.Index] = AllSources
			continue
		}
		c := m.conds[g.Index]
		c.unknown = "NVML does not know this device node"
		for idx, err := range m.missing {
			if errors.Is(err, ErrGPUIsLost) {
				// Its minor number cannot be asked of a lost GPU: the
				// device node NVML cannot name is the one lost.
				c.lost = fmt.Sprintf("%s at start (NVML device %d)", LostReason, idx)
			}
		}
	}
	// MIG mode, from each GPU at once: one slow GPU delays the start by
	// one call, not one per GPU.
	readings := make(map[int]Reading, len(m.sampled))
	var rmu sync.Mutex
	var wg sync.WaitGroup
	for idx := range m.sampled {
		wg.Go(func() {
			r := m.Lib.SampleGPU(idx, SrcMIG)
			rmu.Lock()
			readings[idx] = r
			rmu.Unlock()
		})
	}
	wg.Wait()
	var managed []occupancy.GPU
	for _, g := range gpus {
		r := readings[g.Index]
		m.mig[g.Index] = r.MIG
		if r.MIG {
			// The parent is left alone; its slices are GPUs (mig.go).
			managed = append(managed, m.migSlices(g)...)
			m.sampled[g.Index] = SrcMIG // only to see MIG turned off
			continue
		}
		managed = append(managed, g)
	}
	return managed
}

// Start gives the monitor the ledger (built on Open's GPUs) and marks the
// GPUs lost at start unhealthy.
func (m *Monitor) Start(l Ledger) {
	m.ledger = l
	now := time.Now()
	for idx, c := range m.conds {
		if c.lost != "" {
			m.log().Warn("GPU lost at start: unhealthy; the other GPUs keep NVML", "gpu", idx, "reason", c.lost)
			l.SetUnhealthy(idx, c.lost, true, now)
		}
	}
}

// Loaded reports whether NVML was loaded at Open.
func (m *Monitor) Loaded() bool { return m.loaded }

// Info says which library was loaded.
func (m *Monitor) Info() Info { return m.info }

// Restart reports whether NVML's view of the GPUs changed since Open (a
// MIG mode changed, a GPU lost at start answers again, NVML loads after
// failing): gpud starts again on it.
func (m *Monitor) Restart() bool { return m.restart.Load() }

// AllGPUs is every GPU found at Open, those left alone included.
func (m *Monitor) AllGPUs(managed []occupancy.GPU) []occupancy.GPU {
	if len(m.leftAlone) == 0 {
		return managed
	}
	out := make([]occupancy.GPU, 0, len(m.byIndex))
	for _, idx := range slices.Sorted(maps.Keys(m.byIndex)) {
		out = append(out, m.byIndex[idx])
	}
	return out
}

// Run samples each GPU in its own loop and watches health events until
// ctx ends; without NVML it retries Init with backoff.
func (m *Monitor) Run(ctx context.Context) {
	if m.Lib == nil {
		return
	}
	if !m.loaded {
		m.retryInit(ctx)
		return
	}
	defer m.Lib.Shutdown()
	var wg sync.WaitGroup
	for idx, want := range m.sampled {
		wg.Go(func() { m.sampleLoop(ctx, idx, want) })
		if m.ShareGPUs != nil {
			wg.Go(func() { m.shareLoop(ctx, idx) })
		}
	}
	if len(m.missing) > 0 {
		wg.Go(func() { m.refind(ctx) })
	}
	wg.Go(func() { m.watchHealth(ctx) })
	wg.Wait()
}

// sleep waits d or until ctx ends, and reports whether ctx is still on.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// retryInit tries NVML's Init with backoff; once it loads, gpud starts
// again on it (MIG detection, names and health need the start's path).
func (m *Monitor) retryInit(ctx context.Context) {
	var delay time.Duration
	last := m.initErr
	for {
		delay = m.backoff(delay)
		if !sleep(ctx, delay) {
			return
		}
		err := m.Lib.Init()
		if err != nil {
			if err.Error() != last {
				last = err.Error()
				m.log().Warn("NVML still unavailable", "error", err, "retry_in", delay)
			}
			continue
		}
		m.Lib.Shutdown()
		m.log().Info("NVML loads now: starting again on it")
		m.restart.Store(true)
		return
	}
}

// refind asks NVML again, with backoff, for the devices it could not reach
// at start; one that answers now makes gpud start again with it.
func (m *Monitor) refind(ctx context.Context) {
	var delay time.Duration
	for {
		delay = m.backoff(delay)
		if !sleep(ctx, delay) {
			return
		}
		if now := m.Lib.Missing(); len(now) < len(m.missing) {
			m.log().Info("an NVML device unreachable at start answers now: starting again", "unreachable_before", len(m.missing), "unreachable_now", len(now))
			m.restart.Store(true)
			return
		}
	}
}

// sampleLoop samples one GPU every Interval, each source unless it is
// waiting for its retry.
func (m *Monitor) sampleLoop(ctx context.Context, gpu int, want Source) {
	tick := time.NewTicker(orDefault(m.Interval, time.Second))
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if m.Sampling != nil && !m.Sampling() {
			continue
		}
		now := time.Now()
		if ask := m.due(gpu, want, now); ask != 0 {
			m.apply(gpu, ask, m.Lib.SampleGPU(gpu, ask), now)
		}
	}
}

// shareLoop samples one GPU's per-process utilization every
// ShareInterval while ShareGPUs asks for it, with the backoff of any
// source.
func (m *Monitor) shareLoop(ctx context.Context, gpu int) {
	tick := time.NewTicker(orDefault(m.ShareInterval, 200*time.Millisecond))
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if !m.ShareGPUs(gpu) || (m.Sampling != nil && !m.Sampling()) {
			continue
		}
		now := time.Now()
		if m.due(gpu, SrcShares, now) != 0 {
			m.apply(gpu, SrcShares, m.Lib.SampleGPU(gpu, SrcShares), now)
		}
	}
}

// Utilization is GPU gpu's per-process utilization at its last sample
// (ShareGPUs asks for it): each process's share of the GPU in percent, by
// PID, a process absent at 0, and the sample's time. It fails while the
// source fails on that GPU (ErrNotSupported on a MIG-enabled GPU), before
// the first sample, and for a GPU NVML does not sample.
func (m *Monitor) Utilization(gpu int) (map[int32]uint32, time.Time, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	c, err := m.sharesOf(gpu)
	if err != nil {
		return nil, time.Time{}, err
	}
	return maps.Clone(c.shares), c.sharesAt, nil
}

// sharesOf is gpu's condition when its per-process utilization is
// sampled; the caller holds mu.
func (m *Monitor) sharesOf(gpu int) (*cond, error) {
	c := m.conds[gpu]
	_, sampled := m.sampled[gpu]
	switch {
	case m.Lib == nil || !m.loaded:
		return nil, fmt.Errorf("utilization of GPU %d: NVML unavailable", gpu)
	case c == nil || !sampled || m.ShareGPUs == nil:
		return nil, fmt.Errorf("utilization of GPU %d: not sampled from NVML", gpu)
	case c.lost != "":
		return nil, fmt.Errorf("utilization of GPU %d: %w", gpu, ErrGPUIsLost)
	case c.failed[SrcShares] != nil:
		return nil, fmt.Errorf("utilization of GPU %d: %w", gpu, c.failed[SrcShares])
	case c.sharesAt.IsZero():
		return nil, fmt.Errorf("utilization of GPU %d: %w", gpu, ErrNoSample)
	}
	return c, nil
}

// Busy is the GPU time each process of GPU gpu used, by PID, summed over
// its per-process utilization samples (ShareGPUs asks for them) from
// `from` through `through` (the newest sample's time), each sample once:
// the difference between two looks with the same from is what each
// process used between them, however many samples arrived meanwhile. A
// gap in the samples (a failed source, sampling stopped for a while)
// starts the totals again from a new from; a process not sampled for a
// minute is dropped (its total starts again at 0). It fails as
// Utilization does, and until a second sample (the first is where the
// totals start).
func (m *Monitor) Busy(gpu int) (byPID map[int32]time.Duration, from, through time.Time, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	c, err := m.sharesOf(gpu)
	if err != nil {
		return nil, time.Time{}, time.Time{}, err
	}
	b := c.busy
	if b.from.IsZero() || !b.through.After(b.from) {
		return nil, time.Time{}, time.Time{}, fmt.Errorf("busy time of GPU %d: %w", gpu, ErrNoSample)
	}
	byPID = make(map[int32]time.Duration, len(b.byPID))
	for pid, o := range b.byPID {
		byPID[pid] = o.busy
	}
	return byPID, b.from, b.through, nil
}

// ErrNoSample: the GPU's per-process utilization is not sampled yet.
var ErrNoSample = errors.New("not sampled yet")

// due is what of want may be asked of gpu now.
func (m *Monitor) due(gpu int, want Source, now time.Time) Source {
	m.mu.Lock()
	defer m.mu.Unlock()
	c := m.conds[gpu]
	var ask Source
	for _, s := range Sources {
		if want&s != 0 && !now.Before(c.retryAt[s]) {
			ask |= s
		}
	}
	return ask
}

// apply takes one reading of gpu (the sources in ask) into the ledger
// and the GPU's condition.
func (m *Monitor) apply(gpu int, ask Source, r Reading, now time.Time) {
	m.mu.Lock()
	c := m.conds[gpu]
	changed := false
	for _, s := range Sources {
		if ask&s == 0 {
			continue
		}
		err := r.Failed[s]
		if r.Lost && err == nil {
			err = ErrGPUIsLost
		}
		if err == nil {
			if c.failed[s] != nil {
				m.log().Info("NVML source answers again", "gpu", gpu, "source", s.String())
				changed = true
			}
			delete(c.failed, s)
			delete(c.retryAt, s)
			delete(c.delay, s)
			continue
		}
		c.delay[s] = m.backoff(c.delay[s])
		c.retryAt[s] = now.Add(c.delay[s])
		if c.failed[s] == nil {
			msg := "NVML sampling failing on a GPU: retried with backoff"
			switch s {
			case SrcUtilization:
				msg += "; its activity falls back to GPU opens"
			case SrcShares:
				msg += "; its compute shares are not measured"
			}
			m.log().Warn(msg, "gpu", gpu, "source", s.String(), "error", err, "retry_in", c.delay[s])
			changed = true
		}
		c.failed[s] = err
	}
	lostNow := r.Lost && c.lost == ""
	switch {
	case r.Lost:
		if lostNow {
			c.lost, changed = LostReason, true
		}
	case c.lost != "" && len(c.failed) == 0:
		c.lost, changed = "", true // it answers again (its health stays as the ledger keeps it)
	}
	var computeSet *bool
	if ask&SrcUtilization != 0 {
		if on := c.failed[SrcUtilization] == nil; on != c.compute {
			c.compute, changed = on, true
			computeSet = &on
		}
	}
	if ask&SrcShares != 0 {
		c.shares, c.sharesAt = nil, time.Time{}
		if c.failed[SrcShares] == nil {
			c.shares = make(map[int32]uint32, len(r.Shares))
			for pid, pct := range r.Shares {
				c.shares[int32(pid)] = pct
			}
			// No sample: nothing used the GPU since the last reading.
			c.sharesAt = r.SharesAt
			if c.sharesAt.IsZero() {
				c.sharesAt = now
			}
			c.busy.add(r.Shares, c.sharesAt, m.busyGap())
		} else {
			c.busy = busyTotals{} // what the failed reading missed is unknown
		}
	}
	if ask&SrcMemory != 0 {
		c.mem = nil
		if r.Memory != nil && c.failed[SrcMemory] == nil {
			c.mem = &occupancy.Memory{Total: r.Memory.Total, Used: r.Memory.Used}
		}
	}
	if ask&SrcProcesses != 0 {
		c.procMem = nil
		if c.failed[SrcProcesses] == nil {
			c.procMem = r.ProcessMemory
		}
	}
	mem, procMem := c.mem, c.procMem
	migChanged := ask&SrcMIG != 0 && c.failed[SrcMIG] == nil && r.MIG != m.mig[gpu]
	m.mu.Unlock()

	if m.ledger != nil {
		if computeSet != nil {
			m.ledger.SetComputeActivityOf(gpu, *computeSet)
		}
		if ask&SrcUtilization != 0 && !r.At.IsZero() {
			m.ledger.ActivityBy(gpu, r.At, r.PIDs) // agents' use is none
		}
		if ask&(SrcMemory|SrcProcesses) != 0 {
			m.ledger.SetMemory(gpu, mem, procMem)
		}
		if lostNow {
			m.ledger.SetUnhealthy(gpu, LostReason, true, now)
		}
	}
	if ask&SrcUtilization != 0 && !r.At.IsZero() && m.Activity != nil {
		m.Activity(gpu, r.PIDs)
	}
	if ask&SrcProcesses != 0 && procMem != nil && m.Memory != nil {
		m.Memory(gpu, procMem)
	}
	if lostNow {
		m.log().Warn("GPU lost: unhealthy; the other GPUs keep NVML", "gpu", gpu)
		if m.Unhealthy != nil {
			m.Unhealthy(gpu)
		}
	}
	if migChanged {
		m.log().Warn("a GPU's MIG mode changed: starting again", "gpu", gpu, "mig", r.MIG)
		m.restart.Store(true)
	}
	if changed && m.Changed != nil {
		m.Changed()
	}
}

// watchHealth turns NVML's XID and ECC events into the ledger's health,
// and watches again, with backoff, whenever waiting fails.
func (m *Monitor) watchHealth(ctx context.Context) {
	var delay time.Duration
	for {
		start := time.Now()
		// Watching for RetryMin without failing is watching: the
		// failure shown before is over.
		ok := time.AfterFunc(orDefault(m.RetryMin, 2*time.Second), func() { m.setEvents(nil, 0) })
		err := m.Lib.WatchHealth(ctx, m.onHealth)
		ok.Stop()
		if ctx.Err() != nil {
			return
		}
		if time.Since(start) > orDefault(m.RetryMax, time.Minute) {
			delay = 0
		}
		if err == nil {
			err = errors.New("the health watch ended")
		}
		delay = m.backoff(delay)
		m.setEvents(err, delay)
		if !sleep(ctx, delay) {
			return
		}
	}
}

// setEvents records the health watch's failure (nil: watching).
func (m *Monitor) setEvents(err error, retry time.Duration) {
	m.mu.Lock()
	was := m.events
	m.events = err
	m.mu.Unlock()
	switch {
	case err != nil && was == nil:
		m.log().Warn("GPU health events not watched: XID and ECC errors are missed until the watch is back; retried with backoff", "error", err, "retry_in", retry)
	case err == nil && was != nil:
		m.log().Info("GPU health events watched again")
	default:
		return
	}
	if m.Changed != nil {
		m.Changed()
	}
}

// onHealth takes one health event into the ledger.
func (m *Monitor) onHealth(e HealthEvent) {
	reason := e.Kind
	switch e.Kind {
	case "xid":
		reason = fmt.Sprintf("XID %d", e.XID)
	case "lost":
		reason = LostReason
		m.mu.Lock()
		if c := m.conds[e.GPU]; c != nil && c.lost == "" {
			c.lost = LostReason
		}
		m.mu.Unlock()
	}
	lvl := slog.LevelInfo
	if e.Critical {
		lvl = slog.LevelWarn
	}
	m.log().Log(context.Background(), lvl, "GPU health event", "gpu", e.GPU, "event", reason, "critical", e.Critical)
	if m.ledger != nil {
		m.ledger.SetUnhealthy(e.GPU, reason, e.Critical, time.Now())
	}
	if e.Critical && m.Unhealthy != nil {
		m.Unhealthy(e.GPU) // an unhealthy GPU leaves the DRA slice now, not at the next tick
	}
	if e.Kind == "lost" && m.Changed != nil {
		m.Changed()
	}
}

// Decorate adds what the state file says of NVML: the library, the
// activity source, the left-alone GPUs and each GPU's NVML condition.
func (m *Monitor) Decorate(f *v1.StateFile) {
	f.ActivitySource = "opens"
	f.LeftAlone = m.leftAlone
	switch {
	case m.loaded:
		f.NVML = &v1.StateNVML{Library: m.info.Library, DriverVersion: m.info.DriverVersion}
	case m.initErr != "":
		f.NVML = &v1.StateNVML{Error: m.initErr}
	}
	if m.Lib == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	computing := 0
	for i := range f.GPUs {
		n := m.view(f.GPUs[i].Index)
		f.GPUs[i].NVML = n
		if n.ActivitySource == "nvml" {
			computing++
		}
	}
	if computing > 0 && computing == len(f.GPUs) {
		f.ActivitySource = "nvml"
	} else if computing > 0 {
		f.ActivitySource = "mixed"
	}
}

// view is gpu's NVML condition; the caller holds mu.
func (m *Monitor) view(gpu int) *v1.StateGPUNVML {
	n := &v1.StateGPUNVML{State: StateOK, ActivitySource: "opens"}
	c := m.conds[gpu]
	switch {
	case !m.loaded:
		n.State, n.Reason = StateDegraded, "NVML unavailable: "+m.initErr
		n.Failing = []v1.StateNVMLFailure{{Source: "library", Error: m.initErr}}
		return n
	case c == nil:
		return n
	case c.lost != "":
		n.State, n.Reason = StateLost, c.lost
		n.Failing = []v1.StateNVMLFailure{{Source: "device", Error: c.lost}}
		return n
	case c.unknown != "":
		n.State, n.Reason = StateDegraded, c.unknown
		n.Failing = []v1.StateNVMLFailure{{Source: "device", Error: c.unknown}}
		return n
	}
	if c.compute {
		n.ActivitySource = "nvml"
	}
	var why []string
	for _, s := range Sources {
		if err := c.failed[s]; err != nil {
			n.Failing = append(n.Failing, v1.StateNVMLFailure{Source: s.String(), Error: err.Error()})
			why = append(why, s.String()+": "+err.Error())
		}
	}
	if m.events != nil {
		n.Failing = append(n.Failing, v1.StateNVMLFailure{Source: "events", Error: m.events.Error()})
		why = append(why, "events: "+m.events.Error())
	}
	if len(why) > 0 {
		n.State, n.Reason = StateDegraded, strings.Join(why, "; ")
	}
	return n
}
