package config

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/gpud/gpud/internal/testutil"
)

const nobody = 65534

// asNobody runs a command as uid 65534: the local user planting things.
func asNobody(t *testing.T, name string, args ...string) {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s %v as uid %d: %v: %s", name, args, nobody, err, out)
	}
}

// trustDir is a fresh directory root owns that uid 65534 can traverse.
func trustDir(t *testing.T) string {
	t.Helper()
	testutil.RequireRoot(t)
	d := t.TempDir()
	for p := d; p != "/tmp" && p != "/"; p = filepath.Dir(p) {
		if err := os.Chmod(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return d
}

func writeFile(t *testing.T, p, data string, mode os.FileMode, uid int) string {
	t.Helper()
	if err := os.WriteFile(p, []byte(data), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Lchown(p, uid, uid); err != nil {
		t.Fatal(err)
	}
	return p
}

const goodFile = "version: v1\nidle-after: 1m\n"

// A settings file anyone but root could have written is refused, with the
// path and the reason, before any of its settings is taken: owned by
// another user, writable by others, behind a symlink another user
// planted, in a directory another user can change.
func TestLoadRefusesAFileOthersCanChange(t *testing.T) {
	d := trustDir(t)
	good := writeFile(t, filepath.Join(d, "good.yaml"), goodFile, 0o644, 0)
	sticky := filepath.Join(d, "tmp")
	if err := os.Mkdir(sticky, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Chmod(sticky, 0o1777); err != nil {
		t.Fatal(err)
	}
	asNobody(t, "ln", "-s", good, filepath.Join(sticky, "planted.yaml"))
	theirs := testutil.MkdirOwned(t, filepath.Join(d, "theirs"), 0o755, nobody)
	groupW := testutil.MkdirOwned(t, filepath.Join(d, "groupw"), 0o775, 0)
	rootLink := filepath.Join(d, "link.yaml")
	if err := os.Symlink(good, rootLink); err != nil {
		t.Fatal(err)
	}
	nobodyLink := filepath.Join(d, "nobody-link.yaml")
	if err := os.Symlink(good, nobodyLink); err != nil {
		t.Fatal(err)
	}
	if err := os.Lchown(nobodyLink, nobody, nobody); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ what, path, why string }{
		{"a file owned by uid 65534", writeFile(t, filepath.Join(d, "owned.yaml"), goodFile, 0o644, nobody), "owned by uid 65534"},
		{"a file mode 0666", writeFile(t, filepath.Join(d, "w.yaml"), goodFile, 0o666, 0), "writable by other users"},
		{"a symlink uid 65534 planted in a sticky directory", filepath.Join(sticky, "planted.yaml"), "symlink owned by uid 65534"},
		{"a symlink owned by uid 65534", nobodyLink, "symlink owned by uid 65534"},
		{"a root file in a directory of uid 65534", writeFile(t, filepath.Join(theirs, "gpud.yaml"), goodFile, 0o644, 0), "owned by uid 65534"},
		{"a root file in a group-writable directory", writeFile(t, filepath.Join(groupW, "gpud.yaml"), goodFile, 0o644, 0), "writable by other users"},
	} {
		for _, how := range []string{"flag", "env"} {
			fs, s := newFlags()
			args, env := []string{"--config", c.path}, map[string]string{}
			if how == "env" {
				args, env["GPUD_CONFIG"] = nil, c.path
			}
			_, err := Load(fs, args, Sources{LookupEnv: func(k string) (string, bool) { v, ok := env[k]; return v, ok }})
			var ce *Error
			if !errors.As(err, &ce) || ce.Key != FileFlag || !strings.Contains(err.Error(), c.why) || !strings.Contains(err.Error(), "unsafe") {
				t.Errorf("%s (%s): %v, want refused (%q)", c.what, how, err, c.why)
			}
			if s.idleAfter != 5*60e9 {
				t.Errorf("%s (%s): idle-after %v taken from the file", c.what, how, s.idleAfter)
			}
		}
	}
	// Root's file, directly or through root's own symlink, is read.
	for _, p := range []string{good, rootLink} {
		fs, s := newFlags()
		if _, err := Load(fs, []string{"--config", p}, Sources{LookupEnv: func(string) (string, bool) { return "", false }}); err != nil || s.idleAfter != 60e9 {
			t.Errorf("%s: %v, idle-after %v", p, err, s.idleAfter)
		}
	}
}

// The chart's way: the file from a ConfigMap volume, as kubelet lays it
// out (a 0777 mount point, read-only in the container, root's symlinks
// gpud.yaml → ..data/gpud.yaml and ..data → ..<timestamp>). Accepted
// read-only; the same layout on a writable mount is not (anyone could
// swap ..data).
func TestLoadReadsAConfigMapVolume(t *testing.T) {
	d := trustDir(t)
	vol := configMapVolume(t, filepath.Join(d, "vol"), goodFile)
	load := func() error {
		fs, s := newFlags()
		_, err := Load(fs, []string{"--config", filepath.Join(vol, "gpud.yaml")}, Sources{LookupEnv: func(string) (string, bool) { return "", false }})
		if err == nil && s.idleAfter != 60e9 {
			t.Errorf("idle-after %v, want the file's 1m", s.idleAfter)
		}
		return err
	}
	if err := load(); err == nil || !strings.Contains(err.Error(), "writable by other users") {
		t.Errorf("a writable 0777 volume: %v, want refused", err)
	}
	// Mounted read-only, as kubelet mounts it into the container.
	mnt := filepath.Join(d, "mnt")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(vol, mnt, "", unix.MS_BIND, ""); err != nil {
		testutil.Skip(t, "bind mount: "+err.Error())
	}
	t.Cleanup(func() { unix.Unmount(mnt, unix.MNT_DETACH) })
	if err := unix.Mount("", mnt, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
		t.Fatalf("remount read-only: %v", err)
	}
	vol = mnt
	if err := load(); err != nil {
		t.Fatalf("the ConfigMap volume, read-only: %v", err)
	}
}

// configMapVolume lays out dir as kubelet's atomic writer does for a
// ConfigMap with the key gpud.yaml.
func configMapVolume(t *testing.T, dir, data string) string {
	t.Helper()
	ts := filepath.Join(dir, "..2026_01_02_03_04_05.123456789")
	if err := os.MkdirAll(ts, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(ts, "gpud.yaml"), data, 0o644, 0)
	if err := os.Symlink(filepath.Base(ts), filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("..data/gpud.yaml", filepath.Join(dir, "gpud.yaml")); err != nil {
		t.Fatal(err)
	}
	return dir
}
