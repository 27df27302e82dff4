// Package gate is the user-space controller of the kernel gate: it keeps
// each GPU's policy in the gate's maps (holder counts by class, loans,
// reservations), queues refused low-priority requests earliest first, and
// turns the gate's events and opens it could not judge into preemptions.
// Holding is the one statement of what the rule table sees of a GPU's
// holders now (a loan included): the policy Sync pushes, the after-the-fact
// rule of Opened and Explain's verdicts all go through it.
package gate

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	v1 "github.com/gpud/gpud/api/v1"
	"github.com/gpud/gpud/bpf"
	"github.com/gpud/gpud/internal/occupancy"
	"github.com/gpud/gpud/internal/preempt"
	"github.com/gpud/gpud/internal/workload"
)

// Kernel is the gate's side in the kernel (bpf.Monitor).
type Kernel interface {
	SetGPUPolicy(gpu uint32, p bpf.GPUPolicy, confirmedMono uint64) error
	SetCgroupPriority(cgroupID uint64, prio uint32) error
	CgroupPriority(cgroupID uint64) (prio uint32, ok bool, err error)
	ForgetCgroup(cgroupID uint64) error
	FenceCgroup(cgroupID uint64, gpus bpf.GPUSet, fenced int) error
	UnfenceCgroup(cgroupID uint64, fenced int) error
}

// Loans is the lender as the gate sees it: a lent GPU's idle owner does
// not block its borrower, and a high-priority open ends the loan.
type Loans interface {
	IsLent(gpu int) bool
	TakeBack(gpu int)
	// Role says what lending made of a pod: "borrower" or "owner" of gpu.
	Role(podUID string) (gpu int, role string, ok bool)
}

// Ledger is what the gate reads of GPU occupancy (*occupancy.Ledger):
// holders by GPU and class, and a fresh classification of them.
type Ledger interface {
	// Holders returns gpu's holders, agents left out.
	Holders(gpu int) []occupancy.ProcInfo
	// Counts returns every GPU's holders by class (every GPU, zero or not);
	// the map may be shared: read only.
	Counts() map[int]occupancy.ClassCounts
	// CountsVersioned is Counts with a number that changes whenever any
	// GPU's counts change.
	CountsVersioned() (map[int]occupancy.ClassCounts, uint64)
	CountsOf(gpu int) occupancy.ClassCounts
	Snapshot(now time.Time) occupancy.Snapshot
	Reclassify(classify func(*occupancy.ProcInfo))
}

// Classes is the workload registry as the gate reads it
// (*workload.Registry): whose a process is, its class, and its preempt mode.
type Classes interface {
	Lookup(info occupancy.ProcInfo) (workload.Workload, bool)
	// PreemptMode is the workload's own preempt mode where its namespace
	// may choose one ("": the node's).
	PreemptMode(w workload.Workload) string
	ClassifyProc(info *occupancy.ProcInfo)
	Explain(info occupancy.ProcInfo) (w workload.Workload, ok bool, class occupancy.Priority, reason string)
	AgentProc(info occupancy.ProcInfo) bool
}

// Executor carries out the gate's verdicts (*executor.Executor): kills or
// freezes victims, records refusals, resumes and adopts frozen workloads.
type Executor interface {
	// Handled reports whether v is being or was recently preempted.
	Handled(v preempt.Victim) bool
	Preempt(ctx context.Context, gpu int, rule string, preemptor preempt.Party, victims []preempt.Victim, decided time.Time, done chan<- struct{})
	// PreemptNow signals the victims before it returns; preemptor is read
	// only after that, for the records.
	PreemptNow(ctx context.Context, gpu int, rule string, known preempt.Party, preemptor func() preempt.Party, victims []preempt.Victim, decided time.Time)
	Denied(ctx context.Context, gpu int, rule string, opener preempt.Party, workload preempt.Target, reclaim bool)
	// Resume runs suspended workloads again whose GPUs held says are free
	// of high priority.
	Resume(held func(gpu int) preempt.Holding)
	Adopt(recs []preempt.Record, cands []preempt.AdoptCandidate) (adopted, thawed int)
	SuspendedPID(pid int) (v1.Suspension, bool)
}

