package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
)

// run is one run of the benchmarks: one file of `go test -bench` output
// (scripts/bench.sh writes one per run), its figures and its setting.
type run struct {
	file   string
	series string            // "unloaded", "loaded", "kmatrix-trixie", ...
	n      int               // run number within its series (1, 2, ...)
	meta   map[string]string // benchmeta: lines, and go test's cpu: header
	// figures: benchmark → unit → value. A benchmark that printed its
	// result line is here even with no metric of its own.
	figures map[string]map[string]float64
	// failures: what the output says failed (--- FAIL, FAIL, panic:).
	failures []string
}

// benchName starts a benchmark's line (the -GOMAXPROCS suffix apart);
// benchResult ends it: iterations, a tab, ns/op and the other value/unit
// pairs. The testing package prints the name before the benchmark runs and
// the result after, so what the benchmark's children write to the same
// output can come in between, on the same line or on lines of its own.
var (
	benchName   = regexp.MustCompile(`^(Benchmark\S+?)(-\d+)?(\s|$)`)
	benchResult = regexp.MustCompile(`(?:^|\s)(\d+)\t\s*([-+.\deE]+ ns/op.*)$`)
)

// parseRun reads one file: `go test -bench` text, test2json (-json) lines,
// or both, and scripts/bench.sh's "benchmeta: KEY VALUE" lines.
func parseRun(name string, r io.Reader) (*run, error) {
	text, err := plainText(r)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	ru := &run{file: name, meta: map[string]string{}, figures: map[string]map[string]float64{}}
	pending := ""
	// why: how many of a failed benchmark's indented log lines (its
	// t.Fatal message) are still to be kept beside its --- FAIL line, so
	// that a report read only from CI's tail says why it failed.
	why := 0
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimRight(line, " \t\r")
		if why > 0 && strings.HasPrefix(line, "    ") {
			ru.failures = append(ru.failures, "  "+strings.TrimSpace(line))
			why--
			continue
		}
		why = 0
		switch {
		case strings.HasPrefix(line, "--- FAIL"):
			ru.failures = append(ru.failures, strings.TrimSpace(line))
			why = 5
		case strings.HasPrefix(line, "benchmeta: "):
			k, v, _ := strings.Cut(strings.TrimPrefix(line, "benchmeta: "), " ")
			ru.meta[k] = strings.TrimSpace(v)
		case strings.HasPrefix(line, "cpu: ") && ru.meta["cpu"] == "":
			ru.meta["cpu"] = strings.TrimPrefix(line, "cpu: ")
		case line == "FAIL", strings.HasPrefix(line, "FAIL\t"),
			strings.HasPrefix(line, "panic: "):
			ru.failures = append(ru.failures, strings.TrimSpace(line))
		default:
			rest := line
			if m := benchName.FindStringSubmatch(line); m != nil {
				pending, rest = m[1], line[len(m[1])+len(m[2]):]
			}
			m := benchResult.FindStringSubmatch(rest)
			if m == nil || pending == "" {
				continue
			}
			figs, err := parseFigures(m[2])
			if err != nil {
				return nil, fmt.Errorf("%s: %s: %q: %w", name, pending, m[2], err)
			}
			ru.figures[pending] = figs
			pending = ""
		}
	}
	ru.series = ru.meta["series"]
	if ru.series == "" {
		ru.series = seriesFromName(name)
	}
	if n, err := strconv.Atoi(ru.meta["run"]); err == nil {
		ru.n = n
	}
	return ru, nil
}

// parseFigures reads "123 ns/op  4.5 µs-p99 ..." into unit → value.
func parseFigures(s string) (map[string]float64, error) {
	f := strings.Fields(s)
	if len(f)%2 != 0 {
		return nil, fmt.Errorf("%d fields: want value/unit pairs", len(f))
	}
	figs := map[string]float64{}
	for i := 0; i < len(f); i += 2 {
		v, err := strconv.ParseFloat(f[i], 64)
		if err != nil {
			return nil, fmt.Errorf("figure %q: %w", f[i], err)
		}
		figs[f[i+1]] = v
	}
	return figs, nil
}

// plainText is r's text with test2json's events (go test -json) turned
// back into the output they carry; other lines are kept as they are.
func plainText(r io.Reader) (string, error) {
	var b strings.Builder
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "{") {
			var ev struct{ Action, Output string }
			if json.Unmarshal([]byte(line), &ev) == nil {
				if ev.Action == "output" {
					b.WriteString(ev.Output)
				}
				continue
			}
		}
		b.WriteString(line)
		b.WriteByte('\n')
	}
	if err := sc.Err(); err != nil {
		return "", fmt.Errorf("reading: %w", err)
	}
	return b.String(), nil
}

// seriesFromName: "loaded-2.txt" → "loaded"; a file without benchmeta and
// without such a name is one run of an "unloaded" series.
func seriesFromName(name string) string {
	base := strings.TrimSuffix(filepath.Base(name), filepath.Ext(name))
	for _, s := range []string{"unloaded", "loaded"} {
		if base == s || strings.HasPrefix(base, s+"-") {
			return s
		}
	}
	return "unloaded"
}
