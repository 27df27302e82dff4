package occupancy

import (
	"maps"
	"slices"
	"sync"
	"time"

	v1 "github.com/gpud/gpud/api/v1"
)

// Priority is a holder's class (a wire type: api/v1). Until a classifier
// is configured every holder is Unclassified.
type Priority = v1.Priority

// The classes of a holder.
const (
	High         = v1.High
	Low          = v1.Low
	Unmanaged    = v1.Unmanaged
	Unclassified = v1.Unclassified
)

// State is a GPU's occupancy state (a wire type: api/v1).
type State = v1.State

// The states of a GPU.
const (
	Free = v1.Free // no holder
	Busy = v1.Busy // holders, active within idle-after
	Idle = v1.Idle // holders, no activity for idle-after
	Lent = v1.Lent // lent to a borrower through the device plugin
)

// GPU is one physical GPU as gpud tracks it.
type GPU struct {
	// Index is N of its node /dev/nvidiaN (the minor number the driver gave
	// it): gpud's own name for the GPU (the kernel maps, the state file's
	// index, GPUD_GPU).
	Index int
	UUID  string // from NVML, "" without it
	// NVMLIndex is NVML's index of the GPU (what nvidia-smi and
	// dcgm-exporter call it, and CUDA's order by default), from NVML; nil
	// without it. It is not always Index: NVML orders GPUs by PCI bus.
	NVMLIndex    *int
	Product      string // NVML's name of the model, e.g. "NVIDIA H100 80GB HBM3"; "" without it
	Device       string // device node path, e.g. /dev/nvidia0
	Major, Minor uint32
	// Aliases are other nodes of the same device (same major:minor): the
	// same GPU under more names, never a GPU of its own.
	Aliases []string
	// MIG is set when this "GPU" is a MIG instance of a GPU in MIG mode:
	// its Device is the instance's capability node, which its processes
	// hold open beside their parent's /dev/nvidiaN (nil for a whole GPU).
	MIG *MIGSlice
	// PCIBusID is the GPU's PCI address as sysfs names it (0000:3b:00.0),
	// from NVML; "" without it. NVLinkGroup is the lowest NVML index of
	// the GPUs joined to it by active NVLinks (through NVSwitches too),
	// itself included; nil when it has no active NVLink.
	PCIBusID    string
	NVLinkGroup *int
}

// MIGSlice is what makes a GPU a MIG instance: its parent GPU (left out of
// the rules: every slice's processes open the parent's node) and its place
// in it.
type MIGSlice struct {
	Parent       int    // the parent's index (N of /dev/nvidiaN)
	ParentUUID   string // the parent's NVML UUID
	ParentDevice string // the parent's node, /dev/nvidiaN
	GI, CI       int    // GPU and compute instance ids
	Profile      string // e.g. "1g.10gb"
	CapMinor     int    // M of /dev/nvidia-caps/nvidia-capM (mig-minors' gpuN/giG/access)
}

// ProcInfo identifies a process that holds GPU fds.
type ProcInfo struct {
	PID         int    // tgid
	StartTime   uint64 // clock ticks since boot (/proc/<pid>/stat field 22): tells PID reuse apart, to the tick
	PidfdIno    uint64 // inode of a pidfd of the process (pidfs, Linux ≥ 6.9): unique for ever; 0 when unknown
	Comm        string
	CgroupID    uint64
	ContainerID string
	PodUID      string
	Priority    Priority
	// Unknown: classified by default because gpud did not know its
	// container or pod yet (set by the classifier).
	Unknown bool
	// Root: its real uid is 0 (/proc/<pid>/status). Read, never guessed:
	// false when unknown, so nothing that trusts root trusts a guess.
	Root bool
	// Agent: a system agent (NVIDIA's persistence daemon, DCGM, device
	// plugin, ...; set by the classifier). An agent holds GPUs without
	// making them busy: it is no holder to the rules, the idle detection,
	// the lending or the preemption; the ledger keeps it only to show it.
	Agent bool
}