// Journal is the preemption records as the gate reads them
// (*journal.Journal).
type Journal interface {
	// Resumed marks the task's latest preemption resumed (ok false: none
	// to mark).
	Resumed(namespace, taskID string, at time.Time) (preempt.Record, bool, error)
	Recent() []preempt.Record
}

// Controller turns the gate's events and the ledger into actions and keeps
// the gate's per-GPU policy current.
type Controller struct {
	Ledger   Ledger
	Registry Classes
	Exec     Executor
	// Journal is the executor's (nil: no records, nothing adopted).
	Journal Journal
	Kernel  Kernel
	// Identify names the process behind a gate event (the tracker's).
	Identify func(pid int, ev *bpf.Event) occupancy.ProcInfo
	// Wall turns an event's CLOCK_MONOTONIC time into wall time.
	Wall func(mono uint64) time.Time
	// Changed is called when something the state file shows changed
	// outside the ledger (a preempted task resumed).
	Changed func()
	Log     *slog.Logger
	// TTL is how long a freed GPU waits for its earliest refused requester.
	TTL time.Duration

	// For Explain.
	Proc       *occupancy.ProcFS
	Enforce    bool
	Reclaim    string
	Monitoring func() bool

	Denials  atomic.Uint64 // refusals recorded
	Rejudged atomic.Uint64 // holders preempted by Rejudge

	// SharedOpened is called when a GPU shared by memory was opened (the
	// daemon's share judgement then finds holders without a share).
	SharedOpened func(gpu int)
	// ComputeShare is pod podUID's share of GPU gpu's compute, when the
	// compute scheduler shares it (explain shows it); nil: none.
	ComputeShare func(gpu int, podUID string) (v1.StateComputeShare, bool)
	// ShareRefusals counts opens of a shared GPU the kernel refused to a
	// workload without a share of it (reports, at most one per workload
	// and GPU per 100 ms).
	ShareRefusals atomic.Uint64

	judging atomic.Bool // Rejudge acts (Judge was called)
	fences  fences      // sharing pods' GPUs, as the kernel has them

	// started: Start's context and lender, read without mu: the event
	// thread's preemption path reads them, and mu is held by Sync (map
	// writes, the ledger's counts) from a goroutine at normal priority,
	// which a busy node preempts for milliseconds at a time.
	started atomic.Pointer[startedWith]

	mu        sync.Mutex
	waiters   map[int][]waiter // GPU → denied low-priority requests, oldest first
	reserved  map[int]waiter   // GPU → the waiter it is reserved for
	until     map[int]uint64   // GPU → reservation end, CLOCK_MONOTONIC
	last      map[int]bpf.GPUPolicy
	lastConf  map[int]uint64 // GPU → when the gate was last told "confirmed up to"
	drainedAt uint64         // the latest time the ring buffer was seen drained

	// What the last pass over the GPUs saw, for the drains after it: under
	// a churn of opens the ring buffer drains at nearly every event, and a
	// pass whose inputs are unchanged while every GPU was confirmed less
	// than confirmEvery ago would write nothing (see unchangedLocked).
	synced     map[int]syncedGPU
	syncedGen  uint64 // the ledger's counts version synced was read at
	highGPUs   []int  // the GPUs high priority held at that pass (their loans matter)
	heldFn     func(gpu int) preempt.Holding
	clean      bool   // synced is all that changed; false: the next drain makes a pass
	oldestConf uint64 // the oldest confirmation among the GPUs after that pass
	expires    uint64 // the earliest reservation end after that pass (MaxUint64: none)
	passes     uint64 // passes made (tests)
}

