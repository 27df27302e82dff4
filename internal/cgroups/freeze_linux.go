package cgroups

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The two cgroup freezers a node may have. A workload is frozen by the one
// its container runtime uses for `docker pause` / `crictl`'s pause on that
// host, so that gpud and the runtime see each other's freezes: on a hybrid
// host (v1 controllers) runc freezes through the v1 freezer controller, on
// a pure v2 host through cgroup.freeze.
const (
	FreezerV2 = "cgroup.freeze" // cgroup v2 core interface (kernel ≥ 5.2)
	FreezerV1 = "freezer.state" // cgroup v1 freezer controller
)

// Freezer errors.
var (
	// ErrNoFreezer: the process's workload has no cgroup gpud can freeze
	// (it is in a root cgroup, or neither freezer is available).
	ErrNoFreezer = errors.New("cgroups: no freezable cgroup for the workload")
	// ErrCgroupMoved: the workload's cgroup (by its v2 id) is not among the
	// process's cgroup's ancestors any more.
	ErrCgroupMoved = errors.New("cgroups: the process is not in the workload's cgroup")
	// ErrFreezeTimeout: the cgroup did not report frozen in time (a task in
	// an uninterruptible sleep, in a driver say, delays a freeze).
	ErrFreezeTimeout = errors.New("cgroups: the cgroup did not freeze in time")
)

// Freezer freezes and thaws one cgroup. It holds the cgroup's directory
// open: a cgroup removed and made again under the same name is a new
// directory, and the writes of a Freezer opened on the old one fail rather
// than freeze or thaw the new one.
type Freezer struct {
	Kind string // FreezerV2 or FreezerV1
	Path string // the cgroup's directory, for messages and records
	dir  int    // O_PATH descriptor of the directory
}

// Close releases the directory.
func (f *Freezer) Close() error {
	if f.dir < 0 {
		return nil
	}
	err := unix.Close(f.dir)
	f.dir = -1
	return err
}

// OpenFreezer opens the freezer of cgroup directory dir (kind FreezerV2 or
// FreezerV1); want, when non-zero, is the inode (the v2 cgroup id) dir must
// have. No symlink is followed (cgroupfs has none; a path that names one is
// not a cgroup).
func OpenFreezer(kind, dir string, want uint64) (*Freezer, error) {
	if kind != FreezerV2 && kind != FreezerV1 {
		return nil, fmt.Errorf("cgroups: freezer kind %q", kind)
	}
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("cgroups: opening %s: %w", dir, err)
	}
	if want != 0 {
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil || st.Ino != want {
			unix.Close(fd)
			return nil, fmt.Errorf("%w: %s is not cgroup %d", ErrCgroupMoved, dir, want)
		}
	}
	f := &Freezer{Kind: kind, Path: dir, dir: fd}
	if _, err := f.read(kind); err != nil { // a cgroup without the interface (a root, a v1 dir of another controller)
		f.Close()
		return nil, fmt.Errorf("%w: %s: %w", ErrNoFreezer, dir, err)
	}
	return f, nil
}

// file opens one of the cgroup's interface files through the directory's
// descriptor.
func (f *Freezer) file(name string, flags int) (*os.File, error) {
	fd, err := unix.Openat(f.dir, name, flags|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("cgroups: %s/%s: %w", f.Path, name, err)
	}
	return os.NewFile(uintptr(fd), filepath.Join(f.Path, name)), nil
}

func (f *Freezer) read(name string) (string, error) {
	fl, err := f.file(name, unix.O_RDONLY)
	if err != nil {
		return "", err
	}
	defer fl.Close()
	b, err := io.ReadAll(io.LimitReader(fl, 4096))
	if err != nil {
		return "", fmt.Errorf("cgroups: reading %s: %w", fl.Name(), err)
	}
	return string(b), nil
}

