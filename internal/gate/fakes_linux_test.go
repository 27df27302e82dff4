package gate

// The gate's collaborators as hand-written fakes, and a rig that wires them
// into a Controller, so that each test reads as its scenario: who holds
// which GPU, which event or open arrives, what the executor and the kernel
// were asked. Nothing here needs root, a cgroup, BPF or a GPU.

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	v1 "github.com/gpud/gpud/api/v1"
	"github.com/gpud/gpud/bpf"
	"github.com/gpud/gpud/internal/cgroups"
	"github.com/gpud/gpud/internal/occupancy"
	"github.com/gpud/gpud/internal/preempt"
	"github.com/gpud/gpud/internal/preempt/executor"
	"github.com/gpud/gpud/internal/preempt/journal"
	"github.com/gpud/gpud/internal/workload"
)

// The concrete types the daemon wires in satisfy the gate's interfaces.
var (
	_ Ledger   = (*occupancy.Ledger)(nil)
	_ Classes  = (*workload.Registry)(nil)
	_ Executor = (*executor.Executor)(nil)
	_ Journal  = (*journal.Journal)(nil)
	_ Kernel   = (*bpf.Monitor)(nil)
	_ Pinned   = (*bpf.Monitor)(nil)

	_ CgroupExpecter = (*bpf.Monitor)(nil)
)

// fakeLedger holds each GPU's holders as given.
type fakeLedger struct {
	mu      sync.Mutex
	gpus    []int
	holders map[int][]occupancy.ProcInfo
	// unknown: PIDs that opened before gpud knew their workload.
	unknown      map[int]bool
	reclassified int
	gen          uint64 // bumped at every change (CountsVersioned)
}

func newFakeLedger(gpus ...int) *fakeLedger {
	return &fakeLedger{gpus: gpus, holders: map[int][]occupancy.ProcInfo{}, unknown: map[int]bool{}}
}

// hold adds holders of gpu.
func (l *fakeLedger) hold(gpu int, ps ...occupancy.ProcInfo) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.gen++
	l.holders[gpu] = append(l.holders[gpu], ps...)
}

// release removes every holder of gpu.
func (l *fakeLedger) release(gpu int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.gen++
	delete(l.holders, gpu)
}

func (l *fakeLedger) Holders(gpu int) []occupancy.ProcInfo {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []occupancy.ProcInfo
	for _, h := range l.holders[gpu] {
		if !h.Agent {
			out = append(out, h)
		}
	}
	return out
}

func (l *fakeLedger) countsLocked(gpu int) occupancy.ClassCounts {
	var c occupancy.ClassCounts
	for _, h := range l.holders[gpu] {
		switch {
		case h.Agent:
		case h.Priority == occupancy.High:
			c.High++
		case h.Priority == occupancy.Low:
			c.Low++
		}
	}
	return c
}

func (l *fakeLedger) Counts() map[int]occupancy.ClassCounts {
	out, _ := l.CountsVersioned()
	return out
}

func (l *fakeLedger) CountsVersioned() (map[int]occupancy.ClassCounts, uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[int]occupancy.ClassCounts{}
	for _, g := range l.gpus {
		out[g] = l.countsLocked(g)
	}
	return out, l.gen
}

func (l *fakeLedger) CountsOf(gpu int) occupancy.ClassCounts {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.countsLocked(gpu)
}

func (l *fakeLedger) Snapshot(now time.Time) occupancy.Snapshot {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := occupancy.Snapshot{Taken: now}
	for _, g := range slices.Sorted(slices.Values(l.gpus)) {
		v := occupancy.GPUView{GPU: occupancy.GPU{Index: g}, State: occupancy.Free}
		for _, h := range l.holders[g] {
			if h.Agent {
				continue
			}
			v.State = occupancy.Busy
			v.Holders = append(v.Holders, occupancy.HolderView{ProcInfo: h, OpenedUnknown: l.unknown[h.PID]})
		}
		s.GPUs = append(s.GPUs, v)
	}
	return s
}

func (l *fakeLedger) Reclassify(classify func(*occupancy.ProcInfo)) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.gen++
	l.reclassified++
	for _, hs := range l.holders {
		for i := range hs {
			classify(&hs[i])
		}
	}
}

// fakeRegistry knows workloads by cgroup id and by container id.
type fakeRegistry struct {
	mu        sync.Mutex
	byCgroup  map[uint64]workload.Workload
	byCtr     map[string]workload.Workload
	def       occupancy.Priority // the class of a process of no known workload
	defReason string
}

func newFakeRegistry() *fakeRegistry {
	return &fakeRegistry{byCgroup: map[uint64]workload.Workload{}, byCtr: map[string]workload.Workload{},
		def: occupancy.Unclassified, defReason: workload.ReasonHost}
}

