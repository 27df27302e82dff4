// Package safefs writes gpud's files so that nobody but root can steer
// them: gpud runs as root, and a file it writes through a symlink another
// user planted, or a setting it reads from a file another user wrote, would
// hand that user root's pen.
//
// The rule for a directory gpud writes in (OpenDir): every component of its
// path, from /, is a directory owned by root (or gpud's own user) that no
// one else can write; an ancestor may be world-writable only when it is
// root's and sticky (/tmp), since then no one else can rename or replace
// gpud's entry in it; the directory itself never (no /tmp, no 0777). A
// symlink on the way is followed only where it sits in a directory that
// passed the rule and is root's (root put it there: /var/run → /run). Missing components
// are created by gpud, with the mode asked for. Files are then opened
// relative to the directory's descriptor, never following a symlink
// (O_NOFOLLOW), created exclusively (O_EXCL) and renamed into place.
package safefs

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// ErrUnsafe marks a path or a file gpud refuses: someone other than root
// could have made or changed it.
var ErrUnsafe = errors.New("unsafe")

// maxLinks bounds the symlinks followed while resolving one path (as the
// kernel's ELOOP does).
const maxLinks = 40

// Dir is a directory that passed the rule, held open: everything gpud
// does in it goes through this descriptor.
type Dir struct {
	f    *os.File
	Path string // the path as resolved (symlinks followed)
}

// Fd is the directory's descriptor (for *at calls; valid until Close).
func (d *Dir) Fd() uintptr { return d.f.Fd() }

// Close releases the directory.
func (d *Dir) Close() error { return d.f.Close() }

func (d *Dir) fd() int { return int(d.f.Fd()) }

// trusted reports whether uid is root or gpud's own user.
func trusted(uid uint32) bool { return uid == 0 || int(uid) == os.Geteuid() }

// checkDir applies the rule to one directory component.
func checkDir(path string, st *unix.Stat_t, last bool) error {
	if !trusted(st.Uid) {
		return fmt.Errorf("%w: %s is owned by uid %d (want root)", ErrUnsafe, path, st.Uid)
	}
	if st.Mode&0o022 == 0 {
		return nil
	}
	mode := st.Mode & 0o7777
	if last {
		return fmt.Errorf("%w: %s is writable by other users (mode %04o): anyone could plant files or symlinks there", ErrUnsafe, path, mode)
	}
	if st.Mode&unix.S_ISVTX != 0 && st.Uid == 0 {
		return nil // /tmp-like: others cannot rename or replace gpud's own entry
	}
	return fmt.Errorf("%w: %s is writable by other users (mode %04o) and not sticky: anyone could replace what is under it", ErrUnsafe, path, mode)
}

// OpenDir opens the directory at path, creating what is missing with perm,
// after checking that only root can change it or any directory above it.
func OpenDir(path string, perm os.FileMode) (*Dir, error) {
	return openDir("/", path, perm, true)
}

// OpenExisting opens the directory at path as it is seen under root (a
// directory such as /proc/1/root, the host's / from a pod with the host's
// PID namespace), with the rule of OpenDir, creating nothing: a missing
// component gives an error that errors.Is(err, fs.ErrNotExist). Absolute
// symlinks on the way resolve under root, not under this process's /.
func OpenExisting(root, path string) (*Dir, error) {
	if !filepath.IsAbs(root) {
		return nil, fmt.Errorf("safefs: root %q is not absolute", root)
	}
	return openDir(root, path, 0, false)
}

// OpenToRead is OpenExisting (under /) for a directory gpud only reads
// files of root's from: the directory itself may be root's and sticky
// (others can add entries but not replace root's), as kubelet makes a
// Secret volume's mount point. Never for a directory gpud writes in.
// A directory of root's on a read-only mount passes whatever its mode:
// kubelet makes a ConfigMap volume's mount point 0777 but mounts it
// read-only into the container, so nobody can add, rename or replace an
// entry in it (its other path, under the host's /var/lib/kubelet, is
// root's: see ReadFile).
func OpenToRead(path string) (*Dir, error) {
	return openDirOpts("/", path, 0, false, true, true)
}

func openDir(root, path string, perm os.FileMode, create bool) (*Dir, error) {
	return openDirOpts(root, path, perm, create, false, false)
}