// ProcFDs is one process's GPU fds, as read from /proc or known from events.
type ProcFDs struct {
	Info ProcInfo
	FDs  map[int][]int32 // GPU index → fds
}

type hold struct {
	fds      map[int32]struct{}
	openedAt time.Time
	// lastActive is this holder's newest use: its first open, then NVML
	// samples naming it (and, without NVML, its opens).
	lastActive time.Time
	memory     *uint64 // its GPU memory (NVML); nil when not known
}

type proc struct {
	info  ProcInfo
	holds map[int]*hold // GPU index → its fds in this process
	// openedUnknown: its first recorded open came before gpud knew its
	// workload (the gate could not judge it by class).
	openedUnknown bool
}

type gpuEntry struct {
	GPU
	lastActive time.Time
	state      State // as last published
	memory     *Memory
	health     GPUHealth
	// computeActivity: NVML's samples say when this GPU is used; a
	// holder's opens after its first are not use (without them they are).
	computeActivity bool
	// counts is its holders by class, and held how many holders (agents
	// left out) it has: kept up to date at every change of a process's
	// holds or class (count), so the gate's per-open and per-drain reads,
	// and every change's state, cost O(1) rather than a walk of every
	// process (issue 31: a node with hundreds of holders and thousands of
	// opens a second).
	counts ClassCounts
	held   uint32
}

// Memory is a GPU's memory in bytes, as NVML reports it.
type Memory struct {
	Total, Used uint64
}

// Free is the memory not in use.
func (m Memory) Free() uint64 {
	if m.Used >= m.Total {
		return 0
	}
	return m.Total - m.Used
}

// GPUHealth says whether a GPU can be trusted with work: an XID that is not
// an application's fault, a double-bit ECC error or a GPU fallen off the
// bus makes it unhealthy until gpud restarts (as NVIDIA's device plugin).
type GPUHealth struct {
	Unhealthy bool
	Reason    string    // the first cause, e.g. "XID 79"
	Since     time.Time // when it was seen
	Events    uint64    // health events seen (XID, ECC), critical or not
}

// Ledger is the GPU → holders record. It is safe for concurrent use; every
// change bumps Version and calls the change hook.
type Ledger struct {
	mu        sync.Mutex
	idleAfter time.Duration
	gpus      map[int]*gpuEntry
	procs     map[int]*proc
	version   uint64
	onChange  func()
	// counts is Counts' answer while no GPU's counts change (nil: to be
	// built): the gate asks for it at every drain of the event ring.
	counts map[int]ClassCounts
	// countsGen counts the changes of any GPU's counts (CountsVersioned).
	countsGen uint64
}

// NewLedger returns an empty ledger of gpus.
func NewLedger(gpus []GPU, idleAfter time.Duration) *Ledger {
	l := &Ledger{idleAfter: idleAfter, gpus: map[int]*gpuEntry{}, procs: map[int]*proc{}}
	for _, g := range gpus {
		l.gpus[g.Index] = &gpuEntry{GPU: g, state: Free}
	}
	return l
}

// OnChange sets the hook called (without the ledger's lock) after a change.
func (l *Ledger) OnChange(f func()) {
	l.mu.Lock()
	l.onChange = f
	l.mu.Unlock()
}

// SetIdleAfter changes the idle threshold.
func (l *Ledger) SetIdleAfter(d time.Duration) {
	l.mu.Lock()
	l.idleAfter = d
	l.mu.Unlock()
	l.Refresh(time.Now())
}

// mutate runs f under the lock. When f reports a change, the version is
// bumped and the change hook is called, after the lock is released.
func (l *Ledger) mutate(f func() bool) {
	l.mu.Lock()
	if !f() {
		l.mu.Unlock()
		return
	}
	l.version++
	hook := l.onChange
	l.mu.Unlock()
	if hook != nil {
		hook()
	}
}

// Version counts the changes so far.
func (l *Ledger) Version() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.version
}

// Has reports whether pid is a holder, with its identity.
func (l *Ledger) Has(pid int) (ProcInfo, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	p, ok := l.procs[pid]
	if !ok {
		return ProcInfo{}, false
	}
	return p.info, true
}

