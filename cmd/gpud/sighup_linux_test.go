package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "github.com/gpud/gpud/api/v1"

	"github.com/gpud/gpud/internal/occupancy"
	"github.com/gpud/gpud/internal/testutil"
)

// The real binary: settings from the file and the environment, SIGHUP
// applies a changed idle-after and default priority, warns about a setting
// that needs a restart, and survives a bad file; gpud explain and gpud
// status talk to it.
func TestBinarySIGHUPReload(t *testing.T) {
	devDir, gpus := testutil.MakeFakeGPUs(t, 2)
	bin := gpudBinary(t)
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "gpud.yaml")
	stateFile := filepath.Join(dir, "state.json")
	socket := filepath.Join(dir, "gpud.sock")
	writeCfg := func(s string) {
		t.Helper()
		if err := os.WriteFile(cfgPath, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	writeCfg("version: v1\nidle-after: 1h\ndefault-priority: unmanaged\nreclaim: none\n")

	// A process in an unknown container holding GPU 0 (from before gpud:
	// found by the start-up scan).
	cg, _, _ := testutil.ContainerCgroup(t)
	holder := exec.Command("sh", "-c", fmt.Sprintf("echo $$ > %s/cgroup.procs && exec 3<>%s && exec sleep 600", cg, gpus[0].Path))
	holder.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { holder.Process.Kill(); holder.Wait() })
	pid := holder.Process.Pid
	deadline := time.Now().Add(5 * time.Second)
	for {
		if link, _ := os.Readlink(fmt.Sprintf("/proc/%d/fd/3", pid)); link == gpus[0].Path {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the holder never opened the fake GPU")
		}
		time.Sleep(10 * time.Millisecond)
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	metricsAddr := ln.Addr().String()
	ln.Close()
	d := exec.Command(bin, "run", "--dev-dir", devDir, "--state-file", stateFile, "--state-dir", dir,
		"--control-socket", socket, "--checkpoint-root", filepath.Join(dir, "ckpt"), "--metrics-addr", metricsAddr,
		"--docker-host", "none", "--cri-endpoint", "none", "--nvml", "off", "--node-name", "sighup-test",
		"--bpf-pin-dir", "") // the gate goes with the process: nothing left pinned if the test fails
	d.Env = append(os.Environ(), "GPUD_CONFIG="+cfgPath, "GPUD_PREEMPT_GRACE=1s", "KUBERNETES_SERVICE_HOST=")
	logs := &testutil.Buffer{}
	d.Stderr = logs
	if err := d.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- d.Wait() }()
	t.Cleanup(func() {
		d.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			d.Process.Kill()
		}
		if t.Failed() {
			t.Logf("gpud's log:\n%s", logs.String())
		}
	})

	testutil.WaitStateFile(t, stateFile, 10*time.Second, func(f *v1.StateFile) bool {
		return f.Node == "sighup-test" && testutil.HolderPriority(f, 0, pid) == occupancy.Unmanaged && f.GPUs[0].State == occupancy.Busy
	})
	hup := func() {
		t.Helper()
		if err := d.Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
	}
	logLines := func(msg string) []map[string]any {
		var out []map[string]any
		for _, l := range strings.Split(logs.String(), "\n") {
			var m map[string]any
			if json.Unmarshal([]byte(l), &m) == nil && m["msg"] == msg {
				out = append(out, m)
			}
		}
		return out
	}
	waitLog := func(msg string, n int) map[string]any {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			if l := logLines(msg); len(l) >= n {
				return l[n-1]
			}
			if time.Now().After(deadline) {
				t.Fatalf("no log %q (#%d)", msg, n)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}

	// Reload: the holder becomes low at once, GPU 0 idle within a second or two.
	writeCfg("version: v1\nidle-after: 1s\ndefault-priority: low\nreclaim: stop\n")
	hup()
	f := testutil.WaitStateFile(t, stateFile, 10*time.Second, func(f *v1.StateFile) bool {
		return testutil.HolderPriority(f, 0, pid) == occupancy.Low && f.GPUs[0].State == occupancy.Idle
	})
	if f.GPUs[0].IdleSince == nil {
		t.Error("idle without idle_since")
	}
	if w := waitLog("reload: these settings changed but take effect only after a restart", 1); fmt.Sprint(w["keys"]) != "[reclaim]" {
		t.Errorf("restart warning: %v", w)
	}
	if l := waitLog("reload: done", 1); fmt.Sprint(l["changed"]) != "[default-priority idle-after]" {
		t.Errorf("reload log: %v", l)
	}

	// gpud explain through the control socket.
	out, err := exec.Command(bin, "explain", "--control-socket", socket, "--pid", strconv.Itoa(pid)).CombinedOutput()
	if err != nil {
		t.Fatalf("gpud explain: %v\n%s", err, out)
	}
	for _, want := range []string{fmt.Sprintf("pid %d (sleep)", pid), "priority low: a container gpud does not know: --default-priority (low)",
		"holds GPU 0", "open of GPU 0: allow (rule: free: allow)", "open of GPU 1: allow (rule: free: allow)"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("gpud explain lacks %q:\n%s", want, out)
		}
	}
	out, err = exec.Command(bin, "explain", "--control-socket", socket, "--pid", strconv.Itoa(pid), "-o", "json").Output()
	var ex v1.Explanation
	if err != nil || json.Unmarshal(out, &ex) != nil || ex.Priority != occupancy.Low || ex.ContainerID == "" {
		t.Errorf("gpud explain -o json: %v %s", err, out)
	}
	cmd := exec.Command(bin, "explain", "--control-socket", socket, "--pid", "1073741824")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	var ee *exec.ExitError
	if err := cmd.Run(); !errors.As(err, &ee) || ee.ExitCode() != 1 ||
		stderr.String() != "gpud: explain: no process 1073741824 (on this node, in gpud's PID namespace)\n" {
		t.Errorf("explain of no process: %v %q", err, stderr.String())
	}
	// gpud status reads the same state.
	out, err = exec.Command(bin, "status", "--state-file", stateFile).Output()
	if err != nil || !strings.Contains(string(out), "0   idle ") || !strings.Contains(string(out), strconv.Itoa(pid)) {
		t.Errorf("gpud status: %v\n%s", err, out)
	}

	// A bad file: an error logged, gpud keeps running with what it had.
	writeCfg("version: v1\nidle-after: 1h\ndefault-priority: top\n")
	hup()
	if l := waitLog("reload: bad settings; the running ones stay", 1); !strings.Contains(fmt.Sprint(l["error"]), "default-priority (file "+cfgPath+":3)") {
		t.Errorf("bad reload log: %v", l)
	}
	time.Sleep(300 * time.Millisecond)
	select {
	case err := <-exited:
		t.Fatalf("gpud exited after a bad reload: %v", err)
	default:
	}
	if f, _ := occupancy.ReadStateFile(stateFile); testutil.HolderPriority(f, 0, pid) != occupancy.Low {
		t.Errorf("a bad reload changed the class")
	}
	// and counts it, for an alert on a node whose reloads stopped taking.
	var body string
	if !testutil.Poll(10*time.Second, func() bool {
		_, body, _ = testutil.HTTPGet("http://" + metricsAddr + "/metrics")
		return strings.Contains(body, "\ngpud_config_reloads_refused_total 1\n")
	}) {
		t.Errorf("/metrics lacks gpud_config_reloads_refused_total 1:\n%s", body)
	}
	// Monitoring off from the file.
	writeCfg("version: v1\nidle-after: 1s\ndefault-priority: low\nmonitoring: false\n")
	hup()
	testutil.WaitStateFile(t, stateFile, 10*time.Second, func(f *v1.StateFile) bool { return !f.Monitoring })

	if err := d.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Errorf("gpud exit: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Error("gpud did not stop on SIGTERM")
	}
}