// readOnlyMount reports whether the directory open at fd is on a mount
// nobody can write through (statfs's ST_RDONLY).
func readOnlyMount(fd int) bool {
	var fs unix.Statfs_t
	return unix.Fstatfs(fd, &fs) == nil && fs.Flags&unix.ST_RDONLY != 0
}

func openDirOpts(root, path string, perm os.FileMode, create, stickyLast, readOnlyOK bool) (*Dir, error) {
	if path == "" {
		return nil, errors.New("safefs: empty path")
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("safefs: %w", err)
	}
	links := 0
restart:
	fd, err := unix.Open(root, unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("safefs: opening %s: %w", root, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("safefs: %s: %w", root, err)
	}
	comps := strings.Split(strings.TrimPrefix(filepath.Clean(abs), "/"), "/")
	if comps[0] == "" {
		comps = nil
	}
	if err := checkDir("/", &st, len(comps) == 0); err != nil && !(readOnlyOK && trusted(st.Uid) && readOnlyMount(fd)) {
		unix.Close(fd)
		return nil, err
	}
	cur := "/"
	for i := 0; i < len(comps); i++ {
		c := comps[i]
		next := filepath.Join(cur, c)
		nfd, err := unix.Openat(fd, c, unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if errors.Is(err, unix.ENOENT) && !create {
			unix.Close(fd)
			return nil, fmt.Errorf("safefs: opening %s: %w", filepath.Join(root, next), os.ErrNotExist)
		}
		if errors.Is(err, unix.ENOENT) {
			// Missing: gpud makes it (another user racing to make it first
			// makes one gpud refuses below, as not root's).
			if err := unix.Mkdirat(fd, c, uint32(perm.Perm())); err != nil && !errors.Is(err, unix.EEXIST) {
				unix.Close(fd)
				return nil, fmt.Errorf("safefs: creating %s: %w", next, err)
			}
			nfd, err = unix.Openat(fd, c, unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_RDONLY|unix.O_CLOEXEC, 0)
		}
		if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
			target, lerr := readlinkat(fd, c)
			if lerr != nil {
				unix.Close(fd)
				return nil, fmt.Errorf("safefs: %s is not a directory", next)
			}
			// A symlink in a directory that passed the rule, and root's
			// own: one another user left in a sticky /tmp is not followed
			// (the kernel's protected_symlinks rule, made unconditional).
			var lst unix.Stat_t
			if err := unix.Fstatat(fd, c, &lst, unix.AT_SYMLINK_NOFOLLOW); err != nil || !trusted(lst.Uid) {
				unix.Close(fd)
				return nil, fmt.Errorf("%w: %s is a symlink owned by uid %d (want root)", ErrUnsafe, next, lst.Uid)
			}
			unix.Close(fd)
			if links++; links > maxLinks {
				return nil, fmt.Errorf("safefs: %s: too many symlinks", path)
			}
			rest := filepath.Join(comps[i+1:]...)
			if filepath.IsAbs(target) {
				abs = filepath.Join(target, rest)
			} else {
				abs = filepath.Join(cur, target, rest) // cur has no symlinks: ".." is lexical
			}
			goto restart
		}
		if err != nil {
			unix.Close(fd)
			return nil, fmt.Errorf("safefs: opening %s: %w", next, err)
		}
		unix.Close(fd)
		fd = nfd
		if err := unix.Fstat(fd, &st); err != nil {
			unix.Close(fd)
			return nil, fmt.Errorf("safefs: %s: %w", next, err)
		}
		if err := checkDir(next, &st, i == len(comps)-1 && !stickyLast); err != nil && !(readOnlyOK && trusted(st.Uid) && readOnlyMount(fd)) {
			unix.Close(fd)
			return nil, err
		}
		cur = next
	}
	p := filepath.Join(root, cur)
	return &Dir{f: os.NewFile(uintptr(fd), p), Path: p}, nil
}

func readlinkat(dirfd int, name string) (string, error) {
	buf := make([]byte, unix.PathMax)
	n, err := unix.Readlinkat(dirfd, name, buf)
	if err != nil {
		return "", err
	}
	return string(buf[:n]), nil
}

// Check applies the rule to the directory at path, creating it with perm
// when missing: the check gpud makes at start for each of its directories.
func Check(path string, perm os.FileMode) error {
	d, err := OpenDir(path, perm)
	if err != nil {
		return err
	}
	return d.Close()
}

// checkName refuses names that would leave the directory.
func checkName(name string) error {
	if name == "" || name == "." || name == ".." || strings.ContainsRune(name, '/') {
		return fmt.Errorf("safefs: bad file name %q", name)
	}
	return nil
}

// WriteFile replaces name in d atomically: a new file (O_EXCL, never
// following a symlink) written, given mode perm, optionally fsync'ed,
// then renamed over name (a symlink there is replaced, not followed), and
// the directory fsync'ed when durable. On any failure the old content
// stays and the temporary file is removed.
func (d *Dir) WriteFile(name string, data []byte, perm os.FileMode, durable bool) error {
	if err := checkName(name); err != nil {
		return err
	}
	var rnd [6]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		return fmt.Errorf("safefs: %w", err)
	}
	tmp := "." + name + ".tmp" + hex.EncodeToString(rnd[:])
	fd, err := unix.Openat(d.fd(), tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, uint32(perm.Perm()))
	if err != nil {
		return fmt.Errorf("safefs: creating %s: %w", filepath.Join(d.Path, tmp), err)
	}
	f := os.NewFile(uintptr(fd), filepath.Join(d.Path, tmp))
	fail := func(err error) error {
		f.Close()
		unix.Unlinkat(d.fd(), tmp, 0)
		return err
	}
	if _, err := f.Write(data); err != nil {
		return fail(fmt.Errorf("safefs: %w", err)) // err names the file
	}
	if err := f.Chmod(perm.Perm()); err != nil { // whatever the umask
		return fail(fmt.Errorf("safefs: %w", err))
	}
	if durable {
		if err := f.Sync(); err != nil {
			return fail(fmt.Errorf("safefs: syncing %s: %w", f.Name(), err))
		}
	}
	if err := f.Close(); err != nil {
		unix.Unlinkat(d.fd(), tmp, 0)
		return fmt.Errorf("safefs: %w", err)
	}
	if err := unix.Renameat(d.fd(), tmp, d.fd(), name); err != nil {
		unix.Unlinkat(d.fd(), tmp, 0)
		return fmt.Errorf("safefs: replacing %s: %w", filepath.Join(d.Path, name), err)
	}
	if durable {
		if err := d.f.Sync(); err != nil {
			return fmt.Errorf("safefs: syncing %s: %w", d.Path, err)
		}
	}
	return nil
}