// AddFD records that info's process has fd open on gpu since at. An open is
// activity on the GPU.
func (l *Ledger) AddFD(info ProcInfo, gpu int, fd int32, at time.Time) {
	l.mutate(func() bool {
		g, ok := l.gpus[gpu]
		if !ok {
			return false
		}
		p := l.procFor(info)
		h := p.holds[gpu]
		if h == nil {
			h = &hold{fds: map[int32]struct{}{}, openedAt: at}
			p.holds[gpu] = h
			l.countHold(p, gpu, 1)
		}
		_, known := h.fds[fd]
		h.fds[fd] = struct{}{}
		// An agent's open is no use of the GPU: GPU Feature Discovery
		// opens every GPU each minute, and would keep every GPU busy. With
		// NVML, only a holder's first open is (its start); its use is
		// what NVML samples say.
		first := len(h.fds) == 1 && !known
		if !p.info.Agent && (first || !g.computeActivity) {
			if at.After(h.lastActive) {
				h.lastActive = at
			}
			if at.After(g.lastActive) {
				g.lastActive = at
			}
		}
		return l.publishLocked(at) || !known
	})
}

// procFor returns the process record for info, replacing one of a previous
// process that had the same PID.
func (l *Ledger) procFor(info ProcInfo) *proc {
	p := l.procs[info.PID]
	if p != nil && !sameProcess(p.info, info) {
		l.count(p, -1)
		p = nil // PID reused: the old process is gone
	}
	if p == nil {
		p = &proc{info: info, holds: map[int]*hold{}, openedUnknown: info.Unknown}
		l.procs[info.PID] = p
	}
	return p
}

// RemoveFD records that pid closed fd on gpu.
func (l *Ledger) RemoveFD(pid, gpu int, fd int32) {
	l.mutate(func() bool {
		p := l.procs[pid]
		if p == nil || p.holds[gpu] == nil {
			return false
		}
		h := p.holds[gpu]
		if _, ok := h.fds[fd]; !ok {
			return false
		}
		delete(h.fds, fd)
		if len(h.fds) == 0 {
			l.countHold(p, gpu, -1)
			delete(p.holds, gpu)
		}
		if len(p.holds) == 0 {
			delete(l.procs, pid)
		}
		l.publishLocked(time.Now())
		return true
	})
}

// RemoveProcess drops every fd of pid (the process exited).
func (l *Ledger) RemoveProcess(pid int) {
	l.mutate(func() bool {
		p, ok := l.procs[pid]
		if !ok {
			return false
		}
		l.count(p, -1)
		delete(l.procs, pid)
		l.publishLocked(time.Now())
		return true
	})
}

// SetProcess replaces what the ledger knows of one process with pf (read
// from /proc). Fds that were already known keep their opened_at.
func (l *Ledger) SetProcess(pf ProcFDs, at time.Time) {
	l.mutate(func() bool {
		if !l.setProcessLocked(pf, at) {
			return false
		}
		l.publishLocked(at)
		return true
	})
}

func (l *Ledger) setProcessLocked(pf ProcFDs, at time.Time) bool {
	cur := l.procs[pf.Info.PID] // what is counted now, replaced below
	old := cur
	if old != nil && !sameProcess(old.info, pf.Info) {
		old = nil
	}
	holds := map[int]*hold{}
	for gpu, fds := range pf.FDs {
		g, ok := l.gpus[gpu]
		if !ok || len(fds) == 0 {
			continue
		}
		h := &hold{fds: map[int32]struct{}{}, openedAt: at, lastActive: at}
		if old != nil && old.holds[gpu] != nil {
			o := old.holds[gpu]
			h.openedAt, h.lastActive, h.memory = o.openedAt, o.lastActive, o.memory
		} else if !pf.Info.Agent && !l.heldLocked(gpu) && at.After(g.lastActive) {
			// A holder appears on a GPU nobody held: count it as active now,
			// since nothing is known of its past (a GPU used long ago must
			// not read idle the moment a new holder is found).
			g.lastActive = at
		}
		for _, fd := range fds {
			h.fds[fd] = struct{}{}
		}
		holds[gpu] = h
	}
	if old != nil && sameHolds(old.holds, holds) && old.info == pf.Info {
		return false
	}
	if len(holds) == 0 {
		if cur == nil {
			return false
		}
		l.count(cur, -1)
		delete(l.procs, pf.Info.PID)
		return true
	}
	info := pf.Info
	if old != nil && info.Comm == "" {
		info.Comm = old.info.Comm
	}
	opened := info.Unknown
	if old != nil {
		opened = old.openedUnknown
	}
	if cur != nil {
		l.count(cur, -1)
	}
	p := &proc{info: info, holds: holds, openedUnknown: opened}
	l.procs[pf.Info.PID] = p
	l.count(p, 1)
	return true
}

