package executor

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpud/gpud/internal/cgroups"
	"github.com/gpud/gpud/internal/occupancy"
	"github.com/gpud/gpud/internal/preempt"
)

// adoptGrace is how long an adopted suspension is kept even though its
// GPUs show no high-priority holder: a restarted gpud's holders are
// classified as its workload sources report, which can be after the
// adoption; the high holder seen in that time ends the grace.
const adoptGrace = 5 * time.Second

// Unthawed returns the freezes a gpud did (result done) and journaled with
// no later thaw of the same cgroup nor kill of its victims, by cgroup
// directory, the first record of each: what a gpud killed outright
// (SIGKILL, OOM) left frozen. recs are oldest first (Journal.Recent).
func Unthawed(recs []preempt.Record) map[string]preempt.Record {
	out := map[string]preempt.Record{}
	for path, o := range unthawed(recs) {
		out[path] = o.first
	}
	return out
}

// Preempting reports whether cgroup directory path is frozen for a
// preemption: a suspension of this executor's, or one the journal names
// as frozen and never thawed (Unthawed: a previous gpud's, to adopt).
// Another freezer (the compute scheduler's journal thaw) must leave it.
func (e *Executor) Preempting(path string) bool {
	e.mu.Lock()
	s := e.susp[path]
	e.mu.Unlock()
	if s != nil {
		return true
	}
	if e.Journal == nil {
		return false
	}
	_, ok := Unthawed(e.Journal.Recent())[path]
	return ok
}

// UnthawedCheckpoints reports whether the journal names a process whose
// CUDA state a gpud checkpointed and never restored: the next gpud needs
// the CUDA API to restore it, whatever its --preempt-mode.
func UnthawedCheckpoints(recs []preempt.Record) bool {
	for _, o := range unthawed(recs) {
		if len(o.ckpt) > 0 {
			return true
		}
	}
	return false
}

// pendingFreeze is a cgroup a gpud froze and did not thaw: its first
// freeze record, its victims' PIDs and the records of those CUDA-
// checkpointed (their PIDs, in order).
type pendingFreeze struct {
	first preempt.Record
	pids  map[int]bool
	ckpt  []preempt.Record
}

func unthawed(recs []preempt.Record) map[string]*pendingFreeze {
	m := map[string]*pendingFreeze{}
	for _, r := range recs {
		switch r.Action {
		case preempt.ActionFreeze:
			if !strings.HasPrefix(r.Result, "done") || r.Cgroup == "" { // "done; CUDA checkpointed …" too
				continue
			}
			o := m[r.Cgroup]
			if o == nil {
				o = &pendingFreeze{first: r, pids: map[int]bool{}}
				m[r.Cgroup] = o
			}
			o.pids[r.Victim.PID] = true
			if checkpointedIn(r) && !slices.ContainsFunc(o.ckpt, func(x preempt.Record) bool { return x.Victim.PID == r.Victim.PID }) {
				o.ckpt = append(o.ckpt, r)
			}
		case preempt.ActionThaw:
			delete(m, r.Cgroup)
		case preempt.ActionKill:
			for path, o := range m {
				if o.pids[r.Victim.PID] {
					delete(m, path)
				}
			}
		}
	}
	return m
}

// checkpointedIn reports whether a freeze record's victim was CUDA-
// checkpointed: its Checkpointed field, or, in the records of gpuds before
// it, the PIDs its result names ("done; CUDA checkpointed [12 34]…").
func checkpointedIn(r preempt.Record) bool {
	if r.Checkpointed {
		return true
	}
	rest, ok := strings.CutPrefix(r.Result, "done; CUDA checkpointed [")
	if !ok {
		return false
	}
	list, _, _ := strings.Cut(rest, "]")
	for _, f := range strings.Fields(list) {
		if pid, err := strconv.Atoi(f); err == nil && pid == r.Victim.PID {
			return true
		}
	}
	return false
}