// syncedGPU is one GPU's inputs to its policy as the last pass read them
// outside the controller's own state (reservations and waiters clear
// clean instead; a change of the shared GPUs makes its own Sync). Whether
// the GPU is lent only matters while high priority holds it (Holding), and
// the lender is only asked then.
type syncedGPU struct {
	counts occupancy.ClassCounts
	lent   bool // counts.High > 0 and lent
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

// Start sets the context preemptions run under (the daemon's) and the
// lender (nil without lending); call it before events flow.
func (c *Controller) Start(ctx context.Context, loans Loans) {
	c.started.Store(&startedWith{ctx: ctx, loans: loans})
}

type startedWith struct {
	ctx   context.Context
	loans Loans
}

// loans is the lender Start was given (nil: none, or not started).
func (c *Controller) loans() Loans {
	if s := c.started.Load(); s != nil {
		return s.loans
	}
	return nil
}

func (c *Controller) init() {
	if c.waiters == nil {
		c.waiters, c.reserved, c.until = map[int][]waiter{}, map[int]waiter{}, map[int]uint64{}
		c.last, c.lastConf = map[int]bpf.GPUPolicy{}, map[int]uint64{}
		c.synced = map[int]syncedGPU{}
	}
}

func (c *Controller) context() context.Context {
	if s := c.started.Load(); s != nil && s.ctx != nil {
		return s.ctx
	}
	return context.Background()
}

func (c *Controller) lent(gpu int) bool {
	l := c.loans()
	return l != nil && l.IsLent(gpu)
}

func (c *Controller) takeBack(gpu int) {
	if l := c.loans(); l != nil {
		l.TakeBack(gpu)
	}
}

// Holding is what the rules see of a GPU's holders: a lent GPU's idle
// owner does not block its borrower (the owner's next open still preempts
// the borrower, through the gate's high mark).
func Holding(counts occupancy.ClassCounts, lent bool) preempt.Holding {
	return preempt.Holding{High: counts.High > 0 && !lent, Low: counts.Low > 0}
}

func party(info occupancy.ProcInfo, taskID string) preempt.Party {
	return preempt.Party{PID: info.PID, Comm: info.Comm, ContainerID: info.ContainerID, PodUID: info.PodUID,
		TaskID: taskID, CgroupID: info.CgroupID}
}

func (c *Controller) taskID(info occupancy.ProcInfo) string {
	_, task := c.task(info)
	return task
}

// task names a process's task as its kill records and checkpoint
// directory do: its pod's namespace with its task id ("" for a Docker
// container's, as workload gives a reclaim target's namespace).
func (c *Controller) task(info occupancy.ProcInfo) (namespace, taskID string) {
	w, ok := c.Registry.Lookup(info)
	if !ok {
		return "", ""
	}
	if w.PodUID != "" {
		namespace = w.Namespace
	}
	return namespace, w.TaskID
}

// workload names what a process's reclaim acts on: its pod when gpud knows
// the pod, else its container.
func (c *Controller) workload(info occupancy.ProcInfo, reason string) preempt.Target {
	if w, ok := c.Registry.Lookup(info); ok && w.PodUID != "" {
		return preempt.Target{PodUID: w.PodUID, Namespace: w.Namespace, Name: w.Name, Reason: reason}
	}
	if info.PodUID != "" {
		return preempt.Target{PodUID: info.PodUID, Reason: reason} // unknown pod: not reclaimed
	}
	return preempt.Target{ContainerID: info.ContainerID, Reason: reason}
}

func (c *Controller) victim(info occupancy.ProcInfo, reason string) preempt.Victim {
	v := preempt.Victim{ProcInfo: info, TaskID: c.taskID(info), Workload: c.workload(info, reason)}
	if w, ok := c.Registry.Lookup(info); ok {
		v.WorkloadCgroup, v.LivenessProbe = w.CgroupID, w.LivenessProbe
		// A mode the workload's namespace may not choose is no choice
		// (Registry.PreemptMode): the node's mode applies.
		if pm := c.Registry.PreemptMode(w); pm != "" {
			// A malformed label gets the node's mode: it only chooses
			// between two ways of preempting.
			if m, err := preempt.ParseMode(pm); err == nil {
				v.Mode = m
			} else {
				c.Log.Warn("ignoring the workload's preempt-mode label", "label", workload.LabelPreemptMode, "error", err)
			}
		}
	}
	return v
}

// lowHolders returns the low-priority holders of gpu as victims.
func (c *Controller) lowHolders(gpu int, reason string) []preempt.Victim {
	var out []preempt.Victim
	for _, h := range c.Ledger.Holders(gpu) {
		if h.Priority == occupancy.Low {
			out = append(out, c.victim(h, reason))
		}
	}
	return out
}

// PreemptLow preempts gpu's low-priority holders for by (the high-priority
// side, named in the record); it returns how many it set out to preempt.
func (c *Controller) PreemptLow(gpu int, by occupancy.ProcInfo, reason string, decided time.Time) int {
	victims := c.lowHolders(gpu, reason)
	if len(victims) > 0 {
		c.preempt(gpu, by, victims, decided)
	}
	return len(victims)
}

// Preempt preempts holders of gpu for by, whatever their class (a
// borrower whose class is not known yet); the executor acts once per
// process however often it is asked. It returns how many were new.
func (c *Controller) Preempt(gpu int, by occupancy.ProcInfo, holders []occupancy.ProcInfo, reason string) int {
	var victims []preempt.Victim
	for _, h := range holders {
		if v := c.victim(h, reason); !c.Exec.Handled(v) {
			victims = append(victims, v)
		}
	}
	if len(victims) > 0 {
		c.preempt(gpu, by, victims, time.Now())
	}
	return len(victims)
}

// PreemptForRule preempts holders of gpu for by under a rule decided
// outside the rule table (the GPU memory share rule: its name goes to the
// records); only low-priority holders are ever taken, whatever the caller
// passes. It returns how many were new.
func (c *Controller) PreemptForRule(gpu int, by occupancy.ProcInfo, holders []occupancy.ProcInfo, rule, reason string) int {
	var victims []preempt.Victim
	for _, h := range holders {
		if h.Priority != occupancy.Low || h.Agent {
			continue
		}
		if v := c.victim(h, reason); !c.Exec.Handled(v) {
			victims = append(victims, v)
		}
	}
	if len(victims) > 0 {
		c.Exec.Preempt(c.context(), gpu, rule, party(by, c.taskID(by)), victims, time.Now(), nil)
	}
	return len(victims)
}

func (c *Controller) preempt(gpu int, pre occupancy.ProcInfo, victims []preempt.Victim, decided time.Time) {
	v := preempt.Decide(preempt.Holding{Low: true}, occupancy.High)
	c.Exec.Preempt(c.context(), gpu, v.Rule, party(pre, c.taskID(pre)), victims, decided, nil)
}

// HandleEvent handles the gate's events, emitted at decision time.
func (c *Controller) HandleEvent(ev *bpf.Event) {
	gpu := int(ev.GPU)
	switch ev.Type {
	case bpf.EventOpen:
		c.openReported(ev)
	case bpf.EventGateHigh:
		if c.shared(gpu) {
			return // an event the kernel emitted before it knew: the share rule judges
		}
		preempt.StepAt("decision", ev.Mono)
		preempt.Step("event")
		c.takeBack(gpu)
		// Kill first; the preemptor's identity is only for the record.
		victims := c.lowHolders(gpu, fmt.Sprintf("a high-priority process opened GPU %d", gpu))
		if len(victims) == 0 {
			return
		}
		preempt.Step("victims")
		// The signals are sent before PreemptNow returns; the opener is
		// read from /proc (its identity, for the records) only after them.
		// A copy of the event: the tracker reuses it.
		e := *ev
		v := preempt.Decide(preempt.Holding{Low: true}, occupancy.High)
		c.Exec.PreemptNow(c.context(), gpu, v.Rule, c.knownOpener(&e), func() preempt.Party {
			o := c.opener(&e)
			return party(o, c.taskID(o))
		}, victims, c.Wall(ev.Mono))
	case bpf.EventDeny:
		if c.shared(gpu) {
			c.shareRefused(ev)
			return // no waiter: a shared GPU is not freed for a workload without a share
		}
		opener := c.opener(ev)
		target := c.workload(opener, fmt.Sprintf("refused GPU %d, held by high priority", gpu))
		if c.addWaiter(gpu, waiter{cgroupID: ev.CgroupID, containerID: opener.ContainerID, workload: target.Key(), since: c.Wall(ev.Mono)}) {
			v := preempt.Decide(preempt.Holding{High: true}, occupancy.Low)
			c.Denials.Add(1)
			c.Exec.Denied(c.context(), gpu, v.Rule, party(opener, c.taskID(opener)), target, v.ReclaimOpener)
		}
	}
}

// opener identifies the process behind a gate event. The event's cgroup
// is the classified cgroup that decided (a pod's or a container's): it
// names the workload even when the opener has exited before /proc could be
// read, as a refused opener often has.
func (c *Controller) opener(ev *bpf.Event) occupancy.ProcInfo {
	info := c.Identify(int(ev.TGID), ev)
	if w, ok := c.Registry.Lookup(occupancy.ProcInfo{CgroupID: ev.CgroupID}); ok {
		if info.ContainerID == "" && info.PodUID == "" {
			info.ContainerID, info.PodUID = w.ContainerID, w.PodUID
		}
		info.Priority = w.Priority
	}
	if ev.CgroupID != 0 {
		info.CgroupID = ev.CgroupID // the waiter's cgroup: covers the whole workload
	}
	return info
}

// knownOpener names the process behind a gate event with what is known
// without reading /proc: the event's own fields and its cgroup's workload.
func (c *Controller) knownOpener(ev *bpf.Event) preempt.Party {
	p := preempt.Party{PID: int(ev.TGID), Comm: ev.Comm, CgroupID: ev.CgroupID}
	if w, ok := c.Registry.Lookup(occupancy.ProcInfo{CgroupID: ev.CgroupID}); ok {
		p.ContainerID, p.PodUID, p.TaskID = w.ContainerID, w.PodUID, w.TaskID
	}
	return p
}

// addWaiter queues a denied request; false when that cgroup already waits.
func (c *Controller) addWaiter(gpu int, w waiter) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.init()
	for _, x := range c.waiters[gpu] {
		if x.cgroupID == w.cgroupID {
			return false
		}
	}
	if r, ok := c.reserved[gpu]; ok && r.cgroupID == w.cgroupID {
		return false
	}
	c.waiters[gpu] = append(c.waiters[gpu], w)
	c.clean = false // a free GPU is reserved for it at the next drain
	sort.SliceStable(c.waiters[gpu], func(i, j int) bool { return c.waiters[gpu][i].since.Before(c.waiters[gpu][j].since) })
	return true
}

