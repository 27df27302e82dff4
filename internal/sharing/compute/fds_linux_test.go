package compute

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/gpud/gpud/internal/cgroups"
	"github.com/gpud/gpud/internal/testutil"
)

// The Controller's freezer keeps a cgroup's files open between freezes
// and thaws, and a cgroup removed and made again under its name is opened
// again: it is frozen, not left running behind a stale file.
func TestFDFreezerKeepsFilesAndReopens(t *testing.T) {
	testutil.RequireRoot(t)
	dir, pid := freezerCgroup(t, "compute-fd")
	c := Cgroup{Kind: kindOf(dir), Path: dir}
	f := newFDFreezer(CgroupFreezer{})
	t.Cleanup(func() { f.Close() })
	frozen := func() bool {
		fz, err := cgroups.OpenFreezer(c.Kind, c.Path, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer fz.Close()
		ok, err := fz.Frozen()
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	for i := range 3 {
		if err := f.Set(c, true); err != nil {
			t.Fatal(err)
		}
		if p, err := f.Paused(c); err != nil || !p || !frozen() {
			t.Fatalf("freeze %d: paused %v (%v), frozen %v", i, p, err, frozen())
		}
		if err := f.Set(c, false); err != nil {
			t.Fatal(err)
		}
		if p, err := f.Paused(c); err != nil || p || paused(t, dir) {
			t.Fatalf("thaw %d: paused %v (%v)", i, p, err)
		}
	}
	if len(f.open) != 1 {
		t.Fatalf("%d cgroups' files open, want 1", len(f.open))
	}
	old := f.open[c]

	// The cgroup removed and made again: the kept files are stale.
	parent := filepath.Dir(dir)
	move := func(to string) {
		if err := os.WriteFile(filepath.Join(to, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	move(parent)
	if err := os.Remove(dir); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	move(dir)
	if err := f.Set(c, true); err != nil {
		t.Fatal(err)
	}
	if !frozen() {
		t.Fatal("the cgroup made again is not frozen")
	}
	if got := f.open[c]; got == nil || got == old {
		t.Fatal("the stale files were not replaced")
	}
	if err := f.Set(c, false); err != nil || paused(t, dir) {
		t.Fatalf("thaw after reopening: %v, paused %v", err, paused(t, dir))
	}
	f.Close()
	if len(f.open) != 0 {
		t.Errorf("%d cgroups' files open after Close", len(f.open))
	}
}
