package compute

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/gpud/gpud/internal/cgroups"
	"golang.org/x/sys/unix"
)

// fdFreezer is the Controller's CgroupFreezer: it keeps each cgroup's
// freezer files open between ticks and reads and writes them with
// pread/pwrite. A tick every Slice (20 ms) reads the running pods' state
// and freezes and thaws tens of cgroups a second; opening the directory
// and the files again for each (CgroupFreezer) was most of the
// scheduler's CPU. A file kept open names the cgroup it was opened in: one
// removed and made again under its name is a new cgroup, and the old
// file's reads and writes fail (ENODEV); the cgroup is then opened again
// by its path, as CgroupFreezer would.
type fdFreezer struct {
	CgroupFreezer

	mu   sync.Mutex
	open map[Cgroup]*freezerFDs
}

// freezerFDs are one cgroup's open freezer files.
type freezerFDs struct {
	state  int // freezer.state (v1) or cgroup.freeze (v2), read and written
	events int // v2: cgroup.events (frozen); -1 on v1
	used   time.Time
	buf    [64]byte
}

// unusedFor: a cgroup's files not read or written for this long are
// closed (a pod gone, or no longer sharing by compute).
const unusedFor = 10 * time.Second

func newFDFreezer(f CgroupFreezer) *fdFreezer {
	return &fdFreezer{CgroupFreezer: f, open: map[Cgroup]*freezerFDs{}}
}

// Locate is CgroupFreezer's; it also closes the files of cgroups unused
// for a while.
func (f *fdFreezer) Locate(pid int, cgroupID uint64) (Cgroup, error) {
	f.sweep()
	return f.CgroupFreezer.Locate(pid, cgroupID)
}

// sweep closes the files of cgroups unused for a while (the Controller
// sweeps once a Period).
func (f *fdFreezer) sweep() {
	f.mu.Lock()
	defer f.mu.Unlock()
	now := time.Now()
	for c, fds := range f.open {
		if now.Sub(fds.used) > unusedFor {
			fds.close()
			delete(f.open, c)
		}
	}
}

// Set freezes (waiting up to freezeWait until the cgroup is frozen) or
// thaws c.
func (f *fdFreezer) Set(c Cgroup, frozen bool) error {
	v := "THAWED"
	switch {
	case c.Kind == cgroups.FreezerV2 && frozen:
		v = "1"
	case c.Kind == cgroups.FreezerV2:
		v = "0"
	case frozen:
		v = "FROZEN"
	}
	return f.with(c, func(fds *freezerFDs) error {
		if _, err := unix.Pwrite(fds.state, []byte(v), 0); err != nil {
			return fmt.Errorf("compute: writing %q to %s: %w", v, filepath.Join(c.Path, c.Kind), err)
		}
		if !frozen {
			return nil
		}
		return fds.waitFrozen(c, time.Now().Add(freezeWait))
	})
}

// WaitFrozen waits until c, which Set froze, is frozen, or deadline; it
// reports whether it is.
func (f *fdFreezer) WaitFrozen(c Cgroup, deadline time.Time) (done bool, err error) {
	err = f.with(c, func(fds *freezerFDs) error {
		if err := fds.waitFrozen(c, deadline); err != nil {
			return err
		}
		var err error
		done, err = fds.frozen(c)
		return err
	})
	return done, err
}

// waitFrozen waits until c is frozen, or deadline. A running task
// freezes at once, one waiting for a CPU when it is next scheduled (ms
// under contention). On v2 it sleeps in poll on cgroup.events, which
// raises POLLPRI when the file changes (frozen 0 → 1): one wake-up, not
// a poll loop of short sleeps (most of the scheduler's wake-ups were
// those). The read before each poll arms it: a change after the read
// makes the poll return at once, so none is missed. On v1 (no
// notification) it reads again after 250 µs, doubling up to 1 ms: a
// task that is not frozen at once is waiting for a CPU (ms under
// contention), and each shorter sleep was a wake-up for nothing.
func (fds *freezerFDs) waitFrozen(c Cgroup, deadline time.Time) error {
	for step := 250 * time.Microsecond; ; step = min(2*step, time.Millisecond) {
		done, err := fds.frozen(c)
		if err != nil || done {
			return err
		}
		left := time.Until(deadline)
		if left <= 0 {
			return nil // the next holder runs beside it rather than wait
		}
		if c.Kind == cgroups.FreezerV2 {
			ts := unix.NsecToTimespec(left.Nanoseconds())
			pfd := []unix.PollFd{{Fd: int32(fds.events), Events: unix.POLLPRI}}
			if _, err := unix.Ppoll(pfd, &ts, nil); err != nil && err != unix.EINTR {
				return fmt.Errorf("compute: waiting for %s to freeze: %w", c.Path, err)
			}
			continue
		}
		ts := unix.NsecToTimespec(min(left, step).Nanoseconds())
		if err := unix.Nanosleep(&ts, nil); err != nil && err != unix.EINTR {
			return fmt.Errorf("compute: waiting for %s to freeze: %w", c.Path, err)
		}
	}
}

