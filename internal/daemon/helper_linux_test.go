package daemon_test

// A helper process for the integration tests: the test binary re-executed
// with GPUD_HELPER=1 reads commands on stdin and answers one line each, so
// tests can drive exact syscalls (open, dup3, close_range, SCM_RIGHTS, ...)
// in a process that is not the (exempt) test process itself.

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	v1 "github.com/gpud/gpud/api/v1"
	"github.com/gpud/gpud/internal/daemon"
	"github.com/gpud/gpud/internal/occupancy"
	"github.com/gpud/gpud/internal/testutil"
	"github.com/gpud/gpud/internal/workload"
	"golang.org/x/sys/unix"
)

func TestMain(m *testing.M) {
	if os.Getenv("GPUD_HELPER") == "1" {
		runHelper()
		return
	}
	stopLoad, err := startLoad()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	code := m.Run()
	stopLoad()
	os.Exit(code)
}

func runHelper() {
	// An fd to receive on, passed by a parent's "sendfd".
	if os.Getenv("GPUD_HELPER_RECV") == "1" {
		fd := recvFD(3)
		unix.Close(3)
		fmt.Println(fd)
	}
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		f := strings.Fields(in.Text())
		if len(f) == 0 {
			continue
		}
		res, err := helperCmd(f)
		if err != nil {
			fmt.Println("err", err)
			continue
		}
		fmt.Println(res)
	}
	// Without commands (a spawned child), stay alive holding what was
	// inherited until killed; Pdeathsig ends it with its parent.
	time.Sleep(time.Hour)
}

func atoi(s string) int { n, _ := strconv.Atoi(s); return n }