// put registers w under its cgroup id and container id.
func (r *fakeRegistry) put(w workload.Workload) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if w.CgroupID != 0 {
		r.byCgroup[w.CgroupID] = w
	}
	if w.ContainerID != "" {
		r.byCtr[w.ContainerID] = w
	}
}

func (r *fakeRegistry) Lookup(info occupancy.ProcInfo) (workload.Workload, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if w, ok := r.byCgroup[info.CgroupID]; ok && info.CgroupID != 0 {
		return w, true
	}
	if w, ok := r.byCtr[info.ContainerID]; ok && info.ContainerID != "" {
		return w, true
	}
	return workload.Workload{}, false
}

// PreemptMode returns the label as is: which namespaces may choose is the
// registry's rule, not the gate's.
func (r *fakeRegistry) PreemptMode(w workload.Workload) string { return w.PreemptMode }

func (r *fakeRegistry) ClassifyProc(info *occupancy.ProcInfo) {
	if w, ok := r.Lookup(*info); ok {
		info.Priority, info.Agent = w.Priority, w.Agent
	}
}

func (r *fakeRegistry) Explain(info occupancy.ProcInfo) (workload.Workload, bool, occupancy.Priority, string) {
	if w, ok := r.Lookup(info); ok {
		return w, true, w.Priority, workload.ReasonLabel
	}
	return workload.Workload{}, false, r.def, r.defReason
}

func (r *fakeRegistry) AgentProc(info occupancy.ProcInfo) bool { return info.Agent }

// preemptCall is one Preempt or PreemptNow.
type preemptCall struct {
	gpu     int
	rule    string
	by      preempt.Party // for PreemptNow: what preemptor() returned
	known   preempt.Party // PreemptNow only
	victims []preempt.Victim
	now     bool // PreemptNow
	decided time.Time
}

func (p preemptCall) pids() []int {
	var out []int
	for _, v := range p.victims {
		out = append(out, v.PID)
	}
	slices.Sort(out)
	return out
}

type deniedCall struct {
	gpu      int
	rule     string
	opener   preempt.Party
	workload preempt.Target
	reclaim  bool
}

// fakeExecutor records what it is asked; a victim it was asked to preempt
// is Handled from then on, as the executor's is.
type fakeExecutor struct {
	mu        sync.Mutex
	preempts  []preemptCall
	denied    []deniedCall
	handled   map[int]bool // by PID
	resumes   int
	held      func(gpu int) preempt.Holding // the last Resume's
	adoptRecs []preempt.Record
	adopted   []preempt.AdoptCandidate
	suspended map[int]v1.Suspension
}

func newFakeExecutor() *fakeExecutor {
	return &fakeExecutor{handled: map[int]bool{}, suspended: map[int]v1.Suspension{}}
}

func (e *fakeExecutor) Handled(v preempt.Victim) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.handled[v.PID]
}

func (e *fakeExecutor) Preempt(_ context.Context, gpu int, rule string, by preempt.Party, victims []preempt.Victim, decided time.Time, _ chan<- struct{}) {
	e.add(preemptCall{gpu: gpu, rule: rule, by: by, victims: victims, decided: decided})
}

func (e *fakeExecutor) PreemptNow(_ context.Context, gpu int, rule string, known preempt.Party, preemptor func() preempt.Party, victims []preempt.Victim, decided time.Time) {
	// The executor signals first and reads the preemptor after.
	e.add(preemptCall{gpu: gpu, rule: rule, by: preemptor(), known: known, victims: victims, now: true, decided: decided})
}

func (e *fakeExecutor) add(p preemptCall) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, v := range p.victims {
		e.handled[v.PID] = true
	}
	e.preempts = append(e.preempts, p)
}

func (e *fakeExecutor) Denied(_ context.Context, gpu int, rule string, opener preempt.Party, w preempt.Target, reclaim bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.denied = append(e.denied, deniedCall{gpu: gpu, rule: rule, opener: opener, workload: w, reclaim: reclaim})
}

func (e *fakeExecutor) Resume(held func(gpu int) preempt.Holding) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.resumes++
	e.held = held
}

func (e *fakeExecutor) Adopt(recs []preempt.Record, cands []preempt.AdoptCandidate) (int, int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.adoptRecs, e.adopted = recs, cands
	return len(cands), 0
}

func (e *fakeExecutor) SuspendedPID(pid int) (v1.Suspension, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	s, ok := e.suspended[pid]
	return s, ok
}

// calls returns the preemptions so far.
func (e *fakeExecutor) calls() []preemptCall {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.preempts)
}

func (e *fakeExecutor) refusals() []deniedCall {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.denied)
}

// fakeJournal answers Resumed for the tasks in resumable (namespace/task).
type fakeJournal struct {
	mu        sync.Mutex
	resumable map[string]preempt.Record
	resumed   []string
	recent    []preempt.Record
}

