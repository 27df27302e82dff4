// Command benchreport judges a `make bench` run: it reads the output of
// `go test -bench` (text or -json; one file per run, as scripts/bench.sh
// writes them, with its "benchmeta:" lines giving each run's series,
// machine, kernel, load and date), prints every figure of the goals table
// (goals.go) beside its goal with MET or MISSED, and with -doc writes the
// generated tables of docs/benchmarks.md (between its benchreport markers)
// from that run.
//
//	go run ./tools/benchreport [-doc docs/benchmarks.md] [-strict] FILE...
//
// Exit status: 2 for bad input (no benchmark figures at all, a file that
// cannot be read, no markers in -doc's page); with -strict, 1 when the
// benchmarks' output says something failed or a goal's benchmark ran
// without reporting the goal's unit (the benchmark and the table disagree).
// A MISSED goal is a finding, not an error: the exit status stays 0.
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
)

func main() {
	doc := flag.String("doc", "", "write the generated tables into this page, between its markers")
	strict := flag.Bool("strict", false, "fail on failures in the output and on goals without their figure")
	flag.Parse()
	os.Exit(run1(os.Stdout, os.Stderr, *doc, *strict, flag.Args()))
}

// run1 is main without the process: the exit status.
func run1(stdout, stderr io.Writer, doc string, strict bool, files []string) int {
	if len(files) == 0 {
		fmt.Fprintln(stderr, "benchreport: no files (the output of go test -bench, one per run)")
		return 2
	}
	var runs []*run
	figures := 0
	for _, name := range files {
		f, err := os.Open(name)
		if err != nil {
			fmt.Fprintf(stderr, "benchreport: %v\n", err)
			return 2
		}
		r, err := parseRun(name, f)
		f.Close()
		if err != nil {
			fmt.Fprintf(stderr, "benchreport: %v\n", err)
			return 2
		}
		runs = append(runs, r)
		figures += len(r.figures)
	}
	if figures == 0 {
		fmt.Fprintln(stderr, "benchreport: no benchmark results in", files)
		return 2
	}
	all := group(runs)
	printReport(stdout, all)
	if doc != "" {
		page, err := os.ReadFile(doc)
		if err == nil {
			page, err = replaceGenerated(page, markdown(all))
		}
		if err == nil {
			err = os.WriteFile(doc, page, 0o644)
		}
		if err != nil {
			fmt.Fprintf(stderr, "benchreport: %s: %v\n", doc, err)
			return 2
		}
		fmt.Fprintf(stdout, "\nwrote %s\n", doc)
	}
	if strict {
		if problems := check(all); len(problems) > 0 {
			for _, p := range problems {
				fmt.Fprintln(stderr, "benchreport:", p)
			}
			return 1
		}
	}
	return 0
}

// check lists what -strict fails on.
func check(all []series) []string {
	var out []string
	for _, s := range all {
		for i, r := range s.runs {
			for _, f := range r.failures {
				out = append(out, fmt.Sprintf("%s (%s): the output says %q", runLabel(r, i), r.file, f))
			}
			for _, g := range goals {
				if judge(g, r).v == noFigure {
					want := g.unit
					if g.bound.base != "" {
						want += " and " + g.bound.base
					}
					out = append(out, fmt.Sprintf("%s (%s): %s ran without reporting %s (goal %s in tools/benchreport/goals.go)",
						runLabel(r, i), r.file, g.bench, want, g.id))
				}
			}
		}
	}
	return out
}