func helperCmd(f []string) (string, error) {
	switch f[0] {
	case "open": // open PATH [cloexec]
		flags := unix.O_RDWR
		if len(f) > 2 && f[2] == "cloexec" {
			flags |= unix.O_CLOEXEC
		}
		fd, err := unix.Open(f[1], flags, 0)
		return strconv.Itoa(fd), err
	case "openat2": // openat2 PATH
		fd, err := unix.Openat2(unix.AT_FDCWD, f[1], &unix.OpenHow{Flags: unix.O_RDWR})
		return strconv.Itoa(fd), err
	case "open2": // open2 PATH: the legacy open(2) syscall (x86-64 only)
		fd, err := legacyOpen(f[1])
		return strconv.Itoa(fd), err
	case "reopen": // reopen FD: open /proc/self/fd/FD again (a new file)
		fd, err := unix.Open("/proc/self/fd/"+f[1], unix.O_RDWR, 0)
		return strconv.Itoa(fd), err
	case "byhandle": // byhandle PATH: name_to_handle_at, then open_by_handle_at
		h, _, err := unix.NameToHandleAt(unix.AT_FDCWD, f[1], 0)
		if err != nil {
			return "", err
		}
		mnt, err := unix.Open(filepath.Dir(f[1]), unix.O_RDONLY|unix.O_DIRECTORY, 0)
		if err != nil {
			return "", err
		}
		defer unix.Close(mnt)
		fd, err := unix.OpenByHandleAt(mnt, h, unix.O_RDWR)
		return strconv.Itoa(fd), err
	case "uringopen": // uringopen PATH: IORING_OP_OPENAT; prints the new fd
		fd, err := uringOpen(f[1])
		return strconv.Itoa(fd), err
	case "close":
		return "ok", unix.Close(atoi(f[1]))
	case "dup":
		fd, err := unix.Dup(atoi(f[1]))
		return strconv.Itoa(fd), err
	case "dup2":
		return "ok", unix.Dup2(atoi(f[1]), atoi(f[2]))
	case "dup3":
		return "ok", unix.Dup3(atoi(f[1]), atoi(f[2]), 0)
	case "dupfd":
		fd, err := unix.FcntlInt(uintptr(atoi(f[1])), unix.F_DUPFD, 100)
		return strconv.Itoa(fd), err
	case "closerange":
		return "ok", unix.CloseRange(uint(atoi(f[1])), uint(atoi(f[2])), 0)
	case "getfd": // getfd PID FD: steal a fd with pidfd_getfd
		pidfd, err := unix.PidfdOpen(atoi(f[1]), 0)
		if err != nil {
			return "", err
		}
		defer unix.Close(pidfd)
		fd, err := unix.PidfdGetfd(pidfd, atoi(f[2]), 0)
		return strconv.Itoa(fd), err
	case "spawn": // spawn FD...: a child helper inheriting FDs as 3, 4, ...
		var files []*os.File
		for _, s := range f[1:] {
			files = append(files, os.NewFile(uintptr(atoi(s)), "gpu"))
		}
		cmd := helperCommand(files...)
		if err := cmd.Start(); err != nil {
			return "", err
		}
		return strconv.Itoa(cmd.Process.Pid), nil
	case "sendfd": // sendfd FD: pass FD to a new child over a unix socket
		pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return "", err
		}
		cmd := helperCommand(os.NewFile(uintptr(pair[1]), "sock"))
		cmd.Env = append(cmd.Env, "GPUD_HELPER_RECV=1")
		if err := cmd.Start(); err != nil {
			return "", err
		}
		unix.Close(pair[1])
		err = unix.Sendmsg(pair[0], []byte{'x'}, unix.UnixRights(atoi(f[1])), nil, 0)
		unix.Close(pair[0])
		return strconv.Itoa(cmd.Process.Pid), err
	case "sendfdto": // sendfdto SOCK FD: connect to the unix socket SOCK, wait, pass FD (SCM_RIGHTS)
		s, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return "", err
		}
		defer unix.Close(s)
		if err := unix.Connect(s, &unix.SockaddrUnix{Name: f[1]}); err != nil {
			return "", err
		}
		// The receiver accepts and waits inside its receive call first.
		time.Sleep(200 * time.Millisecond)
		return "ok", unix.Sendmsg(s, []byte{'x'}, unix.UnixRights(atoi(f[2])), nil, 0)
	case "opentimed": // opentimed PATH: CLOCK_MONOTONIC ns just before the open, and the fd
		t0 := monoNow()
		fd, err := unix.Open(f[1], unix.O_RDWR|unix.O_CLOEXEC, 0)
		return fmt.Sprintf("%d %d", t0, fd), err
	case "churn": // churn PATH MILLIS [RATE]: open/close pairs in a loop (at most RATE a second); prints the count
		start := time.Now()
		deadline := start.Add(time.Duration(atoi(f[2])) * time.Millisecond)
		rate := 0
		if len(f) > 3 {
			rate = atoi(f[3])
		}
		n := 0
		for time.Now().Before(deadline) {
			if rate > 0 {
				// Paced in batches: the batch is due at n/rate seconds.
				time.Sleep(time.Until(start.Add(time.Duration(float64(n) / float64(rate) * float64(time.Second)))))
			}
			for i := 0; i < 256; i++ {
				fd, err := unix.Open(f[1], unix.O_RDWR|unix.O_CLOEXEC, 0)
				if err != nil {
					return "", err
				}
				unix.Close(fd)
			}
			n += 256
		}
		return strconv.Itoa(n), nil
	case "lowrace": // lowrace PATH N OUT: N open attempts; successes' [start end] to OUT
		out, err := os.Create(f[3])
		if err != nil {
			return "", err
		}
		defer out.Close()
		w := bufio.NewWriter(out)
		ok, denied := 0, 0
		for i := 0; i < atoi(f[2]); i++ {
			t0 := monoNow()
			fd, err := unix.Open(f[1], unix.O_RDWR|unix.O_CLOEXEC, 0)
			t1 := monoNow()
			if err != nil {
				if err != unix.EPERM {
					return "", err
				}
				denied++
				continue
			}
			unix.Close(fd)
			ok++
			fmt.Fprintf(w, "%d %d\n", t0, t1)
		}
		return fmt.Sprintf("%d %d", ok, denied), w.Flush()
	case "highrace": // highrace PATH MILLIS OUT: hold/release loop; holding [open returned, close called] to OUT
		out, err := os.Create(f[3])
		if err != nil {
			return "", err
		}
		defer out.Close()
		w := bufio.NewWriter(out)
		deadline := time.Now().Add(time.Duration(atoi(f[2])) * time.Millisecond)
		n := 0
		for i := 0; time.Now().Before(deadline); i++ {
			fd, err := unix.Open(f[1], unix.O_RDWR|unix.O_CLOEXEC, 0)
			if err != nil {
				return "", err
			}
			c := monoNow()
			for monoNow()-c < uint64(i%7)*30000 { // hold 0-180 µs
			}
			d := monoNow()
			unix.Close(fd)
			fmt.Fprintf(w, "%d %d\n", c, d)
			n++
			time.Sleep(time.Duration(i%5+1) * time.Millisecond) // idle gaps for low opens to get in
		}
		return strconv.Itoa(n), w.Flush()
	case "exec": // exec [PATH]: replace this process with sleep (or PATH, a copy of it); non-CLOEXEC fds survive
		bin := "/bin/sleep"
		if len(f) > 1 {
			bin = f[1]
		}
		return "", syscall.Exec(bin, []string{bin, "600"}, os.Environ())
	case "comm": // comm NAME: rename the process (its leader's comm, as prctl PR_SET_NAME would)
		return "ok", os.WriteFile("/proc/self/comm", []byte(f[1]), 0)
	case "setuid": // setuid UID: drop root for good (real, effective and saved uid)
		return "ok", syscall.Setuid(atoi(f[1]))
	case "exit":
		os.Exit(0)
	}
	return "", fmt.Errorf("unknown command %q", f[0])
}

func monoNow() uint64 {
	var ts unix.Timespec
	unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return uint64(ts.Nano())
}

