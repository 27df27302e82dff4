package gate

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

// reservedRule names the refusal of a reservation's, which the gate
// applies on top of the rule table.
const reservedRule = "reserved for the earliest refused low-priority request: deny"

// Explain says which rule would apply to process pid now: its workload,
// its class and why, the GPUs it holds, and for each GPU the Verdict given
// the GPU's other holders, its loan and its reservation.
func (c *Controller) Explain(pid int) (*v1.Explanation, error) {
	info, err := c.Proc.Info(pid)
	if err != nil {
		if errors.Is(err, occupancy.ErrNoProcess) {
			return nil, fmt.Errorf("%w: %d", ErrNoSuchProcess, pid)
		}
		return nil, err
	}
	e := &v1.Explanation{
		PID: pid, Comm: info.Comm, CgroupID: info.CgroupID, ContainerID: info.ContainerID, PodUID: info.PodUID,
		Monitoring: c.Monitoring(), Enforcing: c.Enforce, Holds: []int{}, GPUs: []v1.ExplainGPU{},
	}
	cgPath := ""
	if b, err := os.ReadFile(filepath.Join(c.Proc.Root, strconv.Itoa(pid), "cgroup")); err == nil {
		if ci, err := cgroups.Parse(string(b)); err == nil {
			cgPath = ci.V2Path
		}
	}
	e.Cgroup = cgPath
	w, known, class, reason := c.Registry.Explain(info)
	if c.Registry.AgentProc(info) {
		class, reason = occupancy.Unmanaged, workload.ReasonAgent
	}
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
	e.Why = c.why(w, known, class, reason)
	ancestors := c.cgroupAncestors(cgPath)

	snap := c.Ledger.Snapshot(time.Now())
	for _, g := range snap.GPUs {
		eg := v1.ExplainGPU{Index: g.Index, State: g.State}
		if m := g.MIG; m != nil {
			eg.MIG = fmt.Sprintf("GPU %d gi%d %s %s", m.Parent, m.GI, m.Profile, g.UUID)
		}
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
		for _, h := range g.Holders {
			if h.PID == pid && h.OpenedUnknown && e.BeforeClassified == "" {
				e.BeforeClassified = c.lateWords(pid, g.Index)
			}
		}
		if c.lent(g.Index) {
			eg.Lent = true
			eg.State = occupancy.Lent
		}
		if cg, ok := c.Reservation(g.Index); ok {
			eg.ReservedFor = cg
		}
		if c.shared(g.Index) {
			c.judgeShared(&eg, class, known && reason != workload.ReasonAgent, c.sharerOf(g.Index, append([]uint64{info.CgroupID}, ancestors...)))
		} else {
			c.judge(&eg, class, lows, slices.Contains(ancestors, eg.ReservedFor) || eg.ReservedFor == info.CgroupID)
		}
		if c.ComputeShare != nil && info.PodUID != "" {
			if cs, ok := c.ComputeShare(g.Index, info.PodUID); ok {
				eg.Compute = &cs
			}
		}
		e.GPUs = append(e.GPUs, eg)
	}
	if s, ok := c.Exec.SuspendedPID(pid); ok {
		e.Suspended = &s
	}
	if !known && (class == occupancy.High || class == occupancy.Low) {
		e.Why += "; the gate does not know its cgroup yet, so its opens get through and the rule acts right after"
	}
	return e, nil
}

// judge fills in the verdict for an open of g by a process of class, as the
// gate and the controller would decide it now.
func (c *Controller) judge(g *v1.ExplainGPU, class occupancy.Priority, lows []int, reservedOK bool) {
	if !c.Monitoring() || !c.Enforce {
		g.Allow, g.Rule = true, "enforcement off: allow"
		return
	}
	counts := occupancy.ClassCounts{High: uint32(g.HighHolders), Low: uint32(g.LowHolders)}
	v := preempt.Decide(Holding(counts, g.Lent), class)
	g.Allow, g.Rule = v.Allow, v.Rule
	if v.Allow && class == occupancy.Low && g.ReservedFor != 0 && !reservedOK {
		g.Allow, g.Rule = false, reservedRule
		g.Effects = append(g.Effects, "it waits its turn: the GPU is kept for the earlier request until it opens or its reservation expires")
		return
	}
	if v.KillHolders && len(lows) > 0 {
		g.Effects = append(g.Effects, fmt.Sprintf("the low-priority holders are killed (pid %s)%s", joinPIDs(lows), c.reclaimWords("their")))
	}
	if v.ReclaimOpener {
		g.Effects = append(g.Effects, "the refusal is recorded; it waits for the GPU (earliest request first)"+c.reclaimWords("its"))
	}
}

// sharedNoShareRule names the kernel's refusal of a shared GPU to a
// workload without a share of it (the fence; IntruderRule when one got in).
const sharedNoShareRule = "shared, no share of it: deny"