// sameProcess tells whether two identities with one PID can be the same
// process; unknown fields (0) do not tell them apart.
func sameProcess(a, b ProcInfo) bool {
	if a.StartTime != 0 && b.StartTime != 0 && a.StartTime != b.StartTime {
		return false
	}
	if a.PidfdIno != 0 && b.PidfdIno != 0 && a.PidfdIno != b.PidfdIno {
		return false
	}
	return true
}

func sameHolds(a, b map[int]*hold) bool {
	if len(a) != len(b) {
		return false
	}
	for gpu, ha := range a {
		hb := b[gpu]
		if hb == nil || !maps.Equal(ha.fds, hb.fds) {
			return false
		}
	}
	return true
}

// ReplaceAll makes the ledger equal to a full scan: every process not in
// procs is dropped.
func (l *Ledger) ReplaceAll(procs []ProcFDs, at time.Time) {
	l.mutate(func() bool {
		changed := false
		seen := map[int]bool{}
		for _, pf := range procs {
			seen[pf.Info.PID] = true
			if l.setProcessLocked(pf, at) {
				changed = true
			}
		}
		for pid, p := range l.procs {
			if !seen[pid] {
				l.count(p, -1)
				delete(l.procs, pid)
				changed = true
			}
		}
		if changed {
			l.publishLocked(at)
		}
		return changed
	})
}

// Activity records use of gpu at the given time (an NVML utilization sample).
func (l *Ledger) Activity(gpu int, at time.Time) { l.ActivityBy(gpu, at, nil) }

// ActivityBy records use of gpu at the given time by pids (an NVML
// utilization sample names the processes): when every one of them is an
// agent, it is no use (DCGM's own profiling, nvidia-smi). Without pids the
// sample counts.
func (l *Ledger) ActivityBy(gpu int, at time.Time, pids []uint32) {
	l.mutate(func() bool {
		if len(pids) > 0 && l.allAgentsLocked(pids) {
			return false
		}
		for _, pid := range pids {
			if p := l.procs[int(pid)]; p != nil && p.holds[gpu] != nil && at.After(p.holds[gpu].lastActive) {
				p.holds[gpu].lastActive = at
			}
		}
		g, ok := l.gpus[gpu]
		if !ok || !at.After(g.lastActive) {
			return false
		}
		g.lastActive = at
		return l.publishLocked(at)
	})
}

// SetComputeActivity says whether NVML's samples are every GPU's activity
// (true while sampling works); without them every open is.
func (l *Ledger) SetComputeActivity(on bool) {
	l.mu.Lock()
	for _, g := range l.gpus {
		g.computeActivity = on
	}
	l.mu.Unlock()
}

// SetComputeActivityOf says it of one GPU: NVML samples each GPU on its
// own, and one that cannot be sampled (per-process utilization is not
// supported on a MIG-enabled GPU) falls back to opens alone.
func (l *Ledger) SetComputeActivityOf(gpu int, on bool) {
	l.mu.Lock()
	if g, ok := l.gpus[gpu]; ok {
		g.computeActivity = on
	}
	l.mu.Unlock()
}

