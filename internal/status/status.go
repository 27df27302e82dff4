// Package status renders the state file for people: `gpud status`.
package status

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	v1 "github.com/gpud/gpud/api/v1"

	"github.com/gpud/gpud/internal/occupancy"
)

// Width is the terminal width the table fits.
const Width = 80

// Render writes a table of GPUs and their holders, the lent GPUs and the
// last preemptions, each line at most Width columns: long names end in an
// ellipsis (-o wide and -o json have them whole).
func Render(out io.Writer, f *v1.StateFile, now time.Time) error {
	return renderTable(out, f, now, false)
}

// RenderWide writes the table of Render with every name whole and more
// columns (the pod's container, the GPU's UUID, file descriptors): lines
// as long as they need.
func RenderWide(out io.Writer, f *v1.StateFile, now time.Time) error {
	return renderTable(out, f, now, true)
}

func renderTable(out io.Writer, f *v1.StateFile, now time.Time, wide bool) error {
	var w bytes.Buffer
	mon, rules := "on", "enforced"
	if !f.Monitoring {
		mon = "OFF (ledger frozen)"
	}
	if !f.Enforcing {
		rules = "NOT enforced"
	}
	fmt.Fprintf(&w, "node %s  monitoring %s  rules %s  updated %s ago\n", trunc(orDash(f.Node), 30), mon, rules, ago(now, f.UpdatedAt))
	renderHealth(&w, f.Health, now)
	renderSource(&w, f)
	renderHooks(&w, f.Hooks)
	renderKernelMaps(&w, f.KernelMaps)
	fmt.Fprintln(&w)
	tw := tabwriter.NewWriter(&w, 0, 0, 1, ' ', 0)
	// cut shortens a name to n columns in the table, never in -o wide.
	cut := func(s string, n int) string {
		if wide {
			return printable(s)
		}
		return trunc(s, n)
	}
	if wide {
		fmt.Fprintln(tw, "GPU\tSTATE\tPID\tCOMM\tCONTAINER/POD\tCONTAINER\tPRIORITY\tFDS\tSINCE\tUUID")
	} else {
		fmt.Fprintln(tw, "GPU\tSTATE\tPID\tCOMM\tCONTAINER/POD\tPRIORITY\tSINCE")
	}
	for _, g := range f.GPUs {
		state := trunc(string(g.State), 6)
		if g.State == occupancy.Idle && g.IdleSince != nil {
			state += " " + ago(now, *g.IdleSince)
		}
		// Agents follow the holders, their class shown as "agent": they
		// hold the GPU without making it busy.
		rows := g.Holders
		if len(g.Agents) > 0 {
			rows = append(slices.Clone(g.Holders), g.Agents...)
		}
		if len(rows) == 0 {
			if wide {
				fmt.Fprintf(tw, "%s\t%s\t-\t-\t-\t-\t-\t-\t-\t%s\n", gpuName(g), state, orDash(g.UUID))
			} else {
				fmt.Fprintf(tw, "%s\t%s\t-\t-\t-\t-\t-\n", gpuName(g), state)
			}
			continue
		}
		for i, h := range rows {
			gpu, uuid := gpuName(g), orDash(g.UUID)
			if i > 0 {
				gpu, state, uuid = "", "", ""
			}
			if i >= len(g.Holders) {
				h.Priority = "agent"
			}
			if wide {
				container := "-"
				if h.Pod != "" && h.Container != "" {
					container = printable(h.Container)
				}
				fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", gpu, state, h.PID, printable(h.Comm),
					workload(h, wide), container, orDash(string(h.Priority)), h.FDs, ago(now, h.OpenedAt), uuid)
				continue
			}
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\n", gpu, state, h.PID, cut(h.Comm, 15),
				cut(workload(h, wide), 20), cut(orDash(string(h.Priority)), 12), ago(now, h.OpenedAt))
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	renderUnenforced(&w, f.GPUs)
	renderGPUFacts(&w, f, now)
	if err := renderLoans(&w, f.GPUs); err != nil {
		return err
	}
	if err := renderShares(&w, f.GPUs, wide); err != nil {
		return err
	}
	if err := renderComputeShares(&w, f.GPUs, wide); err != nil {
		return err
	}
	renderSuspended(&w, f.Suspended, now)
	if err := renderPreemptions(&w, f.Preemptions, now); err != nil {
		return err
	}
	if wide {
		_, err := out.Write(w.Bytes())
		return err
	}
	return writeFitted(out, w.String())
}

