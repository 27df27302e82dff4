//go:build cgo

package nvidia_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/gpud/gpud/internal/nvidia"
	"github.com/gpud/gpud/internal/testutil"
)

// The checkpoint API against the CUDA double, through dlopen as on a real
// node: a driver without it is refused with the reason; a suspend locks and
// checkpoints, a resume restores and unlocks; a lock timeout, a failed
// checkpoint (the process unlocked again) or restore (left FAILED), and a
// lock that never returns (bounded on gpud's side) are errors that say so.
func TestCUDACheckpointAgainstTheDouble(t *testing.T) {
	lib := testutil.NewCUDADouble(t)
	testutil.CUDAScript(t, lib, "driver version=12040\n")
	if _, err := nvidia.OpenCUDACheckpoint(lib); !errors.Is(err, nvidia.ErrNoCheckpoint) || !strings.Contains(err.Error(), "12040") {
		t.Fatalf("an old driver: %v, want ErrNoCheckpoint naming its version", err)
	}
	if _, err := nvidia.OpenCUDACheckpoint(t.TempDir() + "/libcuda.so.1"); err == nil {
		t.Fatal("a missing library opened")
	}
	testutil.CUDAScript(t, lib, `driver version=12080
pid pid=100 lock=ok checkpoint=ok restore=ok
pid pid=101 lock=timeout
pid pid=102 lock=ok checkpoint=fail
pid pid=103 lock=ok checkpoint=ok restore=fail
pid pid=104 lock=hang
`)
	c, err := nvidia.OpenCUDACheckpoint(lib)
	if err != nil {
		t.Fatal(err)
	}
	if c.Driver != 12080 {
		t.Errorf("driver %d", c.Driver)
	}
	state := func(pid int, want string) {
		t.Helper()
		if s, err := c.State(pid); err != nil || s != want {
			t.Fatalf("pid %d: state %q %v, want %s", pid, s, err, want)
		}
	}
	if err := c.Suspend(100, time.Second); err != nil {
		t.Fatal(err)
	}
	state(100, nvidia.CUDACheckpointed)
	if err := c.Resume(100); err != nil {
		t.Fatal(err)
	}
	state(100, nvidia.CUDARunning)

	var ce *nvidia.CUDAError
	if err := c.Suspend(101, time.Second); !errors.As(err, &ce) || !ce.Timeout() {
		t.Fatalf("a lock timeout: %v", err)
	}
	state(101, nvidia.CUDARunning)

	if err := c.Suspend(102, time.Second); err == nil || !strings.Contains(err.Error(), "Checkpoint") {
		t.Fatalf("a failed checkpoint: %v", err)
	}
	state(102, nvidia.CUDAFailed)

	if err := c.Suspend(103, time.Second); err != nil {
		t.Fatal(err)
	}
	if err := c.Resume(103); err == nil || !strings.Contains(err.Error(), "left failed") {
		t.Fatalf("a failed restore: %v, want the FAILED state said", err)
	}

	start := time.Now()
	if err := c.Suspend(104, 100*time.Millisecond); !errors.Is(err, nvidia.ErrLockHung) {
		t.Fatalf("a hung lock: %v", err)
	}
	if d := time.Since(start); d > 30*time.Second {
		t.Errorf("a hung lock took %s to give up", d)
	}

	if _, err := c.State(999); err == nil {
		t.Error("a process the driver does not know has a state")
	}
}

// Two libraries loaded one after the other through LoadCUDACheckpoint
// (each through /proc/self/fd/N, as gpud loads a library it checked): the
// second is the second file, not the first again. The dynamic loader knows
// a loaded library by the name it was loaded under, so with the first's
// descriptor closed and its number reused, dlopen gave back the first
// library (the daemon tests' second CUDA double said "no checkpoint API",
// the first one's script being gone).
func TestCUDACheckpointLoadedThroughAReusedFD(t *testing.T) {
	old := testutil.NewCUDADouble(t)
	testutil.CUDAScript(t, old, "driver version=12040\n")
	if _, err := nvidia.LoadCUDACheckpoint(nvidia.Load{Library: old, DriverRoot: "/"}); !errors.Is(err, nvidia.ErrNoCheckpoint) {
		t.Fatalf("the first library (driver 12040): %v, want ErrNoCheckpoint", err)
	}
	lib := testutil.NewCUDADouble(t)
	testutil.CUDAScript(t, lib, "driver version=12080\n")
	c, err := nvidia.LoadCUDACheckpoint(nvidia.Load{Library: lib, DriverRoot: "/"})
	if err != nil {
		t.Fatalf("the second library (driver 12080): %v", err)
	}
	if c.Driver != 12080 {
		t.Fatalf("the second library says driver %d, want 12080 (the first one loaded again?)", c.Driver)
	}
}
