package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/grpclog"
	"k8s.io/klog/v2"

	"github.com/gpud/gpud/internal/config"
	"github.com/gpud/gpud/internal/daemon"
	"github.com/gpud/gpud/internal/logging"
	"github.com/gpud/gpud/internal/occupancy"
)

func fakeSources(env map[string]string, files map[string]string) config.Sources {
	return config.Sources{
		LookupEnv: func(k string) (string, bool) { v, ok := env[k]; return v, ok },
		Environ: func() []string {
			var kv []string
			for k, v := range env {
				kv = append(kv, k+"="+v)
			}
			return kv
		},
		ReadFile: func(p string) ([]byte, error) {
			if c, ok := files[p]; ok {
				return []byte(c), nil
			}
			return nil, &fs.PathError{Op: "open", Path: p, Err: fs.ErrNotExist}
		},
	}
}

func TestRunSettingsSources(t *testing.T) {
	files := map[string]string{"/etc/gpud.yaml": `version: v1
idle-after: 10m
default-priority: low
preempt-grace: 5s
monitoring: false
metrics-addr: ":9500"
log-level: debug
nvml: "off"
`}
	o, s, err := loadRun([]string{"--preempt-grace", "7s"},
		fakeSources(map[string]string{"GPUD_CONFIG": "/etc/gpud.yaml", "GPUD_IDLE_AFTER": "20m", "GPUD_ENFORCE": "false"}, files))
	if err != nil {
		t.Fatal(err)
	}
	c := o.cfg
	if c.IdleAfter != 20*time.Minute || c.DefaultPriority != occupancy.Low || c.PreemptGrace != 7*time.Second ||
		c.MetricsAddr != ":9500" || c.Enforce || c.UseNVML || o.monitoring || o.level != slog.LevelDebug {
		t.Errorf("settings: %+v (monitoring %v, level %v)", c, o.monitoring, o.level)
	}
	for name, want := range map[string]string{
		"idle-after": "env GPUD_IDLE_AFTER", "preempt-grace": "flag --preempt-grace", "default-priority": "file /etc/gpud.yaml:3",
		"config": "env GPUD_CONFIG", "dev-dir": "default",
	} {
		if got := s.Origin(name); got != want {
			t.Errorf("Origin(%s) = %q, want %q", name, got, want)
		}
	}
	// An action is not a setting: GPUD_UNINSTALL is not read.
	if o, _, err := loadRun(nil, fakeSources(map[string]string{"GPUD_UNINSTALL": "true"}, nil)); err != nil || o.uninstall {
		t.Errorf("GPUD_UNINSTALL: %v, uninstall %v", err, o != nil && o.uninstall)
	}
	// The defaults, with no source at all, are those of docs/operating.md.
	o, _, err = loadRun(nil, fakeSources(nil, nil))
	if err != nil {
		t.Fatal(err)
	}
	if c := o.cfg; c.IdleAfter != 5*time.Minute || c.DefaultPriority != occupancy.Unmanaged || c.DevDir != "/dev" ||
		c.StateFile != "/run/gpud/state.json" || !c.Enforce || !c.UseNVML || c.Reclaim != "stop" || c.MetricsAddr != ":9407" || !o.monitoring {
		t.Errorf("defaults: %+v", c)
	}
}

