package daemon

import (
	"context"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	v1 "github.com/gpud/gpud/api/v1"
	"github.com/gpud/gpud/internal/occupancy"
	"github.com/gpud/gpud/internal/sharing"
)

// shares is what the daemon keeps of the GPU memory shares (cfg.Shares):
// the last verdict per GPU (the state file and metrics show it), who is
// over (warned once per going over), the conflicts already logged, and
// the pods the rule preempted.
type shares struct {
	book *sharing.Book
	kick chan struct{}
	// fenceMu orders the fences' computations with their pushes: a fence
	// computed from an older book or registry never overwrites a newer one.
	fenceMu sync.Mutex

	mu        sync.Mutex
	last      map[int]sharing.Judgement    // by GPU index
	over      map[overKey]bool             // shares over now
	conflicts map[int]map[int]bool         // GPU → PIDs logged as conflicts
	preempted map[string]bool              // pod UIDs the rule preempted (shown while their share lasts)
	holders   map[int][]occupancy.ProcInfo // by GPU, as last judged

	overs, preemptions atomic.Uint64
}

type overKey struct {
	claim, request string
	gpu            int
	pod            string
}

// setupShares hooks the share book, when there is one: its changes and
// every NVML sample judge the shared GPUs again.
func (d *Daemon) setupShares() {
	if d.cfg.Shares == nil {
		return
	}
	d.shares = &shares{
		book: d.cfg.Shares, kick: make(chan struct{}, 1),
		last: map[int]sharing.Judgement{}, over: map[overKey]bool{}, conflicts: map[int]map[int]bool{}, preempted: map[string]bool{},
		holders: map[int][]occupancy.ProcInfo{},
	}
	book := d.cfg.Shares
	book.OnChange(func() {
		// At once, in the prepare (or the new reservation) that changed
		// the book: before the pod's containers start, the claimants are
		// fenced in and their GPU is no one's to hold (the table stops
		// applying to it, any other workload is refused), then the share
		// rule judges.
		d.fenceNow()
		d.kickShares()
	})
	// A shared GPU opened: a workload without a share that got in (before
	// it was shared, or before the kernel knew its cgroup) is found by the
	// judgement at once, not at the next NVML sample.
	d.gate.SharedOpened = func(int) { d.kickShares() }
	d.runners = append(d.runners, d.runShares)
}

// kickShares asks for a judgement of the shared GPUs (coalesced).
func (d *Daemon) kickShares() {
	if d.shares == nil {
		return
	}
	select {
	case d.shares.kick <- struct{}{}:
	default:
	}
}

// runShares judges the shared GPUs on each kick until ctx ends.
func (d *Daemon) runShares(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-d.shares.kick:
			d.judgeShares()
		}
	}
}

// judgeShares applies the share rule (sharing.Judge) to every shared GPU:
// warns of pods going over their share, logs holders outside every share,
// preempts what the rule chose through the executor, and keeps the verdict
// for the state file and metrics.
func (d *Daemon) judgeShares() {
	s := d.shares
	byGPU := d.fenceNow()
	if len(byGPU) == 0 {
		s.mu.Lock()
		had := len(s.last) > 0
		s.last, s.holders, s.over, s.conflicts = map[int]sharing.Judgement{}, map[int][]occupancy.ProcInfo{}, map[overKey]bool{}, map[int]map[int]bool{}
		s.mu.Unlock()
		if had {
			d.writer.Kick()
			if d.lender != nil {
				d.lender.LedgerChanged()
			}
		}
		return // nothing shared: no snapshot of the ledger every second
	}
	snap := d.ledger.Snapshot(time.Now())
	last := map[int]sharing.Judgement{}
	holders := map[int][]occupancy.ProcInfo{}
	var decisions []shareDecision
	for _, g := range snap.GPUs {
		gs := byGPU[g.Index]
		if len(gs) == 0 {
			continue
		}
		in := sharing.Input{Shares: gs}
		if g.Memory != nil {
			in.Memory = &sharing.Memory{Total: g.Memory.Total, Used: g.Memory.Used}
		}
		for _, h := range g.Holders {
			p := sharing.Proc{PID: h.PID, PodUID: h.PodUID, Priority: h.Priority}
			if h.Memory != nil {
				p.Memory = *h.Memory
			}
			in.Procs = append(in.Procs, p)
			holders[g.Index] = append(holders[g.Index], h.ProcInfo)
		}
		j := sharing.Judge(in)
		last[g.Index] = j
		decisions = append(decisions, shareDecision{gpu: g.Index, j: j})
	}
	s.mu.Lock()
	// The state file is rewritten when a verdict changed, not every second.
	changed := !reflect.DeepEqual(s.last, last)
	s.last, s.holders = last, holders
	warn, conflicts := s.transitions(last)
	s.mu.Unlock()
	for _, w := range warn {
		d.warnOver(w.gpu, w)
	}
	for _, c := range conflicts {
		d.log.Warn("a process holds a shared GPU outside every share: another device plugin may have given it the whole GPU",
			"gpu", c.gpu, "pid", c.proc.PID, "pod_uid", c.proc.PodUID, "memory_bytes", c.proc.Memory)
	}
	for _, dc := range decisions {
		// As the open rules: nothing is preempted under --enforce=false or
		// with monitoring off; the warnings and the state still say who is
		// over.
		if d.enforcing() && d.preemptForShares(dc.gpu, dc.j, holders[dc.gpu]) {
			changed = true
		}
		if d.enforcing() && d.preemptIntruders(dc.gpu, dc.j, holders[dc.gpu]) {
			changed = true
		}
	}
	if changed {
		d.writer.Kick()
		if d.lender != nil {
			d.lender.LedgerChanged() // a GPU shared or no longer: lendable or not
		}
	}
}