// DropWaiters removes the requests of a workload (preempt.Target.Key) that
// is gone, reclaimed after its refusal: a freed GPU must not wait for it.
func (c *Controller) DropWaiters(key string) {
	if key == "" {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.clean = false
	for gpu, ws := range c.waiters {
		kept := ws[:0]
		for _, w := range ws {
			if w.workload != key {
				kept = append(kept, w)
			}
		}
		c.waiters[gpu] = kept
	}
	for gpu, r := range c.reserved {
		if r.workload == key {
			delete(c.reserved, gpu)
			delete(c.until, gpu)
		}
	}
}

// fulfil ends gpu's reservation when its waiter (by cgroup, or by
// container where the open came from another cgroup of it) opened it.
func (c *Controller) fulfil(gpu int, cgroupID uint64, containerID string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if r, ok := c.reserved[gpu]; ok && (r.cgroupID == cgroupID || (r.containerID != "" && r.containerID == containerID)) {
		delete(c.reserved, gpu)
		delete(c.until, gpu)
		c.clean = false
	}
}

// openReported handles an open the gate let through, reported before its
// fd exists (--hooks driver): it fulfils the GPU's reservation even when
// the opener is gone before its fd could be read (and Opened never runs
// for it). The opener is read from /proc only while a reservation exists.
func (c *Controller) openReported(ev *bpf.Event) {
	gpu := int(ev.GPU)
	c.mu.Lock()
	r, ok := c.reserved[gpu]
	c.mu.Unlock()
	if !ok {
		return
	}
	containerID := ""
	if r.cgroupID != ev.CgroupID {
		containerID = c.opener(ev).ContainerID
	}
	c.fulfil(gpu, ev.CgroupID, containerID)
}

// Opened handles a recorded open (the tracker's hook): a preempted task's
// resume mark, a reservation's fulfilment, and the rules for opens the
// gate could not judge (a workload classified only after its open).
func (c *Controller) Opened(info occupancy.ProcInfo, gpu int, ev *bpf.Event) {
	if ns, task := c.task(info); task != "" && c.Journal != nil {
		if rec, ok, err := c.Journal.Resumed(ns, task, time.Now()); err != nil {
			c.Log.Error("marking resumed", "namespace", ns, "task_id", task, "error", err)
		} else if ok {
			c.Log.Info("preempted task resumed", "namespace", ns, "task_id", task, "record_id", rec.ID, "gpu", gpu)
			if c.Changed != nil {
				c.Changed()
			}
		}
	}
	c.fulfil(gpu, ev.CgroupID, info.ContainerID)

	if c.shared(gpu) {
		// Shared by memory: the share rule judges its holders, not the
		// table; a workload without a share of it (in before it was
		// shared, or before the kernel knew its cgroup) goes there.
		if c.SharedOpened != nil {
			c.SharedOpened(gpu)
		}
		return
	}
	counts := c.Ledger.CountsOf(gpu)
	switch info.Priority {
	case occupancy.High:
		if c.lent(gpu) {
			c.takeBack(gpu)                 // the borrower's later opens are refused again
			counts = c.Ledger.CountsOf(gpu) // the borrower may have just been classified
		}
		if counts.Low > 0 {
			c.preempt(gpu, info, c.lowHolders(gpu, fmt.Sprintf("a high-priority process opened GPU %d", gpu)), c.Wall(ev.Mono))
		}
	case occupancy.Low:
		// A borrower opening its lent GPU while the owner idles is the loan.
		if Holding(counts, c.lent(gpu)).High {
			// Got past the gate unclassified: the deny rule, after the fact.
			// Said at warning level with what the kernel knows of the opener
			// now: a low workload on a high GPU is what gpud exists to
			// prevent, and each one must be explainable.
			c.Log.Warn("a low-priority open of a GPU high priority holds got past the gate: preempting it after the fact",
				"gpu", gpu, "pid", info.PID, "container_id", info.ContainerID, "pod_uid", info.PodUID,
				"cgroup_id", ev.CgroupID, "kernel_class", c.kernelClass(ev.CgroupID),
				"open_age", time.Duration(bpf.MonotonicNow()-ev.Mono).Round(time.Microsecond))
			v := preempt.Decide(preempt.Holding{High: true}, occupancy.Low)
			c.Exec.Preempt(c.context(), gpu, v.Rule+" (after the open)", preempt.Party{},
				[]preempt.Victim{c.victim(info, fmt.Sprintf("opened GPU %d, held by high priority", gpu))}, time.Now(), nil)
		}
	}
}

// kernelClass names the class the kernel has now for a cgroup id itself
// (not its ancestors'), for the log.
func (c *Controller) kernelClass(id uint64) string {
	p, ok, err := c.Kernel.CgroupPriority(id)
	switch {
	case err != nil:
		return "unreadable: " + err.Error()
	case !ok:
		return "none"
	case p == bpf.PrioHigh:
		return "high"
	case p == bpf.PrioLow:
		return "low"
	case p == bpf.PrioWorkload:
		return "workload"
	}
	return fmt.Sprintf("unknown (%d)", p)
}

// Drained is the tracker's hook: every event queued before mono is applied.
func (c *Controller) Drained(mono uint64) {
	c.mu.Lock()
	if mono > c.drainedAt {
		c.drainedAt = mono
	}
	c.mu.Unlock()
	c.sync(true)
}

// Sync pushes per-GPU counts and reservations to the gate, then confirms
// that events up to the last drain are reflected: never further, or a
// high-priority open whose event is still queued would lose its mark.
// Called whenever the ring buffer is drained (Drained), every second, and
// by whatever changed the policy's inputs outside the ledger (loans, shared
// GPUs, classes).
func (c *Controller) Sync() { c.sync(false) }

// sync is Sync; drained: called for a drain, which skips the pass over the
// GPUs when it would write nothing.
func (c *Controller) sync(drained bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.init()
	// The counts are read after the drain time they will be confirmed for,
	// so they reflect at least every event queued before it (a count read
	// earlier by a concurrent sync must never go out with a later drain).
	mono := c.drainedAt
	counts, gen := c.Ledger.CountsVersioned()
	if !drained || !c.unchangedLocked(counts, gen, mono) {
		c.passLocked(counts, gen, mono)
	}
	// Suspended workloads whose GPUs high priority let go run again.
	if c.heldFn == nil {
		// Made once: a closure made at every drain was 4 % of gpud's CPU
		// under the big node's churn.
		c.heldFn = func(gpu int) preempt.Holding { return Holding(c.Ledger.CountsOf(gpu), c.lent(gpu)) }
	}
	c.Exec.Resume(c.heldFn)
}

// unchangedLocked reports whether a pass over the GPUs at mono would write
// nothing: since the last pass no count, loan, waiter or reservation
// changed, no reservation ended, and every GPU was confirmed less than
// confirmEvery before mono (a pass re-confirms it then). Skipping it
// confirms nothing new: the gate's confirmations only ever come from a
// pass, which reads the counts after the drain it confirms.
func (c *Controller) unchangedLocked(counts map[int]occupancy.ClassCounts, gen, mono uint64) bool {
	if !c.clean || mono-c.oldestConf >= confirmEvery || mono > c.expires || len(counts) != len(c.synced) {
		return false
	}
	if gen == c.syncedGen {
		// The same counts (walking them was 12 % of gpud's CPU under the
		// big node's churn): only the loans of high-held GPUs may differ.
		for _, gpu := range c.highGPUs {
			if c.synced[gpu].lent != c.lent(gpu) {
				return false
			}
		}
		return true
	}
	for gpu, n := range counts {
		if s, ok := c.synced[gpu]; !ok || s.counts != n || (n.High > 0 && s.lent != c.lent(gpu)) {
			return false
		}
	}
	return true
}

// passLocked works out each GPU's reservation and policy and writes those
// that changed or were confirmed confirmEvery ago or earlier.
func (c *Controller) passLocked(counts map[int]occupancy.ClassCounts, gen, mono uint64) {
	c.clean, c.oldestConf, c.expires = true, mono, math.MaxUint64
	c.passes++
	clear(c.synced)
	c.syncedGen, c.highGPUs = gen, c.highGPUs[:0]
	for gpu, n := range counts {
		if n.High > 0 {
			// Reservations start when the high-priority holders are gone.
			delete(c.reserved, gpu)
			delete(c.until, gpu)
		} else if _, ok := c.reserved[gpu]; ok && mono > c.until[gpu] {
			delete(c.reserved, gpu) // expired: the next waiter's turn
			delete(c.until, gpu)
		}
		if _, ok := c.reserved[gpu]; !ok && n.High == 0 && len(c.waiters[gpu]) > 0 {
			c.reserved[gpu] = c.waiters[gpu][0]
			c.waiters[gpu] = c.waiters[gpu][1:]
			c.until[gpu] = mono + uint64(c.TTL.Nanoseconds())
			c.Log.Info("GPU reserved for the earliest waiter", "gpu", gpu,
				"cgroup_id", c.reserved[gpu].cgroupID, "container_id", c.reserved[gpu].containerID, "ttl", c.TTL)
		}
		lent := n.High > 0 && c.lent(gpu)
		p := bpf.GPUPolicy{Low: n.Low}
		if Holding(n, lent).High {
			p.High = n.High
		}
		if c.shared(gpu) {
			// Shared by memory (DRA): its pods are there together whatever
			// their class; the share rule, not the table, preempts.
			p = bpf.GPUPolicy{Shared: true}
		}
		if r, ok := c.reserved[gpu]; ok {
			p.ReservedCgroup, p.ReservedUntil = r.cgroupID, c.until[gpu]
			c.expires = min(c.expires, c.until[gpu])
		}
		c.synced[gpu] = syncedGPU{counts: n, lent: lent}
		if n.High > 0 {
			c.highGPUs = append(c.highGPUs, gpu)
		}
		if last, ok := c.last[gpu]; !ok || last != p || mono-c.lastConf[gpu] >= confirmEvery {
			if err := c.Kernel.SetGPUPolicy(uint32(gpu), p, mono); err != nil {
				c.Log.Error("updating the gate", "gpu", gpu, "error", err)
				c.clean = false // tried again at the next drain
				continue
			}
			c.last[gpu], c.lastConf[gpu] = p, mono
		}
		c.oldestConf = min(c.oldestConf, c.lastConf[gpu])
	}
}

// Judge starts judging holders after the fact (Rejudge), and judges them
// all once. A restarted gpud calls it only once every workload source has
// listed what exists and the lender knows its loans: before that, a
// borrower beside its idle owner would look like a low holder of a
// high-held GPU.
func (c *Controller) Judge() {
	if c.Exec != nil && c.Journal != nil {
		// What a gpud killed outright left frozen is this one's again
		// before anything is judged: a frozen holder is not judged twice.
		c.Ledger.Reclassify(c.Registry.ClassifyProc)
		var cands []preempt.AdoptCandidate
		for gpu := range c.Ledger.Counts() {
			for _, h := range c.Ledger.Holders(gpu) {
				cands = append(cands, preempt.AdoptCandidate{GPU: gpu, Victim: c.victim(h, "adopted from the previous gpud")})
			}
		}
		if a, th := c.Exec.Adopt(c.Journal.Recent(), cands); a+th > 0 {
			c.Log.Info("the previous gpud's frozen workloads", "adopted", a, "thawed", th)
		}
	}
	c.judging.Store(true)
	c.Rejudge("gpud started")
}

// rejudgedRule names the rule Rejudge applies in records.
const rejudgedRule = "class known after the open: a low-priority holder of a GPU high priority holds: kill"

// Rejudge applies the rule table to every GPU's holders as they are
// classified now, and is the one path for "a holder's class became known or
// changed" (a workload classified after its open, a label or the default
// changed, a lending override, monitoring back on, gpud restarted): on a
// GPU that high priority holds, every low-priority holder is preempted as a
// refused opener would be (killed, recorded, its workload reclaimed),
// whichever of the two came first. A GPU lent to its holders is theirs to
// share (Holding). It returns how many holders it set out to preempt.
func (c *Controller) Rejudge(why string) int {
	if !c.judging.Load() || (c.Monitoring != nil && !c.Monitoring()) || !c.Enforce {
		return 0
	}
	n := 0
	for gpu, counts := range c.Ledger.Counts() {
		if counts.Low == 0 || !Holding(counts, c.lent(gpu)).High || c.shared(gpu) {
			continue
		}
		var by occupancy.ProcInfo
		var victims []preempt.Victim
		for _, h := range c.Ledger.Holders(gpu) {
			switch h.Priority {
			case occupancy.High:
				if by.PID == 0 {
					by = h
				}
			case occupancy.Low:
				if v := c.victim(h, fmt.Sprintf("held GPU %d beside high priority (%s)", gpu, why)); !c.Exec.Handled(v) {
					victims = append(victims, v)
				}
			}
		}
		if len(victims) == 0 {
			continue
		}
		c.Log.Info("low-priority holders beside high priority: preempting them", "gpu", gpu, "holders", len(victims), "why", why)
		c.Rejudged.Add(uint64(len(victims)))
		c.Exec.Preempt(c.context(), gpu, rejudgedRule, party(by, c.taskID(by)), victims, time.Now(), nil)
		n += len(victims)
	}
	return n
}

// ClassChanged is the registry's hook (workload.Registry.OnChange): the
// gate learns a cgroup's class (p is high, low, unmanaged for a workload of
// no enforced class, or "" for no longer classified), and the holders are
// classified again.
func (c *Controller) ClassChanged(cgroupID uint64, p occupancy.Priority) {
	var err error
	switch p {
	case occupancy.High:
		err = c.Kernel.SetCgroupPriority(cgroupID, bpf.PrioHigh)
	case occupancy.Low:
		err = c.Kernel.SetCgroupPriority(cgroupID, bpf.PrioLow)
	case occupancy.Unmanaged, occupancy.Unclassified:
		// A workload of no enforced class: the table ignores it, a GPU
		// shared by memory refuses it unless its fence lets it in.
		err = c.Kernel.SetCgroupPriority(cgroupID, bpf.PrioWorkload)
	default:
		err = c.Kernel.ForgetCgroup(cgroupID)
	}
	if err != nil {
		c.Log.Error("updating the gate's cgroups", "cgroup_id", cgroupID, "error", err)
	}
	c.Reclassified("class changed")
}

// Reclassified classifies every holder again and judges them: call it
// whenever classes may have changed (a source, lending, the default).
func (c *Controller) Reclassified(why string) {
	c.Ledger.Reclassify(c.Registry.ClassifyProc)
	c.Sync()
	c.Rejudge(why)
}

// Reservation reports whom gpu is reserved for, by cgroup id.
func (c *Controller) Reservation(gpu int) (uint64, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	r, ok := c.reserved[gpu]
	return r.cgroupID, ok
}