// The bad inputs, from each source: one line naming the key (and
// where it came from), a usage error (exit status 2).
func TestRunBadSettings(t *testing.T) {
	files := map[string]string{
		"/v9":        "version: v9\n",
		"/unknown":   "version: v1\nidle-after: 1m\nidel-after: 2m\n",
		"/duration":  "version: v1\nidle-after: 5mins\n",
		"/prio":      "version: v1\ndefault-priority: urgent\n",
		"/grace":     "version: v1\npreempt-grace: -1s\n",
		"/zero":      "version: v1\nfail-open-after: 0s\n",
		"/bool":      "version: v1\nmonitoring: on\n",
		"/uninstall": "version: v1\nuninstall: true\n",
	}
	for _, tc := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{[]string{"--config", "/v9"}, nil, `run: version (file /v9:1): unknown version "v9" (want v1)`},
		{[]string{"--config", "/unknown"}, nil, `run: idel-after (file /unknown:3): unknown key (did you mean idle-after?)`},
		{[]string{"--config", "/duration"}, nil, `run: idle-after (file /duration:2): invalid duration "5mins" (want e.g. 30s, 5m or 1h)`},
		{[]string{"--config", "/prio"}, nil, `run: default-priority (file /prio:2): invalid value "urgent": want unmanaged, low or high`},
		{[]string{"--config", "/grace"}, nil, `run: preempt-grace (file /grace:2): must not be negative, got -1s`},
		{[]string{"--config", "/zero"}, nil, `run: fail-open-after (file /zero:2): must be positive, got 0s`},
		{[]string{"--config", "/bool"}, nil, `run: monitoring (file /bool:2): invalid bool "on" (want true or false)`},
		{nil, map[string]string{"GPUD_IDLE_AFTER": "5"}, `run: idle-after (env GPUD_IDLE_AFTER): invalid duration "5" (want e.g. 30s, 5m or 1h)`},
		{nil, map[string]string{"GPUD_DEFAULT_PRIORITY": "medium"}, `run: default-priority (env GPUD_DEFAULT_PRIORITY): invalid value "medium": want unmanaged, low or high`},
		{nil, map[string]string{"GPUD_RECLAIM": "kill"}, `run: reclaim (env GPUD_RECLAIM): invalid value "kill": want stop, remove, evict, delete or none`},
		{nil, map[string]string{"GPUD_HOOKS": "kprobes"}, `run: hooks (env GPUD_HOOKS): invalid value "kprobes": want driver or syscalls`},
		{[]string{"--driver-symbols", "open=nvidia_open"}, nil, `run: driver-symbols (flag --driver-symbols): driver symbols "open=nvidia_open": unknown role "open" (want release or receive)`},
		{nil, map[string]string{"GPUD_LOG_LEVEL": "verbose"}, `run: log-level (env GPUD_LOG_LEVEL): invalid value "verbose": want debug, info, warn or error`},
		{nil, map[string]string{"GPUD_NVML": "on"}, `run: nvml (env GPUD_NVML): invalid value "on": want auto or off`},
		{nil, map[string]string{"GPUD_CONFIG": "/nowhere.yaml"}, `run: config (env GPUD_CONFIG): open /nowhere.yaml: file does not exist`},
		{[]string{"--idle-after", "0"}, nil, `run: idle-after (flag --idle-after): must be positive, got 0s`},
		{[]string{"--default-priority=unclassified"}, nil, `run: default-priority (flag --default-priority): invalid value "unclassified": want unmanaged, low or high`},
		{[]string{"--resync-interval", "-1m"}, nil, `run: resync-interval (flag --resync-interval): must not be negative, got -1m0s`},
		{[]string{"--state-file", " "}, nil, `run: state-file (flag --state-file): is empty`},
		{[]string{"--idle-after"}, nil, `run: idle-after (flag --idle-after): no value`},
		{[]string{"--idle-afterr", "1m"}, nil, `run: unknown flag --idle-afterr (did you mean --idle-after?)`},
		{[]string{"--config", "/uninstall"}, nil, `run: uninstall (file /uninstall:2): unknown key`},
		{[]string{"--cdi-kind", "nvidia.com"}, nil, `run: cdi-kind (flag --cdi-kind): invalid CDI kind "nvidia.com": want vendor/class, e.g. nvidia.com/gpu`},
		{nil, map[string]string{"GPUD_CDI_KIND": "nvidia.com/gpu=x"}, `run: cdi-kind (env GPUD_CDI_KIND): invalid CDI kind "nvidia.com/gpu=x": "gpu=x" must start with a letter, end with a letter or digit and hold only letters, digits, '_', '-' and '.'`},
		{nil, map[string]string{"GPUD_CGROUP_PARENTS": "/mycontainers,kubelet.slice"}, `run: cgroup-parents (env GPUD_CGROUP_PARENTS): invalid value "/mycontainers,kubelet.slice": "kubelet.slice" is not an absolute cgroup path (e.g. /mycontainers, /kubelet.slice/kubelet-kubepods.slice)`},
		{[]string{"--cgroup-parents", "/"}, nil, `run: cgroup-parents (flag --cgroup-parents): invalid value "/": the root cgroup cannot be a runtime's parent (every cgroup root made in it would be a workload's)`},
	} {
		_, _, err := loadRun(tc.args, fakeSources(tc.env, files))
		if err == nil {
			t.Errorf("args %q env %v: accepted", tc.args, tc.env)
			continue
		}
		if err.Error() != tc.want {
			t.Errorf("args %q env %v:\n got %s\nwant %s", tc.args, tc.env, err, tc.want)
		}
		var ue usageError
		if !errors.As(err, &ue) {
			t.Errorf("%v: not a usage error (exit status 2)", err)
		}
	}
}

