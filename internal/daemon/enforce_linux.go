package daemon

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/gpud/gpud/bpf"
	"github.com/gpud/gpud/internal/occupancy"
	"github.com/gpud/gpud/internal/preempt"
	"github.com/gpud/gpud/internal/workload"
)

// enforcer turns the gate's events and the ledger into actions (the rule
// table, claim 1), keeps the gate's per-GPU policy current, and runs the
// earliest-request-first reservations of claim 5.
type enforcer struct {
	d    *Daemon
	reg  *workload.Registry
	exec *preempt.Executor
	ttl  time.Duration
	ctx  context.Context

	mu        sync.Mutex
	waiters   map[int][]waiter // GPU → denied low-priority requests, oldest first
	reserved  map[int]waiter   // GPU → the waiter it is reserved for
	until     map[int]uint64   // GPU → reservation end, CLOCK_MONOTONIC
	last      map[int]bpf.GPUPolicy
	lastConf  map[int]uint64 // GPU → when the gate was last told "confirmed up to"
	drainedAt uint64         // the latest time the ring buffer was seen drained
}

// confirmEvery bounds how often an unchanged policy is re-confirmed to the
// gate (two map writes): under a churn of opens the ring buffer drains
// constantly. A stale confirmation only keeps refusing low opens for at
// most this long after a high-priority open's mark.
const confirmEvery = uint64(time.Millisecond)

type waiter struct {
	cgroupID    uint64
	containerID string
	workload    string // preempt.Target.Key of the requester's pod or container
	since       time.Time
}

func newEnforcer(d *Daemon, reg *workload.Registry, exec *preempt.Executor, ttl time.Duration) *enforcer {
	return &enforcer{d: d, reg: reg, exec: exec, ttl: ttl, ctx: context.Background(),
		waiters: map[int][]waiter{}, reserved: map[int]waiter{}, until: map[int]uint64{}, last: map[int]bpf.GPUPolicy{},
		lastConf: map[int]uint64{}}
}

func party(info occupancy.ProcInfo, taskID string) preempt.Party {
	return preempt.Party{PID: info.PID, Comm: info.Comm, ContainerID: info.ContainerID, PodUID: info.PodUID,
		TaskID: taskID, CgroupID: info.CgroupID}
}

func (e *enforcer) taskID(info occupancy.ProcInfo) string {
	if w, ok := e.reg.Lookup(info); ok {
		return w.TaskID
	}
	return ""
}

// workload names what a process's reclaim acts on: its pod when gpud knows
// the pod, else its container.
func (e *enforcer) workload(info occupancy.ProcInfo, reason string) preempt.Target {
	if w, ok := e.reg.Lookup(info); ok && w.PodUID != "" {
		return preempt.Target{PodUID: w.PodUID, Namespace: w.Namespace, Name: w.Name, Reason: reason}
	}
	if info.PodUID != "" {
		return preempt.Target{PodUID: info.PodUID, Reason: reason} // unknown pod: not reclaimed
	}
	return preempt.Target{ContainerID: info.ContainerID, Reason: reason}
}

func (e *enforcer) victim(info occupancy.ProcInfo, reason string) preempt.Victim {
	return preempt.Victim{ProcInfo: info, TaskID: e.taskID(info), Workload: e.workload(info, reason)}
}

// lowHolders returns the low-priority holders of gpu as victims.
func (e *enforcer) lowHolders(gpu int, reason string) []preempt.Victim {
	var out []preempt.Victim
	for _, h := range e.d.ledger.Holders(gpu) {
		if h.Priority == occupancy.Low {
			out = append(out, e.victim(h, reason))
		}
	}
	return out
}

