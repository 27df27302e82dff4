package sharing

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	v1 "github.com/gpud/gpud/api/v1"
	"github.com/gpud/gpud/internal/occupancy"
	"github.com/gpud/gpud/internal/workload"
)

// Holders is who holds each GPU and how much of its memory: the ledger.
type Holders interface {
	Snapshot(now time.Time) occupancy.Snapshot
}

// Workloads finds a pod's workload, for its cgroup (the fence is per
// cgroup): the workload registry.
type Workloads interface {
	Lookup(p occupancy.ProcInfo) (workload.Workload, bool)
}

// Fencer keeps the kernel's share fence and the cgroups' classes: the
// gate.
type Fencer interface {
	// FenceShares says which GPUs are shared and which GPUs each sharing
	// pod's cgroup may open.
	FenceShares(shared []int, want map[uint64][]int)
	// ClassChanged tells the kernel a cgroup's class.
	ClassChanged(cgroupID uint64, p occupancy.Priority)
}

// Preempter carries out the preemptions the share rule chose (kill or
// freeze, the journal, the reclaim): the gate, through its executor.
type Preempter interface {
	// PreemptForRule preempts victims of gpu for by under rule; it returns
	// how many processes it preempted.
	PreemptForRule(gpu int, by occupancy.ProcInfo, victims []occupancy.ProcInfo, rule, reason string) int
	// PreemptIntruders kills, under the intruder rule, workloads that hold
	// the shared GPU gpu without a share of it; it returns how many.
	PreemptIntruders(gpu int, intruders []occupancy.ProcInfo) int
}

// Warner puts a Warning Event on a pod: the Kubernetes Events.
type Warner interface {
	Warn(podUID, reason, msg string)
}

// EnforcerConfig is what an Enforcer is built from.
type EnforcerConfig struct {
	Book      *Book
	Holders   Holders
	Workloads Workloads
	Fencer    Fencer
	Preempter Preempter
	// Events, when set, gets a Warning Event for each pod going over its
	// share (nil without an API server).
	Events Warner
	// Enforcing reports whether rules are carried out (--enforce, with
	// monitoring on): otherwise nothing is preempted, and the warnings and
	// the state still say who is over.
	Enforcing func() bool
	// Changed is called when a verdict changed or a pod was preempted
	// (the state file, the lender: a GPU shared or no longer).
	Changed func()
	Log     *slog.Logger
}

// Enforcer applies the share rule (Judge) to the shared GPUs, on every
// Kick: it fences the sharing pods to their GPUs, warns of pods going
// over their share (the log, an Event, a counter), logs holders outside
// every share once, preempts what the rule chose and the workloads
// without a share, and keeps the verdicts for the state file and metrics.
type Enforcer struct {
	cfg  EnforcerConfig
	kick chan struct{}
	// fenceMu orders the fences' computations with their pushes: a fence
	// computed from an older book or registry never overwrites a newer one.
	fenceMu sync.Mutex

	mu        sync.Mutex
	last      map[int]Judgement            // by GPU index
	over      map[overKey]bool             // shares over now
	conflicts map[int]map[int]bool         // GPU → PIDs logged as conflicts
	preempted map[string]bool              // pod UIDs the rule preempted (shown while their share lasts)
	holders   map[int][]occupancy.ProcInfo // by GPU, as last judged
	// settle: GPU → until when the share rule preempts no one more there,
	// after it preempted (settleAfterPreempt).
	settle map[int]time.Time

	overs, preemptions atomic.Uint64
}

type overKey struct {
	claim, request string
	gpu            int
	pod            string
}

// NewEnforcer builds the enforcement of cfg.Book and hooks the book: at
// once, in the prepare (or the new reservation) that changed it, before
// the pod's containers start, the claimants are fenced in and their GPU
// is no one's to hold (the table stops applying to it, any other workload
// is refused); then the share rule judges.
func NewEnforcer(cfg EnforcerConfig) *Enforcer {
	e := &Enforcer{
		cfg: cfg, kick: make(chan struct{}, 1),
		last: map[int]Judgement{}, over: map[overKey]bool{}, conflicts: map[int]map[int]bool{}, preempted: map[string]bool{},
		holders: map[int][]occupancy.ProcInfo{}, settle: map[int]time.Time{},
	}
	cfg.Book.OnChange(func() {
		e.Fence()
		e.Kick()
	})
	return e
}