// checkpointedVictim is the victim of a checkpointed process's freeze
// record if that process is still in the cgroup it was frozen in (the
// cgroup's id as recorded, when one was): a checkpointed process holds no
// GPU file, so it is no GPU holder to find among the candidates.
func (e *Executor) checkpointedVictim(root, v1 string, rec preempt.Record) (preempt.Victim, bool) {
	b, err := os.ReadFile(filepath.Join(e.ProcRoot, strconv.Itoa(rec.Victim.PID), "cgroup"))
	if err != nil {
		return preempt.Victim{}, false
	}
	in, sameID := false, rec.Victim.CgroupID == 0
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.SplitN(line, ":", 3)
		if len(f) != 3 {
			continue
		}
		var dir string
		switch {
		case f[0] == "0" && f[1] == "":
			dir = filepath.Join(root, f[2])
			var st unix.Stat_t
			if !sameID && unix.Stat(dir, &st) == nil && st.Ino == rec.Victim.CgroupID {
				sameID = true
			}
		case v1 != "" && slices.Contains(strings.Split(f[1], ","), "freezer"):
			dir = filepath.Join(v1, f[2])
		default:
			continue
		}
		if dir == rec.Cgroup || under(dir, rec.Cgroup) {
			in = true
		}
	}
	if !in || !sameID {
		return preempt.Victim{}, false
	}
	return preempt.Victim{ProcInfo: procOf(rec.Victim), TaskID: rec.Victim.TaskID, Released: true,
		Workload: preempt.Target{ContainerID: rec.Victim.ContainerID, PodUID: rec.Victim.PodUID, Namespace: rec.Victim.Namespace}}, true
}

// under reports whether path is a directory strictly below root.
func under(path, root string) bool {
	return root != "" && path != root && strings.HasPrefix(path, strings.TrimSuffix(root, "/")+"/")
}

