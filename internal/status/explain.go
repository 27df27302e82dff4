package status

import (
	"fmt"
	"io"
	"strings"

	"github.com/gpud/gpud/internal/occupancy"
)

// Explanation is which rule applies to one process now: the answer of the
// control socket's GET /v1/explain?pid=N, shown by `gpud explain`.
type Explanation struct {
	PID         int                `json:"pid"`
	Comm        string             `json:"comm"`
	Cgroup      string             `json:"cgroup"` // cgroup v2 path
	CgroupID    uint64             `json:"cgroup_id"`
	ContainerID string             `json:"container_id,omitempty"`
	PodUID      string             `json:"pod_uid,omitempty"`
	Workload    *Workload          `json:"workload,omitempty"` // nil: gpud knows no workload for it
	Priority    occupancy.Priority `json:"priority"`
	Reason      string             `json:"reason"` // label | override | default | host
	Why         string             `json:"why"`    // the reason in words
	Monitoring  bool               `json:"monitoring"`
	Enforcing   bool               `json:"enforcing"`
	Holds       []int              `json:"holds"` // GPUs it holds, by index
	GPUs        []ExplainGPU       `json:"gpus"`
}

// Workload is the container or pod a process belongs to, as gpud knows it.
type Workload struct {
	Kind        string `json:"kind"` // pod | container | cgroup
	Namespace   string `json:"namespace,omitempty"`
	Name        string `json:"name,omitempty"`
	PodUID      string `json:"pod_uid,omitempty"`
	ContainerID string `json:"container_id,omitempty"`
	TaskID      string `json:"task_id,omitempty"`
	CgroupID    uint64 `json:"cgroup_id,omitempty"`
}

// ExplainGPU is what would happen if the process opened one GPU now.
type ExplainGPU struct {
	Index       int             `json:"index"`
	State       occupancy.State `json:"state"`
	Holds       bool            `json:"holds"`        // the process holds it already
	HighHolders int             `json:"high_holders"` // other processes, by class
	LowHolders  int             `json:"low_holders"`
	Lent        bool            `json:"lent"`
	ReservedFor uint64          `json:"reserved_for,omitempty"` // cgroup id of the earliest refused request
	Allow       bool            `json:"allow"`
	Rule        string          `json:"rule"`
	Effects     []string        `json:"effects,omitempty"` // what the verdict sets off
}

// RenderExplain writes an explanation for people.
func RenderExplain(w io.Writer, e *Explanation) error {
	var b strings.Builder
	// Names come from processes and the API server: printable only.
	fmt.Fprintf(&b, "pid %d (%s)", e.PID, orDash(e.Comm))
	if wl := e.Workload; wl != nil {
		switch wl.Kind {
		case "pod":
			fmt.Fprintf(&b, " in pod %s/%s (uid %s)", printable(wl.Namespace), printable(wl.Name), printable(wl.PodUID))
		case "container":
			fmt.Fprintf(&b, " in container %s", orDash(wl.Name))
		default:
			fmt.Fprintf(&b, " in a classified cgroup")
		}
		if wl.TaskID != "" {
			fmt.Fprintf(&b, ", task %s", printable(wl.TaskID))
		}
	} else if e.PodUID != "" {
		fmt.Fprintf(&b, " in pod uid %s (not known to gpud)", printable(e.PodUID))
	}
	if e.ContainerID != "" {
		fmt.Fprintf(&b, ", container id %s", prefix(e.ContainerID, 12))
	}
	if e.ContainerID == "" && e.PodUID == "" {
		b.WriteString(" on the host")
	}
	b.WriteString("\n")
	fmt.Fprintf(&b, "cgroup %s (id %d)\n", orDash(e.Cgroup), e.CgroupID)
	fmt.Fprintf(&b, "priority %s: %s\n", printable(string(e.Priority)), printable(e.Why))
	if len(e.Holds) == 0 {
		b.WriteString("holds no GPU\n")
	} else {
		fmt.Fprintf(&b, "holds GPU %s\n", joinInts(e.Holds))
	}
	switch {
	case !e.Monitoring:
		b.WriteString("monitoring is off: the gate allows every open and nothing is recorded\n")
	case !e.Enforcing:
		b.WriteString("enforcement is off (--enforce=false): every open is allowed, only recorded\n")
	}
	for _, g := range e.GPUs {
		verdict := "deny"
		if g.Allow {
			verdict = "allow"
		}
		fmt.Fprintf(&b, "open of GPU %d: %s (rule: %s)", g.Index, verdict, printable(g.Rule))
		var facts []string
		facts = append(facts, printable(string(g.State)))
		if g.Holds {
			facts = append(facts, "held by it")
		}
		if g.HighHolders > 0 {
			facts = append(facts, fmt.Sprintf("%d other high", g.HighHolders))
		}
		if g.LowHolders > 0 {
			facts = append(facts, fmt.Sprintf("%d other low", g.LowHolders))
		}
		if g.Lent {
			facts = append(facts, "lent")
		}
		if g.ReservedFor != 0 {
			facts = append(facts, fmt.Sprintf("reserved for cgroup %d", g.ReservedFor))
		}
		fmt.Fprintf(&b, " [%s]\n", strings.Join(facts, ", "))
		for _, eff := range g.Effects {
			fmt.Fprintf(&b, "  then: %s\n", printable(eff))
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func joinInts(xs []int) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = fmt.Sprint(x)
	}
	return strings.Join(s, ", ")
}