// memoryStep is the smallest change of a GPU's or a holder's memory that is
// a change of the ledger (rewrites the state file): a GPU's use moves by
// kilobytes all the time.
const memoryStep = 1 << 20

// SetMemory records gpu's memory and its holders' (by PID, from NVML's
// process list); m nil is memory NVML does not report.
func (l *Ledger) SetMemory(gpu int, m *Memory, byPID map[uint32]uint64) {
	l.mutate(func() bool {
		g, ok := l.gpus[gpu]
		if !ok {
			return false
		}
		changed := false
		switch {
		case m == nil:
			changed = g.memory != nil
			g.memory = nil
		case g.memory == nil || moved(g.memory.Used, m.Used) || g.memory.Total != m.Total:
			c := *m
			g.memory, changed = &c, true
		}
		for pid, p := range l.procs {
			h := p.holds[gpu]
			if h == nil {
				continue
			}
			v, ok := byPID[uint32(pid)]
			switch {
			case !ok && h.memory != nil:
				h.memory, changed = nil, true
			case ok && (h.memory == nil || moved(*h.memory, v)):
				h.memory, changed = &v, true
			}
		}
		return changed
	})
}

func moved(a, b uint64) bool {
	if a > b {
		a, b = b, a
	}
	return b-a >= memoryStep
}

// SetUnhealthy marks gpu unhealthy for reason (the first one stays), and
// counts the event; critical false only counts it.
func (l *Ledger) SetUnhealthy(gpu int, reason string, critical bool, at time.Time) {
	l.mutate(func() bool {
		g, ok := l.gpus[gpu]
		if !ok {
			return false
		}
		g.health.Events++
		if critical && !g.health.Unhealthy {
			g.health = GPUHealth{Unhealthy: true, Reason: reason, Since: at, Events: g.health.Events}
		}
		return true
	})
}

// Refresh re-derives states that change with time alone (busy → idle) and
// reports a change if any did.
func (l *Ledger) Refresh(now time.Time) {
	l.mutate(func() bool { return l.publishLocked(now) })
}

// publishLocked recomputes every GPU's state and reports whether one changed.
func (l *Ledger) publishLocked(now time.Time) bool {
	changed := false
	for idx, g := range l.gpus {
		s := l.stateLocked(idx, g, now)
		if s != g.state {
			g.state = s
			changed = true
		}
	}
	return changed
}

// allAgentsLocked reports whether every pid is a known agent.
func (l *Ledger) allAgentsLocked(pids []uint32) bool {
	for _, pid := range pids {
		p := l.procs[int(pid)]
		if p == nil || !p.info.Agent {
			return false
		}
	}
	return true
}

// heldLocked reports whether a holder other than an agent holds idx.
func (l *Ledger) heldLocked(idx int) bool {
	g := l.gpus[idx]
	return g != nil && g.held > 0
}

// count adds (sign 1) or takes away (-1) p's holds from its GPUs' counts:
// called before a process record leaves the ledger or changes its holds,
// class or agency wholesale, and after one enters or has changed.
func (l *Ledger) count(p *proc, sign int) {
	for gpu := range p.holds {
		l.countHold(p, gpu, sign)
	}
}

// countHold adds or takes away p's hold of gpu from gpu's counts.
func (l *Ledger) countHold(p *proc, gpu, sign int) {
	g := l.gpus[gpu]
	if g == nil || p.info.Agent {
		return // an agent never blocks an open, is never a victim
	}
	d := uint32(sign) // wraps for -1: the counts stay ≥ 0 by pairing
	g.held += d
	switch p.info.Priority {
	case High:
		g.counts.High += d
		l.counts = nil
		l.countsGen++
	case Low:
		g.counts.Low += d
		l.counts = nil
		l.countsGen++
	}
}