// Paused reports whether c is frozen, or freezing, by anyone.
func (f *fdFreezer) Paused(c Cgroup) (paused bool, err error) {
	err = f.with(c, func(fds *freezerFDs) error {
		s, err := fds.read(fds.state, c.Kind)
		if err != nil {
			return fmt.Errorf("compute: reading %s: %w", filepath.Join(c.Path, c.Kind), err)
		}
		if c.Kind == cgroups.FreezerV1 {
			paused = strings.TrimSpace(s) != "THAWED"
			return nil
		}
		if strings.TrimSpace(s) == "1" {
			paused = true
			return nil
		}
		paused, err = fds.frozen(c)
		return err
	})
	return paused, err
}

// Close closes every cgroup's files.
func (f *fdFreezer) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	for c, fds := range f.open {
		fds.close()
		delete(f.open, c)
	}
	return nil
}

// with runs op on c's open files, opening them first if they are not; a
// failure on files kept open (the cgroup removed, maybe made again) is
// tried once more on the cgroup opened again by its path.
func (f *fdFreezer) with(c Cgroup, op func(*freezerFDs) error) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	for try := 0; ; try++ {
		fds, cached := f.open[c]
		if !cached {
			var err error
			if fds, err = openFreezerFDs(c); err != nil {
				return err
			}
			f.open[c] = fds
		}
		fds.used = time.Now()
		err := op(fds)
		if err == nil {
			return nil
		}
		fds.close()
		delete(f.open, c)
		if !cached || try > 0 {
			return err
		}
	}
}

func openFreezerFDs(c Cgroup) (*freezerFDs, error) {
	// OpenFreezer checks the kind and that the directory has it.
	fz, err := cgroups.OpenFreezer(c.Kind, c.Path, 0)
	if err != nil {
		return nil, err
	}
	defer fz.Close()
	fds := &freezerFDs{state: -1, events: -1}
	open := func(name string, flags int) (int, error) {
		fd, err := unix.Open(filepath.Join(c.Path, name), flags|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return -1, fmt.Errorf("compute: opening %s: %w", filepath.Join(c.Path, name), err)
		}
		return fd, nil
	}
	if fds.state, err = open(c.Kind, unix.O_RDWR); err != nil {
		return nil, err
	}
	if c.Kind == cgroups.FreezerV2 {
		if fds.events, err = open("cgroup.events", unix.O_RDONLY); err != nil {
			fds.close()
			return nil, err
		}
	}
	return fds, nil
}

// read reads the whole of fd (a cgroup interface file) from its start.
func (fds *freezerFDs) read(fd int, name string) (string, error) {
	n, err := unix.Pread(fd, fds.buf[:], 0)
	if err != nil {
		return "", err
	}
	if n == len(fds.buf) {
		return "", errors.New("compute: " + name + " longer than expected")
	}
	return string(fds.buf[:n]), nil
}

// frozen reports whether every process of the cgroup is frozen now.
func (fds *freezerFDs) frozen(c Cgroup) (bool, error) {
	if c.Kind == cgroups.FreezerV1 {
		s, err := fds.read(fds.state, c.Kind)
		if err != nil {
			return false, fmt.Errorf("compute: reading %s: %w", filepath.Join(c.Path, c.Kind), err)
		}
		return strings.TrimSpace(s) == "FROZEN", nil
	}
	s, err := fds.read(fds.events, "cgroup.events")
	if err != nil {
		return false, fmt.Errorf("compute: reading %s: %w", filepath.Join(c.Path, "cgroup.events"), err)
	}
	for _, line := range strings.Split(s, "\n") {
		if k, v, ok := strings.Cut(line, " "); ok && k == "frozen" {
			return strings.TrimSpace(v) == "1", nil
		}
	}
	return false, nil
}

func (fds *freezerFDs) close() {
	for _, fd := range []int{fds.state, fds.events} {
		if fd >= 0 {
			unix.Close(fd)
		}
	}
	fds.state, fds.events = -1, -1
}
