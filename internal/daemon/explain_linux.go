package daemon

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	v1 "github.com/gpud/gpud/api/v1"

	"github.com/gpud/gpud/internal/cgroups"
	"github.com/gpud/gpud/internal/occupancy"
	"github.com/gpud/gpud/internal/preempt"
	"github.com/gpud/gpud/internal/workload"
)

// ErrNoSuchProcess is returned by Explain for a PID with no process.
var ErrNoSuchProcess = errors.New("no such process")

// reservedRule names the refusal of claim 5's reservations, which the gate
// applies on top of the rule table.
const reservedRule = "reserved for the earliest refused low-priority request: deny"

// Explain says which rule would apply to process pid now: its workload,
// its class and why, the GPUs it holds, and for each GPU the verdict of
// preempt.Decide (the enforcer's policy) given the GPU's other holders, its
// loan and its reservation.
func (d *Daemon) Explain(pid int) (*v1.Explanation, error) {
	info, err := d.tracker.Proc.Info(pid)
	if err != nil {
		if errors.Is(err, occupancy.ErrNoProcess) {
			return nil, fmt.Errorf("%w: %d", ErrNoSuchProcess, pid)
		}
		return nil, err
	}
	e := &v1.Explanation{
		PID: pid, Comm: info.Comm, CgroupID: info.CgroupID, ContainerID: info.ContainerID, PodUID: info.PodUID,
		Monitoring: d.monitoring.Load(), Enforcing: d.cfg.Enforce, Holds: []int{}, GPUs: []v1.ExplainGPU{},
	}
	cgPath := ""
	if b, err := os.ReadFile(filepath.Join(d.tracker.Proc.Root, strconv.Itoa(pid), "cgroup")); err == nil {
		if ci, err := cgroups.Parse(string(b)); err == nil {
			cgPath = ci.V2Path
		}
	}
	e.Cgroup = cgPath
	w, known, class, reason := d.registry.Explain(info)
	e.Priority, e.Reason = class, reason
	if known {
		e.Workload = &v1.Workload{Namespace: w.Namespace, Name: w.Name, PodUID: w.PodUID,
			ContainerID: w.ContainerID, TaskID: w.TaskID, CgroupID: w.CgroupID}
		switch {
		case w.PodUID != "":
			e.Workload.Kind = "pod"
		case w.ContainerID != "":
			e.Workload.Kind = "container"
		default:
			e.Workload.Kind = "cgroup"
		}
	}
	e.Why = d.why(w, known, class, reason)
	ancestors := d.cgroupAncestors(cgPath)

	snap := d.ledger.Snapshot(time.Now())
	for _, g := range snap.GPUs {
		eg := v1.ExplainGPU{Index: g.Index, State: g.State}
		var lows []int
		for _, h := range g.Holders {
			if h.PID == pid {
				eg.Holds = true
				continue
			}
			switch h.Priority {
			case occupancy.High:
				eg.HighHolders++
			case occupancy.Low:
				eg.LowHolders++
				lows = append(lows, h.PID)
			}
		}
		if eg.Holds {
			e.Holds = append(e.Holds, g.Index)
		}
		if d.lender != nil && d.lender.isLent(g.Index) {
			eg.Lent = true
			eg.State = occupancy.Lent
		}
		if cg, ok := d.enforcer.reservation(g.Index); ok {
			eg.ReservedFor = cg
		}
		d.judge(&eg, class, lows, slices.Contains(ancestors, eg.ReservedFor) || eg.ReservedFor == info.CgroupID)
		e.GPUs = append(e.GPUs, eg)
	}
	if !known && (class == occupancy.High || class == occupancy.Low) {
		e.Why += "; the gate does not know its cgroup yet, so its opens get through and the rule acts right after"
	}
	return e, nil
}

