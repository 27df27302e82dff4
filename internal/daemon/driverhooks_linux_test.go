package daemon_test

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "github.com/gpud/gpud/api/v1"
	"github.com/gpud/gpud/internal/testutil"
)

// newDriverEnv is newEnv with gpud in --hooks driver, whatever
// GPUD_TEST_HOOKS says.
func newDriverEnv(t *testing.T) *env {
	e := newEnv(t)
	e.cfg.Hooks = "driver"
	e.settleFor = 10 * time.Second
	return e
}

// Every route to a GPU fd the kernel offers ends in the right ledger in
// driver mode, which has no syscall hook: the gate, which runs for every
// device-file open, reports the open whatever the syscall (or none: an
// io_uring worker), and the holder is listed while it holds and gone after
// its last close (by the driver's release where the kernel has kprobes,
// else by the re-read of the holders' fd tables).
func TestDriverHooksOpenRoutes(t *testing.T) {
	e := newDriverEnv(t)
	e.start()
	g := e.gpus[0].Path
	routes := []struct{ name, cmd string }{
		{"openat", "open " + g},
		{"openat2", "openat2 " + g},
		{"open_by_handle_at", "byhandle " + g},
		{"io_uring IORING_OP_OPENAT", "uringopen " + g},
	}
	if runtime.GOARCH == "amd64" {
		routes = append(routes, struct{ name, cmd string }{"open(2)", "open2 " + g})
	}
	for _, r := range routes {
		h := startHelper(t)
		fd := int32(h.doInt("%s", r.cmd))
		e.settle(r.name+": open", holds(h.pid(), 0, fd))
		// A reopen through /proc/self/fd is another open of the device.
		re := int32(h.doInt("reopen %d", fd))
		e.settle(r.name+": reopen through /proc/self/fd", holds(h.pid(), 0, fd, re))
		h.do("close %d", fd)
		h.do("close %d", re)
		e.settle(r.name+": closed", holds(h.pid(), 0))
	}
	testutil.WaitStateFile(t, e.cfg.StateFile, 3*time.Second, func(f *v1.StateFile) bool {
		return f.Hooks != nil && f.Hooks.Mode == "driver" && !slices.Contains(f.Hooks.Attached, "tp_btf/sys_enter") &&
			(f.Hooks.Complete || len(f.Hooks.Missing) > 0)
	})
}

// The 32-bit ABI's open (int 0x80), which the syscall hooks' x86-64
// syscall numbers do not match: the gate sees it all the same.
func TestDriverHooksCompatOpen(t *testing.T) {
	if runtime.GOARCH != "amd64" {
		testutil.Skip(t, "the 32-bit ABI test is x86-64's")
	}
	e := newDriverEnv(t)
	bin := buildCompatOpener(t, e.gpus[0].Path)
	e.start()
	cmd := exec.Command(bin)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("32-bit opener: %v", err)
	}
	fd, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil || fd < 0 {
		t.Fatalf("32-bit opener printed %q", line)
	}
	e.settle("32-bit open", holds(cmd.Process.Pid, 0, int32(fd)))
	cmd.Process.Kill()
	cmd.Wait()
	e.settle("32-bit opener gone", holds(cmd.Process.Pid, 0))
}

