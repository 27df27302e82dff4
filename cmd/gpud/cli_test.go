package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/gpud/gpud/internal/testutil"
)

// gpud runs the built binary: its stdout, stderr and exit status.
func gpud(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	cmd := exec.Command(gpudBinary(t), args...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		code = ee.ExitCode()
	default:
		t.Fatalf("gpud %q: %v", args, err)
	}
	return o.String(), e.String(), code
}

// TestBinaryHelpEveryCommand: -h and --help, on every command and
// wherever they stand, print that command's usage with its flags on
// stdout and exit 0 (`gpud monitor -h` used to fail).
func TestBinaryHelpEveryCommand(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want []string // in the usage
	}{
		{[]string{"run"}, []string{"gpud run [flags]", "--idle-after duration", "--default-priority unmanaged|low|high", "GPUD_<FLAG>"}},
		{[]string{"status"}, []string{"gpud status [flags]", "-o, --output", "table, wide, json or yaml", "--watch duration", "--state-file"}},
		{[]string{"explain"}, []string{"gpud explain PID", "--pid int", "--control-socket", "text, json or yaml"}},
		{[]string{"monitor"}, []string{"gpud monitor on|off", "--control-socket"}},
		{[]string{"monitor", "on"}, []string{"gpud monitor on|off", "--control-socket"}},
		{[]string{"version"}, []string{"gpud version"}},
		{[]string{"uninstall"}, []string{"gpud uninstall [flags]", "--host-root", "--keep-records", "--daemonset", "--check"}},
		{[]string{"completion"}, []string{"bash", "zsh"}},
		{[]string{"completion", "bash"}, []string{"gpud completion bash"}},
		{nil, []string{"run", "status", "explain", "monitor", "completion", "Flags go anywhere"}},
	} {
		for _, h := range []string{"-h", "--help"} {
			args := append(append([]string{}, tc.args...), h)
			out, errOut, code := gpud(t, args...)
			if code != 0 || errOut != "" {
				t.Errorf("gpud %q: exit %d, stderr %q", args, code, errOut)
				continue
			}
			for _, w := range append([]string{"Usage:"}, tc.want...) {
				if !strings.Contains(out, w) {
					t.Errorf("gpud %q: usage lacks %q:\n%s", args, w, out)
				}
			}
		}
	}
	// help COMMAND is the same usage.
	if out, _, code := gpud(t, "help", "monitor"); code != 0 || !strings.Contains(out, "gpud monitor on|off") {
		t.Errorf("gpud help monitor: exit %d\n%s", code, out)
	}
}

// fakeControl serves gpud's control API on a unix socket, recording the
// requests.
func fakeControl(t *testing.T) (socket string, got func() []string) {
	t.Helper()
	socket = filepath.Join(t.TempDir(), "gpud.sock")
	ln, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var reqs []string
	srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		reqs = append(reqs, r.Method+" "+r.URL.String())
		mu.Unlock()
		switch r.URL.Path {
		case "/v1/monitoring":
			w.Write([]byte("monitoring " + map[string]string{"true": "on", "false": "off"}[r.URL.Query().Get("on")] + "\n"))
		case "/v1/explain":
			w.Header().Set("Content-Type", "application/json")
			w.Write([]byte(`{"pid":42,"comm":"python","priority":"low","reason":"label","enforcing":true,"monitoring":true,"gpus":[]}`))
		default:
			http.NotFound(w, r)
		}
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return socket, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), reqs...)
	}
}

