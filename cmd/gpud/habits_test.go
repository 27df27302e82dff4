package main

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// TestOutputVocabulary: every command that prints takes -o/--output from
// one of the two vocabularies, its first value the default, completed, and
// a bad value is refused before the command runs, with the same error
// naming the allowed values. The commands without -o are named here.
func TestOutputVocabulary(t *testing.T) {
	noOutput := []string{"run", "monitor", "uninstall", "completion", "help", "thaw-guard"}
	root := newRoot(&bytes.Buffer{}, &bytes.Buffer{})
	root.InitDefaultCompletionCmd()
	root.InitDefaultHelpCmd()
	for _, c := range root.Commands() {
		f := c.Flags().Lookup("output")
		if f == nil {
			if !slices.Contains(noOutput, c.Name()) {
				t.Errorf("gpud %s prints but has no -o/--output", c.Name())
			}
			continue
		}
		if slices.Contains(noOutput, c.Name()) {
			t.Errorf("gpud %s has -o but is listed as a command without it", c.Name())
		}
		var formats []string
		for _, v := range [][]string{listOutputs, recordOutputs} {
			if strings.Contains(f.Usage, joinOr(v)) {
				formats = v
			}
		}
		if formats == nil || f.Shorthand != "o" || f.DefValue != formats[0] {
			t.Errorf("gpud %s -o: shorthand %q, default %q, usage %q: not the -o vocabulary", c.Name(), f.Shorthand, f.DefValue, f.Usage)
			continue
		}
		want := `gpud: ` + c.Name() + `: -o "xml": want ` + joinOr(formats) + "\n"
		for _, args := range [][]string{{c.Name(), "-o", "xml"}, {c.Name(), "--output=xml"}} {
			out, errOut, code := gpud(t, args...)
			if code != 2 || errOut != want || out != "" {
				t.Errorf("gpud %q: exit %d, stdout %q, stderr %q; want exit 2 and %q", args, code, out, errOut, want)
			}
		}
		comp, _, _ := gpud(t, "__complete", c.Name(), "-o", "")
		for _, v := range formats {
			if !strings.Contains(comp, v+"\n") {
				t.Errorf("gpud %s -o completes %q, lacks %s", c.Name(), comp, v)
			}
		}
	}
}

// TestStrayArguments: an argument a command does not take is named as
// such, with exit status 2 (cobra.NoArgs called it an unknown command);
// explain takes the PID as its argument.
func TestStrayArguments(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"status", "1"}, `gpud: status: unexpected argument "1"`},
		{[]string{"explain", "1", "2"}, `gpud: explain: unexpected argument "2"`},
		{[]string{"explain", "one"}, `gpud: explain: "one": want a PID (a positive number)`},
		{[]string{"explain", "0"}, `gpud: explain: "0": want a PID (a positive number)`},
		{[]string{"explain", "7", "--pid", "8"}, `gpud: explain: PID 7 and --pid 8: give one`},
		{[]string{"explain"}, `gpud: explain: a PID is required (gpud explain PID)`},
		{[]string{"monitor", "on", "1"}, `gpud: monitor: unexpected argument "1"`},
		{[]string{"uninstall", "1"}, `gpud: uninstall: unexpected argument "1"`},
		{[]string{"version", "1"}, `gpud: version: unexpected argument "1"`},
		{[]string{"run", "1"}, `gpud: run: unexpected argument "1"`},
		{[]string{"bogus"}, `gpud: unknown command "bogus" for "gpud"`},
	} {
		out, errOut, code := gpud(t, tc.args...)
		if code != 2 || errOut != tc.want+"\n" || out != "" {
			t.Errorf("gpud %q: exit %d, stdout %q, stderr %q; want exit 2 and %q", tc.args, code, out, errOut, tc.want)
		}
	}
	socket, got := fakeControl(t)
	for _, args := range [][]string{{"explain", "42", "--control-socket", socket}, {"explain", "--control-socket", socket, "42", "--pid", "42"}} {
		if out, errOut, code := gpud(t, args...); code != 0 || !strings.Contains(out, "python") {
			t.Errorf("gpud %q: exit %d, stdout %q, stderr %q", args, code, out, errOut)
		}
	}
	if r := got(); len(r) != 2 || r[0] != "GET /v1/explain?pid=42" {
		t.Errorf("requests: %q", r)
	}
}

