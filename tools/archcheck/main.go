// Command archcheck holds the code to what docs/architecture.md states:
//
//   - its package table ("## Packages") names exactly the packages of
//     `go list ./...` (plus the k8s-tagged test packages);
//   - every package imports only what "## Import rules" lets it: the gpud
//     packages its row names, and an import that table restricts ("only
//     in") only where it is allowed;
//   - a package with a line budget ("## Line budget") has at most that many
//     non-test lines.
//
// scripts/check-architecture.sh runs it (make lint):
//
//	go run ./tools/archcheck [-root DIR] [-budget enforce|report]
//
// -budget report prints the budgets' counts without failing on them (while
// code is being moved out of an over-budget package).
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
)

func main() {
	root := flag.String("root", ".", "the module's root directory")
	budget := flag.String("budget", "enforce", "line budgets: enforce (fail when over) or report (print only)")
	flag.Parse()
	if *budget != "enforce" && *budget != "report" {
		fmt.Fprintf(os.Stderr, "archcheck: -budget must be enforce or report, got %q\n", *budget)
		os.Exit(2)
	}
	if err := run(*root, *budget == "enforce", os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

// pkg is what archcheck needs of one package from `go list -json`.
type pkg struct {
	ImportPath string
	Dir        string
	Imports    []string
	Module     *struct{ Path string }
}

// run checks the module at root against its docs/architecture.md.
func run(root string, enforceBudgets bool, out io.Writer) error {
	doc, err := os.ReadFile(filepath.Join(root, "docs", "architecture.md"))
	if err != nil {
		return fmt.Errorf("reading the architecture: %w", err)
	}
	pkgs, err := goList(root)
	if err != nil {
		return err
	}
	r, err := parseDoc(string(doc))
	if err != nil {
		return fmt.Errorf("docs/architecture.md: %w", err)
	}
	return r.check(pkgs, countLines, enforceBudgets, out)
}

// goList lists the module's packages (the k8s-tagged tests included),
// their paths relative to the module. cgo is on so that a file importing
// "C" is seen whatever the caller's CGO_ENABLED.
func goList(root string) ([]pkg, error) {
	args := [][]string{{"list", "-json", "./..."}}
	if _, err := os.Stat(filepath.Join(root, "test")); err == nil {
		args = append(args, []string{"list", "-json", "-tags", "k8s", "./test/..."})
	}
	seen := map[string]bool{}
	var pkgs []pkg
	for _, a := range args {
		cmd := exec.Command(goTool(), a...)
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "CGO_ENABLED=1")
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		b, err := cmd.Output()
		if err != nil {
			return nil, fmt.Errorf("go %s: %w: %s", strings.Join(a, " "), err, stderr.Bytes())
		}
		dec := json.NewDecoder(bytes.NewReader(b))
		for {
			var p pkg
			if err := dec.Decode(&p); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				return nil, fmt.Errorf("go %s: %w", strings.Join(a, " "), err)
			}
			if p.Module == nil || seen[p.ImportPath] {
				continue
			}
			seen[p.ImportPath] = true
			mod := p.Module.Path + "/"
			p.ImportPath = strings.TrimPrefix(p.ImportPath, mod)
			for i, imp := range p.Imports {
				p.Imports[i] = strings.TrimPrefix(imp, mod)
			}
			pkgs = append(pkgs, p)
		}
	}
	return pkgs, nil
}

// goTool is the go command: $GO (as the Makefile passes it), else go.
func goTool() string {
	if g := os.Getenv("GO"); g != "" {
		return g
	}
	return "go"
}

// countLines counts the lines of the non-test Go files in dir, of every
// platform and build tag.
func countLines(dir string) (int, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		return 0, err
	}
	n := 0
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			return 0, err
		}
		n += bytes.Count(b, []byte("\n"))
		if len(b) > 0 && b[len(b)-1] != '\n' {
			n++
		}
	}
	return n, nil
}

// rules is what docs/architecture.md states.
type rules struct {
	packages []string            // the package table
	mayUse   map[string][]string // package (or pattern) → the gpud packages it may import
	onlyIn   map[string][]string // import (or pattern) → the only packages that may import it
	budgets  map[string]int      // package → most non-test lines
}

