package safefs

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpud/gpud/internal/testutil"
	"golang.org/x/sys/unix"
)

const nobody = 65534 // another, unprivileged user

// base returns a root-owned 0755 directory to build cases in (t.TempDir
// is 0700 under the sticky /tmp: an ancestor that passes the rule).
func base(t *testing.T) string {
	testutil.RequireRoot(t)
	d := t.TempDir()
	if err := os.Chmod(d, 0o755); err != nil {
		t.Fatal(err)
	}
	return d
}

// Directories gpud must refuse, and ones it may use.
func TestOpenDirRule(t *testing.T) {
	b := base(t)
	sticky := testutil.MkdirOwned(t, filepath.Join(b, "tmp"), 0o777|os.ModeSticky, 0)
	open := testutil.MkdirOwned(t, filepath.Join(b, "open"), 0o777, 0)
	group := testutil.MkdirOwned(t, filepath.Join(b, "group"), 0o775, 0)
	theirs := testutil.MkdirOwned(t, filepath.Join(b, "theirs"), 0o755, nobody)
	mine := testutil.MkdirOwned(t, filepath.Join(sticky, "mine"), 0o755, 0)
	stickyTheirs := testutil.MkdirOwned(t, filepath.Join(b, "tmp-theirs"), 0o777|os.ModeSticky, nobody)
	testutil.MkdirOwned(t, filepath.Join(stickyTheirs, "in"), 0o755, 0)
	safe := testutil.MkdirOwned(t, filepath.Join(b, "safe"), 0o755, 0)
	if err := os.Symlink(safe, filepath.Join(b, "link")); err != nil { // root's link in a safe dir
		t.Fatal(err)
	}
	planted := filepath.Join(sticky, "planted") // another user's link in the sticky dir
	if err := os.Symlink(safe, planted); err != nil {
		t.Fatal(err)
	}
	if err := os.Lchown(planted, nobody, nobody); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		path string
		ok   bool
		want string // in the error
	}{
		{sticky, false, "writable by other users (mode 1777)"},             // /tmp itself
		{open, false, "writable by other users (mode 0777)"},               // 0777
		{group, false, "writable by other users (mode 0775)"},              // group-writable
		{theirs, false, "owned by uid 65534"},                              // another user's
		{filepath.Join(open, "sub"), false, "not sticky"},                  // under a 0777 dir (created, then refused)
		{filepath.Join(theirs, "sub"), false, "owned by uid 65534"},        // under another user's
		{filepath.Join(stickyTheirs, "in"), false, "owned by uid 65534"},   // sticky but not root's
		{filepath.Join(b, "link", "x"), true, ""},                          // root's symlink, followed
		{filepath.Join(planted, "x"), false, "symlink owned by uid 65534"}, // another user's symlink, not followed
		{mine, true, ""}, // root's dir in a sticky /tmp
		{filepath.Join(mine, "new", "deeper"), true, ""}, // created
		{safe, true, ""},
		{"/", true, ""},
	} {
		d, err := OpenDir(tc.path, 0o755)
		if tc.ok {
			if err != nil {
				t.Errorf("OpenDir(%s): %v", tc.path, err)
				continue
			}
			d.Close()
			continue
		}
		if err == nil {
			d.Close()
			t.Errorf("OpenDir(%s) accepted", tc.path)
			continue
		}
		if !errors.Is(err, ErrUnsafe) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("OpenDir(%s) = %v, want ErrUnsafe with %q", tc.path, err, tc.want)
		}
	}
	// A directory another user slipped in before gpud made it is refused,
	// not used.
	race := testutil.MkdirOwned(t, filepath.Join(sticky, "gpud"), 0o755, nobody)
	if _, err := OpenDir(race, 0o755); !errors.Is(err, ErrUnsafe) {
		t.Errorf("a directory another user made first: %v", err)
	}
}