func (j *fakeJournal) Resumed(namespace, taskID string, _ time.Time) (preempt.Record, bool, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	k := namespace + "/" + taskID
	r, ok := j.resumable[k]
	if ok {
		delete(j.resumable, k)
		j.resumed = append(j.resumed, k)
	}
	return r, ok, nil
}

func (j *fakeJournal) Recent() []preempt.Record {
	j.mu.Lock()
	defer j.mu.Unlock()
	return slices.Clone(j.recent)
}

// fakeKernel is the gate's maps: each GPU's policy, the classes of
// cgroups, and the share fences.
type fakeKernel struct {
	mu        sync.Mutex
	policy    map[uint32]bpf.GPUPolicy
	confirmed map[uint32]uint64
	pushes    int // SetGPUPolicy calls
	// failPolicy: GPUs whose SetGPUPolicy fails (as the real one does when
	// the GPU's entries are gone).
	failPolicy map[uint32]bool
	prio       map[uint64]uint32
	forgotten  []uint64
	fenced     map[uint64]bpf.GPUSet
	fenceOps   []string // "fence <cgroup> <fenced>", "unfence <cgroup> <fenced>", in order
	failFence  map[uint64]bool
	// newFenceOnShared counts cgroups fenced for the first time while a
	// GPU was already shared: a claimant the kernel would refuse.
	newFenceOnShared int
}

func newFakeKernel() *fakeKernel {
	return &fakeKernel{policy: map[uint32]bpf.GPUPolicy{}, confirmed: map[uint32]uint64{},
		prio: map[uint64]uint32{}, fenced: map[uint64]bpf.GPUSet{}, failFence: map[uint64]bool{}}
}

func (k *fakeKernel) SetGPUPolicy(gpu uint32, p bpf.GPUPolicy, confirmedMono uint64) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.pushes++
	if k.failPolicy[gpu] {
		return fmt.Errorf("%w: GPU %d policy: failing as asked", bpf.ErrUnprotected, gpu)
	}
	k.policy[gpu], k.confirmed[gpu] = p, confirmedMono
	return nil
}

func (k *fakeKernel) SetCgroupPriority(cgroupID uint64, prio uint32) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.prio[cgroupID] = prio
	return nil
}

func (k *fakeKernel) CgroupPriority(cgroupID uint64) (uint32, bool, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	p, ok := k.prio[cgroupID]
	return p, ok, nil
}

func (k *fakeKernel) ForgetCgroup(cgroupID uint64) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	delete(k.prio, cgroupID)
	k.forgotten = append(k.forgotten, cgroupID)
	return nil
}

func (k *fakeKernel) FenceCgroup(cgroupID uint64, gpus bpf.GPUSet, fenced int) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.fenceOps = append(k.fenceOps, fmt.Sprintf("fence %d %d", cgroupID, fenced))
	if k.failFence[cgroupID] {
		return fmt.Errorf("fence map full")
	}
	if _, ok := k.fenced[cgroupID]; !ok {
		for _, p := range k.policy {
			if p.Shared {
				k.newFenceOnShared++
				break
			}
		}
	}
	k.fenced[cgroupID] = gpus
	return nil
}

func (k *fakeKernel) UnfenceCgroup(cgroupID uint64, fenced int) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.fenceOps = append(k.fenceOps, fmt.Sprintf("unfence %d %d", cgroupID, fenced))
	delete(k.fenced, cgroupID)
	return nil
}

// gpuPolicy returns what the kernel was last told of gpu.
func (k *fakeKernel) gpuPolicy(gpu int) (bpf.GPUPolicy, uint64) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.policy[uint32(gpu)], k.confirmed[uint32(gpu)]
}

// ops returns the fence operations so far and forgets them.
func (k *fakeKernel) ops() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	o := k.fenceOps
	k.fenceOps = nil
	return o
}

func (k *fakeKernel) pushCount() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.pushes
}

// fakeLoans is the lender: GPUs lent, take-backs asked, pods' roles.
type fakeLoans struct {
	mu    sync.Mutex
	lent  map[int]bool
	taken []int
	roles map[string]string // pod UID → "borrower" or "owner" of GPU 0
	asked int               // IsLent calls
}

func (l *fakeLoans) IsLent(gpu int) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.asked++
	return l.lent[gpu]
}

func (l *fakeLoans) TakeBack(gpu int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.taken = append(l.taken, gpu)
	delete(l.lent, gpu)
}

func (l *fakeLoans) Role(podUID string) (int, string, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	r, ok := l.roles[podUID]
	return 0, r, ok
}

func (l *fakeLoans) lend(gpu int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lent[gpu] = true
}

func (l *fakeLoans) takeBacks() []int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.taken)
}