// buildCompatOpener compiles a static 32-bit program, without libc (the
// test machines have no 32-bit one), that opens path with int 0x80's
// open, prints the fd and waits.
func buildCompatOpener(t *testing.T, path string) string {
	t.Helper()
	src := filepath.Join(t.TempDir(), "open32.c")
	bin := strings.TrimSuffix(src, ".c")
	code := fmt.Sprintf(`
static long sys3(long nr, long a, long b, long c) {
	long ret;
	__asm__ volatile("int $0x80" : "=a"(ret) : "a"(nr), "b"(a), "c"(b), "d"(c) : "memory");
	return ret;
}
void _start(void) {
	char buf[16];
	int n = sizeof(buf);
	long fd = sys3(5, (long)%q, 2, 0); /* open(path, O_RDWR) */
	unsigned long v = fd < 0 ? 0 : (unsigned long)fd;
	buf[--n] = '\n';
	do { buf[--n] = '0' + v %% 10; v /= 10; } while (v);
	if (fd < 0) buf[--n] = '-';
	sys3(4, 1, (long)(buf + n), sizeof(buf) - n); /* write(1, ...) */
	for (;;) sys3(29, 0, 0, 0); /* pause() */
}
`, path)
	if err := os.WriteFile(src, []byte(code), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("cc", "-m32", "-nostdlib", "-static", "-O1", "-o", bin, src).CombinedOutput()
	if err != nil {
		testutil.Skip(t, fmt.Sprintf("no 32-bit toolchain (cc -m32): %v %s", err, out))
	}
	return bin
}

// Process events in driver mode: fork, exec (O_CLOEXEC) and exit, dup, and
// fds passed by SCM_RIGHTS and pidfd_getfd.
func TestDriverHooksLifecycle(t *testing.T) {
	e := newDriverEnv(t)
	e.start()
	g0 := e.gpus[0].Path

	parent := startHelper(t)
	fd := parent.doInt("open %s cloexec", g0)
	dup := parent.doInt("dup %d", fd)
	e.settle("dup", holds(parent.pid(), 0, int32(fd), int32(dup)))
	parent.do("close %d", dup)
	e.forkThenExec(parent, fd)

	s := startHelper(t)
	sfd := s.doInt("open %s cloexec", g0)
	recv := s.doInt("sendfd %d", sfd)
	e.passedFDsNeedResync(recv)
	e.settleReceived(recv)
	thief := e.stealFD(s, sfd)

	thief.send("exit")
	e.settle("exit", holds(thief.pid(), 0))
}

// A driver upgrade reloads the driver's module: the running gpud drops the
// kprobe that died with the old module and hooks the new one within a
// tick or two, and holders' last closes are reported by it again, at once
// (the holders' re-read would take up to 2 s: three closes all seen within
// 300 ms by the re-read alone would happen once in 300 runs). It runs in
// the kernel matrix's guests where fuse, the stand-in driver of GPU 1, is
// a module (GPUD_TEST_FUSE_KO names its file).
func TestDriverHooksFollowModuleReload(t *testing.T) {
	e := newDriverEnv(t)
	e.start()
	const fuse = "kprobe/release:fuse_dev_release"
	hooked := func() bool { return slices.Contains(e.d.Monitor().Hooks().Attached, fuse) }
	ko := os.Getenv("GPUD_TEST_FUSE_KO")
	if ko == "" {
		time.Sleep(2 * time.Second) // a tick or two: nothing may change
		if strings.Contains(e.logs.String(), "driver hooks changed") {
			t.Fatalf("driver hooks changed without a reload:\n%s", e.logs.String())
		}
		t.Logf("fuse hooked: %v; the reload runs in the kernel matrix's guests where fuse is a module (GPUD_TEST_FUSE_KO)", hooked())
		return
	}
	if !hooked() {
		t.Fatalf("%s not attached: %+v", fuse, e.d.Monitor().Hooks())
	}
	load := testutil.UnloadModule(t, "fuse", ko, func() string {
		var who []string
		for pid := range e.groundTruth() {
			cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
			who = append(who, fmt.Sprintf("%d %q", pid, cmd))
		}
		return fmt.Sprintf("GPU 1's holders: %v", who)
	})
	// The daemon logs a change just after the monitor's state shows it,
	// so each wait is for both.
	changes := func() int { return strings.Count(e.logs.String(), "driver hooks changed") }
	testutil.Eventually(t, 3*time.Second, "the dead kprobe dropped, and logged", func() bool { return !hooked() && changes() >= 1 })
	load()
	testutil.Eventually(t, 3*time.Second, "fuse's release hooked again", hooked)
	if !testutil.Poll(time.Second, func() bool { return changes() >= 2 }) {
		t.Errorf("%d 'driver hooks changed' lines, want one for the drop and one for the new attach:\n%s", changes(), e.logs.String())
	}
	if err := e.d.Monitor().GateErr(); err != nil {
		// 5.10: without the gate no open is reported, and a new holder
		// is found by the periodic resync only.
		t.Logf("the gate is refused (%v): the closes after the reload are not timed", err)
		return
	}
	g := e.gpus[1].Path
	for i := 0; i < 3; i++ {
		h := startHelper(t)
		fd := int32(h.doInt("open %s", g))
		e.settle("open after the reload", holds(h.pid(), 1, fd))
		h.do("close %d", fd)
		closed := time.Now()
		testutil.Eventually(t, 3*time.Second, "the close in the ledger", func() bool {
			return len(e.d.Ledger().FDTable()[h.pid()][1]) == 0
		})
		if d := time.Since(closed); d > 300*time.Millisecond {
			t.Errorf("close %d left the ledger after %v: by the holders' re-read, not the reloaded module's release", i, d)
		}
	}
}