// Kick asks for a judgement of the shared GPUs (coalesced); a nil
// Enforcer (no share book) has nothing to judge.
func (e *Enforcer) Kick() {
	if e == nil {
		return
	}
	select {
	case e.kick <- struct{}{}:
	default:
	}
}

// Run judges the shared GPUs on each kick until ctx ends.
func (e *Enforcer) Run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-e.kick:
			e.Enforce()
		}
	}
}

// Overs counts the pods that went over their share (each going over); 0
// for a nil Enforcer (no share book).
func (e *Enforcer) Overs() uint64 {
	if e == nil {
		return 0
	}
	return e.overs.Load()
}

// Preemptions counts the pods the share rule preempted; 0 for a nil
// Enforcer.
func (e *Enforcer) Preemptions() uint64 {
	if e == nil {
		return 0
	}
	return e.preemptions.Load()
}

// Enforce applies the share rule (the pure Judge) to every shared GPU:
// warns of pods going over their share, logs holders outside every share,
// preempts what the rule chose, and keeps the verdict for the state file
// and metrics.
func (e *Enforcer) Enforce() {
	byGPU := e.Fence()
	if len(byGPU) == 0 {
		e.mu.Lock()
		had := len(e.last) > 0
		e.last, e.holders, e.over, e.conflicts = map[int]Judgement{}, map[int][]occupancy.ProcInfo{}, map[overKey]bool{}, map[int]map[int]bool{}
		e.mu.Unlock()
		if had {
			e.cfg.Changed()
		}
		return // nothing shared: no snapshot of the ledger every second
	}
	snap := e.cfg.Holders.Snapshot(time.Now())
	last := map[int]Judgement{}
	holders := map[int][]occupancy.ProcInfo{}
	var decisions []shareDecision
	for _, g := range snap.GPUs {
		gs := byGPU[g.Index]
		if len(gs) == 0 {
			continue
		}
		in := Input{Shares: gs}
		if g.Memory != nil {
			in.Memory = &Memory{Total: g.Memory.Total, Used: g.Memory.Used}
		}
		for _, h := range g.Holders {
			p := Proc{PID: h.PID, PodUID: h.PodUID, Priority: h.Priority}
			if h.Memory != nil {
				p.Memory = *h.Memory
			}
			in.Procs = append(in.Procs, p)
			holders[g.Index] = append(holders[g.Index], h.ProcInfo)
		}
		j := Judge(in)
		last[g.Index] = j
		decisions = append(decisions, shareDecision{gpu: g.Index, j: j})
	}
	e.mu.Lock()
	// The state file is rewritten when a verdict changed, not every second.
	changed := !reflect.DeepEqual(e.last, last)
	e.last, e.holders = last, holders
	warn, conflicts := e.transitions(last)
	e.mu.Unlock()
	for _, w := range warn {
		e.warnOver(w.gpu, w)
	}
	for _, c := range conflicts {
		e.cfg.Log.Warn("a process holds a shared GPU outside every share: another device plugin may have given it the whole GPU",
			"gpu", c.gpu, "pid", c.proc.PID, "pod_uid", c.proc.PodUID, "memory_bytes", c.proc.Memory)
	}
	for _, dc := range decisions {
		// As the open rules: nothing is preempted under --enforce=false or
		// with monitoring off; the warnings and the state still say who is
		// over.
		if e.cfg.Enforcing() && e.settled(dc.gpu) && e.preemptForShares(dc.gpu, dc.j, holders[dc.gpu]) {
			e.mu.Lock()
			e.settle[dc.gpu] = time.Now().Add(settleAfterPreempt)
			e.mu.Unlock()
			changed = true
		}
		if e.cfg.Enforcing() && e.preemptIntruders(dc.gpu, dc.j, holders[dc.gpu]) {
			changed = true
		}
	}
	if changed {
		e.cfg.Changed()
	}
}

// settleAfterPreempt is how long the share rule waits on a GPU after it
// preempted there before it preempts again: NVML's used memory lags a
// killed victim's exit (the driver tears its context down; the next
// sample is up to a second away) while the victim is already gone from
// the holders, so a judgement in between would see the need uncovered
// still and take the next sharer, one within its share for a high need.
const settleAfterPreempt = 2 * time.Second

// settled reports whether the share rule may preempt on gpu again.
func (e *Enforcer) settled(gpu int) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return !time.Now().Before(e.settle[gpu])
}

type shareDecision struct {
	gpu int
	j   Judgement
}

type overWarning struct {
	gpu int
	use Use
	pod PodRef
}

type conflict struct {
	gpu  int
	proc Proc
}