// fakeDaemon records reloads.
type fakeDaemon struct {
	got  []daemon.Reloadable
	fail error
}

func (f *fakeDaemon) Reload(r daemon.Reloadable) error {
	if f.fail != nil {
		return f.fail
	}
	f.got = append(f.got, r)
	return nil
}

func TestReloader(t *testing.T) {
	files := map[string]string{"/c": "version: v1\nidle-after: 1m\n"}
	src := fakeSources(nil, files)
	args := []string{"--config", "/c", "--dev-dir", "/tmp/dev"}
	_, s, err := loadRun(args, src)
	if err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	level := new(slog.LevelVar)
	fd := &fakeDaemon{}
	r := &reloader{args: args, d: fd, log: slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: level})), level: level, running: compared(s)}
	type logLine struct {
		Level, Msg string
		Keys       []string
		Changed    []string
	}
	lastLog := func() logLine {
		t.Helper()
		lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
		var l logLine
		if err := json.Unmarshal([]byte(lines[len(lines)-1]), &l); err != nil {
			t.Fatalf("log %q: %v", logs.String(), err)
		}
		return l
	}
	find := func(msgPrefix string) *logLine {
		for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
			var l logLine
			if json.Unmarshal([]byte(line), &l) == nil && strings.HasPrefix(l.Msg, msgPrefix) {
				return &l
			}
		}
		return nil
	}

	// Reloadable settings change: applied, nothing needs a restart.
	files["/c"] = "version: v1\nidle-after: 2m\ndefault-priority: low\npreempt-grace: 3s\nlog-level: debug\n"
	r.reload(src)
	if len(fd.got) != 1 {
		t.Fatalf("Reload calls: %d", len(fd.got))
	}
	if g := fd.got[0]; g.IdleAfter != 2*time.Minute || g.DefaultPriority != occupancy.Low || g.PreemptGrace != 3*time.Second || g.Monitoring != nil {
		t.Errorf("reloaded %+v", g)
	}
	if level.Level() != slog.LevelDebug {
		t.Errorf("log level %v", level.Level())
	}
	if l := lastLog(); l.Msg != "reload: done" || strings.Join(l.Changed, ",") != "default-priority,idle-after,log-level,preempt-grace" {
		t.Errorf("last log %+v", l)
	}
	if find("reload: these settings") != nil {
		t.Error("restart warning for reloadable settings")
	}

	// monitoring set in the file: the switch flips; other keys need a restart.
	logs.Reset()
	files["/c"] = "version: v1\nidle-after: 2m\ndefault-priority: low\npreempt-grace: 3s\nlog-level: debug\nmonitoring: false\nreclaim: none\nstate-dir: /x\n"
	r.reload(src)
	if g := fd.got[1]; g.Monitoring == nil || *g.Monitoring {
		t.Errorf("monitoring: %+v", g)
	}
	w := find("reload: these settings")
	if w == nil || w.Level != "WARN" || strings.Join(w.Keys, ",") != "reclaim,state-dir" {
		t.Errorf("restart warning %+v in %s", w, logs.String())
	}
	// Unchanged since: the switch is left alone (gpud monitor's wins), and
	// the restart warning repeats until a restart.
	logs.Reset()
	r.reload(src)
	if g := fd.got[2]; g.Monitoring != nil {
		t.Errorf("monitoring flipped again: %+v", *g.Monitoring)
	}
	if w := find("reload: these settings"); w == nil || strings.Join(w.Keys, ",") != "reclaim,state-dir" {
		t.Errorf("restart warning %+v", w)
	}

	// A bad file: an error, the running settings stay, Reload is not called.
	logs.Reset()
	files["/c"] = "version: v1\nidle-after: soon\n"
	r.reload(src)
	if len(fd.got) != 3 {
		t.Errorf("Reload called with a bad file")
	}
	if l := lastLog(); l.Level != "ERROR" || !strings.Contains(logs.String(), `idle-after (file /c:2): invalid duration \"soon\"`) {
		t.Errorf("bad file log: %s", logs.String())
	}
	// The daemon refusing: an error too.
	logs.Reset()
	files["/c"] = "version: v1\n"
	fd.fail = errors.New("no")
	before := configRefused.Load()
	r.reload(src)
	if l := lastLog(); l.Level != "ERROR" || !strings.HasPrefix(l.Msg, "reload: not applied") {
		t.Errorf("refused reload log: %s", logs.String())
	}
	// A value the daemon refuses is a refused reload
	// (gpud_config_reloads_refused_total); a failure to apply is not.
	fd.fail = fmt.Errorf("%w: idle-after must be positive", daemon.ErrConfig)
	r.reload(src)
	if n := configRefused.Load() - before; n != 1 {
		t.Errorf("refused reloads counted %d, want 1 (the daemon's ErrConfig)", n)
	}
}

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
)