func recvFD(sock int) int {
	buf := make([]byte, 1)
	oob := make([]byte, unix.CmsgSpace(4))
	_, oobn, _, _, err := unix.Recvmsg(sock, buf, oob, 0)
	if err != nil {
		return -1
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil || len(msgs) == 0 {
		return -1
	}
	fds, err := unix.ParseUnixRights(&msgs[0])
	if err != nil || len(fds) == 0 {
		return -1
	}
	return fds[0]
}

// helperCommand returns a helper process that dies with its parent.
func helperCommand(extra ...*os.File) *exec.Cmd {
	exe, _ := os.Executable()
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), "GPUD_HELPER=1")
	cmd.ExtraFiles = extra
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	return cmd
}

// helper is a running helper process driven by a test.
type helper struct {
	t   testing.TB
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Scanner
}

func startHelper(t testing.TB) *helper {
	t.Helper()
	cmd := helperCommand()
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	h := &helper{t: t, cmd: cmd, in: stdin, out: bufio.NewScanner(stdout)}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	return h
}

func (h *helper) pid() int { return h.cmd.Process.Pid }

// do runs one command and returns its answer; an error answer fails the test.
func (h *helper) do(format string, args ...any) string {
	h.t.Helper()
	h.send(format, args...)
	if !h.out.Scan() {
		h.t.Fatalf("helper %d: no answer to %q", h.pid(), fmt.Sprintf(format, args...))
	}
	ans := h.out.Text()
	if strings.HasPrefix(ans, "err ") {
		h.t.Fatalf("helper %d: %q: %s", h.pid(), fmt.Sprintf(format, args...), ans)
	}
	return ans
}

// send sends a command without waiting for an answer (exec, exit).
func (h *helper) send(format string, args ...any) {
	fmt.Fprintf(h.in, format+"\n", args...)
}

func (h *helper) doInt(format string, args ...any) int {
	h.t.Helper()
	return atoi(h.do(format, args...))
}

// classified starts a helper in a new cgroup that reg classifies as class
// (a workload known by its cgroup alone, named by taskID).
func classified(tb testing.TB, reg *workload.Registry, name string, class occupancy.Priority, taskID string) (*helper, uint64) {
	tb.Helper()
	dir, id := classifiedCgroup(tb, reg, name, class, taskID)
	h := startHelper(tb)
	testutil.JoinCgroup(tb, dir, h.pid())
	return h, id
}

// classifiedCgroup is a new cgroup that reg classifies as class (named by
// taskID), for processes born into it.
func classifiedCgroup(tb testing.TB, reg *workload.Registry, name string, class occupancy.Priority, taskID string) (dir string, id uint64) {
	tb.Helper()
	dir, id = testutil.Cgroup(tb, name)
	reg.Put(workload.Workload{CgroupID: id, Priority: class, TaskID: taskID})
	return dir, id
}

// highAndLow starts a helper in a high and one in a low cgroup of reg
// (names prefix+"high", prefix+"low"; task ids taskPrefix+"-high" and
// taskPrefix+"-low", or none when taskPrefix is ""): the two sides of a
// preemption.
func highAndLow(tb testing.TB, reg *workload.Registry, prefix, taskPrefix string) (high, low *helper) {
	tb.Helper()
	task := func(class string) string {
		if taskPrefix == "" {
			return ""
		}
		return taskPrefix + "-" + class
	}
	high, _ = classified(tb, reg, prefix+"high", occupancy.High, task("high"))
	low, _ = classified(tb, reg, prefix+"low", occupancy.Low, task("low"))
	return high, low
}

// runDaemon runs a daemon on cfg, logging to log, until stop is called or
// the test ends; an error from its run fails the test. It does not wait
// for the daemon to be ready (waitReady does).
func runDaemon(tb testing.TB, cfg daemon.Config, log *slog.Logger) (d *daemon.Daemon, stop func()) {
	tb.Helper()
	d, err := daemon.New(cfg, log)
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				tb.Errorf("daemon: %v", err)
			}
		})
	}
	tb.Cleanup(stop)
	return d, stop
}

// waitReady waits (5 s at most) until d is ready: its first
// reconciliation done and events flowing.
func waitReady(tb testing.TB, d *daemon.Daemon) {
	tb.Helper()
	testutil.Eventually(tb, 5*time.Second, "gpud ready", d.Ready)
}

// debugLog is a debug-level JSON logger writing to w (a test's log buffer).
func debugLog(w io.Writer) *slog.Logger {
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// waitHolder waits (5 s at most) until the state file lists pid as a holder
// of GPU gpu, and returns that state file.
func waitHolder(t *testing.T, e *env, gpu, pid int) *v1.StateFile {
	t.Helper()
	return testutil.WaitStateFile(t, e.cfg.StateFile, 5*time.Second, func(f *v1.StateFile) bool {
		for _, h := range f.GPUs[gpu].Holders {
			if h.PID == pid {
				return true
			}
		}
		return false
	})
}
