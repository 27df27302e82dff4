//go:build ignore

// check-links: every relative link in the repository's Markdown files
// (README.md, CHANGELOG.md, docs/, deploy/) must name a file that exists and,
// with a #fragment into a Markdown file, a heading of that file, as GitHub
// makes its anchors. Run by `make lint`:
//
//	go run scripts/check-links.go [ROOT]
//
// It exits 1 and names each broken link (file:line: link: why).
package main

import (
	"bufio"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"unicode"
)

// linkRE matches an inline link's target: ](target) or ](target "title").
var linkRE = regexp.MustCompile(`\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)

func main() {
	root := "."
	if len(os.Args) > 1 {
		root = os.Args[1]
	}
	files, err := markdownFiles(root)
	if err != nil {
		fmt.Fprintln(os.Stderr, "check-links:", err)
		os.Exit(2)
	}
	anchors := map[string]map[string]bool{}
	bad := 0
	links := 0
	for _, f := range files {
		lines, err := readLines(f)
		if err != nil {
			fmt.Fprintln(os.Stderr, "check-links:", err)
			os.Exit(2)
		}
		for i, text := range proseLines(lines) {
			for _, m := range linkRE.FindAllStringSubmatch(text, -1) {
				target := m[1]
				if isExternal(target) {
					continue
				}
				links++
				if why := check(f, target, anchors); why != "" {
					rel, _ := filepath.Rel(root, f)
					fmt.Fprintf(os.Stderr, "%s:%d: %s: %s\n", rel, i+1, target, why)
					bad++
				}
			}
		}
	}
	if bad > 0 {
		fmt.Fprintf(os.Stderr, "check-links: %d broken of %d relative links\n", bad, links)
		os.Exit(1)
	}
	fmt.Printf("links: %d relative links in %d Markdown files resolve\n", links, len(files))
}

func isExternal(t string) bool {
	for _, p := range []string{"http://", "https://", "mailto:", "oci://"} {
		if strings.HasPrefix(t, p) {
			return true
		}
	}
	return false
}

// check says why target, linked from file, does not resolve ("" when it does).
func check(file, target string, anchors map[string]map[string]bool) string {
	path, frag, _ := strings.Cut(target, "#")
	dest := file
	if path != "" {
		dest = filepath.Join(filepath.Dir(file), path)
		if _, err := os.Stat(dest); err != nil {
			return "no such file"
		}
	}
	if frag == "" || !strings.HasSuffix(dest, ".md") {
		return ""
	}
	a, ok := anchors[dest]
	if !ok {
		lines, err := readLines(dest)
		if err != nil {
			return err.Error()
		}
		a = headingAnchors(lines)
		anchors[dest] = a
	}
	if !a[frag] {
		return "no heading with that anchor in " + filepath.Base(dest)
	}
	return ""
}

func markdownFiles(root string) ([]string, error) {
	var out []string
	for _, top := range []string{"README.md", "CHANGELOG.md"} {
		if _, err := os.Stat(filepath.Join(root, top)); err == nil {
			out = append(out, filepath.Join(root, top))
		}
	}
	for _, dir := range []string{"docs", "deploy"} {
		err := filepath.WalkDir(filepath.Join(root, dir), func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if !d.IsDir() && strings.HasSuffix(p, ".md") {
				out = append(out, p)
			}
			return nil
		})
		if err != nil && !os.IsNotExist(err) {
			return nil, fmt.Errorf("walk %s: %w", dir, err)
		}
	}
	return out, nil
}

func readLines(p string) ([]string, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", p, err)
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read %s: %w", p, err)
	}
	return lines, nil
}

// proseLines blanks the lines inside fenced code blocks, whose brackets are
// not links and whose "#" lines are not headings; line numbers stay.
func proseLines(lines []string) []string {
	out := make([]string, len(lines))
	fenced := false
	for i, l := range lines {
		if strings.HasPrefix(strings.TrimSpace(l), "```") {
			fenced = !fenced
			continue
		}
		if !fenced {
			out[i] = l
		}
	}
	return out
}

// headingAnchors gives the anchors GitHub makes for a file's ATX headings:
// lower case, punctuation other than '-' and '_' dropped, spaces turned into
// '-', and a repeated anchor suffixed -1, -2, ...
func headingAnchors(lines []string) map[string]bool {
	seen := map[string]int{}
	out := map[string]bool{}
	for _, l := range proseLines(lines) {
		t := strings.TrimLeft(l, "#")
		if t == l || (t != "" && t[0] != ' ') || len(l)-len(t) > 6 {
			continue
		}
		s := slug(strings.TrimSpace(t))
		if n := seen[s]; n > 0 {
			out[fmt.Sprintf("%s-%d", s, n)] = true
		} else {
			out[s] = true
		}
		seen[s]++
	}
	return out
}

func slug(h string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(h) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}