// gpudBinary builds gpud once per test run.
func gpudBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "gpud-bin")
		if err != nil {
			buildErr = err
			return
		}
		binPath = filepath.Join(dir, "gpud")
		out, err := exec.Command("go", "build", "-o", binPath, ".").CombinedOutput()
		if err != nil {
			buildErr = errors.New(string(out))
		}
	})
	if buildErr != nil {
		t.Fatalf("go build: %v", buildErr)
	}
	return binPath
}

func TestMain(m *testing.M) {
	code := m.Run()
	if binPath != "" {
		os.RemoveAll(filepath.Dir(binPath))
	}
	os.Exit(code)
}

// The built binary: bad settings from each source exit 2 with one line on
// stderr naming the key, before anything is started.
func TestBinaryBadSettings(t *testing.T) {
	bin := gpudBinary(t)
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, tc := range []struct {
		name string
		args []string
		env  []string
		key  string
	}{
		{"unknown version", []string{"--config", write("v2.yaml", "version: v2\n")}, nil, "version"},
		{"unknown key", []string{"--config", write("k.yaml", "version: v1\nidle-afterr: 1m\n")}, nil, "idle-afterr"},
		{"bad duration in file", []string{"--config", write("d.yaml", "version: v1\nidle-after: 5x\n")}, nil, "idle-after"},
		{"bad priority in file", []string{"--config", write("p.yaml", "version: v1\ndefault-priority: top\n")}, nil, "default-priority"},
		{"bad duration in env", nil, []string{"GPUD_IDLE_AFTER=forever"}, "idle-after"},
		{"bad priority in env", nil, []string{"GPUD_DEFAULT_PRIORITY=top"}, "default-priority"},
		{"bad bool in env", nil, []string{"GPUD_MONITORING=sometimes"}, "monitoring"},
		{"file from env", nil, []string{"GPUD_CONFIG=" + write("e.yaml", "version: v1\npreempt-grace: 1\n")}, "preempt-grace"},
		{"bad duration flag", []string{"--preempt-grace", "x"}, nil, "preempt-grace"},
		{"bad priority flag", []string{"--default-priority", "top"}, nil, "default-priority"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command(bin, append([]string{"run"}, tc.args...)...)
			cmd.Env = append(os.Environ(), tc.env...)
			var stderr, stdout bytes.Buffer
			cmd.Stderr, cmd.Stdout = &stderr, &stdout
			err := cmd.Run()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != 2 {
				t.Fatalf("exit: %v, want status 2; stderr %q", err, stderr.String())
			}
			msg := stderr.String()
			if strings.Count(msg, "\n") != 1 || !strings.HasSuffix(msg, "\n") {
				t.Errorf("stderr is not one line: %q", msg)
			}
			if !strings.HasPrefix(msg, "gpud: run: "+tc.key+" (") {
				t.Errorf("stderr %q does not name %s", msg, tc.key)
			}
			if stdout.Len() != 0 {
				t.Errorf("stdout: %q", stdout.String())
			}
		})
	}
}