// TestRunHelpGroups: every flag of `gpud run` is in exactly one section
// of -h, its help one short line; -h shows the sections in order, each
// visible flag once, and the deprecated --uninstall not at all.
func TestRunHelpGroups(t *testing.T) {
	fs, _ := runFlags()
	in := map[string][]string{}
	for _, g := range runGroups {
		for _, n := range g.flags {
			in[n] = append(in[n], g.title)
			if fs.Lookup(n) == nil {
				t.Errorf("section %q names --%s, which gpud run has not", g.title, n)
			}
		}
	}
	fs.VisitAll(func(f *pflag.Flag) {
		if len(in[f.Name]) != 1 {
			t.Errorf("--%s is in %d sections of gpud run -h (%q), want 1: add it to runGroups (runhelp.go) and docs/settings.md", f.Name, len(in[f.Name]), in[f.Name])
		}
		if g := f.Annotations[groupAnnotation]; len(g) != 1 || g[0] != in[f.Name][0] {
			t.Errorf("--%s: annotation %q", f.Name, g)
		}
		if strings.ContainsAny(f.Usage, "\r\n") || utf8.RuneCountInString(f.Usage) > 80 {
			t.Errorf("--%s: help of %d characters, want one line of at most 80 (the long text goes to docs/settings.md): %q",
				f.Name, utf8.RuneCountInString(f.Usage), f.Usage)
		}
	})

	out, errOut, code := gpud(t, "run", "-h")
	if code != 0 || errOut != "" {
		t.Fatalf("gpud run -h: exit %d, stderr %q", code, errOut)
	}
	last := -1
	for _, g := range runGroups {
		i := strings.Index(out, "\n"+g.title+":\n")
		if i < last {
			t.Errorf("section %q missing or out of order:\n%s", g.title, out)
		}
		last = i
	}
	fs.VisitAll(func(f *pflag.Flag) {
		n := len(regexp.MustCompile(`(?m)^\s+--`+regexp.QuoteMeta(f.Name)+`\s`).FindAllString(out, -1))
		if want := map[bool]int{true: 0, false: 1}[f.Hidden]; n != want {
			t.Errorf("gpud run -h shows --%s %d times, want %d", f.Name, n, want)
		}
	})
	if strings.Contains(out, "Other flags:\n      --") {
		t.Errorf("a flag in no section:\n%s", out)
	}
}

// TestSettingsDocEveryFlag: docs/settings.md has each flag of gpud run
// once, in the section of -h it is in, with its default where the page
// gives it as a plain value.
func TestSettingsDocEveryFlag(t *testing.T) {
	b, err := os.ReadFile("../../docs/settings.md")
	if err != nil {
		t.Fatal(err)
	}
	fs, _ := runFlags()
	row := regexp.MustCompile("^\\| `--([a-z0-9-]+)` \\| ([^|]*) \\|")
	section, seen := "", map[string]int{}
	for _, l := range strings.Split(string(b), "\n") {
		if s, ok := strings.CutPrefix(l, "## "); ok {
			section = s
			continue
		}
		m := row.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		seen[m[1]]++
		f := fs.Lookup(m[1])
		if f == nil {
			t.Errorf("docs/settings.md: --%s is no flag of gpud run", m[1])
			continue
		}
		if g := f.Annotations[groupAnnotation]; len(g) != 1 || g[0] != section {
			t.Errorf("docs/settings.md: --%s under %q, in -h under %q", m[1], section, g)
		}
		cell := strings.TrimSpace(m[2])
		// A plain value, not another flag's (`--dev-dir`: the same as it).
		if v, ok := strings.CutPrefix(cell, "`"); ok && strings.Count(cell, "`") == 2 && strings.HasSuffix(v, "`") && !strings.HasPrefix(v, "--") {
			v = strings.TrimSuffix(v, "`")
			if !sameValue(f, v) {
				t.Errorf("docs/settings.md: --%s default `%s`, the flag's is %q", m[1], v, f.DefValue)
			}
		}
	}
	fs.VisitAll(func(f *pflag.Flag) {
		if seen[f.Name] != 1 {
			t.Errorf("docs/settings.md has --%s %d times, want once", f.Name, seen[f.Name])
		}
	})
}