// TestBinaryFlagsAnywhere: flags before or after a command's argument,
// in --name, --name=value or Go's old -name form; a bad one is a one-line
// usage error (exit 2), as is an unknown command or a missing argument.
func TestBinaryFlagsAnywhere(t *testing.T) {
	socket, got := fakeControl(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"monitor", "on", "--control-socket", socket}, "monitoring on\n"},
		{[]string{"monitor", "--control-socket", socket, "off"}, "monitoring off\n"},
		{[]string{"monitor", "--control-socket=" + socket, "on"}, "monitoring on\n"},
		{[]string{"monitor", "off", "-control-socket", socket}, "monitoring off\n"},
	} {
		out, errOut, code := gpud(t, tc.args...)
		if code != 0 || out != tc.want {
			t.Errorf("gpud %q: exit %d, stdout %q, stderr %q; want %q", tc.args, code, out, errOut, tc.want)
		}
	}
	if r := got(); len(r) != 4 || r[0] != "POST /v1/monitoring?on=true" || r[1] != "POST /v1/monitoring?on=false" {
		t.Errorf("requests: %q", r)
	}
	out, errOut, code := gpud(t, "explain", "-o", "json", "--pid", "42", "--control-socket", socket)
	if code != 0 || !strings.Contains(out, `"comm": "python"`) {
		t.Errorf("explain: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	out, errOut, code = gpud(t, "explain", "--pid=42", "--control-socket", socket, "--output", "yaml")
	if code != 0 || !strings.Contains(out, "comm: python\n") {
		t.Errorf("explain -o yaml: exit %d, stdout %q, stderr %q", code, out, errOut)
	}

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"monitor", "maybe", "--control-socket", socket}, `gpud: monitor: "maybe": want on or off`},
		{[]string{"monitor", "--control-socket", socket}, `gpud: monitor: want on or off`},
		{[]string{"monitor", "on", "--control-sock", socket}, `gpud: monitor: unknown flag: --control-sock`},
		{[]string{"status", "-o", "xml"}, `gpud: status: -o "xml": want table, wide, json or yaml`},
		{[]string{"status", "--watch", "soon"}, `gpud: status: invalid argument "soon" for "--watch" flag: time: invalid duration "soon"`},
		{[]string{"status", "extra"}, `gpud: status: unexpected argument "extra"`},
		{[]string{"bogus"}, `gpud: unknown command "bogus" for "gpud"`},
		{[]string{"explain", "--control-socket", socket}, `gpud: explain: a PID is required (gpud explain PID)`},
		{[]string{"run", "--idle-after", "5x"}, `gpud: run: idle-after (flag --idle-after): invalid duration "5x" (want e.g. 30s, 5m or 1h)`},
		{[]string{"run", "extra"}, `gpud: run: unexpected argument "extra"`},
	} {
		out, errOut, code := gpud(t, tc.args...)
		if code != 2 || errOut != tc.want+"\n" || out != "" {
			t.Errorf("gpud %q: exit %d, stdout %q, stderr %q; want exit 2 and %q", tc.args, code, out, errOut, tc.want)
		}
	}
	if len(got()) != 6 { // the four monitor and two explain calls above
		t.Errorf("a refused command reached the daemon: %q", got())
	}
	// No command at all: the usage on stderr, exit 2.
	if out, errOut, code := gpud(t); code != 2 || out != "" || !strings.Contains(errOut, "Usage:") {
		t.Errorf("gpud: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	if out, _, code := gpud(t, "--version"); code != 0 || out != "gpud dev\n" {
		t.Errorf("gpud --version: %d %q", code, out)
	}
	if out, _, code := gpud(t, "version"); code != 0 || !strings.HasPrefix(out, "gpud dev\n  commit: ") { // in full: TestVersionOutputs
		t.Errorf("gpud version: %d %q", code, out)
	}
}

const stateDoc = `{
  "version": 1, "node": "gpu-node-7", "updated_at": "2025-03-01T12:00:00Z", "monitoring": true, "enforcing": true,
  "gpus": [
    {"index": 0, "uuid": "GPU-6f0e7c56-5bd8-4c38-9b1d-6c44e6f3b0a1", "device": "/dev/nvidia0", "state": "busy",
     "idle_since": null, "owner": "", "borrower": "",
     "holders": [
       {"pid": 4242, "comm": "python", "cgroup_id": 77, "container_id": "3f1c2d4e5b6a7980a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718",
        "pod_uid": "1a2b3c4d-0000-1111-2222-333344445555", "priority": "low", "opened_at": "2025-03-01T11:00:00Z", "fds": 2,
        "namespace": "team-a", "pod": "trainer-0", "container": "worker"},
       {"pid": 4343, "comm": "tritonserver", "cgroup_id": 78, "container_id": "9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b3a2f1e0d9c8b7a6f5e4d3c2b1a0f9e8d",
        "pod_uid": "", "priority": "high", "opened_at": "2025-03-01T11:30:00Z", "fds": 1,
        "container": "triton-inference-server-with-a-long-name"},
       {"pid": 4444, "comm": "old", "cgroup_id": 79, "container_id": "",
        "pod_uid": "5b6c7d8e-0000-1111-2222-333344445555", "priority": "low", "opened_at": "2025-03-01T11:30:00Z", "fds": 1}
     ]}
  ],
  "preemptions": []
}
`