// rig is a Controller on fakes: enforcing, monitoring, judging not yet
// started (Judge starts it), with a lender that has lent nothing.
type rig struct {
	t       testing.TB
	c       *Controller
	ledger  *fakeLedger
	reg     *fakeRegistry
	exec    *fakeExecutor
	journal *fakeJournal
	kernel  *fakeKernel
	loans   *fakeLoans
	logs    *bytes.Buffer
	// procs is what Identify reads of a PID (/proc, to the tracker).
	procs map[int]occupancy.ProcInfo
}

const testTTL = 5 * time.Second

func newRig(t testing.TB, gpus ...int) *rig {
	t.Helper()
	r := &rig{
		t: t, ledger: newFakeLedger(gpus...), reg: newFakeRegistry(), exec: newFakeExecutor(),
		journal: &fakeJournal{resumable: map[string]preempt.Record{}}, kernel: newFakeKernel(),
		loans: &fakeLoans{lent: map[int]bool{}, roles: map[string]string{}},
		logs:  &bytes.Buffer{}, procs: map[int]occupancy.ProcInfo{},
	}
	r.c = &Controller{
		Ledger: r.ledger, Registry: r.reg, Exec: r.exec, Journal: r.journal, Kernel: r.kernel,
		Log:     slog.New(slog.NewTextHandler(r.logs, nil)),
		TTL:     testTTL,
		Enforce: true, Monitoring: func() bool { return true },
		Identify: func(pid int, ev *bpf.Event) occupancy.ProcInfo {
			if p, ok := r.procs[pid]; ok {
				return p
			}
			return occupancy.ProcInfo{PID: pid, Comm: ev.Comm} // gone before /proc was read
		},
		// An event's monotonic time as wall time: orders waiters as the
		// events were.
		Wall: func(mono uint64) time.Time { return time.Unix(0, int64(mono)) },
	}
	r.c.Start(t.Context(), r.loans)
	return r
}

// pod registers a pod workload of class p with one container, cgroup cg;
// it returns a process of it (pid) as the tracker knows it.
func (r *rig) pod(pid int, cg uint64, p occupancy.Priority) occupancy.ProcInfo {
	w := workload.Workload{PodUID: fmt.Sprintf("pod-%d", cg), Namespace: "ns", Name: fmt.Sprintf("job-%d", cg),
		TaskID: fmt.Sprintf("task-%d", cg), ContainerID: fmt.Sprintf("ctr-%d", cg), Priority: p, CgroupID: cg}
	r.reg.put(w)
	info := occupancy.ProcInfo{PID: pid, Comm: fmt.Sprintf("proc%d", pid), CgroupID: cg,
		ContainerID: w.ContainerID, PodUID: w.PodUID, Priority: p}
	r.procs[pid] = info
	return info
}

// event is a gate event of typ for gpu by info, at mono.
func event(typ bpf.EventType, gpu int, info occupancy.ProcInfo, mono uint64) *bpf.Event {
	return &bpf.Event{Type: typ, Mono: mono, CgroupID: info.CgroupID, PID: uint32(info.PID),
		TGID: uint32(info.PID), FD: -1, GPU: int32(gpu), Comm: info.Comm}
}

// onePreemption fails unless exactly one preemption was asked, and
// returns it.
func (r *rig) onePreemption() preemptCall {
	r.t.Helper()
	calls := r.exec.calls()
	if len(calls) != 1 {
		r.t.Fatalf("preemptions asked: %d, want 1: %+v", len(calls), calls)
	}
	return calls[0]
}

// noPreemption fails if any preemption was asked.
func (r *rig) noPreemption() {
	r.t.Helper()
	if calls := r.exec.calls(); len(calls) != 0 {
		r.t.Fatalf("preemptions asked: %+v, want none", calls)
	}
}

// fakeProc writes what Explain reads of pid under a /proc of its own, the
// process in cgroup v2 path cg (made under a cgroup root of its own: the
// cgroup's id is its directory's inode). It returns the ProcFS and the
// cgroup's id.
func fakeProc(t *testing.T, pid int, comm, cg string) (*occupancy.ProcFS, uint64) {
	t.Helper()
	proc, cgRoot := t.TempDir(), t.TempDir()
	dir := filepath.Join(proc, fmt.Sprint(pid))
	stat := fmt.Sprintf("%d (%s) S 1 1 1 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0 555 0 0\n", pid, comm)
	files := map[string]string{"stat": stat, "status": "Uid:\t1000\t1000\t1000\t1000\n", "cgroup": "0::" + cg + "\n"}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, name := range slices.Sorted(maps.Keys(files)) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(files[name]), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(filepath.Join(cgRoot, cg), 0o755); err != nil {
		t.Fatal(err)
	}
	id, err := cgroups.ID(filepath.Join(cgRoot, cg))
	if err != nil {
		t.Fatal(err)
	}
	return &occupancy.ProcFS{Root: proc, CgroupRoot: cgRoot}, id
}