// renderSource says what tells gpud a GPU is in use, and where NVML came
// from or why there is none (files of gpuds before it are silent).
func renderSource(w io.Writer, f *v1.StateFile) {
	if f.ActivitySource == "" {
		return
	}
	line := "activity from " + f.ActivitySource
	switch {
	case f.NVML != nil && f.NVML.Error != "":
		line += " (no NVML: " + printable(f.NVML.Error) + ")"
	case f.NVML != nil:
		line += fmt.Sprintf(" (NVML %s, driver %s)", printable(f.NVML.Library), orDash(printable(f.NVML.DriverVersion)))
	}
	fmt.Fprintln(w, line)
	if d := f.DRA; d != nil {
		fmt.Fprintf(w, "sharing by memory (DRA %s): %d GPUs offered, %d claims prepared\n", printable(d.Driver), d.Offered, d.Claims)
	}
}

// renderHooks says how the kernel side observes GPU fds (files of gpuds
// before it are silent).
func renderHooks(w io.Writer, h *v1.StateHooks) {
	if h == nil {
		return
	}
	line := "kernel hooks " + printable(h.Mode)
	var missing []string
	for _, m := range h.Missing {
		missing = append(missing, printable(m))
	}
	switch {
	case h.Mode == "syscalls" && len(missing) > 0:
		line += " (missing " + strings.Join(missing, ", ") + "; sys_enter/sys_exit: every syscall on the node pays)"
	case h.Mode == "syscalls":
		line += " (sys_enter/sys_exit: every syscall on the node pays)"
	case h.Complete:
		line += " (nothing on the syscall path)"
	default:
		line += " (nothing on the syscall path; missing " + strings.Join(missing, ", ") + ": closes found by re-reading holders' fds)"
	}
	fmt.Fprintln(w, line)
	if h.PassedFDs != "" {
		fmt.Fprintln(w, "passed GPU fds (SCM_RIGHTS) seen by "+printable(h.PassedFDs))
	}
}

// renderGPUFacts lists what NVML says of each GPU (memory, health), why a
// GPU is not lent where lending is on, and the GPUs gpud leaves alone.
func renderGPUFacts(w io.Writer, f *v1.StateFile, now time.Time) {
	var lines []string
	for _, g := range f.GPUs {
		var parts []string
		if mf := migFact(g); mf != "" {
			parts = append(parts, mf)
		}
		if m := g.Memory; m != nil {
			parts = append(parts, fmt.Sprintf("memory %.1f of %.1f GiB used", gib(m.UsedBytes), gib(m.TotalBytes)))
		}
		if h := g.Health; h != nil && !h.Healthy {
			since := ""
			if h.Since != nil {
				since = " for " + ago(now, *h.Since)
			}
			parts = append(parts, fmt.Sprintf("UNHEALTHY%s: %s", since, printable(h.Reason)))
		}
		if n := g.NVML; n != nil && n.State != "" && n.State != "ok" {
			line := "NVML " + strings.ToUpper(printable(n.State)) + ": " + printable(n.Reason)
			if n.ActivitySource == "opens" {
				line += " (activity from opens)"
			}
			parts = append(parts, line)
		}
		if f.DRA != nil {
			for _, n := range f.DRA.NotOffered {
				if n.Index == g.Index {
					parts = append(parts, "not shared: "+printable(n.Reason))
				}
			}
		}
		if g.Lendable != nil && !*g.Lendable && g.State != occupancy.Lent && g.NotLendable != "" {
			parts = append(parts, "not lent: "+printable(g.NotLendable))
		}
		if len(parts) > 0 {
			lines = append(lines, fmt.Sprintf("  GPU %s  %s", gpuName(g), strings.Join(parts, "; ")))
		}
	}
	for _, g := range f.LeftAlone {
		lines = append(lines, fmt.Sprintf("  %s %s  LEFT ALONE: %s", printable(g.Device), orDash(printable(g.UUID)), printable(g.Reason)))
	}
	if len(lines) == 0 {
		return
	}
	fmt.Fprintln(w, "\nGPUs")
	for _, l := range lines {
		fmt.Fprintln(w, l)
	}
}

func gib(b uint64) float64 { return float64(b) / (1 << 30) }

