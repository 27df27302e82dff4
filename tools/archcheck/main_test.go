package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// archDoc is a docs/architecture.md in the shape of gpud's: a package
// table, import rules and a line budget of 10 lines for internal/daemon.
const archDoc = "# Architecture\n\n## Packages\n\n" +
	"| package | its one job |\n|---|---|\n" +
	"| `api/v1` | Wire formats. |\n" +
	"| `internal/sharing` | The share rule. |\n" +
	"| `internal/occupancy` | The ledger. |\n" +
	"| `internal/status` | Rendering. |\n" +
	"| `internal/daemon` | Wiring. |\n" +
	"| `cmd/gpud` | The command. |\n\n" +
	"## Import rules\n\n" +
	"| package | may import (gpud packages) |\n|---|---|\n" +
	"| `api/v1` | — |\n" +
	"| `internal/sharing` | `api/v1` |\n" +
	"| `internal/occupancy` | `api/v1` |\n" +
	"| `internal/status` | `api/v1`, `internal/...` |\n" +
	"| `internal/daemon` | `api/v1`, `internal/...` |\n" +
	"| `cmd/...` | `internal/daemon` |\n\n" +
	"| import | only in |\n|---|---|\n" +
	"| `C` (cgo) | `internal/occupancy` |\n" +
	"| `internal/daemon` | `cmd/gpud` |\n\n" +
	"## Line budget\n\n" +
	"| package | non-test lines at most |\n|---|---|\n" +
	"| `internal/daemon` | 10 |\n\n" +
	"## Where each rule is decided\n\n" +
	"| rule | decided in | how |\n|---|---|---|\n" +
	"| shares | `sharing.Judge` | pure |\n"