// Adopt takes over the workloads a previous gpud froze and never thawed
// (recs: the journal's records, oldest first): each cgroup still frozen is
// a suspension of this executor again, its victims the candidates (GPU
// holders, identified by this gpud) whose workload freezer it is, since the
// first freeze record's time: thawed when Resumable, killed at
// --max-frozen counted from then (at once if past). A frozen cgroup none of
// whose processes holds a GPU is thawed (nothing of gpud's keeps it frozen).
// Called once, when classes and loans are known and before holders are
// judged again. It returns how many it adopted and thawed.
//
// Processes a checkpoint-mode freeze CUDA-checkpointed (the freeze records'
// Checkpointed) and still in the cgroup are victims too, though they hold
// no GPU file, and are restored and unlocked after the thaw, as in a
// resume; one found thawed is restored at once (the previous gpud died
// between the thaw and the restore, or someone thawed it), recorded as a
// thaw.
func (e *Executor) Adopt(recs []preempt.Record, cands []preempt.AdoptCandidate) (adopted, thawed int) {
	pending := unthawed(recs)
	if len(pending) == 0 {
		return 0, 0
	}
	root, err := e.cgroupRoot()
	if err != nil {
		e.log().Warn("cannot adopt the previous gpud's frozen workloads: no cgroup v2 hierarchy", "error", err)
		return 0, 0
	}
	v1 := cgroups.V1FreezerMount()
	var thaw, restore []*suspension
	now := time.Now()
	for path, o := range pending {
		rec := o.first
		kind := ""
		switch {
		case filepath.Clean(path) != path:
		case under(path, root):
			kind = cgroups.FreezerV2
		case under(path, v1):
			kind = cgroups.FreezerV1
		}
		if kind == "" {
			e.log().Warn("journal names a frozen cgroup outside the cgroup hierarchies: ignored", "cgroup", path)
			continue
		}
		fz, err := cgroups.OpenFreezer(kind, path, 0)
		if err != nil {
			e.log().Info("a workload the previous gpud froze is gone", "cgroup", path, "error", err)
			continue
		}
		// Its processes whose CUDA state was checkpointed and never
		// restored: locked in the driver until restored, whoever thaws.
		var ckpt []preempt.Victim
		ckptGPUs := map[int]bool{}
		for _, r := range o.ckpt {
			if v, ok := e.checkpointedVictim(root, v1, r); ok {
				ckpt = append(ckpt, v)
				ckptGPUs[r.GPU] = true
			}
		}
		if frozen, err := fz.Paused(); err != nil || !frozen {
			if len(ckpt) == 0 {
				fz.Close()
				e.log().Info("a workload the previous gpud froze is not frozen any more (thawed by hand, or killed)", "cgroup", path)
				continue
			}
			// Thawed (the previous gpud died between its thaw and the
			// restore, or someone thawed it) with its CUDA state still
			// checkpointed: restored now, or it stays locked for good.
			restore = append(restore, &suspension{fz: fz, path: path, kind: kind, since: rec.Time, gpus: ckptGPUs, victims: ckpt,
				checkpointed: pidsOf(ckpt), rule: rec.Rule, preemptor: rec.Preemptor})
			continue
		}
		s := &suspension{fz: fz, path: path, kind: kind, since: rec.Time, resumeAfter: now.Add(adoptGrace), gpus: map[int]bool{},
			rule: rec.Rule, preemptor: rec.Preemptor, checkpointed: pidsOf(ckpt)}
		for _, c := range cands {
			vfz, err := cgroups.WorkloadFreezer(e.ProcRoot, root, c.Victim.PID, c.Victim.WorkloadCgroup)
			if err != nil {
				continue
			}
			if vfz.Path == path {
				s.gpus[c.GPU] = true
				if !containsPID(s.victims, c.Victim.PID) {
					s.victims = append(s.victims, c.Victim)
				}
			}
			vfz.Close()
		}
		// The checkpointed processes hold no GPU file (a driver's
		// checkpoint releases the GPU): victims of the GPUs of their records.
		for _, v := range ckpt {
			if i := slices.IndexFunc(s.victims, func(x preempt.Victim) bool { return x.PID == v.PID }); i >= 0 {
				s.victims[i].Released = true
			} else {
				s.victims = append(s.victims, v)
			}
		}
		for gpu := range ckptGPUs {
			s.gpus[gpu] = true
		}
		if len(s.victims) == 0 {
			s.victims = []preempt.Victim{{ProcInfo: procOf(rec.Victim)}}
			s.gpus[rec.GPU] = true
			thaw = append(thaw, s)
			continue
		}
		s.reason = s.victims[0].Workload.Reason
		e.mu.Lock()
		if e.susp == nil {
			e.susp = map[string]*suspension{}
		}
		if e.susp[path] != nil { // frozen again by this gpud already
			e.mu.Unlock()
			fz.Close()
			continue
		}
		e.susp[path] = s
		if e.MaxFrozen > 0 {
			s.killAt = s.since.Add(e.MaxFrozen)
			s.timer = time.AfterFunc(max(0, s.killAt.Sub(now)), func() { e.frozenTooLong(path, s) })
		}
		e.mu.Unlock()
		adopted++
		e.log().Info("adopted a workload the previous gpud froze", "cgroup", path, "freezer", kind,
			"since", s.since, "gpus", sortedGPUs(s.gpus), "pids", len(s.victims), "cuda_checkpointed", s.checkpointed)
	}
	if len(thaw) > 0 {
		e.thawAll(thaw, "adopted from the journal: none of its processes holds a GPU")
	}
	if len(restore) > 0 {
		e.thawAll(restore, "adopted from the journal: found thawed with its CUDA state checkpointed")
		thaw = append(thaw, restore...)
	}
	if adopted > 0 && e.Suspended != nil {
		e.Suspended()
	}
	return adopted, len(thaw)
}

func pidsOf(vs []preempt.Victim) []int {
	var out []int
	for _, v := range vs {
		out = append(out, v.PID)
	}
	return out
}

func containsPID(vs []preempt.Victim, pid int) bool {
	for _, v := range vs {
		if v.PID == pid {
			return true
		}
	}
	return false
}

// procOf is what a record says of a process, for the thaw record of a
// cgroup adopted with no holder in it.
func procOf(p preempt.Party) occupancy.ProcInfo {
	return occupancy.ProcInfo{PID: p.PID, Comm: p.Comm, ContainerID: p.ContainerID, PodUID: p.PodUID, CgroupID: p.CgroupID}
}