// judgeShared fills in the verdict for an open of the shared GPU g by a
// process of class: a sharer gets the rule table's shared rows, a workload
// without a share is refused by the kernel's fence; agents and host
// processes are let through. workload: a known workload, not an agent.
func (c *Controller) judgeShared(g *v1.ExplainGPU, class occupancy.Priority, workload, sharer bool) {
	g.Shared = true
	if !c.Monitoring() || !c.Enforce {
		g.Allow, g.Rule = true, "enforcement off: allow"
		return
	}
	if !sharer {
		if workload || class == occupancy.High || class == occupancy.Low {
			g.Allow, g.Rule = false, sharedNoShareRule
			return
		}
		g.Allow, g.Rule = true, "unmanaged opener: allow"
		return
	}
	v := preempt.Decide(preempt.Holding{Shared: true, High: g.HighHolders > 0, Low: g.LowHolders > 0}, class)
	g.Allow, g.Rule = v.Allow, v.Rule
	switch v.PreemptSharers {
	case preempt.SharersLow:
		g.Effects = append(g.Effects, "when it needs the memory of its share that lower-class sharers use, the low-priority sharers are preempted (--preempt-mode), those over their share first; compute: the time-slice scheduler, which never throttles it")
	case preempt.SharersOver:
		g.Effects = append(g.Effects, "when it needs the memory of its share, the low-priority sharers over theirs are preempted; compute: the time-slice scheduler")
	}
}

func (c *Controller) reclaimWords(whose string) string {
	mode := c.Reclaim
	if mode == "" {
		mode = preempt.ReclaimStop
	}
	if mode == "none" {
		return ""
	}
	return fmt.Sprintf(", and %s workload is reclaimed (--reclaim %s)", whose, mode)
}

// why puts a class's reason in words.
func (c *Controller) why(w workload.Workload, known bool, class occupancy.Priority, reason string) string {
	what := "container"
	if w.PodUID != "" {
		what = "pod"
	} else if known && w.ContainerID == "" {
		what = "cgroup"
	}
	switch reason {
	case workload.ReasonAgent:
		// The same marks AgentProc reads; the kernel gate never classifies
		// an agent's cgroup, so "never refused" is the kernel's verdict too.
		const never = ": never a holder, never preempted, never refused (the gate does not classify its cgroup)"
		switch {
		case known && w.Agent && w.PodUID != "":
			return fmt.Sprintf("a system agent: a pod of agent namespace %s (--agent-namespaces)%s", w.Namespace, never)
		case known && w.Agent:
			return fmt.Sprintf("a system agent: a container started with the label %s=true%s", workload.LabelAgent, never)
		}
		return "a system agent: a root host process outside every workload, named in --agent-comms" + never
	case workload.ReasonLabel:
		if w.ContainerID == "" && w.PodUID == "" {
			return "its cgroup was classified " + string(class)
		}
		return fmt.Sprintf("label %s=%s on its %s", workload.LabelPriority, class, what)
	case workload.ReasonOverride:
		if loans := c.loans(); loans != nil {
			switch gpu, role, _ := loans.Role(w.PodUID); role {
			case "borrower":
				return fmt.Sprintf("borrower of lent GPU %d: forced low whatever its label", gpu)
			case "owner":
				return fmt.Sprintf("owner of GPU %d: forced high while it is lent", gpu)
			}
		}
		return "forced by lending"
	case workload.ReasonDefault:
		if !known {
			return fmt.Sprintf("a container gpud does not know: --default-priority (%s)", class)
		}
		return fmt.Sprintf("no valid %s label on its %s: --default-priority (%s)", workload.LabelPriority, what, class)
	case workload.ReasonPriorityClass:
		return fmt.Sprintf("its pod's priority (PriorityClass) is %s by --priority-classes, over any %s label", class, workload.LabelPriority)
	}
	return "not in a container: host processes are never managed"
}

// cgroupAncestors returns the ids of the cgroup at path (under the cgroup
// v2 root) and of its ancestors: the gate matches a reservation against
// any of them.
func (c *Controller) cgroupAncestors(path string) []uint64 {
	root := c.Proc.CgroupRoot
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

// lateWords says that pid opened gpu before gpud knew its workload, and
// what was done about it (its preemption records).
func (c *Controller) lateWords(pid, gpu int) string {
	var done []string
	if c.Journal != nil {
		for _, r := range c.Journal.Recent() {
			if r.Victim.PID == pid {
				done = append(done, fmt.Sprintf("%s on GPU %d: %s (%s)", r.Action, r.GPU, r.Result, r.Rule))
			}
		}
	}
	s := fmt.Sprintf("it opened GPU %d before gpud knew its workload, so the gate could not judge that open by class; the rules judged it once its class was known", gpu)
	if len(done) == 0 {
		return s + ": nothing was done (its class allows it here)"
	}
	return s + ": " + strings.Join(done, "; ")
}