// renderHealth warns of writes that failed (a full disk): how many, how
// many preemption records still wait to be written, and the last error.
func renderHealth(w io.Writer, h *v1.Health, now time.Time) {
	if h == nil || h.StateWriteFailures == 0 && h.JournalWriteFailures == 0 && h.JournalPending == 0 {
		return
	}
	fmt.Fprintf(w, "WRITE FAILURES  state file %d, journal %d, %d records waiting (retried)\n",
		h.StateWriteFailures, h.JournalWriteFailures, h.JournalPending)
	if h.LastError != "" {
		at := "-"
		if h.LastErrorAt != nil {
			at = ago(now, *h.LastErrorAt) + " ago"
		}
		fmt.Fprintf(w, "  last %s: %s\n", at, trunc(h.LastError, Width))
	}
}

// renderUnenforced names the GPUs whose opens the gate does not judge
// (files from gpuds that did not say are silent).
func renderUnenforced(w io.Writer, gpus []v1.StateGPU) {
	var off []string
	for _, g := range gpus {
		if g.Enforced != nil && !*g.Enforced {
			off = append(off, fmt.Sprint(g.Index))
		}
	}
	if len(off) > 0 {
		fmt.Fprintf(w, "\nNOT ENFORCED (the priority rules are not applied to their opens): GPU %s\n", strings.Join(off, ", "))
	}
}

// renderLoans lists the GPUs lent to a borrower, with their owners.
func renderLoans(w io.Writer, gpus []v1.StateGPU) error {
	var lent []v1.StateGPU
	for _, g := range gpus {
		if g.Borrower != "" || g.State == occupancy.Lent {
			lent = append(lent, g)
		}
	}
	if len(lent) == 0 {
		return nil
	}
	fmt.Fprintf(w, "\nLENT GPUS\n")
	tw := tabwriter.NewWriter(w, 0, 0, 1, ' ', 0)
	fmt.Fprintln(tw, "GPU\tOWNER\tBORROWER")
	for _, g := range lent {
		fmt.Fprintf(tw, "%d\t%s\t%s\n", g.Index, trunc(orDash(g.Owner), 36), trunc(orDash(g.Borrower), 36))
	}
	return tw.Flush()
}