// recount is every GPU's counts as a walk of every process finds them:
// what count keeps incrementally (its tests compare the two).
func (l *Ledger) recount() (counts map[int]ClassCounts, held map[int]uint32) {
	counts, held = map[int]ClassCounts{}, map[int]uint32{}
	for idx := range l.gpus {
		counts[idx], held[idx] = ClassCounts{}, 0
	}
	for _, p := range l.procs {
		if p.info.Agent {
			continue
		}
		for gpu := range p.holds {
			if _, ok := l.gpus[gpu]; !ok {
				continue
			}
			c := counts[gpu]
			switch p.info.Priority {
			case High:
				c.High++
			case Low:
				c.Low++
			}
			counts[gpu] = c
			held[gpu]++
		}
	}
	return counts, held
}

func (l *Ledger) stateLocked(idx int, g *gpuEntry, now time.Time) State {
	switch {
	case !l.heldLocked(idx):
		return Free
	case now.Sub(g.lastActive) >= l.idleAfter:
		return Idle
	default:
		return Busy
	}
}

// HolderView is one holder of one GPU in a snapshot.
type HolderView struct {
	ProcInfo
	FDs        []int32
	OpenedAt   time.Time
	LastActive time.Time
	Memory     *uint64 // its GPU memory, bytes (NVML); nil when not known
	// OpenedUnknown: it opened the GPU before gpud knew its workload.
	OpenedUnknown bool
}

// GPUView is one GPU in a snapshot.
type GPUView struct {
	GPU
	State      State
	LastActive time.Time
	Memory     *Memory // nil when NVML does not say
	Health     GPUHealth
	Holders    []HolderView // by PID
	Agents     []HolderView // system agents holding it, by PID: not holders
}

// Snapshot is a consistent copy of the ledger.
type Snapshot struct {
	Version uint64
	Taken   time.Time
	GPUs    []GPUView // by index
}

// Snapshot copies the ledger as of now.
func (l *Ledger) Snapshot(now time.Time) Snapshot {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := Snapshot{Version: l.version, Taken: now}
	// Sorted once, not per GPU: the state file is written after every
	// change, with hundreds of holders on a big node.
	pids := slices.Sorted(maps.Keys(l.procs))
	for _, idx := range slices.Sorted(maps.Keys(l.gpus)) {
		g := l.gpus[idx]
		v := GPUView{GPU: g.GPU, State: l.stateLocked(idx, g, now), LastActive: g.lastActive, Health: g.health}
		if g.held > 0 {
			v.Holders = make([]HolderView, 0, g.held)
		}
		if g.memory != nil {
			m := *g.memory
			v.Memory = &m
		}
		for _, pid := range pids {
			p := l.procs[pid]
			h := p.holds[idx]
			if h == nil {
				continue
			}
			hv := HolderView{
				ProcInfo: p.info, FDs: slices.Sorted(maps.Keys(h.fds)), OpenedAt: h.openedAt, OpenedUnknown: p.openedUnknown,
				LastActive: h.lastActive,
			}
			if h.memory != nil {
				m := *h.memory
				hv.Memory = &m
			}
			if p.info.Agent {
				v.Agents = append(v.Agents, hv)
			} else {
				v.Holders = append(v.Holders, hv)
			}
		}
		s.GPUs = append(s.GPUs, v)
	}
	return s
}

// MemoryHeld returns gpu's free memory and how much of it pids hold, as
// NVML last reported (a process NVML did not name counts 0); ok is false
// when NVML does not report the GPU's memory.
func (l *Ledger) MemoryHeld(gpu int, pids []int) (free, held uint64, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	g, found := l.gpus[gpu]
	if !found || g.memory == nil {
		return 0, 0, false
	}
	for _, pid := range pids {
		if p := l.procs[pid]; p != nil {
			if h := p.holds[gpu]; h != nil && h.memory != nil {
				held += *h.memory
			}
		}
	}
	return g.memory.Free(), held, true
}

// Holders returns the processes holding gpu, agents left out: what is
// asked of holders (victims, owners, borrowers) never applies to an agent.
func (l *Ledger) Holders(gpu int) []ProcInfo { return l.holding(gpu, false) }

// Agents returns the system agents holding gpu.
func (l *Ledger) Agents(gpu int) []ProcInfo { return l.holding(gpu, true) }

