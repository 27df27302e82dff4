package main

import (
	"fmt"
	"io"
	"math"
	"sort"
	"strconv"
	"strings"
)

// goal is one line of the goals table (goals.go).
type goal struct {
	id, bench, unit string
	bound           bound
	what            string
}

// bound is what a figure is held to. op "" reports the figure only.
type bound struct {
	op    string  // "≤", "≥" or ""
	limit float64 // the bound, or the factor of base
	base  string  // a unit of the same benchmark in the same run, or ""
}

func atMost(x float64) bound                   { return bound{op: "≤", limit: x} }
func atLeast(x float64) bound                  { return bound{op: "≥", limit: x} }
func atMostTimes(f float64, base string) bound { return bound{op: "≤", limit: f, base: base} }
func reported() bound                          { return bound{} }
func (b bound) String() string {
	switch {
	case b.op == "":
		return "reported"
	case b.base != "":
		return fmt.Sprintf("%s %s × %s", b.op, exact(b.limit), b.base)
	}
	return fmt.Sprintf("%s %s", b.op, exact(b.limit))
}

// exact writes a bound as the goals table has it (1.1, 0.2, 100 000).
func exact(v float64) string {
	if v == math.Trunc(v) && math.Abs(v) >= 1000 {
		return num(v)
	}
	return strconv.FormatFloat(v, 'f', -1, 64)
}

// verdict is a goal judged on one run.
type verdict int

const (
	notRun   verdict = iota // the goal's benchmark is not in this run
	noFigure                // it ran, without the goal's unit (or baseline)
	shown                   // a reported figure
	met
	missed
)

func (v verdict) String() string {
	return [...]string{"not run", "NO FIGURE", "", "MET", "MISSED"}[v]
}

// judgement is a goal on one run: the figure, its baseline's figure, and
// the figure that is held to the bound (the ratio where there is a base).
type judgement struct {
	v                  verdict
	value, base, judge float64
}

func judge(g goal, r *run) judgement {
	figs, ok := r.figures[g.bench]
	if !ok {
		return judgement{v: notRun}
	}
	v, ok := figs[g.unit]
	if !ok {
		return judgement{v: noFigure}
	}
	j := judgement{v: shown, value: v, judge: v}
	if g.bound.base != "" {
		b, ok := figs[g.bound.base]
		if !ok || b == 0 {
			return judgement{v: noFigure, value: v}
		}
		j.base, j.judge = b, v/b
	}
	switch {
	case g.bound.op == "":
	case g.bound.op == "≤" && j.judge <= g.bound.limit, g.bound.op == "≥" && j.judge >= g.bound.limit:
		j.v = met
	default:
		j.v = missed
	}
	return j
}

// series are runs grouped by series name, in the order series are shown:
// unloaded, loaded, then the others (kernel-matrix guests) by name.
type series struct {
	name string
	runs []*run
}

func group(runs []*run) []series {
	by := map[string][]*run{}
	for _, r := range runs {
		by[r.series] = append(by[r.series], r)
	}
	var out []series
	for name, rs := range by {
		sort.SliceStable(rs, func(i, j int) bool { return rs[i].n < rs[j].n })
		out = append(out, series{name, rs})
	}
	rank := func(s string) int {
		switch s {
		case "unloaded":
			return 0
		case "loaded":
			return 1
		}
		return 2
	}
	sort.Slice(out, func(i, j int) bool {
		if a, b := rank(out[i].name), rank(out[j].name); a != b {
			return a < b
		}
		return out[i].name < out[j].name
	})
	return out
}

// guest says whether a series ran in an emulated kernel-matrix guest:
// there only ratios mean anything.
func (s series) guest() bool { return strings.HasPrefix(s.name, "kmatrix") }

// runLabel: "unloaded 2".
func runLabel(r *run, i int) string {
	n := r.n
	if n == 0 {
		n = i + 1
	}
	return fmt.Sprintf("%s %d", r.series, n)
}