func (f *Freezer) write(name, v string) error {
	fl, err := f.file(name, unix.O_WRONLY)
	if err != nil {
		return err
	}
	defer fl.Close()
	if _, err := fl.WriteString(v); err != nil {
		return fmt.Errorf("cgroups: writing %q to %s: %w", v, fl.Name(), err)
	}
	return nil
}

// Freeze asks the kernel to freeze every process of the cgroup and its
// descendants; Frozen says when it has.
func (f *Freezer) Freeze() error {
	if f.Kind == FreezerV2 {
		return f.write(FreezerV2, "1")
	}
	return f.write(FreezerV1, "FROZEN")
}

// Thaw lets the cgroup's processes run again. A process frozen by an
// ancestor's freeze (v2) or a parent's (v1) stays frozen.
func (f *Freezer) Thaw() error {
	if f.Kind == FreezerV2 {
		return f.write(FreezerV2, "0")
	}
	return f.write(FreezerV1, "THAWED")
}

// Frozen reports whether every process of the cgroup is frozen now, by
// this cgroup's freeze or an ancestor's.
func (f *Freezer) Frozen() (bool, error) {
	if f.Kind == FreezerV2 {
		s, err := f.read("cgroup.events")
		if err != nil {
			return false, err
		}
		return eventsFrozen(s), nil
	}
	s, err := f.read(FreezerV1)
	return strings.TrimSpace(s) == "FROZEN", err
}

// Paused reports whether the cgroup is frozen, or freezing, by anyone
// (gpud, `docker pause`, an ancestor): a workload paused by someone else
// is not gpud's to thaw.
func (f *Freezer) Paused() (bool, error) {
	if f.Kind == FreezerV2 {
		s, err := f.read(FreezerV2)
		if err != nil {
			return false, err
		}
		if strings.TrimSpace(s) == "1" {
			return true, nil
		}
		return f.Frozen()
	}
	s, err := f.read(FreezerV1)
	return strings.TrimSpace(s) != "THAWED", err
}

// WaitFrozen waits until the cgroup reports frozen, or d passes
// (ErrFreezeTimeout). A freeze of running or sleeping tasks completes in
// tens of microseconds, one of a task in an uninterruptible sleep as late
// as that sleep ends. v2: woken by cgroup.events' notification (poll
// POLLPRI), and read again after a short, growing wait all the same: the
// kernel sends a cgroup file's notifications at most once per 10 ms
// (cgroup_file_notify: a change within 10 ms of the last notification is
// notified by a timer at the end of those 10 ms), so a freeze following a thaw
// within 10 ms is notified late. v1 has no notification: polled with a
// short, growing sleep.
func (f *Freezer) WaitFrozen(d time.Duration) error {
	deadline := time.Now().Add(d)
	if f.Kind == FreezerV2 {
		return f.waitEvents(deadline, d)
	}
	sleep := 20 * time.Microsecond
	for {
		ok, err := f.Frozen()
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%w: %s after %s", ErrFreezeTimeout, f.Path, d)
		}
		time.Sleep(sleep)
		sleep = min(2*sleep, time.Millisecond)
	}
}

func (f *Freezer) waitEvents(deadline time.Time, d time.Duration) error {
	ev, err := f.file("cgroup.events", unix.O_RDONLY)
	if err != nil {
		return err
	}
	defer ev.Close()
	fd := int(ev.Fd())
	buf := make([]byte, 256)
	step := 20 * time.Microsecond
	for {
		// Read from the start each time: kernfs reports a change to a
		// reader that has read the file since.
		n, err := unix.Pread(fd, buf, 0)
		if err != nil {
			return fmt.Errorf("cgroups: reading %s: %w", ev.Name(), err)
		}
		if eventsFrozen(string(buf[:n])) {
			return nil
		}
		left := time.Until(deadline)
		if left <= 0 {
			return fmt.Errorf("%w: %s after %s", ErrFreezeTimeout, f.Path, d)
		}
		// Bounded: a notification held back costs at most the step
		// (20 µs, doubling up to 1 ms).
		ts := unix.NsecToTimespec(min(left, step).Nanoseconds())
		step = min(2*step, time.Millisecond)
		_, err = unix.Ppoll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLPRI}}, &ts, nil)
		if err != nil && err != unix.EINTR {
			return fmt.Errorf("cgroups: polling %s: %w", ev.Name(), err)
		}
	}
}