// gate handles the gate's events, emitted at decision time.
func (e *enforcer) gate(ev *bpf.Event) {
	gpu := int(ev.GPU)
	switch ev.Type {
	case bpf.EventGateHigh:
		if e.d.lender != nil {
			e.d.lender.takeBack(gpu)
		}
		// Kill first; the preemptor's identity is only for the record.
		victims := e.lowHolders(gpu, fmt.Sprintf("a high-priority process opened GPU %d", gpu))
		if len(victims) == 0 {
			return
		}
		pre := e.gateOpener(ev)
		e.preempt(gpu, pre, victims, e.d.tracker.Wall(ev.Mono))
	case bpf.EventDeny:
		opener := e.gateOpener(ev)
		target := e.workload(opener, fmt.Sprintf("refused GPU %d, held by high priority", gpu))
		if e.addWaiter(gpu, waiter{cgroupID: ev.CgroupID, containerID: opener.ContainerID, workload: target.Key(), since: e.d.tracker.Wall(ev.Mono)}) {
			v := preempt.Decide(preempt.Holding{High: true}, occupancy.Low)
			e.d.denials.Add(1)
			e.exec.Denied(e.ctx, gpu, v.Rule, party(opener, e.taskID(opener)), target, v.ReclaimOpener)
		}
	}
}

// gateOpener identifies the process behind a gate event. The event's cgroup
// is the classified cgroup that decided (a pod's or a container's): it names
// the workload even when the opener has exited before /proc could be read,
// as a refused opener often has.
func (e *enforcer) gateOpener(ev *bpf.Event) occupancy.ProcInfo {
	info := e.d.tracker.Identify(int(ev.TGID), ev)
	if w, ok := e.reg.Lookup(occupancy.ProcInfo{CgroupID: ev.CgroupID}); ok {
		if info.ContainerID == "" && info.PodUID == "" {
			info.ContainerID, info.PodUID = w.ContainerID, w.PodUID
		}
		info.Priority = w.Priority
	}
	if ev.CgroupID != 0 {
		info.CgroupID = ev.CgroupID // the waiter's cgroup for claim 5: covers the whole workload
	}
	return info
}

func (e *enforcer) preempt(gpu int, pre occupancy.ProcInfo, victims []preempt.Victim, decided time.Time) {
	v := preempt.Decide(preempt.Holding{Low: true}, occupancy.High)
	e.exec.Preempt(e.ctx, gpu, v.Rule, party(pre, e.taskID(pre)), victims, decided, nil)
}

// addWaiter queues a denied request; false when that cgroup already waits.
func (e *enforcer) addWaiter(gpu int, w waiter) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, x := range e.waiters[gpu] {
		if x.cgroupID == w.cgroupID {
			return false
		}
	}
	if r, ok := e.reserved[gpu]; ok && r.cgroupID == w.cgroupID {
		return false
	}
	e.waiters[gpu] = append(e.waiters[gpu], w)
	sort.SliceStable(e.waiters[gpu], func(i, j int) bool { return e.waiters[gpu][i].since.Before(e.waiters[gpu][j].since) })
	return true
}

