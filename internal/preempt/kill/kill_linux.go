// Package kill ends processes through pidfds, never a bare PID: one
// process (Kill), or one decision's victims as a batch (identity checked,
// intents journaled, signalled at real-time priority, waited for together,
// outcomes journaled).
package kill

import (
	"errors"
	"fmt"
	"time"

	"github.com/gpud/gpud/internal/occupancy"
	"golang.org/x/sys/unix"
)

// Kill errors.
var (
	// ErrGone: the process had already exited; nothing was signalled.
	ErrGone = errors.New("preempt: process already gone")
	// ErrNotSameProcess: the PID now belongs to another process (reused);
	// nothing was signalled.
	ErrNotSameProcess = errors.New("preempt: PID belongs to another process now")
	// ErrUnknownIdentity: no start time to tell the process apart from a
	// later one with the same PID; gpud does not signal what it cannot identify.
	ErrUnknownIdentity = errors.New("preempt: process identity unknown")
	// ErrStillAlive: SIGKILL was sent but the process did not exit in time.
	ErrStillAlive = errors.New("preempt: process did not die")
)

// Kill ends one process through a pidfd, never a bare PID: the pidfd is
// opened first, then the process behind it is checked to be the victim —
// its pidfs inode (unique for ever) when the kernel has pidfs, and its start
// time, and verify when given (the executor checks that it still holds the
// GPU in the same cgroup) — so a reused PID is never signalled; the signals
// go to the pidfd, which keeps naming the same process even if the PID is
// reused later. With grace > 0 it sends SIGTERM and waits that long before
// SIGKILL. It returns once the process is confirmed dead (the pidfd turns
// readable).
func Kill(procRoot string, v occupancy.ProcInfo, grace time.Duration, verify ...func(pid int) error) (signal string, err error) {
	pidfd, err := OpenChecked(procRoot, v)
	if err != nil {
		return "", err
	}
	defer unix.Close(pidfd)
	for _, f := range verify {
		if err := f(v.PID); err != nil {
			return "", fmt.Errorf("%w: %w", ErrNotSameProcess, err)
		}
	}
	if grace > 0 {
		if err := unix.PidfdSendSignal(pidfd, unix.SIGTERM, nil, 0); err != nil {
			if errors.Is(err, unix.ESRCH) {
				return "", ErrGone
			}
			return "", fmt.Errorf("preempt: SIGTERM %d: %w", v.PID, err)
		}
		if exited(pidfd, grace) {
			return "SIGTERM", nil
		}
	}
	if err := unix.PidfdSendSignal(pidfd, unix.SIGKILL, nil, 0); err != nil {
		if errors.Is(err, unix.ESRCH) {
			return "SIGTERM", nil // exited between the wait and the kill
		}
		return "", fmt.Errorf("preempt: SIGKILL %d: %w", v.PID, err)
	}
	if !exited(pidfd, 5*time.Second) {
		return "SIGKILL", ErrStillAlive
	}
	return "SIGKILL", nil
}

// OpenChecked opens a pidfd for v and checks that the process behind it is
// v: its start time, and its pidfs inode when known. From then on the pidfd
// names that process, whatever later happens to its PID. The caller closes
// the pidfd.
func OpenChecked(procRoot string, v occupancy.ProcInfo) (int, error) {
	if v.StartTime == 0 {
		return -1, ErrUnknownIdentity
	}
	pidfd, err := unix.PidfdOpen(v.PID, 0)
	if err != nil {
		if errors.Is(err, unix.ESRCH) {
			return -1, ErrGone
		}
		return -1, fmt.Errorf("preempt: pidfd_open %d: %w", v.PID, err)
	}
	if v.PidfdIno != 0 {
		// pidfs: the inode names one process for the system's lifetime,
		// which is all the start time would tell (and reading
		// /proc/<pid>/stat costs as much as the rest of a kill's checks).
		if occupancy.PidfdInoOf(pidfd) != v.PidfdIno {
			unix.Close(pidfd)
			return -1, ErrNotSameProcess
		}
		return pidfd, nil
	}
	start, err := occupancy.StartTime(procRoot, v.PID)
	switch {
	case err != nil:
		err = ErrGone
	case start != v.StartTime:
		err = ErrNotSameProcess
	}
	if err != nil {
		unix.Close(pidfd)
		return -1, err
	}
	return pidfd, nil
}

// exited waits until the process behind pidfd has exited, or d passes.
func exited(pidfd int, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for {
		left := time.Until(deadline)
		if left < 0 {
			left = 0
		}
		fds := []unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, int(left.Milliseconds())+1)
		if err == unix.EINTR {
			continue
		}
		if n > 0 {
			return true
		}
		if err != nil || time.Now().After(deadline) {
			return false
		}
	}
}