// sameValue: v, as the docs write it (5m, ""), is f's default.
func sameValue(f *pflag.Flag, v string) bool {
	if v == `""` {
		v = ""
	}
	if f.Value.Type() == "duration" {
		a, errA := time.ParseDuration(v)
		b, errB := time.ParseDuration(f.DefValue)
		return errA == nil && errB == nil && a == b
	}
	return v == f.DefValue
}

// TestUnknownEnvWarned: a GPUD_* variable that is no setting's is warned
// at start, naming the setting it most likely misspells; an action's
// variable is said not to be read; the variables gpud gives workloads and
// the settings' own are not warned about.
func TestUnknownEnvWarned(t *testing.T) {
	env := map[string]string{
		"GPUD_IDEL_AFTER": "1m", "GPUD_IDLE_AFTER": "2m", "GPUD_DEFAULT_PRIORTY": "low", "GPUD_UNINSTALL": "true",
		"GPUD_RESUME_FROM": "/x", "GPUD_GPU": "0", "GPUD_WHATEVER_THIS_IS": "1", "NOT_GPUD_IDEL_AFTER": "1",
	}
	o, s, err := loadRun(nil, fakeSources(env, nil))
	if err != nil {
		t.Fatal(err)
	}
	if o.cfg.IdleAfter != 2*time.Minute {
		t.Errorf("idle-after %v", o.cfg.IdleAfter)
	}
	var logged bytes.Buffer
	warnUnknownEnv(newLogger(&logged, new(slog.LevelVar)), s)
	for _, want := range []string{
		`"msg":"unknown variable GPUD_DEFAULT_PRIORTY (did you mean GPUD_DEFAULT_PRIORITY?)"`,
		`"msg":"unknown variable GPUD_IDEL_AFTER (did you mean GPUD_IDLE_AFTER?)","variable":"GPUD_IDEL_AFTER","did_you_mean":"GPUD_IDLE_AFTER"`,
		`"msg":"variable GPUD_UNINSTALL is not read (--uninstall is an action: command line only)"`,
		`"msg":"unknown variable GPUD_WHATEVER_THIS_IS (no setting of this name)"`,
	} {
		if !strings.Contains(logged.String(), want) {
			t.Errorf("log lacks %s:\n%s", want, logged.String())
		}
	}
	if n := strings.Count(logged.String(), `"level":"WARN"`); n != 4 {
		t.Errorf("%d warnings, want 4:\n%s", n, logged.String())
	}

	// The binary warns at start, before anything else can fail (here the
	// device directory, which needs no privilege to find missing).
	t.Setenv("GPUD_IDEL_AFTER", "1m")
	_, errOut, code := gpud(t, "run", "--dev-dir", filepath.Join(t.TempDir(), "none"), "--metrics-addr=", "--config=")
	if code != 2 || !strings.Contains(errOut, `"msg":"unknown variable GPUD_IDEL_AFTER (did you mean GPUD_IDLE_AFTER?)"`) {
		t.Errorf("gpud run with GPUD_IDEL_AFTER: exit %d, stderr %q", code, errOut)
	}
}

// TestRunUninstallDeprecated: `gpud run --uninstall` still works, says in
// one line that gpud uninstall is the command, and is out of the help.
func TestRunUninstallDeprecated(t *testing.T) {
	_, errOut, code := gpud(t, "run", "--uninstall", "--bpf-pin-dir=")
	lines := strings.Split(strings.TrimSuffix(errOut, "\n"), "\n")
	if code != 2 || len(lines) != 2 || !strings.HasPrefix(lines[0], "gpud: run --uninstall is deprecated: use gpud uninstall") ||
		lines[1] != "gpud: run: --uninstall needs --bpf-pin-dir" {
		t.Errorf("gpud run --uninstall: exit %d, stderr %q", code, errOut)
	}
	var c *cobra.Command
	for _, sub := range newRoot(&bytes.Buffer{}, &bytes.Buffer{}).Commands() {
		if sub.Name() == "uninstall" {
			c = sub
		}
	}
	if c == nil || c.Deprecated != "" || c.Hidden {
		t.Errorf("gpud uninstall is not the visible command: %+v", c)
	}
}