// dropWaiters removes the requests of a workload (preempt.Target.Key) that
// is gone, reclaimed after its refusal: a freed GPU must not wait for it.
func (e *enforcer) dropWaiters(key string) {
	if key == "" {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	for gpu, ws := range e.waiters {
		kept := ws[:0]
		for _, w := range ws {
			if w.workload != key {
				kept = append(kept, w)
			}
		}
		e.waiters[gpu] = kept
	}
	for gpu, r := range e.reserved {
		if r.workload == key {
			delete(e.reserved, gpu)
			delete(e.until, gpu)
		}
	}
}

// opened handles a recorded open: claim 6's resume mark, claim 5's
// reservation fulfilment, and the rules for opens the gate could not judge
// (a workload classified only after its open).
func (e *enforcer) opened(info occupancy.ProcInfo, gpu int, ev *bpf.Event) {
	if task := e.taskID(info); task != "" && e.exec.Journal != nil {
		if rec, ok, err := e.exec.Journal.Resumed(task, time.Now()); err != nil {
			e.d.log.Error("marking resumed", "task_id", task, "error", err)
		} else if ok {
			e.d.log.Info("preempted task resumed", "task_id", task, "record_id", rec.ID, "gpu", gpu)
			e.d.writer.Kick()
		}
	}
	e.mu.Lock()
	if r, ok := e.reserved[gpu]; ok && (r.cgroupID == ev.CgroupID || (r.containerID != "" && r.containerID == info.ContainerID)) {
		delete(e.reserved, gpu)
		delete(e.until, gpu)
	}
	e.mu.Unlock()

	counts := e.d.ledger.Counts()[gpu]
	switch info.Priority {
	case occupancy.High:
		if e.d.lender != nil && e.d.lender.isLent(gpu) {
			e.d.lender.takeBack(gpu)          // the borrower's later opens are refused again
			counts = e.d.ledger.Counts()[gpu] // the borrower may have just been classified
		}
		if counts.Low > 0 {
			e.preempt(gpu, info, e.lowHolders(gpu, fmt.Sprintf("a high-priority process opened GPU %d", gpu)), e.d.tracker.Wall(ev.Mono))
		}
	case occupancy.Low:
		// A borrower opening its lent GPU while the owner idles is the loan.
		if counts.High > 0 && (e.d.lender == nil || !e.d.lender.isLent(gpu)) {
			// Got past the gate unclassified: the deny rule, after the fact.
			v := preempt.Decide(preempt.Holding{High: true}, occupancy.Low)
			e.exec.Preempt(e.ctx, gpu, v.Rule+" (after the open)", preempt.Party{},
				[]preempt.Victim{e.victim(info, fmt.Sprintf("opened GPU %d, held by high priority", gpu))}, time.Now(), nil)
		}
	}
}

// drained is the tracker's hook: every event queued before mono is applied.
func (e *enforcer) drained(mono uint64) {
	e.mu.Lock()
	if mono > e.drainedAt {
		e.drainedAt = mono
	}
	e.mu.Unlock()
	e.sync()
}

// sync pushes per-GPU counts and reservations to the gate, then confirms
// that events up to the last drain are reflected: never further, or a
// high-priority open whose event is still queued would lose its mark.
// Called whenever the ring buffer is drained, and every second.
func (e *enforcer) sync() {
	e.mu.Lock()
	defer e.mu.Unlock()
	// The counts are read after the drain time they will be confirmed for,
	// so they reflect at least every event queued before it (a count read
	// earlier by a concurrent sync must never go out with a later drain).
	mono := e.drainedAt
	counts := e.d.ledger.Counts()
	for gpu, c := range counts {
		if c.High > 0 {
			// Reservations start when the high-priority holders are gone.
			delete(e.reserved, gpu)
			delete(e.until, gpu)
		} else if _, ok := e.reserved[gpu]; ok && mono > e.until[gpu] {
			delete(e.reserved, gpu) // expired: the next waiter's turn
			delete(e.until, gpu)
		}
		if _, ok := e.reserved[gpu]; !ok && c.High == 0 && len(e.waiters[gpu]) > 0 {
			e.reserved[gpu] = e.waiters[gpu][0]
			e.waiters[gpu] = e.waiters[gpu][1:]
			e.until[gpu] = mono + uint64(e.ttl.Nanoseconds())
			e.d.log.Info("GPU reserved for the earliest waiter", "gpu", gpu,
				"cgroup_id", e.reserved[gpu].cgroupID, "container_id", e.reserved[gpu].containerID, "ttl", e.ttl)
		}
		p := bpf.GPUPolicy{High: c.High, Low: c.Low}
		if e.d.lender != nil && e.d.lender.isLent(gpu) {
			// Lent: the owner's idle hold does not block its borrower; the
			// owner's next open still preempts the borrower (gate-high).
			p.High = 0
		}
		if r, ok := e.reserved[gpu]; ok {
			p.ReservedCgroup, p.ReservedUntil = r.cgroupID, e.until[gpu]
		}
		if last, ok := e.last[gpu]; ok && last == p && mono-e.lastConf[gpu] < confirmEvery {
			continue
		}
		if err := e.d.mon.SetGPUPolicy(uint32(gpu), p, mono); err != nil {
			e.d.log.Error("updating the gate", "gpu", gpu, "error", err)
			continue
		}
		e.last[gpu], e.lastConf[gpu] = p, mono
	}
}

// reservation reports gpu's reservation, for the state file and tests.
func (e *enforcer) reservation(gpu int) (uint64, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	r, ok := e.reserved[gpu]
	return r.cgroupID, ok
}