// holding returns the agents (agents true) or the other holders of gpu.
func (l *Ledger) holding(gpu int, agents bool) []ProcInfo {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []ProcInfo
	for _, p := range l.procs {
		if p.holds[gpu] != nil && p.info.Agent == agents {
			out = append(out, p.info)
		}
	}
	return out
}

// ClassCounts is how many processes of each enforced class hold a GPU.
type ClassCounts struct{ High, Low uint32 }

// Counts returns, per GPU index, its holders by class. The map is shared
// until the counts change (it is asked for at every drain of the event
// ring): callers must not modify it.
func (l *Ledger) Counts() map[int]ClassCounts {
	counts, _ := l.CountsVersioned()
	return counts
}

// CountsVersioned is Counts with a number that changes whenever any GPU's
// counts change: the same number, the same counts (the gate skips its pass
// over the GPUs at a drain that changed none without comparing them).
func (l *Ledger) CountsVersioned() (map[int]ClassCounts, uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.counts == nil {
		l.counts = make(map[int]ClassCounts, len(l.gpus))
		for idx, g := range l.gpus {
			l.counts[idx] = g.counts
		}
	}
	return l.counts, l.countsGen
}

// CountsOf returns gpu's holders by class: Counts()[gpu] without building
// every GPU's (it is asked on every GPU open).
func (l *Ledger) CountsOf(gpu int) ClassCounts {
	l.mu.Lock()
	defer l.mu.Unlock()
	if g := l.gpus[gpu]; g != nil {
		return g.counts
	}
	return ClassCounts{}
}

// Reclassify re-derives every holder's priority with classify (a workload
// was classified after its processes opened a GPU).
func (l *Ledger) Reclassify(classify func(*ProcInfo)) {
	l.mutate(func() bool {
		changed := false
		for _, p := range l.procs {
			before, agent := p.info.Priority, p.info.Agent
			l.count(p, -1)
			classify(&p.info)
			l.count(p, 1)
			if p.info.Priority != before || p.info.Agent != agent {
				changed = true
			}
		}
		if changed {
			// A holder that became an agent (or stopped being one) can
			// free a GPU (or hold one).
			l.publishLocked(time.Now())
		}
		return changed
	})
}

// RefreshComms re-reads each holder's name with comm (nil/false: keep):
// processes rename themselves after exec (busybox applets, prctl).
func (l *Ledger) RefreshComms(comm func(pid int) (string, bool)) {
	l.mu.Lock()
	pids := make([]int, 0, len(l.procs))
	for pid := range l.procs {
		pids = append(pids, pid)
	}
	l.mu.Unlock()
	names := map[int]string{}
	for _, pid := range pids {
		if c, ok := comm(pid); ok {
			names[pid] = c
		}
	}
	l.mutate(func() bool {
		changed := false
		for pid, c := range names {
			if p := l.procs[pid]; p != nil && p.info.Comm != c {
				p.info.Comm = c
				// Root was read with the old name: a process that dropped
				// root and then took an agent's name must not pass for
				// root's choice at the next classification. Unknown is not
				// root (an exec reads both afresh).
				p.info.Root = false
				changed = true
			}
		}
		return changed
	})
}

// FDTable returns pid → GPU → sorted fds: the form /proc ground truth is
// compared in.
func (l *Ledger) FDTable() map[int]map[int][]int32 {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[int]map[int][]int32{}
	for pid, p := range l.procs {
		m := map[int][]int32{}
		for gpu, h := range p.holds {
			m[gpu] = slices.Sorted(maps.Keys(h.fds))
		}
		out[pid] = m
	}
	return out
}

// FDs returns the fds through which pid holds gpu, as the ledger knows
// them (a hint for a quick check against /proc; negative ones are io_uring
// fixed-file slots).
func (l *Ledger) FDs(pid, gpu int) []int32 {
	l.mu.Lock()
	defer l.mu.Unlock()
	p, ok := l.procs[pid]
	if !ok {
		return nil
	}
	h, ok := p.holds[gpu]
	if !ok {
		return nil
	}
	return slices.Sorted(maps.Keys(h.fds))
}