// transitions updates who is over and which conflicts were logged, and
// returns the shares that went over and the conflicts that are new.
func (e *Enforcer) transitions(js map[int]Judgement) (warn []overWarning, conflicts []conflict) {
	nowOver := map[overKey]bool{}
	for gpu, j := range js {
		for _, u := range j.Uses {
			if !u.Over {
				continue
			}
			for _, p := range u.Pods {
				k := overKey{claim: u.ClaimUID, request: u.Request, gpu: gpu, pod: p.UID}
				nowOver[k] = true
				if !e.over[k] {
					warn = append(warn, overWarning{gpu: gpu, use: u, pod: p})
				}
			}
		}
		seen := map[int]bool{}
		for _, c := range j.Conflicts {
			seen[c.PID] = true
			if !e.conflicts[gpu][c.PID] {
				conflicts = append(conflicts, conflict{gpu: gpu, proc: c})
			}
		}
		e.conflicts[gpu] = seen
	}
	for gpu := range e.conflicts {
		if _, ok := js[gpu]; !ok {
			delete(e.conflicts, gpu)
		}
	}
	e.over = nowOver
	e.overs.Add(uint64(len(warn)))
	return warn, conflicts
}

// warnOver says that a pod went over its share: the log, an Event on the
// pod, the counter (counted in transitions).
func (e *Enforcer) warnOver(gpu int, w overWarning) {
	u := w.use
	e.cfg.Log.Warn("a pod is over its GPU memory share",
		"gpu", gpu, "pod_namespace", w.pod.Namespace, "pod", w.pod.Name, "pod_uid", w.pod.UID,
		"claim_namespace", u.ClaimNamespace, "claim", u.ClaimName, "requested_bytes", u.Requested, "used_bytes", u.Used, "priority", u.Priority)
	if e.cfg.Events != nil {
		e.cfg.Events.Warn(w.pod.UID, "GPUMemoryOverShare", fmt.Sprintf(
			"this pod uses %d bytes of GPU %d's memory, over the %d bytes of its claim %s/%s; as low priority it is preempted when a pod within its share needs the memory",
			u.Used, gpu, u.Requested, u.ClaimNamespace, u.ClaimName))
	}
}

// preemptForShares preempts the pods the rule chose on gpu: their
// low-priority holders, through the Preempter (kill or freeze, the
// journal, the reclaim), for a pod within its share that needs memory.
// It reports whether it preempted anyone.
func (e *Enforcer) preemptForShares(gpu int, j Judgement, holders []occupancy.ProcInfo) (acted bool) {
	if len(j.Preempt) == 0 {
		return false
	}
	// The preemptor, for the record: a holder of a share within its
	// share, preferring high priority.
	var by occupancy.ProcInfo
	for _, u := range j.Uses {
		if u.Over {
			continue
		}
		for _, h := range holders {
			if podIn(u.Pods, h.PodUID) && (by.PID == 0 || h.Priority == occupancy.High) {
				by = h
			}
		}
	}
	for _, uid := range j.Preempt {
		var victims []occupancy.ProcInfo
		for _, h := range holders {
			if h.PodUID == uid && h.Priority == occupancy.Low {
				victims = append(victims, h)
			}
		}
		rule, reason := j.Rules[uid], fmt.Sprintf("over its GPU memory share on GPU %d", gpu)
		if !j.overPod(uid) {
			reason = fmt.Sprintf("within its GPU memory share on GPU %d, whose memory a high-priority sharer needs", gpu)
		}
		if n := e.cfg.Preempter.PreemptForRule(gpu, by, victims, rule, reason); n > 0 {
			acted = true
			e.preemptions.Add(1)
			e.mu.Lock()
			e.preempted[uid] = true
			e.mu.Unlock()
			e.cfg.Log.Warn("preempting a sharing pod: a pod within its share needs the memory",
				"gpu", gpu, "pod_uid", uid, "rule", rule, "processes", n, "need_bytes", j.Need, "free_bytes", j.Free, "for_pod_uid", by.PodUID)
		}
	}
	return acted
}

