// Package status renders the state file for people: `gpud status`.
package status

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/gpud/gpud/internal/occupancy"
)

// Render writes a table of GPUs and their holders, fit for 80 columns.
func Render(w io.Writer, f *occupancy.StateFile, now time.Time) error {
	mon := "on"
	if !f.Monitoring {
		mon = "OFF (ledger frozen)"
	}
	fmt.Fprintf(w, "node %s  monitoring %s  updated %s ago\n\n", orDash(f.Node), mon, ago(now, f.UpdatedAt))
	tw := tabwriter.NewWriter(w, 0, 0, 1, ' ', 0)
	fmt.Fprintln(tw, "GPU\tSTATE\tPID\tCOMM\tCONTAINER/POD\tPRIORITY\tFDS\tSINCE")
	for _, g := range f.GPUs {
		state := string(g.State)
		if g.State == occupancy.Idle && g.IdleSince != nil {
			state += " " + ago(now, *g.IdleSince)
		}
		if len(g.Holders) == 0 {
			fmt.Fprintf(tw, "%d\t%s\t-\t-\t-\t-\t-\t-\n", g.Index, state)
			continue
		}
		for i, h := range g.Holders {
			gpu := fmt.Sprint(g.Index)
			if i > 0 {
				gpu, state = "", ""
			}
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%d\t%s\n", gpu, state, h.PID, trunc(h.Comm, 15),
				workload(h), h.Priority, h.FDs, ago(now, h.OpenedAt))
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(f.Preemptions) > 0 {
		fmt.Fprintf(w, "\n%d recent preemption(s): gpud status -o json for details\n", len(f.Preemptions))
	}
	return nil
}

func workload(h occupancy.StateHolder) string {
	switch {
	case h.PodUID != "":
		return "pod/" + trunc(h.PodUID, 12)
	case h.ContainerID != "":
		return "ctr/" + trunc(h.ContainerID, 12)
	}
	return "host"
}

func trunc(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}

func orDash(s string) string {
	if strings.TrimSpace(s) == "" {
		return "-"
	}
	return s
}

func ago(now, t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	d := now.Sub(t)
	switch {
	case d < 0:
		return "0s"
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh%02dm", int(d.Hours()), int(d.Minutes())%60)
	}
	return fmt.Sprintf("%dd", int(d.Hours()/24))
}
