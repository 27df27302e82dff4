package config

import (
	"errors"
	"github.com/spf13/pflag"
	"io"
	"io/fs"
	"slices"
	"strings"
	"testing"
	"time"
)

// settings is a small flag set with each kind of value gpud run has.
type settings struct {
	file       string
	idleAfter  time.Duration
	grace      time.Duration
	enforce    bool
	stateFile  string
	defPrio    string
	monitoring bool
}

func newFlags() (*pflag.FlagSet, *settings) {
	fs := pflag.NewFlagSet("run", pflag.ContinueOnError)
	fs.SetOutput(io.Discard)
	s := &settings{}
	fs.StringVar(&s.file, FileFlag, "", "settings file")
	fs.DurationVar(&s.idleAfter, "idle-after", 5*time.Minute, "idle threshold")
	fs.DurationVar(&s.grace, "preempt-grace", 0, "grace")
	fs.BoolVar(&s.enforce, "enforce", true, "enforce")
	fs.StringVar(&s.stateFile, "state-file", "/run/gpud/state.json", "state file")
	fs.Var(NewEnum(&s.defPrio, "unmanaged", "unmanaged", "low", "high"), "default-priority", "default class")
	fs.BoolVar(&s.monitoring, "monitoring", true, "switch")
	return fs, s
}

// fake sources: env vars and files in maps.
func fake(env map[string]string, files map[string]string) Sources {
	return Sources{
		LookupEnv: func(k string) (string, bool) { v, ok := env[k]; return v, ok },
		ReadFile: func(p string) ([]byte, error) {
			if c, ok := files[p]; ok {
				return []byte(c), nil
			}
			return nil, &fs.PathError{Op: "open", Path: p, Err: fs.ErrNotExist}
		},
	}
}

