package status

import (
	"fmt"
	"io"
	"strings"
	"time"

	v1 "github.com/gpud/gpud/api/v1"
)

// RenderExplain writes an explanation for people.
func RenderExplain(w io.Writer, e *v1.Explanation) error {
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
	if s := e.Suspended; s != nil {
		fmt.Fprintf(&b, "FROZEN since %s (%s, %s): %s\n", s.Since.Format(time.RFC3339), s.Freezer, printable(s.Cgroup), printable(s.Reason))
		fmt.Fprintf(&b, "  %s\n", printable(s.ThawWhen))
	}
	if len(e.Holds) == 0 {
		b.WriteString("holds no GPU\n")
	} else {
		fmt.Fprintf(&b, "holds GPU %s\n", joinInts(e.Holds))
	}
	if e.BeforeClassified != "" {
		fmt.Fprintf(&b, "before classification: %s\n", printable(e.BeforeClassified))
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
		name := fmt.Sprint(g.Index)
		if g.MIG != "" {
			name = "MIG slice " + printable(g.MIG) // its index says nothing to a reader
		}
		fmt.Fprintf(&b, "open of GPU %s: %s (rule: %s)", name, verdict, printable(g.Rule))
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
		if g.Compute != nil {
			explainCompute(&b, g.Compute)
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