// TestPprofAddrLoopbackOnly: Go's profiles (gpud's memory) are served on
// loopback only and only when asked; every other address is refused with
// the setting named, from a flag as from the file.
func TestPprofAddrLoopbackOnly(t *testing.T) {
	o, _, err := loadRun(nil, fakeSources(nil, nil))
	if err != nil || o.cfg.PprofAddr != "" {
		t.Fatalf("default: %q, %v; want off", o.cfg.PprofAddr, err)
	}
	for _, ok := range []string{"127.0.0.1:6060", "[::1]:6060", "localhost:0", "127.0.0.2:1"} {
		if o, _, err := loadRun([]string{"--pprof-addr", ok}, fakeSources(nil, nil)); err != nil || o.cfg.PprofAddr != ok {
			t.Errorf("--pprof-addr %s: %v", ok, err)
		}
	}
	for _, bad := range []string{":6060", "0.0.0.0:6060", "[::]:6060", "10.0.0.1:6060", "example.com:6060", "127.0.0.1"} {
		_, _, err := loadRun([]string{"--pprof-addr", bad}, fakeSources(nil, nil))
		if err == nil || !strings.Contains(err.Error(), "pprof-addr") {
			t.Errorf("--pprof-addr %s: err = %v, want a refusal naming pprof-addr", bad, err)
		}
	}
	files := map[string]string{"/etc/gpud.yaml": "version: v1\npprof-addr: \"0.0.0.0:6060\"\n"}
	if _, _, err := loadRun(nil, fakeSources(map[string]string{"GPUD_CONFIG": "/etc/gpud.yaml"}, files)); err == nil {
		t.Error("pprof-addr 0.0.0.0:6060 from the file accepted")
	}
}

// TestRunLoggerRoutesLibraries: gpud run's log stream stays JSON with
// client-go (klog) and gRPC (grpclog) lines in it, at gpud's log level.
func TestRunLoggerRoutesLibraries(t *testing.T) {
	var buf bytes.Buffer
	level := new(slog.LevelVar)
	newLogger(&buf, level)
	klog.ErrorS(errors.New("connection refused"), "failed to watch pods")
	grpclog.Errorf("[core] kubelet.sock: %s", "connection reset")
	grpclog.Info("channel READY") // gRPC's info is debug: not at level info
	var comps []string
	for _, l := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		var x struct{ Level, Msg, Component, Error string }
		if err := json.Unmarshal([]byte(l), &x); err != nil || x.Level != "ERROR" || x.Msg == "" {
			t.Errorf("line %q: %+v %v", l, x, err)
		}
		comps = append(comps, x.Component)
	}
	if strings.Join(comps, ",") != logging.ComponentKlog+","+logging.ComponentGRPC {
		t.Errorf("components %v in:\n%s", comps, buf.String())
	}
}