var (
	codeSpan = regexp.MustCompile("`([^`]+)`")
	heading  = regexp.MustCompile(`(?m)^## (.+)$`)
)

// parseDoc reads the package table, the import rules and the line
// budgets. A table is told by its header row.
func parseDoc(doc string) (*rules, error) {
	r := &rules{mayUse: map[string][]string{}, onlyIn: map[string][]string{}, budgets: map[string]int{}}
	for name, body := range sections(doc) {
		for _, t := range tables(body) {
			header := strings.ToLower(strings.Join(t[0], " | "))
			kind := ""
			for _, k := range []string{"package | its one job", "package | may import", "import | only in", "package | non-test lines"} {
				if strings.HasPrefix(header, k) {
					kind = k
				}
			}
			if kind == "" || (kind == "package | its one job" && name != "Packages") {
				continue // a table for the reader only
			}
			for _, row := range t[1:] {
				if len(row) < 2 {
					return nil, fmt.Errorf("%s: a row of two cells expected: %q", name, row)
				}
				keys, vals := spans(row[0]), spans(row[1])
				if len(keys) == 0 {
					return nil, fmt.Errorf("%s: row %q names no package", name, row)
				}
				switch kind {
				case "package | its one job":
					r.packages = append(r.packages, keys[0])
				case "package | may import":
					for _, k := range keys {
						if _, dup := r.mayUse[k]; dup {
							return nil, fmt.Errorf("%s: %s has two rows", name, k)
						}
						r.mayUse[k] = vals
					}
				case "import | only in":
					for _, k := range keys {
						r.onlyIn[k] = vals
					}
				case "package | non-test lines":
					n, err := strconv.Atoi(strings.TrimSpace(row[1]))
					if err != nil {
						return nil, fmt.Errorf("%s: the budget of %s: %w", name, keys[0], err)
					}
					r.budgets[keys[0]] = n
				}
			}
		}
	}
	if len(r.packages) == 0 {
		return nil, errors.New(`no package table ("## Packages", header "| package | its one job |")`)
	}
	if len(r.mayUse) == 0 {
		return nil, errors.New(`no import rules ("## Import rules", header "| package | may import (gpud packages) |")`)
	}
	return r, nil
}

// sections splits doc at its "## " headings.
func sections(doc string) map[string]string {
	out := map[string]string{}
	idx := heading.FindAllStringSubmatchIndex(doc, -1)
	for i, m := range idx {
		end := len(doc)
		if i+1 < len(idx) {
			end = idx[i+1][0]
		}
		out[strings.TrimSpace(doc[m[2]:m[3]])] = doc[m[1]:end]
	}
	return out
}

// tables are the markdown tables of body: the header row, then the rows
// (the |---| line left out), each as its cells.
func tables(body string) [][][]string {
	var out [][][]string
	var cur [][]string
	for _, line := range strings.Split(body, "\n") {
		line = strings.TrimSpace(line)
		if !strings.HasPrefix(line, "|") {
			if cur != nil {
				out, cur = append(out, cur), nil
			}
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), " | ")
		for i := range cells {
			cells[i] = strings.TrimSpace(cells[i])
		}
		if strings.HasPrefix(cells[0], "---") {
			continue
		}
		cur = append(cur, cells)
	}
	if cur != nil {
		out = append(out, cur)
	}
	return out
}

// spans are the code spans of a cell: `a`, `b/...`.
func spans(cell string) []string {
	var out []string
	for _, m := range codeSpan.FindAllStringSubmatch(cell, -1) {
		out = append(out, m[1])
	}
	return out
}

// matches reports whether path is pattern: the same path, or for
// "x/..." x or a path below it (as go list's patterns).
func matches(pattern, path string) bool {
	if p, ok := strings.CutSuffix(pattern, "/..."); ok {
		return path == p || strings.HasPrefix(path, p+"/")
	}
	return pattern == path
}

// ruleOf is the row of mayUse that governs path: its own, else the longest
// pattern that matches it.
func (r *rules) ruleOf(path string) (string, bool) {
	if _, ok := r.mayUse[path]; ok {
		return path, true
	}
	best := ""
	for k := range r.mayUse {
		if matches(k, path) && len(k) > len(best) {
			best = k
		}
	}
	return best, best != ""
}