type shareDecision struct {
	gpu int
	j   sharing.Judgement
}

type overWarning struct {
	gpu int
	use sharing.Use
	pod sharing.PodRef
}

type conflict struct {
	gpu  int
	proc sharing.Proc
}

// transitions updates who is over and which conflicts were logged, and
// returns the shares that went over and the conflicts that are new.
func (s *shares) transitions(js map[int]sharing.Judgement) (warn []overWarning, conflicts []conflict) {
	nowOver := map[overKey]bool{}
	for gpu, j := range js {
		for _, u := range j.Uses {
			if !u.Over {
				continue
			}
			for _, p := range u.Pods {
				k := overKey{claim: u.ClaimUID, request: u.Request, gpu: gpu, pod: p.UID}
				nowOver[k] = true
				if !s.over[k] {
					warn = append(warn, overWarning{gpu: gpu, use: u, pod: p})
				}
			}
		}
		seen := map[int]bool{}
		for _, c := range j.Conflicts {
			seen[c.PID] = true
			if !s.conflicts[gpu][c.PID] {
				conflicts = append(conflicts, conflict{gpu: gpu, proc: c})
			}
		}
		s.conflicts[gpu] = seen
	}
	for gpu := range s.conflicts {
		if _, ok := js[gpu]; !ok {
			delete(s.conflicts, gpu)
		}
	}
	s.over = nowOver
	s.overs.Add(uint64(len(warn)))
	return warn, conflicts
}

// warnOver says that a pod went over its share: the log, an Event on the
// pod, the counter (counted in transitions).
func (d *Daemon) warnOver(gpu int, w overWarning) {
	u := w.use
	d.log.Warn("a pod is over its GPU memory share",
		"gpu", gpu, "pod_namespace", w.pod.Namespace, "pod", w.pod.Name, "pod_uid", w.pod.UID,
		"claim_namespace", u.ClaimNamespace, "claim", u.ClaimName, "requested_bytes", u.Requested, "used_bytes", u.Used, "priority", u.Priority)
	if d.events != nil {
		d.events.Warn(w.pod.UID, "GPUMemoryOverShare", fmt.Sprintf(
			"this pod uses %d bytes of GPU %d's memory, over the %d bytes of its claim %s/%s; as low priority it is preempted when a pod within its share needs the memory",
			u.Used, gpu, u.Requested, u.ClaimNamespace, u.ClaimName))
	}
}

// preemptForShares preempts the pods the rule chose on gpu: their
// low-priority holders, through the gate's executor (kill or freeze, the
// journal, the reclaim), for a pod within its share that needs memory.
// It reports whether it preempted anyone.
func (d *Daemon) preemptForShares(gpu int, j sharing.Judgement, holders []occupancy.ProcInfo) (acted bool) {
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
		if n := d.gate.PreemptForRule(gpu, by, victims, sharing.Rule, fmt.Sprintf("over its GPU memory share on GPU %d", gpu)); n > 0 {
			acted = true
			d.shares.preemptions.Add(1)
			d.shares.mu.Lock()
			d.shares.preempted[uid] = true
			d.shares.mu.Unlock()
			d.log.Warn("preempting a pod over its GPU memory share: a pod within its share needs the memory",
				"gpu", gpu, "pod_uid", uid, "processes", n, "need_bytes", j.Need, "free_bytes", j.Free, "for_pod_uid", by.PodUID)
		}
	}
	return acted
}