// Files: a symlink is never written through nor read; a file gpud did not
// write is not read back; WriteFile replaces a planted symlink rather than
// following it.
func TestFilesNeverThroughSymlinks(t *testing.T) {
	b := base(t)
	d, err := OpenDir(filepath.Join(b, "state"), 0o755)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	target := filepath.Join(b, "target")
	if err := os.WriteFile(target, []byte("precious\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"j.jsonl", "s.json"} {
		if err := os.Symlink(target, filepath.Join(d.Path, n)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := d.OpenAppend("j.jsonl", 0o600); !errors.Is(err, ErrUnsafe) || !strings.Contains(err.Error(), "symlink") {
		t.Errorf("OpenAppend through a symlink: %v", err)
	}
	if _, err := d.ReadOwned("s.json", 1<<20); !errors.Is(err, ErrUnsafe) {
		t.Errorf("ReadOwned through a symlink: %v", err)
	}
	if err := d.WriteFile("s.json", []byte("new\n"), 0o644, true); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(target); string(b) != "precious\n" {
		t.Fatalf("the symlink's target was written: %q", b)
	}
	if fi, err := os.Lstat(filepath.Join(d.Path, "s.json")); err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm() != 0o644 {
		t.Fatalf("s.json after WriteFile: %v %v", fi, err)
	}
	// Another user's file, and a file others can write: not read back.
	theirs := filepath.Join(d.Path, "theirs.json")
	os.WriteFile(theirs, []byte("{}"), 0o644)
	os.Chown(theirs, nobody, nobody)
	loose := filepath.Join(d.Path, "loose.json")
	os.WriteFile(loose, []byte("{}"), 0o644)
	os.Chmod(loose, 0o666)
	for _, n := range []string{"theirs.json", "loose.json"} {
		if _, err := d.ReadOwned(n, 1<<20); !errors.Is(err, ErrUnsafe) {
			t.Errorf("ReadOwned(%s): %v, want ErrUnsafe", n, err)
		}
	}
	// A FIFO does not block the open, and is refused.
	if err := mkfifo(filepath.Join(d.Path, "fifo")); err != nil {
		t.Fatal(err)
	}
	if _, err := d.ReadOwned("fifo", 10); !errors.Is(err, ErrUnsafe) {
		t.Errorf("ReadOwned(fifo): %v", err)
	}
	// The task's own directory may be the task's; a symlink in its place is refused.
	if err := os.Symlink(b, filepath.Join(d.Path, "task")); err != nil {
		t.Fatal(err)
	}
	if _, err := d.SubDir("task", 0o755); !errors.Is(err, ErrUnsafe) {
		t.Errorf("SubDir through a symlink: %v", err)
	}
	own := testutil.MkdirOwned(t, filepath.Join(d.Path, "task2"), 0o755, nobody)
	sd, err := d.SubDir("task2", 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, filepath.Join(own, "notice")); err != nil {
		t.Fatal(err)
	}
	if err := sd.WriteFile("notice", []byte("n\n"), 0o644, false); err != nil {
		t.Fatal(err)
	}
	sd.Close()
	if b, _ := os.ReadFile(target); string(b) != "precious\n" {
		t.Fatalf("the task's symlink's target was written: %q", b)
	}
}

func mkfifo(p string) error { return unix.Mkfifo(p, 0o600) }

// OpenExisting resolves under a root (a node's / seen from a pod):
// absolute symlinks stay in it, nothing missing is created, and removal
// never follows a symlink.
func TestOpenExistingUnderARoot(t *testing.T) {
	b := base(t)
	root := testutil.MkdirOwned(t, filepath.Join(b, "node"), 0o755, 0)
	testutil.MkdirOwned(t, filepath.Join(root, "data"), 0o755, 0)
	gpud := testutil.MkdirOwned(t, filepath.Join(root, "data", "gpud"), 0o755, 0)
	// /var/lib -> /data, absolute: under root it is root/data, not /data.
	testutil.MkdirOwned(t, filepath.Join(root, "var"), 0o755, 0)
	if err := os.Symlink("/data", filepath.Join(root, "var", "lib")); err != nil {
		t.Fatal(err)
	}
	d, err := OpenExisting(root, "/var/lib/gpud")
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if d.Path != gpud {
		t.Errorf("resolved to %s, want %s", d.Path, gpud)
	}
	if _, err := OpenExisting(root, "/var/lib/missing"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a missing directory: %v, want ErrNotExist", err)
	}
	if _, err := os.Lstat(filepath.Join(root, "data", "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("OpenExisting created a directory: %v", err)
	}
	target := filepath.Join(b, "precious")
	if err := os.WriteFile(target, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, filepath.Join(gpud, "state.json")); err != nil {
		t.Fatal(err)
	}
	if err := d.Remove("state.json"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(target); err != nil {
		t.Errorf("Remove followed the symlink: %v", err)
	}
	if err := d.Remove("state.json"); err != nil {
		t.Errorf("removing what is gone: %v", err)
	}
	testutil.MkdirOwned(t, filepath.Join(gpud, "full"), 0o755, 0)
	os.WriteFile(filepath.Join(gpud, "full", "f"), nil, 0o644)
	if err := d.RemoveDir("full"); !errors.Is(err, unix.ENOTEMPTY) {
		t.Errorf("RemoveDir of a non-empty directory: %v", err)
	}
	if names, err := d.Names(10); err != nil || len(names) != 1 || names[0] != "full" {
		t.Errorf("Names: %v %v", names, err)
	}
	// A directory others can write on the way is refused, as by OpenDir.
	os.Chmod(gpud, 0o777)
	if _, err := OpenExisting(root, "/var/lib/gpud"); !errors.Is(err, ErrUnsafe) {
		t.Errorf("a world-writable directory: %v", err)
	}
}