func TestEnvName(t *testing.T) {
	for in, want := range map[string]string{"idle-after": "GPUD_IDLE_AFTER", "default-priority": "GPUD_DEFAULT_PRIORITY",
		"metrics-addr": "GPUD_METRICS_ADDR", "config": "GPUD_CONFIG", "nvml": "GPUD_NVML"} {
		if got := EnvName(in); got != want {
			t.Errorf("EnvName(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestPrecedence(t *testing.T) {
	file := "version: v1\nidle-after: 1m\npreempt-grace: 2s\ndefault-priority: low\nenforce: false\n"
	for _, tc := range []struct {
		name      string
		args      []string
		env       map[string]string
		idleAfter time.Duration
		origin    string
		grace     time.Duration
		prio      string
		enforce   bool
	}{
		{"defaults", nil, nil, 5 * time.Minute, "default", 0, "unmanaged", true},
		{"file", []string{"--config", "/c.yaml"}, nil, time.Minute, "file /c.yaml:2", 2 * time.Second, "low", false},
		{"file from env", nil, map[string]string{"GPUD_CONFIG": "/c.yaml"}, time.Minute, "file /c.yaml:2", 2 * time.Second, "low", false},
		{"env over file", []string{"--config=/c.yaml"}, map[string]string{"GPUD_IDLE_AFTER": "2m", "GPUD_DEFAULT_PRIORITY": "high"},
			2 * time.Minute, "env GPUD_IDLE_AFTER", 2 * time.Second, "high", false},
		{"flag over env over file", []string{"--config", "/c.yaml", "--idle-after", "3m", "-enforce"}, map[string]string{"GPUD_IDLE_AFTER": "2m"},
			3 * time.Minute, "flag --idle-after", 2 * time.Second, "low", true},
		{"flag over env", []string{"--idle-after=4m"}, map[string]string{"GPUD_IDLE_AFTER": "2m", "GPUD_ENFORCE": "false"},
			4 * time.Minute, "flag --idle-after", 0, "unmanaged", false},
		{"empty --config disables GPUD_CONFIG", []string{"--config="}, map[string]string{"GPUD_CONFIG": "/c.yaml"},
			5 * time.Minute, "default", 0, "unmanaged", true},
		{"unrelated GPUD_ variables are not settings", nil, map[string]string{"GPUD_RESUME_FROM": "/x", "GPUD_HELPER": "1"},
			5 * time.Minute, "default", 0, "unmanaged", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs, v := newFlags()
			s, err := Load(fs, tc.args, fake(tc.env, map[string]string{"/c.yaml": file}))
			if err != nil {
				t.Fatal(err)
			}
			if v.idleAfter != tc.idleAfter || v.grace != tc.grace || v.defPrio != tc.prio || v.enforce != tc.enforce {
				t.Errorf("got idle-after %s grace %s priority %s enforce %v; want %s %s %s %v",
					v.idleAfter, v.grace, v.defPrio, v.enforce, tc.idleAfter, tc.grace, tc.prio, tc.enforce)
			}
			if got := s.Origin("idle-after"); got != tc.origin {
				t.Errorf("Origin(idle-after) = %q, want %q", got, tc.origin)
			}
		})
	}
}

// Every bad input, from every source, is one line naming the key and where
// its value came from.
func TestBadInputs(t *testing.T) {
	files := map[string]string{
		"/v2.yaml":        "version: v2\nidle-after: 1m\n",
		"/v1num.yaml":     "version: 1\n",
		"/noversion":      "idle-after: 1m\n",
		"/empty":          "",
		"/comment":        "# nothing\n",
		"/unknown":        "version: v1\nidle-after: 1m\nidle_after: 2m\n",
		"/nested":         "version: v1\nconfig: /other.yaml\n",
		"/duration":       "version: v1\nidle-after: 5 minutes\n",
		"/nounit":         "version: v1\npreempt-grace: 30\n",
		"/prio":           "version: v1\ndefault-priority: medium\n",
		"/bool":           "version: v1\nenforce: maybe\n",
		"/list":           "version: v1\nidle-after: [1m, 2m]\n",
		"/map":            "version: v1\nidle-after:\n  value: 1m\n",
		"/null":           "version: v1\nidle-after:\n",
		"/dup":            "version: v1\nidle-after: 1m\n\nidle-after: 2m\n",
		"/notmap":         "- version: v1\n",
		"/scalar":         "v1\n",
		"/syntax":         "version: v1\nidle-after: 1m\n  bad: indent\n",
		"/twodocs":        "version: v1\n---\nversion: v1\n",
		"/versionlist":    "version: [v1]\n",
		"/complexkey":     "version: v1\n? [a, b]\n: c\n",
		"/unknownbeforev": "bogus: 1\nversion: v1\n",
	}
	for _, tc := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{[]string{"--idle-after", "5x"}, nil, `idle-after (flag --idle-after): invalid duration "5x" (want e.g. 30s, 5m or 1h)`},
		{[]string{"--enforce=maybe"}, nil, `enforce (flag --enforce): invalid bool "maybe" (want true or false)`},
		{[]string{"--default-priority", "medium"}, nil, `default-priority (flag --default-priority): invalid value "medium": want unmanaged, low or high`},
		{[]string{"--idle-after"}, nil, `idle-after (flag --idle-after): no value`},
		{[]string{"--bogus"}, nil, `unknown flag --bogus`},
		{[]string{"extra"}, nil, `unexpected argument "extra"`},
		{nil, map[string]string{"GPUD_IDLE_AFTER": "soon"}, `idle-after (env GPUD_IDLE_AFTER): invalid duration "soon" (want e.g. 30s, 5m or 1h)`},
		{nil, map[string]string{"GPUD_DEFAULT_PRIORITY": "HIGH"}, `default-priority (env GPUD_DEFAULT_PRIORITY): invalid value "HIGH": want unmanaged, low or high`},
		{nil, map[string]string{"GPUD_ENFORCE": "yes"}, `enforce (env GPUD_ENFORCE): invalid bool "yes" (want true or false)`},
		{nil, map[string]string{"GPUD_PREEMPT_GRACE": "1s\n2s"}, `preempt-grace (env GPUD_PREEMPT_GRACE): invalid duration "1s\n2s" (want e.g. 30s, 5m or 1h)`},
		{nil, map[string]string{"GPUD_CONFIG": "/missing.yaml"}, `config (env GPUD_CONFIG): open /missing.yaml: file does not exist`},
		{[]string{"--config", "/missing.yaml"}, nil, `config (flag --config): open /missing.yaml: file does not exist`},
		{[]string{"--config", "/v2.yaml"}, nil, `version (file /v2.yaml:1): unknown version "v2" (want v1)`},
		{[]string{"--config", "/v1num.yaml"}, nil, `version (file /v1num.yaml:1): unknown version "1" (want v1)`},
		{[]string{"--config", "/noversion"}, nil, `version (file /noversion): missing (want v1)`},
		{[]string{"--config", "/empty"}, nil, `version (file /empty): missing (want v1)`},
		{[]string{"--config", "/comment"}, nil, `version (file /comment): missing (want v1)`},
		{[]string{"--config", "/unknown"}, nil, `idle_after (file /unknown:3): unknown key (did you mean idle-after?)`},
		{[]string{"--config", "/unknownbeforev"}, nil, `bogus (file /unknownbeforev:1): unknown key`},
		{[]string{"--config", "/nested"}, nil, `config (file /nested:2): unknown key`},
		{[]string{"--config", "/duration"}, nil, `idle-after (file /duration:2): invalid duration "5 minutes" (want e.g. 30s, 5m or 1h)`},
		{[]string{"--config", "/nounit"}, nil, `preempt-grace (file /nounit:2): invalid duration "30" (want e.g. 30s, 5m or 1h)`},
		{[]string{"--config", "/prio"}, nil, `default-priority (file /prio:2): invalid value "medium": want unmanaged, low or high`},
		{[]string{"--config", "/bool"}, nil, `enforce (file /bool:2): invalid bool "maybe" (want true or false)`},
		{[]string{"--config", "/list"}, nil, `idle-after (file /list:2): want a single value, not a list or mapping`},
		{[]string{"--config", "/map"}, nil, `idle-after (file /map:2): want a single value, not a list or mapping`},
		{[]string{"--config", "/null"}, nil, `idle-after (file /null:2): no value (write "" for an empty string)`},
		{[]string{"--config", "/dup"}, nil, `idle-after (file /dup:4): duplicate key (first on line 2)`},
		{[]string{"--config", "/notmap"}, nil, `file /notmap:1: want a mapping of settings (key: value)`},
		{[]string{"--config", "/scalar"}, nil, `file /scalar:1: want a mapping of settings (key: value)`},
		{[]string{"--config", "/syntax"}, nil, `file /syntax: yaml: line 3: mapping values are not allowed in this context`},
		{[]string{"--config", "/twodocs"}, nil, `file /twodocs:2: more than one YAML document`},
		{[]string{"--config", "/versionlist"}, nil, `version (file /versionlist:1): want a single value, not a list or mapping`},
		{[]string{"--config", "/complexkey"}, nil, `file /complexkey:2: a key must be a name`},
		// A bad value is refused even where a flag would override it.
		{[]string{"--config", "/duration", "--idle-after", "1m"}, nil, `idle-after (file /duration:2): invalid duration "5 minutes" (want e.g. 30s, 5m or 1h)`},
		{[]string{"--idle-after", "1m"}, map[string]string{"GPUD_IDLE_AFTER": "x"}, `idle-after (env GPUD_IDLE_AFTER): invalid duration "x" (want e.g. 30s, 5m or 1h)`},
	} {
		fs, _ := newFlags()
		_, err := Load(fs, tc.args, fake(tc.env, files))
		if err == nil {
			t.Errorf("args %q env %v: accepted", tc.args, tc.env)
			continue
		}
		if got := err.Error(); got != tc.want {
			t.Errorf("args %q env %v:\n got %s\nwant %s", tc.args, tc.env, got, tc.want)
		}
		if strings.ContainsAny(err.Error(), "\r\n") {
			t.Errorf("error is not one line: %q", err)
		}
	}
}

func TestFlagOnly(t *testing.T) {
	src := fake(map[string]string{"GPUD_ENFORCE": "false"}, map[string]string{"/f": "version: v1\nenforce: false\n"})
	src.FlagOnly = []string{"enforce"}
	fs, v := newFlags()
	if _, err := Load(fs, nil, src); err != nil || !v.enforce {
		t.Errorf("a flag-only setting read from the environment: %v %v", err, v.enforce)
	}
	fs, _ = newFlags()
	if _, err := Load(fs, []string{"--config", "/f"}, src); err == nil || err.Error() != "enforce (file /f:2): unknown key" {
		t.Errorf("a flag-only setting in the file: %v", err)
	}
	fs, v = newFlags()
	if _, err := Load(fs, []string{"--enforce=false"}, src); err != nil || v.enforce {
		t.Errorf("the flag itself: %v %v", err, v.enforce)
	}
}

func TestHelp(t *testing.T) {
	fs, _ := newFlags()
	if _, err := Load(fs, []string{"-h"}, fake(nil, nil)); !errors.Is(err, pflag.ErrHelp) {
		t.Fatalf("-h: %v, want pflag.ErrHelp", err)
	}
}

func TestInvalidNamesOrigin(t *testing.T) {
	fs, _ := newFlags()
	s, err := Load(fs, nil, fake(map[string]string{"GPUD_IDLE_AFTER": "0s"}, nil))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := s.Invalid("idle-after", "must be positive, got %s", "0s").Error(),
		"idle-after (env GPUD_IDLE_AFTER): must be positive, got 0s"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	if got := s.Invalid("enforce", "x").Error(); got != "enforce (default): x" {
		t.Errorf("got %q", got)
	}
}

func TestExplicitAndChanged(t *testing.T) {
	files := map[string]string{"/a": "version: v1\nmonitoring: false\nidle-after: 1m\n", "/b": "version: v1\nidle-after: 2m\n"}
	fsA, _ := newFlags()
	a, err := Load(fsA, []string{"--config", "/a"}, fake(nil, files))
	if err != nil {
		t.Fatal(err)
	}
	fsB, _ := newFlags()
	b, err := Load(fsB, []string{"--config", "/b"}, fake(nil, files))
	if err != nil {
		t.Fatal(err)
	}
	if !a.Explicit("monitoring") || b.Explicit("monitoring") || b.Explicit("enforce") {
		t.Errorf("Explicit: a.monitoring %v b.monitoring %v b.enforce %v", a.Explicit("monitoring"), b.Explicit("monitoring"), b.Explicit("enforce"))
	}
	if got := strings.Join(Changed(a.Values(), b.Values()), ","); got != "config,idle-after,monitoring" {
		t.Errorf("Changed = %s", got)
	}
	if b.File != "/b" {
		t.Errorf("File = %q", b.File)
	}
}

func TestYAMLForms(t *testing.T) {
	// Quoted, anchored and commented values are plain values.
	file := "# gpud\nversion: \"v1\"\nidle-after: &d '90s' # a comment\npreempt-grace: *d\nstate-file: \"\"\nenforce: false\n"
	fs, v := newFlags()
	if _, err := Load(fs, []string{"--config", "/f"}, fake(nil, map[string]string{"/f": file})); err != nil {
		t.Fatal(err)
	}
	if v.idleAfter != 90*time.Second || v.grace != 90*time.Second || v.stateFile != "" || v.enforce {
		t.Errorf("got %+v", v)
	}
}

func TestFileTooLarge(t *testing.T) {
	_, err := ParseFile("/big", make([]byte, MaxFileSize+1))
	if err == nil || err.Error() != "file /big: larger than 1048576 bytes" {
		t.Errorf("err = %v", err)
	}
}

// TestLongDashes: Go's flag package took -name as well as --name, and
// scripts written for it keep working under pflag; a value that starts
// with a dash stays a value, shorthands and what follows "--" stay as they
// are.
func TestLongDashes(t *testing.T) {
	fs, _ := newFlags()
	fs.StringP("output", "o", "table", "format")
	for _, tc := range []struct{ in, want []string }{
		{[]string{"-idle-after", "3m", "-enforce=false"}, []string{"--idle-after", "3m", "--enforce=false"}},
		{[]string{"--state-file", "-enforce", "-idle-after=1m"}, []string{"--state-file", "-enforce", "--idle-after=1m"}},
		{[]string{"-state-file", "-idle-after"}, []string{"--state-file", "-idle-after"}},
		{[]string{"-o", "-idle-after", "-ojson"}, []string{"-o", "-idle-after", "-ojson"}},
		{[]string{"-enforce", "-bogus", "--", "-idle-after"}, []string{"--enforce", "-bogus", "--", "-idle-after"}},
	} {
		if got := LongDashes(fs, tc.in); strings.Join(got, " ") != strings.Join(tc.want, " ") {
			t.Errorf("LongDashes(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
	fs, v := newFlags()
	if _, err := Load(fs, []string{"-idle-after", "3m", "-state-file", "-x"}, fake(nil, nil)); err != nil || v.idleAfter != 3*time.Minute || v.stateFile != "-x" {
		t.Errorf("single-dash flags: %v, idle-after %s, state-file %q", err, v.idleAfter, v.stateFile)
	}
}

// A List is replaced whole by each Set (a later source wins, never
// appends), "" is the empty list (not nil), and items are vetted.
func TestList(t *testing.T) {
	var got []string
	def := []string{"a", "b"}
	l := NewList(&got, def, func(s string) error {
		if s == "bad" {
			return errors.New("no")
		}
		return nil
	})
	got[0] = "x"
	if def[0] != "a" {
		t.Fatal("the default shares its array with the value")
	}
	if err := l.Set(" c , d,,"); err != nil || l.String() != "c,d" {
		t.Fatalf("Set: %v %q", err, got)
	}
	if err := l.Set("e"); err != nil || l.String() != "e" {
		t.Fatalf("a second Set appended: %q", got)
	}
	if err := l.Set(""); err != nil || got == nil || len(got) != 0 {
		t.Fatalf("Set(\"\") = %#v, want an empty non-nil list", got)
	}
	if err := l.Set("f,bad"); err == nil || len(got) != 0 {
		t.Errorf("a bad item: %v, list %q changed", err, got)
	}
	r := Run{}.Complete()
	if !slices.Equal(r.AgentComms, Defaults().AgentComms) || len(r.AgentComms) == 0 {
		t.Errorf("Complete: agent comms %q", r.AgentComms)
	}
	if r := (Run{AgentComms: []string{}}).Complete(); len(r.AgentComms) != 0 {
		t.Errorf("Complete filled an explicitly empty list: %q", r.AgentComms)
	}
}

// A GPUD_* variable no flag reads is reported, with the variable it most
// likely misspells (a swap, a missing or extra letter); one of another word
// has no suggestion, a flag-only action's is said not to be read, and
// NotSettings are left alone.
func TestUnknownEnv(t *testing.T) {
	fs, _ := newFlags()
	fs.Bool("uninstall", false, "action")
	src := Sources{
		LookupEnv: func(string) (string, bool) { return "", false },
		Environ: func() []string {
			return []string{"GPUD_IDEL_AFTER=1m", "GPUD_PREEMPT_GRACEE=1s", "GPUD_ENFORCE=true", "GPUD_UNINSTALL=1",
				"GPUD_RESUME_FROM=/x", "GPUD_NOTHING_LIKE_IT=1", "PATH=/bin", "GPUD_IDEL_AFTER=2m"}
		},
		FlagOnly:    []string{"uninstall"},
		NotSettings: []string{"GPUD_RESUME_FROM"},
	}
	s, err := Load(fs, nil, src)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, u := range s.UnknownEnv {
		got = append(got, u.String())
	}
	want := []string{
		"unknown variable GPUD_IDEL_AFTER (did you mean GPUD_IDLE_AFTER?)",
		"unknown variable GPUD_NOTHING_LIKE_IT (no setting of this name)",
		"unknown variable GPUD_PREEMPT_GRACEE (did you mean GPUD_PREEMPT_GRACE?)",
		"variable GPUD_UNINSTALL is not read (--uninstall is an action: command line only)",
	}
	if !slices.Equal(got, want) {
		t.Errorf("unknown variables:\n%q\nwant\n%q", got, want)
	}
	for _, tc := range []struct {
		a, b string
		d    int
	}{{"IDEL_AFTER", "IDLE_AFTER", 1}, {"IDLE_AFTER", "IDLE_AFTER", 0}, {"IDLEAFTER", "IDLE_AFTER", 1}, {"", "AB", 2}, {"ABC", "CBA", 2}} {
		if d := editDistance(tc.a, tc.b); d != tc.d {
			t.Errorf("editDistance(%q, %q) = %d, want %d", tc.a, tc.b, d, tc.d)
		}
	}
}
