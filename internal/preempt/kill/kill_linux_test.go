package kill

import (
	"errors"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/gpud/gpud/internal/occupancy"
	"github.com/gpud/gpud/internal/testutil"
)

func startSleep(t *testing.T, script string) (*exec.Cmd, occupancy.ProcInfo) {
	t.Helper()
	cmd := exec.Command("sh", "-c", script)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	st, err := occupancy.StartTime("/proc", cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	return cmd, occupancy.ProcInfo{PID: cmd.Process.Pid, StartTime: st, PidfdIno: occupancy.PidfdIno(cmd.Process.Pid)}
}

func TestKillConfirmsDeath(t *testing.T) {
	cmd, v := startSleep(t, "exec sleep 600")
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	sig, err := Kill("/proc", v, 0)
	if err != nil || sig != "SIGKILL" {
		t.Fatalf("Kill = %q, %v", sig, err)
	}
	select {
	case err := <-done:
		if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || ws.Signal() != syscall.SIGKILL {
			t.Fatalf("exit: %v", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("not dead after Kill returned")
	}
}

func TestKillGraceLetsTermHandlerRun(t *testing.T) {
	dir := t.TempDir()
	mark := dir + "/saved"
	_, v := startSleep(t, "trap 'touch "+mark+"; exit 0' TERM; sleep 600 & wait")
	time.Sleep(100 * time.Millisecond) // the trap is set
	sig, err := Kill("/proc", v, 2*time.Second)
	if err != nil || sig != "SIGTERM" {
		t.Fatalf("Kill = %q, %v; want death by SIGTERM within the grace", sig, err)
	}
	if _, err := os.Stat(mark); err != nil {
		t.Fatal("the TERM handler did not run before death")
	}
}

func TestKillRefusesWhatItCannotIdentify(t *testing.T) {
	_, v := startSleep(t, "exec sleep 600")
	if _, err := Kill("/proc", occupancy.ProcInfo{PID: v.PID}, 0); !errors.Is(err, ErrUnknownIdentity) {
		t.Fatalf("no start time: %v", err)
	}
	if _, err := Kill("/proc", occupancy.ProcInfo{PID: v.PID, StartTime: v.StartTime + 1}, 0); !errors.Is(err, ErrNotSameProcess) {
		t.Fatalf("other start time: %v", err)
	}
	if _, err := Kill("/proc", v, 0, func(int) error { return errors.New("no longer holds the GPU") }); !errors.Is(err, ErrNotSameProcess) {
		t.Fatalf("failed verification: %v", err)
	}
	if err := syscall.Kill(v.PID, 0); err != nil {
		t.Fatal("the process was harmed by a refused kill")
	}
}

// A victim exits and its PID is reused by an innocent process before the
// kill: the innocent process is not signalled. The reuse is real: the
// kernel is told (ns_last_pid) to hand out the victim's PID next, so the
// innocent process usually also has the victim's start time (same clock
// tick): only the pidfs identity tells them apart.
func TestKillPIDReuse(t *testing.T) {
	testutil.RequireRoot(t)
	for attempt := 0; attempt < 50; attempt++ {
		victim, v := startSleep(t, "exec sleep 600")
		victim.Process.Kill()
		victim.Wait()
		if err := os.WriteFile("/proc/sys/kernel/ns_last_pid", []byte(strconv.Itoa(v.PID-1)), 0o644); err != nil {
			testutil.Skip(t, "cannot set ns_last_pid: "+err.Error())
		}
		innocent, iv := startSleep(t, "exec sleep 600")
		if innocent.Process.Pid != v.PID {
			continue // another process took it first; try again
		}
		if v.PidfdIno == 0 {
			testutil.Skip(t, "kernel without pidfs: a PID reused within a clock tick cannot be told apart")
		}
		t.Logf("PID %d reused; start times %d → %d", v.PID, v.StartTime, iv.StartTime)
		_, err := Kill("/proc", v, 0)
		if !errors.Is(err, ErrNotSameProcess) {
			t.Fatalf("Kill of a reused PID: %v, want ErrNotSameProcess", err)
		}
		time.Sleep(50 * time.Millisecond)
		if err := syscall.Kill(innocent.Process.Pid, 0); err != nil {
			t.Fatal("the innocent process holding the reused PID was signalled")
		}
		return
	}
	t.Fatal("could not get the PID reused in 50 attempts")
}

func TestKillGone(t *testing.T) {
	cmd, v := startSleep(t, "exec sleep 600")
	cmd.Process.Kill()
	cmd.Wait()
	if _, err := Kill("/proc", v, 0); !errors.Is(err, ErrGone) {
		t.Fatalf("Kill of an exited process: %v, want ErrGone", err)
	}
}