// printReport writes every run's setting and every goal's figure beside its
// bound with its verdict, then a count per goal and series.
func printReport(w io.Writer, all []series) {
	fmt.Fprintln(w, "gpud benchmarks (tools/benchreport; goals in tools/benchreport/goals.go)")
	for _, s := range all {
		for i, r := range s.runs {
			fmt.Fprintf(w, "%-12s %s\n", runLabel(r, i)+":", setting(r))
		}
	}
	for _, g := range goals {
		fmt.Fprintf(w, "\n%s %s %s [%s] — %s\n", g.id, g.bench, g.unit, g.bound, g.what)
		judged := false
		for _, s := range all {
			for i, r := range s.runs {
				j := judge(g, r)
				if j.v == notRun {
					continue
				}
				fig := "—"
				if j.v != noFigure {
					fig = num(j.value)
					if g.bound.base != "" {
						fig += fmt.Sprintf(" (%s %s, × %s)", num(j.base), g.bound.base, num(j.judge))
					}
				}
				fmt.Fprintf(w, "  %-12s %-40s %s\n", runLabel(r, i), fig, j.v)
				judged = true
			}
		}
		if !judged {
			fmt.Fprintln(w, "  not run")
		}
	}
	fmt.Fprintln(w, "\nsummary (met / runs):")
	for _, g := range goals {
		if g.bound.op == "" {
			continue
		}
		var parts []string
		for _, s := range all {
			if m, n := count(g, s); n > 0 {
				parts = append(parts, fmt.Sprintf("%s %d/%d", s.name, m, n))
			}
		}
		if len(parts) == 0 {
			parts = []string{"not run"}
		}
		fmt.Fprintf(w, "  %-4s %-36s %-28s %-22s %s\n", g.id, g.bench, g.unit, g.bound, strings.Join(parts, ", "))
	}
	var failed []string
	for _, s := range all {
		for i, r := range s.runs {
			for _, f := range r.failures {
				failed = append(failed, runLabel(r, i)+": "+f)
			}
		}
	}
	if len(failed) > 0 {
		fmt.Fprintln(w, "\nfailures in the benchmarks' output:")
		for _, f := range failed {
			fmt.Fprintln(w, "  "+f)
		}
	}
}

// count: runs of s where g was met, and runs where it was judged.
func count(g goal, s series) (metN, n int) {
	for _, r := range s.runs {
		switch judge(g, r).v {
		case met:
			metN++
			n++
		case missed, noFigure:
			n++
		}
	}
	return metN, n
}

// setting: a run's machine, kernel, load and date, as scripts/bench.sh
// recorded them (benchmeta:), and what ran beside it.
func setting(r *run) string {
	m := r.meta
	var parts []string
	add := func(format, key string) {
		if v := m[key]; v != "" {
			parts = append(parts, fmt.Sprintf(format, v))
		}
	}
	add("%s", "date")
	add("%s", "cpu")
	add("%s cores", "cores")
	add("kernel %s", "kernel")
	if m["load-before"] != "" || m["load-after"] != "" {
		parts = append(parts, fmt.Sprintf("load %s → %s", orDash(m["load-before"]), orDash(m["load-after"])))
	}
	add("%s CPU hogs", "hogs")
	if b := m["benchmarks"]; b != "" && b != "." {
		parts = append(parts, "benchmarks "+b)
	}
	add("%s s", "seconds")
	add("commit %s", "commit")
	add("not run here: %s", "skipped")
	if len(parts) == 0 {
		return r.file
	}
	return strings.Join(parts, ", ")
}

func orDash(s string) string {
	if s == "" {
		return "—"
	}
	return s
}

// num formats a figure to about three significant digits (a whole number
// as it is), with a space between thousands as docs/benchmarks.md writes
// them.
func num(v float64) string {
	a := math.Abs(v)
	switch {
	case v == 0:
		return "0"
	case a >= 1000 || v == math.Trunc(v):
		s := fmt.Sprintf("%.0f", a)
		var b strings.Builder
		for i, c := range s {
			if i > 0 && (len(s)-i)%3 == 0 {
				b.WriteRune(' ')
			}
			b.WriteRune(c)
		}
		if v < 0 {
			return "-" + b.String()
		}
		return b.String()
	case a >= 100:
		return fmt.Sprintf("%.0f", v)
	case a >= 10:
		return fmt.Sprintf("%.1f", v)
	case a >= 0.1:
		return fmt.Sprintf("%.2f", v)
	}
	return fmt.Sprintf("%.2g", v)
}

// spread: "min–max" of the values, or the value when they are one.
func spread(vs []float64) string {
	if len(vs) == 0 {
		return "—"
	}
	lo, hi := vs[0], vs[0]
	for _, v := range vs {
		lo, hi = math.Min(lo, v), math.Max(hi, v)
	}
	if num(lo) == num(hi) {
		return num(lo)
	}
	return num(lo) + "–" + num(hi)
}
