package main

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "github.com/gpud/gpud/api/v1"
	"github.com/gpud/gpud/internal/testutil"
	"golang.org/x/sys/unix"
)

// waitingGpud starts the binary on devDir with a metrics port; it returns
// the process, its log, the port's base URL and its exit channel.
func waitingGpud(t *testing.T, devDir, stateFile string) (*exec.Cmd, *testutil.Buffer, string, chan error) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	dir := filepath.Dir(stateFile)
	d := exec.Command(gpudBinary(t), "run", "--dev-dir", devDir, "--state-file", stateFile, "--state-dir", dir,
		"--control-socket", "", "--checkpoint-root", filepath.Join(dir, "ckpt"), "--metrics-addr", addr,
		"--docker-host", "none", "--cri-endpoint", "none", "--nri-socket", "none", "--nvml", "off",
		"--node-name", "wait-test", "--default-priority", "unmanaged", "--bpf-pin-dir", "")
	d.Env = append(os.Environ(), "KUBERNETES_SERVICE_HOST=")
	logs := &testutil.Buffer{}
	d.Stderr = logs
	if err := d.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	done := make(chan struct{})
	go func() { exited <- d.Wait(); close(done) }()
	t.Cleanup(func() {
		d.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			d.Process.Kill()
		}
		if t.Failed() {
			t.Logf("gpud's log:\n%s", logs.String())
		}
	})
	return d, logs, "http://" + addr, exited
}

func httpCode(url string) int {
	code, _, _ := testutil.HTTPGet(url)
	return code
}

// A node whose driver is still being installed: gpud started before any
// /dev/nvidiaN exists waits (alive, not ready, says why once) instead of
// exiting; when the first GPU node appears it starts and watches it; when
// another appears later it starts again on both, finding the holder it
// already had; SIGTERM at any point ends it cleanly.
func TestBinaryWaitsForGPUs(t *testing.T) {
	testutil.RequireRoot(t)
	devDir := t.TempDir()
	stateFile := filepath.Join(t.TempDir(), "state.json")
	d, logs, base, exited := waitingGpud(t, devDir, stateFile)

	testutil.Eventually(t, 10*time.Second, "/healthz answering while waiting", func() bool { return httpCode(base+"/healthz") == 200 })
	time.Sleep(500 * time.Millisecond)
	select {
	case err := <-exited:
		t.Fatalf("gpud exited with no GPU node (%v), want it to wait", err)
	default:
	}
	if c := httpCode(base + "/readyz"); c != 503 {
		t.Errorf("/readyz while waiting: %d, want 503", c)
	}
	if n := strings.Count(logs.String(), "no GPU device nodes yet"); n != 1 {
		t.Errorf("the wait is logged %d times, want once", n)
	}
	if _, err := os.Stat(stateFile); err == nil {
		t.Error("a state file before any GPU")
	}

	gpu0 := filepath.Join(devDir, "nvidia0")
	if err := unix.Mknod(gpu0, unix.S_IFCHR|0o666, int(unix.Mkdev(1, 7))); err != nil {
		t.Fatal(err)
	}
	testutil.WaitStateFile(t, stateFile, 15*time.Second, func(f *v1.StateFile) bool { return len(f.GPUs) == 1 })
	testutil.Eventually(t, 10*time.Second, "/readyz 200 once started", func() bool { return httpCode(base+"/readyz") == 200 })

	// A holder after the start: the observers see it.
	holder := exec.Command("sh", "-c", fmt.Sprintf("exec 3<>%s; exec sleep 600", gpu0))
	holder.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { holder.Process.Kill(); holder.Wait() })
	pid := holder.Process.Pid
	testutil.WaitStateFile(t, stateFile, 10*time.Second, func(f *v1.StateFile) bool { return testutil.HolderPriority(f, 0, pid) != "" })

	// A second GPU appears: a new start on both GPUs, the holder kept.
	if err := unix.Mknod(filepath.Join(devDir, "nvidia1"), unix.S_IFCHR|0o666, int(unix.Mkdev(10, 229))); err != nil {
		t.Fatal(err)
	}
	testutil.WaitStateFile(t, stateFile, 20*time.Second, func(f *v1.StateFile) bool {
		return len(f.GPUs) == 2 && testutil.HolderPriority(f, 0, pid) != ""
	})
	if !strings.Contains(logs.String(), "the GPU device nodes changed") {
		t.Error("no log line for the changed GPU set")
	}
	stopGpud(t, d, exited, 10*time.Second, "after the GPU set changed")
}

// SIGTERM while waiting for GPUs: a clean exit, at once.
func TestBinaryStopWhileWaitingForGPUs(t *testing.T) {
	testutil.RequireRoot(t)
	d, logs, base, exited := waitingGpud(t, t.TempDir(), filepath.Join(t.TempDir(), "state.json"))
	testutil.Eventually(t, 10*time.Second, "/healthz answering while waiting", func() bool { return httpCode(base+"/healthz") == 200 })
	stopGpud(t, d, exited, 5*time.Second, "while waiting")
	if !strings.Contains(logs.String(), "stopped while waiting for GPU device nodes") {
		t.Errorf("no stop line in the log")
	}
}

// stopGpud sends SIGTERM and wants a clean exit within limit.
func stopGpud(t *testing.T, d *exec.Cmd, exited <-chan error, limit time.Duration, when string) {
	t.Helper()
	d.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-exited:
		if err != nil {
			t.Errorf("exit after SIGTERM %s: %v, want 0", when, err)
		}
	case <-time.After(limit):
		t.Fatalf("gpud did not stop within %s of SIGTERM %s", limit, when)
	}
}