// ownFile checks an open file: a regular file of root's (or gpud's user).
func ownFile(f *os.File, writableByOthersOK bool) error {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return fmt.Errorf("safefs: %s: %w", f.Name(), err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return fmt.Errorf("%w: %s is not a regular file", ErrUnsafe, f.Name())
	}
	if !trusted(st.Uid) {
		return fmt.Errorf("%w: %s is owned by uid %d, not written by gpud", ErrUnsafe, f.Name(), st.Uid)
	}
	if !writableByOthersOK && st.Mode&0o022 != 0 {
		return fmt.Errorf("%w: %s is writable by other users (mode %04o)", ErrUnsafe, f.Name(), st.Mode&0o7777)
	}
	return nil
}

// openFile opens name in d without following a symlink (ELOOP names it),
// nor blocking on a FIFO, nor taking a terminal.
func (d *Dir) openFile(name string, flags int, perm os.FileMode) (*os.File, error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	p := filepath.Join(d.Path, name)
	fd, err := unix.Openat(d.fd(), name, flags|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_NOCTTY|unix.O_CLOEXEC, uint32(perm.Perm()))
	if errors.Is(err, unix.ELOOP) {
		return nil, fmt.Errorf("%w: %s is a symlink; gpud never writes or reads settings through a symlink it did not make", ErrUnsafe, p)
	}
	if err != nil {
		return nil, fmt.Errorf("safefs: opening %s: %w", p, err)
	}
	// Back to blocking I/O for a regular file (O_NONBLOCK only guarded the open).
	if err := unix.SetNonblock(fd, false); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("safefs: %s: %w", p, err)
	}
	return os.NewFile(uintptr(fd), p), nil
}