// preemptIntruders removes from the shared GPU gpu the holders that are
// workloads without a share of it, whatever their class (the kernel
// refuses their opens; these got in before the GPU was shared, or before
// the kernel knew their cgroup): killed and journaled through the gate's
// executor. Host processes and agents stay conflicts, never preempted.
func (d *Daemon) preemptIntruders(gpu int, j sharing.Judgement, holders []occupancy.ProcInfo) bool {
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
	n := d.gate.PreemptIntruders(gpu, intruders)
	if n > 0 {
		d.log.Warn("preempting workloads without a share from a GPU shared by memory", "gpu", gpu, "processes", n)
	}
	return n > 0
}

func podIn(pods []sharing.PodRef, uid string) bool {
	for _, p := range pods {
		if p.UID == uid && uid != "" {
			return true
		}
	}
	return false
}

// decorateShares adds each shared GPU's shares and conflicts to the state
// document.
func (d *Daemon) decorateShares(f *v1.StateFile) {
	if d.shares == nil {
		return
	}
	s := d.shares
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range f.GPUs {
		g := &f.GPUs[i]
		j, ok := s.last[g.Index]
		if !ok {
			continue
		}
		g.Shared = true
		for _, u := range j.Uses {
			for _, p := range u.Pods {
				g.Shares = append(g.Shares, v1.StateShare{
					ClaimNamespace: u.ClaimNamespace, ClaimName: u.ClaimName, Request: u.Request,
					PodNamespace: p.Namespace, PodName: p.Name, PodUID: p.UID, Priority: u.Priority,
					RequestedBytes: u.Requested, UsedBytes: u.Used, Over: u.Over, Preempted: s.preempted[p.UID],
				})
			}
		}
		for _, c := range j.Conflicts {
			sc := v1.StateShareConflict{PID: c.PID, PodUID: c.PodUID}
			for _, h := range s.holders[g.Index] {
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
	for _, j := range s.last {
		for _, u := range j.Uses {
			for _, p := range u.Pods {
				live[p.UID] = true
			}
		}
	}
	for uid := range s.preempted {
		if !live[uid] {
			delete(s.preempted, uid)
		}
	}
}

// fenceNow reads the book and fences (fenceShares) under fenceMu; it
// returns the shares by GPU it fenced for.
func (d *Daemon) fenceNow() map[int][]sharing.Share {
	d.shares.fenceMu.Lock()
	defer d.shares.fenceMu.Unlock()
	byGPU := map[int][]sharing.Share{}
	for _, sh := range d.shares.book.Shares() {
		byGPU[sh.GPU] = append(byGPU[sh.GPU], sh)
	}
	d.fenceShares(byGPU)
	return byGPU
}

// fenceShares tells the gate which GPUs each sharing pod may open (the
// GPUs of its shares) and which GPUs are shared. A pod whose cgroup is not
// known yet is fenced as soon as the registry learns it (registryChanged),
// before the kernel is told its class.
func (d *Daemon) fenceShares(byGPU map[int][]sharing.Share) {
	want := map[uint64][]int{}
	for gpu, ss := range byGPU {
		for _, sh := range ss {
			for _, p := range sh.Pods {
				w, ok := d.registry.Lookup(occupancy.ProcInfo{PodUID: p.UID})
				if !ok || w.CgroupID == 0 || p.UID == "" || w.PodUID != p.UID {
					continue
				}
				want[w.CgroupID] = append(want[w.CgroupID], gpu)
			}
		}
	}
	d.gate.FenceShares(slices.Collect(maps.Keys(byGPU)), want)
}

// registryChanged is the registry's change hook: the gate's class of the
// cgroup, and, with shares, the fence of a pod whose cgroup became known.
func (d *Daemon) registryChanged(cgroupID uint64, p occupancy.Priority) {
	// The fence first: a claimant's cgroup classified before it is fenced
	// in would be refused its own shared GPU.
	d.fenceNow()
	d.gate.ClassChanged(cgroupID, p)
	d.kickShares()
}