func eventsFrozen(s string) bool {
	for _, line := range strings.Split(s, "\n") {
		if k, v, ok := strings.Cut(line, " "); ok && k == "frozen" {
			return strings.TrimSpace(v) == "1"
		}
	}
	return false
}

// V1FreezerMount returns the mount point of the v1 freezer controller, ""
// when it is not mounted (a pure v2 host).
func V1FreezerMount() string { return v1FreezerMount() }

var v1FreezerMount = sync.OnceValue(func() string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return ""
	}
	return v1FreezerFrom(b)
})

// V1Roots returns the mount points of the v1 hierarchies mounted at their
// root (none on a pure v2 host): where a process moves to leave every v1
// cgroup it is in.
func V1Roots() []string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	var out []string
	for _, m := range v1RootMounts(b) {
		out = append(out, m.point)
	}
	return out
}

func v1FreezerFrom(mountinfo []byte) string {
	for _, m := range v1RootMounts(mountinfo) {
		if slices.Contains(m.opts, "freezer") {
			return m.point
		}
	}
	return ""
}

type v1Mount struct {
	point string
	opts  []string
}

// v1RootMounts lists mountinfo's v1 cgroup mounts of a hierarchy's root.
func v1RootMounts(mountinfo []byte) []v1Mount {
	var out []v1Mount
	sc := bufio.NewScanner(bytes.NewReader(mountinfo))
	for sc.Scan() {
		line := sc.Text()
		sep := strings.Index(line, " - ")
		if sep < 0 {
			continue
		}
		fields := strings.Fields(line[:sep])
		fs := strings.Fields(line[sep+3:])
		if len(fields) < 5 || len(fs) < 3 || fs[0] != "cgroup" || fields[3] != "/" {
			continue
		}
		out = append(out, v1Mount{point: fields[4], opts: strings.Split(fs[2], ",")})
	}
	return out
}

// WorkloadFreezer finds and opens the freezer of the workload process pid
// belongs to. The workload's cgroup is the one with v2 id workload among
// the process's cgroup and its ancestors (0: the process's own cgroup).
// On a host with the v1 freezer controller the v1 cgroup as many levels up
// from the process's v1 freezer cgroup is frozen (the runtime's layout is
// the same in both trees), so that `docker pause` and gpud share one
// freezer; elsewhere, or when the process's v1 freezer cgroup is the root,
// the v2 one. Never a root cgroup.
func WorkloadFreezer(procRoot, v2Root string, pid int, workload uint64) (*Freezer, error) {
	b, err := os.ReadFile(filepath.Join(procRoot, strconv.Itoa(pid), "cgroup"))
	if err != nil {
		return nil, fmt.Errorf("cgroups: %w", err)
	}
	var v2Path, v1Path string
	for _, line := range strings.Split(string(b), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		if parts[0] == "0" && parts[1] == "" {
			v2Path = parts[2]
		}
		for _, c := range strings.Split(parts[1], ",") {
			if c == "freezer" {
				v1Path = parts[2]
			}
		}
	}
	if v2Path == "" || v2Path == "/" {
		return nil, fmt.Errorf("%w: process %d is in the v2 root", ErrNoFreezer, pid)
	}
	// Levels between the process's cgroup and its workload's.
	dir := filepath.Join(v2Root, filepath.Clean("/"+v2Path))
	up, found := 0, workload == 0
	for d := dir; !found && len(d) > len(v2Root); d = filepath.Dir(d) {
		if id, err := ID(d); err == nil && id == workload {
			dir, found = d, true
			break
		}
		up++
	}
	if !found {
		return nil, fmt.Errorf("%w: cgroup %d is not an ancestor of %s", ErrCgroupMoved, workload, v2Path)
	}
	if mnt := v1FreezerMount(); mnt != "" && v1Path != "" {
		p := filepath.Clean("/" + v1Path)
		for i := 0; i < up && p != "/"; i++ {
			p = filepath.Dir(p)
		}
		if p != "/" {
			return OpenFreezer(FreezerV1, filepath.Join(mnt, p), 0)
		}
	}
	return OpenFreezer(FreezerV2, dir, workload)
}