// OpenAppend opens (creating with perm) name in d for reading and
// appending: never through a symlink, only a regular file root owns.
func (d *Dir) OpenAppend(name string, perm os.FileMode) (*os.File, error) {
	f, err := d.openFile(name, unix.O_RDWR|unix.O_APPEND|unix.O_CREAT, perm)
	if err != nil {
		return nil, err
	}
	if err := ownFile(f, false); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// ReadOwned reads name in d, at most limit bytes, only when it is a
// regular file that root owns and nobody else can write: gpud takes no
// setting from a file it did not write. A file that fails is ErrUnsafe.
func (d *Dir) ReadOwned(name string, limit int64) ([]byte, error) {
	f, err := d.openFile(name, unix.O_RDONLY, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if err := ownFile(f, false); err != nil {
		return nil, err
	}
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, fmt.Errorf("safefs: reading %s: %w", f.Name(), err)
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("safefs: %s is larger than %d bytes", f.Name(), limit)
	}
	return b, nil
}

// SubDir opens (creating with perm) the directory name in d, without
// following a symlink. Its owner and mode are not checked: gpud writes in
// it only through its descriptor (WriteFile: O_EXCL, rename), so a
// workload that owns it (a task's checkpoint directory) cannot redirect
// gpud's writes, and d, which passed the rule, keeps it where it is.
func (d *Dir) SubDir(name string, perm os.FileMode) (*Dir, error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	p := filepath.Join(d.Path, name)
	fd, err := unix.Openat(d.fd(), name, unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) {
		if err := unix.Mkdirat(d.fd(), name, uint32(perm.Perm())); err != nil && !errors.Is(err, unix.EEXIST) {
			return nil, fmt.Errorf("safefs: creating %s: %w", p, err)
		}
		fd, err = unix.Openat(d.fd(), name, unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_RDONLY|unix.O_CLOEXEC, 0)
	}
	if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
		return nil, fmt.Errorf("%w: %s is not a directory (a symlink?); gpud does not follow it", ErrUnsafe, p)
	}
	if err != nil {
		return nil, fmt.Errorf("safefs: opening %s: %w", p, err)
	}
	return &Dir{f: os.NewFile(uintptr(fd), p), Path: p}, nil
}

// Remove removes the file (or socket, or symlink: never followed) name
// from d; one already gone is no error.
func (d *Dir) Remove(name string) error {
	if err := checkName(name); err != nil {
		return err
	}
	if err := unix.Unlinkat(d.fd(), name, 0); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("safefs: removing %s: %w", filepath.Join(d.Path, name), err)
	}
	return nil
}

// RemoveDir removes the empty directory name from d; one already gone is no
// error, one that is not empty is (errors.Is(err, unix.ENOTEMPTY)).
func (d *Dir) RemoveDir(name string) error {
	if err := checkName(name); err != nil {
		return err
	}
	if err := unix.Unlinkat(d.fd(), name, unix.AT_REMOVEDIR); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("safefs: removing %s: %w", filepath.Join(d.Path, name), err)
	}
	return nil
}

// Names lists d's entries (at most limit of them), sorted.
func (d *Dir) Names(limit int) ([]string, error) {
	f, err := d.openSub(".")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	names, err := f.Readdirnames(limit)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("safefs: listing %s: %w", d.Path, err)
	}
	slices.Sort(names)
	return names, nil
}

// openSub opens name in d as an *os.File of its own (its own offset),
// never following a symlink. "." is d itself.
func (d *Dir) openSub(name string) (*os.File, error) {
	if name != "." {
		if err := checkName(name); err != nil {
			return nil, err
		}
	}
	fd, err := unix.Openat(d.fd(), name, unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("safefs: opening %s: %w", filepath.Join(d.Path, name), err)
	}
	return os.NewFile(uintptr(fd), filepath.Join(d.Path, name)), nil
}

// Rename renames old to new within d (a damaged file set aside).
func (d *Dir) Rename(oldName, newName string) error {
	if err := checkName(oldName); err != nil {
		return err
	}
	if err := checkName(newName); err != nil {
		return err
	}
	return unix.Renameat(d.fd(), oldName, d.fd(), newName)
}

// Need is one directory gpud writes in, named by the setting that gives it.
type Need struct {
	Setting string // e.g. "state-dir"
	Dir     string // "" when the setting is off
	File    string // or a file, whose directory is meant
	Perm    os.FileMode
}

// CheckDirs checks (creating what is missing) each directory at start, and
// names the first one that fails and the setting that gave it.
func CheckDirs(needs ...Need) error {
	for _, n := range needs {
		if n.File != "" {
			n.Dir = filepath.Dir(n.File)
		}
		if n.Dir == "" {
			continue
		}
		if err := Check(n.Dir, n.Perm); err != nil {
			return fmt.Errorf("--%s: %w (use a directory only root can write, such as /run/gpud or /var/lib/gpud)", n.Setting, err)
		}
	}
	return nil
}
