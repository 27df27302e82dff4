package cgroups_test

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
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
	t.Cleanup(func() { os.Remove(dir) })
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