// renderShares lists the GPUs shared by memory (DRA claims): each pod's
// share, what it uses, whether it is over; and the holders of a shared GPU
// outside every share (a whole-GPU owner another device plugin placed).
func renderShares(w io.Writer, gpus []v1.StateGPU, wide bool) error {
	var shared []v1.StateGPU
	for _, g := range gpus {
		if g.Shared || len(g.Shares) > 0 || len(g.ShareConflicts) > 0 {
			shared = append(shared, g)
		}
	}
	if len(shared) == 0 {
		return nil
	}
	cut := func(s string, n int) string {
		if wide {
			return printable(s)
		}
		return trunc(s, n)
	}
	fmt.Fprintf(w, "\nGPU MEMORY SHARES\n")
	tw := tabwriter.NewWriter(w, 0, 0, 1, ' ', 0)
	if wide {
		fmt.Fprintln(tw, "GPU\tPOD\tPOD UID\tCLAIM\tPRIORITY\tSHARE\tUSED\tSTATUS")
	} else {
		fmt.Fprintln(tw, "GPU\tPOD\tCLAIM\tPRIORITY\tSHARE\tUSED\tSTATUS")
	}
	for _, g := range shared {
		for _, s := range g.Shares {
			status := "ok"
			switch {
			case s.Preempted:
				status = "PREEMPTED"
			case s.Over:
				status = "OVER"
			}
			pod := s.PodNamespace + "/" + s.PodName
			claim := s.ClaimName
			if s.ClaimNamespace != s.PodNamespace {
				claim = s.ClaimNamespace + "/" + s.ClaimName
			}
			req, used := fmt.Sprintf("%.1fGi", gib(s.RequestedBytes)), fmt.Sprintf("%.1fGi", gib(s.UsedBytes))
			if wide {
				fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", g.Index, printable(pod), orDash(printable(s.PodUID)), printable(claim),
					orDash(string(s.Priority)), req, used, status)
				continue
			}
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\n", g.Index, cut(pod, 24), cut(claim, 14), cut(orDash(string(s.Priority)), 12), req, used, status)
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, g := range shared {
		for _, c := range g.ShareConflicts {
			who := fmt.Sprintf("pid %d", c.PID)
			if c.PodUID != "" {
				who += " of pod " + cut(c.PodUID, 13)
			} else if c.ContainerID != "" {
				who += " of container " + prefix(printable(c.ContainerID), 12)
			}
			fmt.Fprintf(w, "  CONFLICT GPU %d: %s holds it outside every share\n", g.Index, who)
		}
	}
	return nil
}

// writeFitted writes s with every line cut to Width columns: the safety
// net under the columns' budgets (a huge GPU index or PID, say).
func writeFitted(w io.Writer, s string) error {
	var b strings.Builder
	for _, l := range strings.SplitAfter(s, "\n") {
		body := strings.TrimSuffix(l, "\n")
		b.WriteString(strings.TrimRight(trunc(body, Width), " "))
		if len(body) < len(l) {
			b.WriteByte('\n')
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// preemption is the part of a preemption record the table shows.
type preemption struct {
	Time      time.Time   `json:"time"`
	GPU       int         `json:"gpu"`
	Action    string      `json:"action"`
	Victim    recordParty `json:"victim"`
	Preemptor recordParty `json:"preemptor"`
	LatencyMS float64     `json:"latency_ms"`
	Result    string      `json:"result"`
}

type recordParty struct {
	PID         int    `json:"pid"`
	ContainerID string `json:"container_id"`
	PodUID      string `json:"pod_uid"`
	TaskID      string `json:"task_id"`
}

// renderPreemptions shows the last few preemptions, newest first.
func renderPreemptions(w io.Writer, raw []v1.RawPreemption, now time.Time) error {
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
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\n", ago(now, p.Time), p.GPU, trunc(p.Action, 7),
			party(p.Victim, 14), party(p.Preemptor, 12), ms, trunc(p.Result, 9))
	}
	return tw.Flush()
}

// party names one side of a record: its task (cut to n columns), else its
// pod's or container's short id; then its PID.
func party(p recordParty, n int) string {
	var s string
	switch {
	case p.TaskID != "":
		s = trunc(p.TaskID, n)
	case p.PodUID != "":
		s = "pod/" + prefix(p.PodUID, 8)
	case p.ContainerID != "":
		s = "ctr/" + prefix(p.ContainerID, 8)
	}
	if p.PID > 0 {
		if s != "" {
			s += " "
		}
		s += fmt.Sprint(p.PID)
	}
	if s == "" {
		return "-"
	}
	return s
}

// workload names a holder's workload: its pod as namespace/name, its Docker
// container as ctr/name; when gpud does not know the name (a pod the API
// server has not shown yet, a state file of an older gpud), by a short id
// as docker ps does (-o wide has the whole id). Names are made printable.
func workload(h v1.StateHolder, wide bool) string {
	n := 12
	if wide {
		n = 64
	}
	switch {
	case h.Pod != "":
		return printable(orDash(h.Namespace) + "/" + h.Pod)
	case h.PodUID != "":
		return "pod/" + prefix(h.PodUID, n)
	case h.Container != "":
		return "ctr/" + printable(h.Container)
	case h.ContainerID != "":
		return "ctr/" + prefix(h.ContainerID, n)
	}
	return "host"
}

// prefix returns s made printable, cut to n characters: a short id.
func prefix(s string, n int) string {
	s = printable(s)
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	return string([]rune(s)[:n])
}

// trunc returns s made printable, in at most n characters: a longer name
// is cut and ends in an ellipsis.
func trunc(s string, n int) string {
	s = printable(s)
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	if n < 1 {
		return ""
	}
	return string([]rune(s)[:n-1]) + "…"
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

// renderSuspended lists the workloads frozen instead of killed: since
// when, why, and what thaws them.
func renderSuspended(w io.Writer, ss []v1.Suspension, now time.Time) {
	if len(ss) == 0 {
		return
	}
	fmt.Fprintf(w, "\nSUSPENDED (frozen, not killed):\n")
	for _, s := range ss {
		fmt.Fprintf(w, "  %s  pids %v  GPUs %v  frozen %s ago (%s)\n    why: %s\n    %s\n",
			trunc(printable(s.Workload), 40), s.PIDs, s.GPUs, ago(now, s.Since), s.Freezer, printable(s.Reason), printable(s.ThawWhen))
	}
}