// WaitFrozenOnThread is WaitFrozen for the preemption's real-time thread:
// it waits in raw system calls, and reads the state again every poll (as
// the bare freeze program does), whatever the notification says. Why raw:
// a goroutine that blocks in an ordinary system call lets the Go scheduler
// hand its P to another thread, and on a busy node the P comes back only
// once a normal-priority thread runs to give it: the real-time thread,
// woken at once by the freeze's notification, then waited for the CPU
// hogs (decision → frozen p99 4.6 × the bare program's with a CPU hog
// per core). A raw system call keeps the P with the thread. The price:
// the P is out of the runtime's reach while the thread waits, so d must
// stay short, well under the 10 ms after which the runtime preempts a
// goroutine (and a preempted goroutine locked to its thread waits for
// another thread to run it again).
func (f *Freezer) WaitFrozenOnThread(d, poll time.Duration) error {
	deadline := time.Now().Add(d)
	name := FreezerV1
	if f.Kind == FreezerV2 {
		name = "cgroup.events"
	}
	fd, err := unix.Openat(f.dir, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("cgroups: %s/%s: %w", f.Path, name, err)
	}
	defer unix.Close(fd)
	var buf [256]byte
	for {
		n, err := rawPread(fd, buf[:])
		if err != nil {
			return fmt.Errorf("cgroups: reading %s/%s: %w", f.Path, name, err)
		}
		s := string(buf[:n])
		if (f.Kind == FreezerV2 && eventsFrozen(s)) || (f.Kind == FreezerV1 && strings.TrimSpace(s) == "FROZEN") {
			return nil
		}
		left := time.Until(deadline)
		if left <= 0 {
			return fmt.Errorf("%w: %s after %s", ErrFreezeTimeout, f.Path, d)
		}
		// v2: woken early by the notification; v1 has none (a sleep).
		if err := rawPoll(fd, f.Kind == FreezerV2, min(left, poll)); err != nil {
			return fmt.Errorf("cgroups: polling %s/%s: %w", f.Path, name, err)
		}
	}
}

// rawPread is pread(2) from offset 0 without the Go scheduler.
func rawPread(fd int, b []byte) (int, error) {
	for {
		n, _, e := unix.RawSyscall6(unix.SYS_PREAD64, uintptr(fd), uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)), 0, 0, 0)
		if e == unix.EINTR {
			continue
		}
		if e != 0 {
			return 0, e
		}
		return int(n), nil
	}
}

// rawPoll waits up to d for POLLPRI on fd (pri) or sleeps d, without the
// Go scheduler; an interruption (the runtime's preemption signal) ends
// the wait early, as a notification would.
func rawPoll(fd int, pri bool, d time.Duration) error {
	ts := unix.NsecToTimespec(d.Nanoseconds())
	var e unix.Errno
	if pri {
		pfd := unix.PollFd{Fd: int32(fd), Events: unix.POLLPRI}
		_, _, e = unix.RawSyscall6(unix.SYS_PPOLL, uintptr(unsafe.Pointer(&pfd)), 1, uintptr(unsafe.Pointer(&ts)), 0, 0, 0)
	} else {
		_, _, e = unix.RawSyscall6(unix.SYS_PPOLL, 0, 0, uintptr(unsafe.Pointer(&ts)), 0, 0, 0)
	}
	if e != 0 && e != unix.EINTR {
		return e
	}
	return nil
}
