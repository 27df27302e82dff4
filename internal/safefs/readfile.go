package safefs

import (
	"errors"
	"fmt"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// ReadFile reads the file at path, at most limit bytes, for settings gpud
// takes from it (--config): under the rule of its directories, since
// whoever can change the file chooses gpud's settings. Every directory on
// the way is root's and only root can change it (OpenToRead: a sticky
// directory of root's, or one on a read-only mount, also passes); a
// symlink on the way, the last one included, is followed only when root
// owns it and it sits in a directory that passed; the file is a regular
// file of root's that nobody else can write. What fails is ErrUnsafe,
// naming the path and why.
//
// A Kubernetes ConfigMap volume passes as kubelet lays it out: the mount
// point (0777, read-only in the container) holds root's symlinks
// config.yaml → ..data/config.yaml and ..data → ..2026_01_02_…, and the
// timestamped directory (0755) the files (0644, or the volume's
// defaultMode). A file kubelet swaps in is read at the next SIGHUP.
func ReadFile(path string, limit int64) ([]byte, error) {
	if path == "" {
		return nil, errors.New("safefs: empty path")
	}
	p, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("safefs: %w", err)
	}
	for hops := 0; ; hops++ {
		d, err := OpenToRead(filepath.Dir(p))
		if err != nil {
			return nil, err
		}
		name := filepath.Base(p)
		var st unix.Stat_t
		if err := unix.Fstatat(d.fd(), name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil || st.Mode&unix.S_IFMT != unix.S_IFLNK {
			b, err := d.ReadOwned(name, limit)
			d.Close()
			return b, err
		}
		link := filepath.Join(d.Path, name)
		if !trusted(st.Uid) {
			d.Close()
			return nil, fmt.Errorf("%w: %s is a symlink owned by uid %d (want root): gpud does not follow it", ErrUnsafe, link, st.Uid)
		}
		target, err := readlinkat(d.fd(), name)
		dir := d.Path // symlinks resolved: a relative target's ".." is lexical from here
		d.Close()
		if err != nil {
			return nil, fmt.Errorf("safefs: reading the symlink %s: %w", link, err)
		}
		if hops >= maxLinks {
			return nil, fmt.Errorf("safefs: %s: too many symlinks", path)
		}
		if !filepath.IsAbs(target) {
			target = filepath.Join(dir, target)
		}
		p = filepath.Clean(target)
	}
}