// The agent lists from each source: a whole list per source (the file's
// replaced by the variable's, that by the flag's), "" for none, and names
// that can never match refused with the key.
// --cdi-kind: nvidia.com/gpu by default, from every source, "" for none
// (Complete leaves it empty).
func TestRunCDIKind(t *testing.T) {
	o, _, err := loadRun(nil, fakeSources(nil, nil))
	if err != nil || o.cfg.CDIKind != "nvidia.com/gpu" || o.cfg.CDIKind != config.Defaults().CDIKind {
		t.Fatalf("default: %q, %v", o.cfg.CDIKind, err)
	}
	files := map[string]string{"/c.yaml": "version: v1\ncdi-kind: example.com/accel\n", "/none.yaml": "version: v1\ncdi-kind: \"\"\n"}
	for _, tc := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{nil, map[string]string{"GPUD_CONFIG": "/c.yaml"}, "example.com/accel"},
		{nil, map[string]string{"GPUD_CONFIG": "/c.yaml", "GPUD_CDI_KIND": "k8s.example/gpu"}, "k8s.example/gpu"},
		{[]string{"--cdi-kind", ""}, map[string]string{"GPUD_CDI_KIND": "k8s.example/gpu"}, ""},
		{nil, map[string]string{"GPUD_CONFIG": "/none.yaml"}, ""},
	} {
		o, _, err := loadRun(tc.args, fakeSources(tc.env, files))
		if err != nil || o.cfg.CDIKind != tc.want {
			t.Errorf("%q %v: %q, %v; want %q", tc.args, tc.env, o.cfg.CDIKind, err, tc.want)
			continue
		}
		if c := o.cfg.Run.Complete(); c.CDIKind != tc.want {
			t.Errorf("Complete changed --cdi-kind %q to %q", tc.want, c.CDIKind)
		}
	}
}

func TestRunAgentSettings(t *testing.T) {
	o, _, err := loadRun(nil, fakeSources(nil, nil))
	if err != nil {
		t.Fatal(err)
	}
	def := config.Defaults()
	if !slices.Equal(o.cfg.AgentComms, def.AgentComms) || !slices.Contains(o.cfg.AgentComms, "nvidia-persiste") ||
		!slices.Equal(o.cfg.AgentNamespaces, []string{"gpu-operator", "nvidia-gpu-operator"}) || !slices.Equal(o.cfg.AgentLabels, def.AgentLabels) {
		t.Errorf("defaults: %q %q %q", o.cfg.AgentComms, o.cfg.AgentNamespaces, o.cfg.AgentLabels)
	}
	files := map[string]string{"/g.yaml": "version: v1\nagent-comms: nvidia-persiste, my-agent\nagent-namespaces: ops\nagent-labels: \"\"\n"}
	o, s, err := loadRun([]string{"--agent-namespaces", "gpu-operator,ops"},
		fakeSources(map[string]string{"GPUD_CONFIG": "/g.yaml", "GPUD_AGENT_COMMS": "dcgm-exporter"}, files))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(o.cfg.AgentComms, []string{"dcgm-exporter"}) || !slices.Equal(o.cfg.AgentNamespaces, []string{"gpu-operator", "ops"}) ||
		o.cfg.AgentLabels == nil || len(o.cfg.AgentLabels) != 0 {
		t.Errorf("from the sources: %q %q %q", o.cfg.AgentComms, o.cfg.AgentNamespaces, o.cfg.AgentLabels)
	}
	if s.Origin("agent-comms") != "env GPUD_AGENT_COMMS" || s.Origin("agent-labels") != "file /g.yaml:4" {
		t.Errorf("origins: %s, %s", s.Origin("agent-comms"), s.Origin("agent-labels"))
	}
	// "" is none, not the defaults: Complete leaves an empty list alone.
	if c := o.cfg.Run.Complete(); c.AgentLabels == nil || len(c.AgentLabels) != 0 {
		t.Errorf("Complete filled an empty list: %q", c.AgentLabels)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--agent-comms", "nvidia-persistenced"}, `run: agent-comms (flag --agent-comms): invalid value "nvidia-persistenced"`},
		{[]string{"--agent-labels", "app"}, `run: agent-labels (flag --agent-labels): invalid value "app"`},
		{[]string{"--agent-namespaces", "GPU"}, `run: agent-namespaces (flag --agent-namespaces): invalid value "GPU"`},
	} {
		_, _, err := loadRun(tc.args, fakeSources(nil, nil))
		if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("%q: %v, want %s…", tc.args, err, tc.want)
		}
	}
}