// preemptIntruders removes from the shared GPU gpu the holders that are
// workloads without a share of it, whatever their class (the kernel
// refuses their opens; these got in before the GPU was shared, or before
// the kernel knew their cgroup): killed and journaled through the
// Preempter. Host processes and agents stay conflicts, never preempted.
func (e *Enforcer) preemptIntruders(gpu int, j Judgement, holders []occupancy.ProcInfo) bool {
	var intruders []occupancy.ProcInfo
	for _, c := range j.Conflicts {
		for _, h := range holders {
			if h.PID == c.PID && !h.Agent && (h.ContainerID != "" || h.PodUID != "") {
				intruders = append(intruders, h)
			}
		}
	}
	if len(intruders) == 0 {
		return false
	}
	n := e.cfg.Preempter.PreemptIntruders(gpu, intruders)
	if n > 0 {
		e.cfg.Log.Warn("preempting workloads without a share from a GPU shared by memory", "gpu", gpu, "processes", n)
	}
	return n > 0
}

// overPod reports whether pod uid's share is over on this GPU.
func (j Judgement) overPod(uid string) bool {
	for _, u := range j.Uses {
		if u.Over && podIn(u.Pods, uid) {
			return true
		}
	}
	return false
}

func podIn(pods []PodRef, uid string) bool {
	for _, p := range pods {
		if p.UID == uid && uid != "" {
			return true
		}
	}
	return false
}

// Decorate adds each shared GPU's shares and conflicts to the state
// document; a nil Enforcer (no share book) adds nothing.
func (e *Enforcer) Decorate(f *v1.StateFile) {
	if e == nil {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	for i := range f.GPUs {
		g := &f.GPUs[i]
		j, ok := e.last[g.Index]
		if !ok {
			continue
		}
		g.Shared = true
		for _, u := range j.Uses {
			for _, p := range u.Pods {
				g.Shares = append(g.Shares, v1.StateShare{
					ClaimNamespace: u.ClaimNamespace, ClaimName: u.ClaimName, Request: u.Request,
					PodNamespace: p.Namespace, PodName: p.Name, PodUID: p.UID, Priority: u.Priority,
					RequestedBytes: u.Requested, UsedBytes: u.Used, Over: u.Over, Preempted: e.preempted[p.UID],
				})
			}
		}
		for _, c := range j.Conflicts {
			sc := v1.StateShareConflict{PID: c.PID, PodUID: c.PodUID}
			for _, h := range e.holders[g.Index] {
				if h.PID == c.PID {
					sc.ContainerID = h.ContainerID
				}
			}
			if c.Memory > 0 {
				m := c.Memory
				sc.MemoryBytes = &m
			}
			g.ShareConflicts = append(g.ShareConflicts, sc)
		}
	}
	// A preempted pod is shown while it has a share.
	live := map[string]bool{}
	for _, j := range e.last {
		for _, u := range j.Uses {
			for _, p := range u.Pods {
				live[p.UID] = true
			}
		}
	}
	for uid := range e.preempted {
		if !live[uid] {
			delete(e.preempted, uid)
		}
	}
}

// Fence reads the book and fences (fence) under fenceMu; it returns the
// shares by GPU it fenced for.
func (e *Enforcer) Fence() map[int][]Share {
	e.fenceMu.Lock()
	defer e.fenceMu.Unlock()
	byGPU := map[int][]Share{}
	for _, sh := range e.cfg.Book.Shares() {
		byGPU[sh.GPU] = append(byGPU[sh.GPU], sh)
	}
	e.fence(byGPU)
	return byGPU
}

// fence tells the gate which GPUs each sharing pod may open (the GPUs of
// its shares) and which GPUs are shared. A pod whose cgroup is not known
// yet is fenced as soon as the registry learns it (ClassChanged), before
// the kernel is told its class.
func (e *Enforcer) fence(byGPU map[int][]Share) {
	want := map[uint64][]int{}
	for gpu, ss := range byGPU {
		for _, sh := range ss {
			for _, p := range sh.Pods {
				w, ok := e.cfg.Workloads.Lookup(occupancy.ProcInfo{PodUID: p.UID})
				if !ok || w.CgroupID == 0 || p.UID == "" || w.PodUID != p.UID {
					continue
				}
				want[w.CgroupID] = append(want[w.CgroupID], gpu)
			}
		}
	}
	e.cfg.Fencer.FenceShares(slices.Collect(maps.Keys(byGPU)), want)
}

// ClassChanged is the registry's change hook with shares: the fence of a
// pod whose cgroup became known, then the gate's class of the cgroup.
func (e *Enforcer) ClassChanged(cgroupID uint64, p occupancy.Priority) {
	// The fence first: a claimant's cgroup classified before it is fenced
	// in would be refused its own shared GPU.
	e.Fence()
	e.cfg.Fencer.ClassChanged(cgroupID, p)
	e.Kick()
}
