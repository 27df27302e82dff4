package uninstall

import (
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/gpud/gpud/internal/preempt"
	"github.com/gpud/gpud/internal/testutil"
)

const nobody = 65534 // another, unprivileged user

// node is a fake node's / (root-owned, as the rule wants) with gpud's files
// where the chart puts them, seen under HostRoot as from a cleaner pod.
func node(t *testing.T) (string, Paths) {
	testutil.RequireRoot(t)
	root := t.TempDir()
	if err := os.Chmod(root, 0o755); err != nil {
		t.Fatal(err)
	}
	p := Paths{
		HostRoot:       root,
		StateFile:      "/run/gpud/state.json",
		ControlSocket:  "/run/gpud/gpud.sock",
		StateDir:       "/var/lib/gpud",
		CheckpointRoot: "/var/lib/gpud/checkpoints",
	}
	for _, f := range []string{p.StateFile, p.ControlSocket, "/var/lib/gpud/" + JournalFile,
		"/var/lib/gpud/checkpoints/task-a/" + preempt.CheckpointFile,
		"/var/lib/gpud/checkpoints/task-b/" + preempt.CheckpointFile} {
		write(t, filepath.Join(root, f))
	}
	return root, p
}

func write(t *testing.T, path string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
}

func exists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}

// Everything gpud wrote goes, and so do its directories.
func TestNodeRemovesGpudsFilesAndDirectories(t *testing.T) {
	root, p := node(t)
	if left := Clean(p); !slices.Equal(left, []string{p.StateFile, p.ControlSocket}) {
		t.Fatalf("Clean before: %v", left)
	}
	if err := Node(p, slog.Default()); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"/run/gpud", "/var/lib/gpud"} {
		if exists(filepath.Join(root, d)) {
			t.Errorf("%s left", d)
		}
	}
	for _, d := range []string{"/run", "/var/lib"} {
		if !exists(filepath.Join(root, d)) {
			t.Errorf("%s removed: not gpud's", d)
		}
	}
	if left := Clean(p); len(left) != 0 {
		t.Errorf("Clean after: %v", left)
	}
	// Twice is fine: a cleaner restarted, or the hook run again.
	if err := Node(p, slog.Default()); err != nil {
		t.Errorf("second run: %v", err)
	}
}

// What gpud did not write stays: a task's own checkpoint, the journal when
// asked, a file planted through a symlink, a directory another user owns.
func TestNodeRemovesOnlyGpudsOwnFiles(t *testing.T) {
	root, p := node(t)
	p.KeepRecords = true
	ckpt := filepath.Join(root, "/var/lib/gpud/checkpoints/task-a/model.ckpt")
	write(t, ckpt)
	// A user's link where the state file was: the link goes, not its target.
	victim := filepath.Join(root, "etc/important")
	write(t, victim)
	sf := filepath.Join(root, p.StateFile)
	os.Remove(sf)
	if err := os.Symlink(victim, sf); err != nil {
		t.Fatal(err)
	}
	// A task directory another user made: not gpud's, left with its file.
	theirs := testutil.MkdirOwned(t, filepath.Join(root, "/var/lib/gpud/checkpoints/task-c"), 0o755, nobody)
	write(t, filepath.Join(theirs, preempt.CheckpointFile))

	if err := Node(p, slog.Default()); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{ckpt, victim, filepath.Join(root, "/var/lib/gpud", JournalFile), filepath.Join(theirs, preempt.CheckpointFile)} {
		if !exists(f) {
			t.Errorf("%s removed", f)
		}
	}
	for _, f := range []string{sf, filepath.Join(root, "/var/lib/gpud/checkpoints/task-a", preempt.CheckpointFile), filepath.Join(root, "/var/lib/gpud/checkpoints/task-b"), filepath.Join(root, "/run/gpud")} {
		if exists(f) {
			t.Errorf("%s left", f)
		}
	}
}

// A directory on the way that another user can change is refused: nothing
// under it is touched.
func TestNodeRefusesADirectoryOthersCanWrite(t *testing.T) {
	root, p := node(t)
	if err := os.Chmod(filepath.Join(root, "/run/gpud"), 0o777); err != nil {
		t.Fatal(err)
	}
	if err := Node(p, slog.Default()); err == nil {
		t.Fatal("no error for a world-writable /run/gpud")
	}
	if !exists(filepath.Join(root, p.StateFile)) {
		t.Error("the state file in a world-writable directory was removed")
	}
}

// Directories that are not gpud's are never removed, even empty.
func TestOwnedDir(t *testing.T) {
	for d, want := range map[string]bool{
		"/": false, "/run": false, "/tmp": false, "/run/gpud": true, "/var/lib/gpud": true,
		"/var/lib/gpud/checkpoints": true, "/data/ckpt": false,
	} {
		if got := ownedDir(d, "/var/lib/gpud"); got != want {
			t.Errorf("ownedDir(%s) = %v, want %v", d, got, want)
		}
	}
}