// isGpud reports whether imp is one of the module's packages (paths are
// relative to the module, so they have no dot in their first element).
func isGpud(imp string, own map[string]bool) bool { return own[imp] }

// check compares pkgs with the rules and writes a summary to out.
func (r *rules) check(pkgs []pkg, lines func(dir string) (int, error), enforceBudgets bool, out io.Writer) error {
	var problems []string
	bad := func(format string, a ...any) { problems = append(problems, fmt.Sprintf(format, a...)) }

	own := map[string]bool{}
	var have []string
	for _, p := range pkgs {
		own[p.ImportPath] = true
		have = append(have, p.ImportPath)
	}
	sort.Strings(have)
	doc := slices.Clone(r.packages)
	sort.Strings(doc)
	doc = slices.Compact(doc)
	for _, p := range doc {
		if !own[p] {
			bad("package table: %s is in docs/architecture.md but not in go list (moved or removed?)", p)
		}
	}
	for _, p := range have {
		if !slices.Contains(doc, p) {
			bad("package table: %s has no row (its one job) in docs/architecture.md", p)
		}
	}

	// Every rule names something that exists: a stale rule checks nothing.
	for _, k := range sortedKeys(r.mayUse) {
		if !slices.ContainsFunc(have, func(p string) bool { return matches(k, p) }) {
			bad("import rules: the row %s matches no package", k)
		}
		for _, v := range r.mayUse[k] {
			if !slices.ContainsFunc(have, func(p string) bool { return matches(v, p) }) {
				bad("import rules: %s may import %s, which matches no package", k, v)
			}
		}
	}

	for _, p := range pkgs {
		rule, ok := r.ruleOf(p.ImportPath)
		if !ok {
			bad("import rules: %s has no row (what it may import) in docs/architecture.md", p.ImportPath)
		}
		for _, imp := range p.Imports {
			if ok && isGpud(imp, own) && !slices.ContainsFunc(r.mayUse[rule], func(a string) bool { return matches(a, imp) }) {
				bad("import rules: %s imports %s, which its row (%s) does not allow", p.ImportPath, imp, rule)
			}
			for _, only := range sortedKeys(r.onlyIn) {
				if matches(only, imp) && !slices.ContainsFunc(r.onlyIn[only], func(a string) bool { return matches(a, p.ImportPath) }) {
					bad("import rules: %s imports %s, which only %s may", p.ImportPath, imp, orNothing(r.onlyIn[only]))
				}
			}
		}
	}

	var counts []string
	for _, name := range sortedKeys(r.budgets) {
		i := slices.IndexFunc(pkgs, func(p pkg) bool { return p.ImportPath == name })
		if i < 0 {
			bad("line budget: %s is not a package", name)
			continue
		}
		n, err := lines(pkgs[i].Dir)
		if err != nil {
			bad("line budget: counting %s: %v", name, err)
			continue
		}
		max := r.budgets[name]
		switch {
		case n <= max:
			counts = append(counts, fmt.Sprintf("%s %d of %d non-test lines", name, n, max))
		case enforceBudgets:
			bad("line budget: %s has %d non-test lines, %d over its budget of %d", name, n, n-max, max)
		default:
			counts = append(counts, fmt.Sprintf("%s %d non-test lines, %d OVER its budget of %d (reported, not enforced: -budget report)", name, n, n-max, max))
		}
	}

	if len(problems) > 0 {
		return fmt.Errorf("docs/architecture.md and the code disagree:\n  %s", strings.Join(problems, "\n  "))
	}
	fmt.Fprintf(out, "architecture: %d packages, each with its job and its imports in docs/architecture.md", len(have))
	if len(counts) > 0 {
		fmt.Fprintf(out, "; %s", strings.Join(counts, "; "))
	}
	fmt.Fprintln(out)
	return nil
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func orNothing(pkgs []string) string {
	if len(pkgs) == 0 {
		return "no package (tests only)"
	}
	return strings.Join(pkgs, ", ")
}