func writeState(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "state.json")
	if err := os.WriteFile(p, []byte(stateDoc), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestBinaryStatusOutputs: -o table shows pods as namespace/name and
// containers by name within 80 columns; -o wide has every name whole, the
// pod's container and the GPU's UUID; -o json is the state file and -o
// yaml the same document, key for key.
func TestBinaryStatusOutputs(t *testing.T) {
	state := writeState(t)
	out, errOut, code := gpud(t, "status", "--state-file", state)
	if code != 0 {
		t.Fatalf("table: exit %d: %s", code, errOut)
	}
	for _, want := range []string{"team-a/trainer-0", "ctr/triton-inferenc…", "pod/5b6c7d8e-000"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	for _, l := range strings.Split(out, "\n") {
		if n := len([]rune(l)); n > 80 {
			t.Errorf("table line of %d columns: %q", n, l)
		}
	}

	out, errOut, code = gpud(t, "status", "-o", "wide", "--state-file", state)
	if code != 0 {
		t.Fatalf("wide: exit %d: %s", code, errOut)
	}
	for _, want := range []string{"team-a/trainer-0", "worker", "ctr/triton-inference-server-with-a-long-name",
		"pod/5b6c7d8e-0000-1111-2222-333344445555", "GPU-6f0e7c56-5bd8-4c38-9b1d-6c44e6f3b0a1", "UUID", "FDS"} {
		if !strings.Contains(out, want) {
			t.Errorf("wide lacks %q:\n%s", want, out)
		}
	}

	var fromJSON, fromYAML, orig any
	if err := json.Unmarshal([]byte(stateDoc), &orig); err != nil {
		t.Fatal(err)
	}
	// Flags after the state file, and --o (Go's old spelling) too.
	out, errOut, code = gpud(t, "status", "--state-file", state, "--o", "json")
	if code != 0 {
		t.Fatalf("json: exit %d: %s", code, errOut)
	}
	if err := json.Unmarshal([]byte(out), &fromJSON); err != nil {
		t.Fatalf("-o json: %v\n%s", err, out)
	}
	if !reflect.DeepEqual(fromJSON, orig) {
		t.Errorf("-o json differs from the state file:\n%s", out)
	}
	out, errOut, code = gpud(t, "status", "--output=yaml", "--state-file", state)
	if code != 0 {
		t.Fatalf("yaml: exit %d: %s", code, errOut)
	}
	if err := yaml.Unmarshal([]byte(out), &fromYAML); err != nil {
		t.Fatalf("-o yaml: %v\n%s", err, out)
	}
	// YAML reads timestamps, ints and nulls as its own types: compare
	// through JSON, as a script would.
	b, err := json.Marshal(fromYAML)
	if err != nil {
		t.Fatal(err)
	}
	var yamlAsJSON any
	json.Unmarshal(b, &yamlAsJSON)
	if !reflect.DeepEqual(yamlAsJSON, orig) {
		t.Errorf("-o yaml differs from the state file:\n%s", out)
	}
	if strings.Contains(out, "{") || !strings.Contains(out, "    - pid: 4242\n") {
		t.Errorf("-o yaml is not block YAML:\n%s", out)
	}
}

// TestBinaryCompletion: `gpud completion bash|zsh` print scripts for the
// shells, and the completions they ask gpud for name the commands, the
// flags and their values.
func TestBinaryCompletion(t *testing.T) {
	for shell, want := range map[string]string{"bash": "complete -o default -F __start_gpud gpud", "zsh": "#compdef gpud"} {
		out, errOut, code := gpud(t, "completion", shell)
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("completion %s: exit %d, stderr %q, script lacks %q", shell, code, errOut, want)
		}
	}
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{""}, []string{"run", "status", "explain", "monitor", "version", "completion"}},
		{[]string{"monitor", ""}, []string{"on", "off"}},
		{[]string{"status", "-o", ""}, []string{"table", "wide", "json", "yaml"}},
		{[]string{"status", "--"}, []string{"--output", "--watch", "--state-file"}},
		{[]string{"run", "--idle"}, []string{"--idle-after"}},
		{[]string{"run", "--default-priority", ""}, []string{"unmanaged", "low", "high"}},
	} {
		out, errOut, code := gpud(t, append([]string{"__complete"}, tc.args...)...)
		if code != 0 {
			t.Errorf("__complete %q: exit %d: %s", tc.args, code, errOut)
			continue
		}
		var got []string
		for _, l := range strings.Split(out, "\n") {
			if l != "" && !strings.HasPrefix(l, ":") {
				got = append(got, strings.SplitN(l, "\t", 2)[0])
			}
		}
		for _, w := range tc.want {
			if !strings.Contains(" "+strings.Join(got, " ")+" ", " "+w+" ") {
				t.Errorf("__complete %q = %q, lacks %q", tc.args, got, w)
			}
		}
	}
}

// TestBinaryUninstall: `gpud uninstall` on a node (here a directory seen
// as the node's /) removes gpud's files; --check says what is left, with
// exit status 1, then nothing.
func TestBinaryUninstall(t *testing.T) {
	testutil.RequireRoot(t) // safefs trusts only root's directories
	root := t.TempDir()
	if err := os.Chmod(root, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"run/gpud/state.json", "var/lib/gpud/preemptions.jsonl"} {
		if err := os.MkdirAll(filepath.Join(root, filepath.Dir(f)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, f), []byte("{}"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	flags := []string{"--host-root", root, "--bpf-pin-dir="}
	if _, errOut, code := gpud(t, append([]string{"uninstall", "--check"}, flags...)...); code != 1 || !strings.Contains(errOut, "/run/gpud/state.json") {
		t.Errorf("--check with a state file: exit %d, %s", code, errOut)
	}
	if _, errOut, code := gpud(t, append([]string{"uninstall"}, flags...)...); code != 0 {
		t.Fatalf("uninstall: exit %d, %s", code, errOut)
	}
	for _, d := range []string{"run/gpud", "var/lib/gpud"} {
		if _, err := os.Lstat(filepath.Join(root, d)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s left: %v", d, err)
		}
	}
	if _, errOut, code := gpud(t, append([]string{"uninstall", "--check"}, flags...)...); code != 0 {
		t.Errorf("--check after: exit %d, %s", code, errOut)
	}
}
