package compute

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpud/gpud/internal/cgroups"
)

// GuardCommand is gpud's hidden subcommand that runs a thaw guard
// (RunGuard): gpud's own binary, re-executed by the Controller before its
// first freeze.
const GuardCommand = "thaw-guard"

// GuardExe is the binary the Controller re-executes as its thaw guard
// (`gpud run` sets /proc/self/exe); "" starts none (the journal thaw at
// the next gpud's start is then the only bound).
var GuardExe string

// guardStart bounds the guard's start: exec, its move out of gpud's
// cgroup, its "ready".
const guardStart = 5 * time.Second

// guard is the thaw guard of this gpud: its stdin is a pipe whose write
// end only this gpud holds, so the kernel closes it as gpud exits, however
// it dies.
type guard struct {
	cmd *exec.Cmd
	w   *os.File
}

// startGuard starts exe's thaw guard for stateDir's journal and waits for
// it to say it is ready (out of gpud's cgroup, watching). note is what
// the guard reported (where it moved to, or why it could not).
func startGuard(exe, stateDir, cgroupRoot string) (g *guard, note string, err error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, "", fmt.Errorf("compute: thaw guard: %w", err)
	}
	defer r.Close()
	cmd := exec.Command(exe, GuardCommand, "--state-dir", stateDir, "--cgroup-root", cgroupRoot)
	cmd.Stdin = r
	out, err := cmd.StdoutPipe()
	if err != nil {
		w.Close()
		return nil, "", fmt.Errorf("compute: thaw guard: %w", err)
	}
	cmd.Stderr = os.Stderr // its few lines in gpud's log stream
	// Its own session: no terminal's signal reaches it with gpud's.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		w.Close()
		return nil, "", fmt.Errorf("compute: thaw guard: %w", err)
	}
	line := make(chan string, 1)
	go func() {
		s, _ := bufio.NewReader(out).ReadString('\n')
		line <- s
		_, _ = io.Copy(io.Discard, out)
	}()
	go func() { _ = cmd.Wait() }() // reaped when it ends (gpud's clean stop)
	select {
	case s := <-line:
		if note, ok := strings.CutPrefix(strings.TrimSpace(s), "ready"); ok {
			return &guard{cmd: cmd, w: w}, strings.TrimSpace(note), nil
		}
		err = fmt.Errorf("compute: thaw guard said %q", s)
	case <-time.After(guardStart):
		err = fmt.Errorf("compute: thaw guard not ready in %s", guardStart)
	}
	_ = cmd.Process.Kill()
	w.Close()
	return nil, "", err
}

// close ends the guard: gpud stopped cleanly (the journal is empty, so
// it thaws nothing).
func (g *guard) close() {
	if g != nil {
		g.w.Close()
	}
}

// RunGuard is the thaw guard: it leaves gpud's cgroup for cgroupRoot's
// root cgroup (a DaemonSet pod's or a systemd unit's teardown kills what
// is in theirs: see escapeCgroup), says "ready" on ready, and waits for
// end of file on watch, its end of a pipe only gpud holds open: the kernel
// closes it as gpud exits, SIGKILL and OOM included. Then it thaws every
// cgroup the journal in stateDir lists (none after a clean stop: gpud
// thawed them and removed it) and returns.
func RunGuard(watch io.Reader, ready io.Writer, stateDir, cgroupRoot string) error {
	note := "in " + escapeCgroup(cgroupRoot)
	if _, err := fmt.Fprintf(ready, "ready %s\n", note); err != nil {
		return fmt.Errorf("compute: thaw guard: %w", err)
	}
	if c, ok := ready.(io.Closer); ok {
		c.Close()
	}
	_, _ = io.Copy(io.Discard, watch) // until gpud is gone
	n, err := ThawJournal(stateDir, cgroupRoot, CgroupFreezer{CgroupRoot: cgroupRoot}, nil)
	if n > 0 || err != nil {
		fmt.Fprintf(os.Stderr, "gpud thaw-guard: gpud ended without thawing: thawed %d cgroups the compute scheduler froze (%v)\n", n, err)
	}
	return err
}

// escapeCgroup moves this process to the root cgroup of the v2 hierarchy
// at root ("" detects it), and of every v1 hierarchy, and returns where
// it is. Out of gpud's cgroup,
// nothing that tears gpud down kills it: kubelet and the runtime kill
// the processes of the container's cgroup (a hostPID pod has no PID
// namespace of its own whose end would), systemd those of the unit's, and
// `docker run --pid=host`'s runc those of the container's. A container
// with a cgroup namespace of its own cannot name the host's root: the
// move is made from the host's cgroup namespace (PID 1's, seen through
// the host's /proc: hostPID), on a thread of its own.
func escapeCgroup(root string) string {
	if root == "" {
		r, _, err := cgroups.V2Root()
		if err != nil {
			return "gpud's cgroup (" + err.Error() + ")"
		}
		root = r
	}
	runtime.LockOSThread() // the namespace is this thread's: never given back
	if fd, err := unix.Open("/proc/1/ns/cgroup", unix.O_RDONLY|unix.O_CLOEXEC, 0); err == nil {
		_ = unix.Setns(fd, unix.CLONE_NEWCGROUP)
		unix.Close(fd)
	}
	procs := filepath.Join(root, "cgroup.procs")
	f, err := os.OpenFile(procs, os.O_WRONLY, 0)
	if err == nil {
		_, err = f.WriteString(strconv.Itoa(os.Getpid()))
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		return "gpud's cgroup (" + err.Error() + ")"
	}
	// On a hybrid host the runtime's teardown may go by a v1 hierarchy
	// (runc's v1 manager): leave gpud's cgroup in each of them too.
	var stuck []string
	for _, v1 := range cgroups.V1Roots() {
		if err := os.WriteFile(filepath.Join(v1, "cgroup.procs"), []byte(strconv.Itoa(os.Getpid())), 0); err != nil {
			stuck = append(stuck, v1)
		}
	}
	if len(stuck) > 0 {
		return root + " (still in gpud's cgroup of " + strings.Join(stuck, ", ") + ")"
	}
	return root
}
