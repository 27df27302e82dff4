package preempt

import (
	"path/filepath"
	"strings"
	"time"

	"github.com/gpud/gpud/internal/cgroups"
	"github.com/gpud/gpud/internal/occupancy"
)

// adoptGrace is how long an adopted suspension is kept even though its
// GPUs show no high-priority holder: a restarted gpud's holders are
// classified as its workload sources report, which can be after the
// adoption; the high holder seen in that time ends the grace.
const adoptGrace = 5 * time.Second

// AdoptCandidate is a GPU holder that a previous gpud may have frozen.
type AdoptCandidate struct {
	GPU    int
	Victim Victim
}

// Unthawed returns the freezes a gpud did (result done) and journaled with
// no later thaw of the same cgroup nor kill of its victims, by cgroup
// directory, the first record of each: what a gpud killed outright
// (SIGKILL, OOM) left frozen. recs are oldest first (Journal.Recent).
func Unthawed(recs []Record) map[string]Record {
	type open struct {
		first Record
		pids  map[int]bool
	}
	m := map[string]*open{}
	for _, r := range recs {
		switch r.Action {
		case ActionFreeze:
			if !strings.HasPrefix(r.Result, "done") || r.Cgroup == "" { // "done; CUDA checkpointed …" too
				continue
			}
			o := m[r.Cgroup]
			if o == nil {
				o = &open{first: r, pids: map[int]bool{}}
				m[r.Cgroup] = o
			}
			o.pids[r.Victim.PID] = true
		case ActionThaw:
			delete(m, r.Cgroup)
		case ActionKill:
			for path, o := range m {
				if o.pids[r.Victim.PID] {
					delete(m, path)
				}
			}
		}
	}
	out := make(map[string]Record, len(m))
	for path, o := range m {
		out[path] = o.first
	}
	return out
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
func (e *Executor) Adopt(recs []Record, cands []AdoptCandidate) (adopted, thawed int) {
	pending := Unthawed(recs)
	if len(pending) == 0 {
		return 0, 0
	}
	root, err := e.cgroupRoot()
	if err != nil {
		e.log().Warn("cannot adopt the previous gpud's frozen workloads: no cgroup v2 hierarchy", "error", err)
		return 0, 0
	}
	v1 := cgroups.V1FreezerMount()
	var thaw []*suspension
	now := time.Now()
	for path, rec := range pending {
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
		if frozen, err := fz.Paused(); err != nil || !frozen {
			fz.Close()
			e.log().Info("a workload the previous gpud froze is not frozen any more (thawed by hand, or killed)", "cgroup", path)
			continue
		}
		s := &suspension{fz: fz, path: path, kind: kind, since: rec.Time, resumeAfter: now.Add(adoptGrace), gpus: map[int]bool{},
			rule: rec.Rule, preemptor: rec.Preemptor}
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
		if len(s.victims) == 0 {
			s.victims = []Victim{{ProcInfo: procOf(rec.Victim)}}
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
			"since", s.since, "gpus", sortedGPUs(s.gpus), "pids", len(s.victims))
	}
	if len(thaw) > 0 {
		e.thawAll(thaw, "adopted from the journal: none of its processes holds a GPU")
	}
	if adopted > 0 && e.Suspended != nil {
		e.Suspended()
	}
	return adopted, len(thaw)
}

func containsPID(vs []Victim, pid int) bool {
	for _, v := range vs {
		if v.PID == pid {
			return true
		}
	}
	return false
}

// procOf is what a record says of a process, for the thaw record of a
// cgroup adopted with no holder in it.
func procOf(p Party) occupancy.ProcInfo {
	return occupancy.ProcInfo{PID: p.PID, Comm: p.Comm, ContainerID: p.ContainerID, PodUID: p.PodUID, CgroupID: p.CgroupID}
}
