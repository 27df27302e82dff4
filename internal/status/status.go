// Package status renders the state file for people: `gpud status`.
package status

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

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
		state := printable(string(g.State))
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
				workload(h), printable(string(h.Priority)), h.FDs, ago(now, h.OpenedAt))
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	return renderPreemptions(w, f.Preemptions, now)
}

// preemption is the part of a preemption record the table shows.
type preemption struct {
	Time   time.Time `json:"time"`
	GPU    int       `json:"gpu"`
	Action string    `json:"action"`
	Victim struct {
		PID         int    `json:"pid"`
		ContainerID string `json:"container_id"`
		PodUID      string `json:"pod_uid"`
	} `json:"victim"`
	Preemptor struct {
		PID         int    `json:"pid"`
		ContainerID string `json:"container_id"`
		PodUID      string `json:"pod_uid"`
	} `json:"preemptor"`
	LatencyMS float64 `json:"latency_ms"`
	Result    string  `json:"result"`
}

// renderPreemptions shows the last few preemptions, newest first.
func renderPreemptions(w io.Writer, raw []occupancy.Preemption, now time.Time) error {
	if len(raw) == 0 {
		return nil
	}
	const show = 5
	fmt.Fprintf(w, "\nLAST PREEMPTIONS (%d recorded; -o json for all)\n", len(raw))
	tw := tabwriter.NewWriter(w, 0, 0, 1, ' ', 0)
	fmt.Fprintln(tw, "AGO\tGPU\tACTION\tVICTIM\tBY\tMS\tRESULT")
	for i := len(raw) - 1; i >= 0 && i >= len(raw)-show; i-- {
		var p preemption
		if err := json.Unmarshal(raw[i], &p); err != nil {
			fmt.Fprintf(tw, "-\t-\t(unreadable record)\t\t\t\t\n")
			continue
		}
		ms := "-"
		if p.LatencyMS > 0 {
			ms = fmt.Sprintf("%.1f", p.LatencyMS)
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\n", ago(now, p.Time), p.GPU, printable(p.Action),
			party(p.Victim.PID, p.Victim.ContainerID, p.Victim.PodUID),
			party(p.Preemptor.PID, p.Preemptor.ContainerID, p.Preemptor.PodUID), ms, trunc(p.Result, 12))
	}
	return tw.Flush()
}

func party(pid int, ctr, pod string) string {
	var s string
	switch {
	case pod != "":
		s = "pod/" + trunc(pod, 8)
	case ctr != "":
		s = "ctr/" + trunc(ctr, 8)
	}
	if pid > 0 {
		if s != "" {
			s += " "
		}
		s += fmt.Sprint(pid)
	}
	if s == "" {
		return "-"
	}
	return s
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

// trunc returns s made printable, cut to n characters.
func trunc(s string, n int) string {
	s = printable(s)
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	return string([]rune(s)[:n])
}

// printable replaces what must not reach a terminal with '?': control
// characters (newlines, escape sequences), bidi overrides and other
// invisible formatting, bytes that are not UTF-8. Comm is whatever a
// process names itself, and the rest comes from a file anyone with write
// access to it could have edited.
func printable(s string) string {
	unsafe := func(r rune) bool { return r == utf8.RuneError || (r != ' ' && !unicode.IsPrint(r)) }
	if strings.IndexFunc(s, unsafe) < 0 {
		return s
	}
	return strings.Map(func(r rune) rune {
		if unsafe(r) {
			return '?'
		}
		return r
	}, s)
}

// orDash returns s made printable, or "-" when it shows nothing.
func orDash(s string) string {
	if strings.TrimSpace(s) == "" {
		return "-"
	}
	return printable(s)
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
