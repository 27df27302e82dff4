package cgroups_test

import (
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gpud/gpud/internal/cgroups"
	"github.com/gpud/gpud/internal/testutil"
)

// freezeThaw freezes a counting process through f, checks that it stops
// counting, thaws it and checks that it counts on from where it stopped.
func freezeThaw(t *testing.T, f *cgroups.Freezer, file string) {
	t.Helper()
	testutil.Eventually(t, 5*time.Second, "the counter counts", func() bool { return testutil.Counted(file) > 3 })
	if paused, err := f.Paused(); err != nil || paused {
		t.Fatalf("Paused before the freeze: %v %v", paused, err)
	}
	if err := f.Freeze(); err != nil {
		t.Fatal(err)
	}
	if err := f.WaitFrozen(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	if paused, err := f.Paused(); err != nil || !paused {
		t.Fatalf("Paused while frozen: %v %v", paused, err)
	}
	at := testutil.Counted(file)
	time.Sleep(300 * time.Millisecond) // 30 counts if it were running
	if n := testutil.Counted(file); n != at {
		t.Fatalf("counted from %d to %d while frozen", at, n)
	}
	if err := f.Thaw(); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 5*time.Second, "the counter counts on", func() bool { return testutil.Counted(file) > at+3 })
	if frozen, err := f.Frozen(); err != nil || frozen {
		t.Fatalf("Frozen after the thaw: %v %v", frozen, err)
	}
}

func TestFreezerV2(t *testing.T) {
	testutil.RequireRoot(t)
	root, _, err := cgroups.V2Root()
	if err != nil {
		testutil.Skip(t, err.Error())
	}
	parent, pid := testutil.Cgroup(t, "fz")
	dir := filepath.Join(parent, "ctr")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "count")
	cmd := testutil.StartCounter(t, file, "", func(p int) { testutil.JoinCgroup(t, dir, p) })
	// The workload is the parent (a pod over its container).
	f, err := cgroups.WorkloadFreezer("/proc", root, cmd.Process.Pid, pid)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if f.Kind != cgroups.FreezerV2 || f.Path != parent {
		t.Fatalf("freezer %s %s, want %s %s", f.Kind, f.Path, cgroups.FreezerV2, parent)
	}
	freezeThaw(t, f, file)
	// A cgroup that is not an ancestor.
	_, other := testutil.Cgroup(t, "other")
	if _, err := cgroups.WorkloadFreezer("/proc", root, cmd.Process.Pid, other); !errors.Is(err, cgroups.ErrCgroupMoved) {
		t.Fatalf("foreign workload cgroup: %v", err)
	}
}

// The v1 freezer controller, as runc (docker pause) uses it on a hybrid
// host; the test's process is in a v2 cgroup and a v1 freezer cgroup.
func TestFreezerV1(t *testing.T) {
	testutil.RequireRoot(t)
	root, _, err := cgroups.V2Root()
	if err != nil {
		testutil.Skip(t, err.Error())
	}
	v1dir := testutil.V1FreezerCgroup(t, "fz")
	v2dir, id := testutil.Cgroup(t, "fz1")
	file := filepath.Join(t.TempDir(), "count")
	cmd := testutil.StartCounter(t, file, "", func(p int) {
		testutil.JoinCgroup(t, v2dir, p)
		if err := os.WriteFile(filepath.Join(v1dir, "cgroup.procs"), []byte(strconv.Itoa(p)), 0o644); err != nil {
			t.Fatal(err)
		}
	})
	f, err := cgroups.WorkloadFreezer("/proc", root, cmd.Process.Pid, id)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if f.Kind != cgroups.FreezerV1 || f.Path != v1dir {
		t.Fatalf("freezer %s %s, want %s %s", f.Kind, f.Path, cgroups.FreezerV1, v1dir)
	}
	freezeThaw(t, f, file)
}

// A Freezer holds its directory: one removed and made again under the
// same name is not frozen through it.
func TestFreezerRecreatedCgroup(t *testing.T) {
	testutil.RequireRoot(t)
	dir, id := testutil.Cgroup(t, "fzre")
	f, err := cgroups.OpenFreezer(cgroups.FreezerV2, dir, id)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := os.Remove(dir); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := f.Freeze(); err == nil {
		t.Fatal("froze through a removed cgroup's directory")
	}
	b, _ := os.ReadFile(filepath.Join(dir, "cgroup.freeze"))
	if string(b) != "0\n" {
		t.Fatalf("the new cgroup's cgroup.freeze: %q", b)
	}
	if _, err := cgroups.OpenFreezer(cgroups.FreezerV2, dir, id); !errors.Is(err, cgroups.ErrCgroupMoved) {
		t.Fatalf("opening by the old id: %v", err)
	}
}

// WaitFrozenOnThread waits as WaitFrozen does (frozen: nil; not in time:
// ErrFreezeTimeout) but keeps the caller's P while it waits: with one P, a
// runnable goroutine beside it does not run until the wait is over (the
// preemption's real-time thread gets no Go scheduler between the freeze's
// notification and its record). (WaitFrozen, in ordinary system calls,
// lets it run when the runtime's monitor catches one of its waits: not
// in every try, so not checked here.)
func TestWaitFrozenOnThreadKeepsThePAndWaits(t *testing.T) {
	testutil.RequireRoot(t)
	dir, _ := testutil.Cgroup(t, "fzrt")
	file := filepath.Join(t.TempDir(), "count")
	testutil.StartCounter(t, file, "", func(p int) { testutil.JoinCgroup(t, dir, p) })
	f, err := cgroups.OpenFreezer(cgroups.FreezerV2, dir, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()

	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var spun atomic.Int64
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		for {
			select {
			case <-stop:
				return
			default:
				spun.Add(1)
			}
		}
	}()
	// The spinner runs while this goroutine sleeps in the runtime; the
	// P comes back with a fresh time slice. The runtime still preempts a
	// goroutine that ran 10 ms (a wait on a slow machine may cross that
	// mark): the P kept in one try of five.
	kept := false
	for try := 0; try < 5 && !kept; try++ {
		time.Sleep(time.Millisecond)
		before := spun.Load()
		err = f.WaitFrozenOnThread(2*time.Millisecond, 50*time.Microsecond)
		kept = spun.Load() == before
		if !errors.Is(err, cgroups.ErrFreezeTimeout) {
			t.Fatalf("WaitFrozenOnThread on a thawed cgroup: %v, want ErrFreezeTimeout", err)
		}
	}
	if !kept {
		t.Fatal("another goroutine ran while WaitFrozenOnThread waited, in 5 tries of 5: the P was handed away")
	}

	if err := f.Freeze(); err != nil {
		t.Fatal(err)
	}
	// Thawed before f is closed (deferred above: it runs first), or the
	// counter's children would stay frozen after the test.
	defer f.Thaw()
	if err := f.WaitFrozenOnThread(5*time.Second, 50*time.Microsecond); err != nil {
		t.Fatalf("WaitFrozenOnThread after a freeze: %v", err)
	}
	if frozen, err := f.Frozen(); err != nil || !frozen {
		t.Fatalf("Frozen after WaitFrozenOnThread: %v %v", frozen, err)
	}
}