// judge fills in the verdict for an open of g by a process of class, as the
// gate and the enforcer would decide it now.
func (d *Daemon) judge(g *v1.ExplainGPU, class occupancy.Priority, lows []int, reservedOK bool) {
	if !d.monitoring.Load() || !d.cfg.Enforce {
		g.Allow, g.Rule = true, "enforcement off: allow"
		return
	}
	held := preempt.Holding{High: g.HighHolders > 0, Low: g.LowHolders > 0}
	if g.Lent {
		// The owner's idle hold does not block its borrower (enforcer.sync).
		held.High = false
	}
	v := preempt.Decide(held, class)
	g.Allow, g.Rule = v.Allow, v.Rule
	if v.Allow && class == occupancy.Low && g.ReservedFor != 0 && !reservedOK {
		g.Allow, g.Rule = false, reservedRule
		g.Effects = append(g.Effects, "it waits its turn: the GPU is kept for the earlier request until it opens or its reservation expires")
		return
	}
	if v.KillHolders && len(lows) > 0 {
		g.Effects = append(g.Effects, fmt.Sprintf("the low-priority holders are killed (pid %s)%s", joinPIDs(lows), d.reclaimWords("their")))
	}
	if v.ReclaimOpener {
		g.Effects = append(g.Effects, "the refusal is recorded; it waits for the GPU (earliest request first)"+d.reclaimWords("its"))
	}
}

func (d *Daemon) reclaimWords(whose string) string {
	mode := d.cfg.Reclaim
	if mode == "" {
		mode = preempt.ReclaimStop
	}
	if mode == "none" {
		return ""
	}
	return fmt.Sprintf(", and %s workload is reclaimed (--reclaim %s)", whose, mode)
}

// why puts a class's reason in words.
func (d *Daemon) why(w workload.Workload, known bool, class occupancy.Priority, reason string) string {
	what := "container"
	if w.PodUID != "" {
		what = "pod"
	} else if known && w.ContainerID == "" {
		what = "cgroup"
	}
	switch reason {
	case workload.ReasonLabel:
		if w.ContainerID == "" && w.PodUID == "" {
			return "its cgroup was classified " + string(class)
		}
		return fmt.Sprintf("label %s=%s on its %s", workload.LabelPriority, class, what)
	case workload.ReasonOverride:
		if d.lender != nil {
			d.lender.mu.Lock()
			defer d.lender.mu.Unlock()
			for gpu, b := range d.lender.borrowers {
				if b.UID == w.PodUID {
					return fmt.Sprintf("borrower of lent GPU %d: forced low whatever its label", gpu)
				}
			}
			for gpu, o := range d.lender.owners {
				if o.UID == w.PodUID {
					return fmt.Sprintf("owner of GPU %d: forced high while it is lent", gpu)
				}
			}
		}
		return "forced by lending"
	case workload.ReasonDefault:
		if !known {
			return fmt.Sprintf("a container gpud does not know: --default-priority (%s)", class)
		}
		return fmt.Sprintf("no valid %s label on its %s: --default-priority (%s)", workload.LabelPriority, what, class)
	}
	return "not in a container: host processes are never managed"
}

// cgroupAncestors returns the ids of the cgroup at path (under the cgroup
// v2 root) and of its ancestors: the gate matches a reservation against
// any of them.
func (d *Daemon) cgroupAncestors(path string) []uint64 {
	root := d.tracker.Proc.CgroupRoot
	if root == "" || path == "" {
		return nil
	}
	var out []uint64
	parts := strings.Split(strings.Trim(path, "/"), "/")
	for i := len(parts); i > 0; i-- {
		if id, err := cgroups.ID(filepath.Join(root, filepath.Join(parts[:i]...))); err == nil {
			out = append(out, id)
		}
	}
	return out
}

func joinPIDs(pids []int) string {
	slices.Sort(pids)
	s := make([]string, len(pids))
	for i, p := range pids {
		s[i] = strconv.Itoa(p)
	}
	return strings.Join(s, ", ")
}