// tree writes a module that conforms to archDoc, then the changes (path
// → content; "" removes the file), and returns its root.
func tree(t *testing.T, changes map[string]string) string {
	t.Helper()
	root := t.TempDir()
	files := map[string]string{
		"go.mod":                      "module example.com/gpud\n\ngo 1.22\n",
		"docs/architecture.md":        archDoc,
		"api/v1/v1.go":                "package v1\n\ntype State struct{}\n",
		"internal/sharing/sharing.go": "package sharing\n\nimport v1 \"example.com/gpud/api/v1\"\n\nfunc Judge(v1.State) {}\n",
		"internal/occupancy/ledger.go": "package occupancy\n\nimport v1 \"example.com/gpud/api/v1\"\n\n" +
			"// #include <stdlib.h>\nimport \"C\"\n\nfunc Render() v1.State { return v1.State{} }\n",
		"internal/status/status.go": "package status\n\nimport v1 \"example.com/gpud/api/v1\"\n\nvar _ v1.State\n",
		// 10 lines: the budget, exactly.
		"internal/daemon/daemon.go": "package daemon\n\nimport (\n\t\"example.com/gpud/internal/occupancy\"\n" +
			"\t\"example.com/gpud/internal/sharing\"\n)\n\nfunc Run() { sharing.Judge(occupancy.Render()) }\n\n// end\n",
		// Tests count for nothing.
		"internal/daemon/daemon_test.go": strings.Repeat("// a test line\n", 50) + "package daemon\n",
		"cmd/gpud/main.go":               "package main\n\nimport \"example.com/gpud/internal/daemon\"\n\nfunc main() { daemon.Run() }\n",
	}
	for p, c := range changes {
		files[p] = c
	}
	for p, c := range files {
		if c == "" {
			continue
		}
		if err := os.MkdirAll(filepath.Join(root, filepath.Dir(p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, p), []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func requireGo(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath(goTool()); err != nil {
		t.Fatalf("the go command is needed to list packages: %v", err)
	}
}

// TestConformingTreePasses: a tree that is what its architecture.md
// says passes, and the summary shows the daemon's count against its budget.
func TestConformingTreePasses(t *testing.T) {
	requireGo(t)
	var out bytes.Buffer
	if err := run(tree(t, nil), true, &out); err != nil {
		t.Fatalf("a conforming tree fails: %v", err)
	}
	if want := "internal/daemon 10 of 10 non-test lines"; !strings.Contains(out.String(), want) {
		t.Errorf("summary %q does not say %q", out.String(), want)
	}
}

// TestDaemonOverBudgetFails: one line over the budget fails (make lint),
// and -budget report only reports it, with the count.
func TestDaemonOverBudgetFails(t *testing.T) {
	requireGo(t)
	root := tree(t, map[string]string{"internal/daemon/extra.go": "package daemon\n"})
	err := run(root, true, &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), "internal/daemon has 11 non-test lines, 1 over its budget of 10") {
		t.Fatalf("a daemon of 11 lines against a budget of 10: got %v", err)
	}
	var out bytes.Buffer
	if err := run(root, false, &out); err != nil {
		t.Fatalf("-budget report fails: %v", err)
	}
	if want := "internal/daemon 11 non-test lines, 1 OVER its budget of 10"; !strings.Contains(out.String(), want) {
		t.Errorf("-budget report says %q, not %q", out.String(), want)
	}
}

// TestForbiddenImportFails: each kind of import against the rules fails.
func TestForbiddenImportFails(t *testing.T) {
	requireGo(t)
	for _, tc := range []struct {
		name, path, content, want string
	}{
		{
			name:    "a gpud package its row does not name",
			path:    "internal/sharing/sharing.go",
			content: "package sharing\n\nimport \"example.com/gpud/internal/occupancy\"\n\nfunc Judge() { occupancy.Render() }\n",
			want:    "internal/sharing imports internal/occupancy, which its row (internal/sharing) does not allow",
		},
		{
			name:    "the daemon from anywhere but the command, whatever the row",
			path:    "internal/status/status.go",
			content: "package status\n\nimport \"example.com/gpud/internal/daemon\"\n\nfunc Show() { daemon.Run() }\n",
			want:    "internal/status imports internal/daemon, which only cmd/gpud may",
		},
		{
			name:    "cgo outside the one package allowed",
			path:    "internal/sharing/cgo.go",
			content: "package sharing\n\n// #include <stdlib.h>\nimport \"C\"\n",
			want:    "internal/sharing imports C, which only internal/occupancy may",
		},
		{
			name:    "a package with no rule",
			path:    "internal/newpart/part.go",
			content: "package newpart\n",
			want:    "internal/newpart has no row (what it may import)",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := run(tree(t, map[string]string{tc.path: tc.content}), true, &bytes.Buffer{})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("want an error saying %q, got %v", tc.want, err)
			}
		})
	}
}

// TestOnlyInAndPatterns checks the rules on listed packages, without a
// module: an external import restricted to a few packages, and a package
// governed by the longest x/... row.
func TestOnlyInAndPatterns(t *testing.T) {
	doc := "## Packages\n\n| package | its one job |\n|---|---|\n| `a` | . |\n| `a/b` | . |\n| `c` | . |\n\n" +
		"## Import rules\n\n| package | may import (gpud packages) |\n|---|---|\n" +
		"| `a/...` | `c` |\n| `c` | — |\n\n" +
		"| import | only in |\n|---|---|\n| `k8s.io/client-go/...` | `a` |\n"
	r, err := parseDoc(doc)
	if err != nil {
		t.Fatal(err)
	}
	none := func(string) (int, error) { return 0, nil }
	ok := []pkg{{ImportPath: "a", Imports: []string{"c", "k8s.io/client-go/kubernetes", "fmt"}}, {ImportPath: "a/b", Imports: []string{"c"}}, {ImportPath: "c"}}
	if err := r.check(ok, none, true, &bytes.Buffer{}); err != nil {
		t.Fatalf("conforming packages fail: %v", err)
	}
	bad := []pkg{{ImportPath: "a"}, {ImportPath: "a/b", Imports: []string{"k8s.io/client-go/rest", "a"}}, {ImportPath: "c", Imports: []string{"a/b"}}}
	err = r.check(bad, none, true, &bytes.Buffer{})
	for _, want := range []string{
		"a/b imports k8s.io/client-go/rest, which only a may",
		"a/b imports a, which its row (a/...) does not allow",
		"c imports a/b, which its row (c) does not allow",
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("want %q in %v", want, err)
		}
	}
}

// TestPackageTableDrift: a package without its row, and a row without its
// package, both fail (what scripts/check-architecture.sh checked before).
func TestPackageTableDrift(t *testing.T) {
	requireGo(t)
	doc := strings.Replace(archDoc, "| `internal/sharing` | The share rule. |\n", "| `internal/gone` | Moved. |\n", 1)
	err := run(tree(t, map[string]string{"docs/architecture.md": doc}), true, &bytes.Buffer{})
	for _, want := range []string{
		"internal/gone is in docs/architecture.md but not in go list",
		"internal/sharing has no row (its one job)",
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("want %q in %v", want, err)
		}
	}
}
