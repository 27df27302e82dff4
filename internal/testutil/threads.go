package testutil

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// leaderExitC is a process whose thread-group leader exits while another
// thread keeps a GPU fd open. Go cannot end only its main thread, so it is
// C. After a line on stdin (the test moves it into a cgroup first) it opens
// argv[1]; with "unshare" as argv[2] the keeper thread takes its own fd
// table and the leader closes the fd, so only the keeper's table holds it;
// otherwise the leader ends with exit(2) (SYS_exit: that thread only) and
// stays a zombie without an fd table. The keeper prints "ready FD" once
// the shape is in place, then sleeps.
const leaderExitC = `
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

static int fd = -1;
static int unshared;
static volatile int keeper_ready;

static char leader_state(void) {
	char buf[1024];
	int f = open("/proc/self/stat", O_RDONLY);
	if (f < 0) return '?';
	ssize_t n = read(f, buf, sizeof buf - 1);
	close(f);
	if (n <= 0) return '?';
	buf[n] = 0;
	char *p = strrchr(buf, ')');
	return p && p[1] && p[2] ? p[2] : '?';
}

static void *keeper(void *arg) {
	(void)arg;
	if (unshared) {
		if (unshare(CLONE_FILES) != 0) { perror("unshare"); _exit(1); }
		keeper_ready = 1;
		while (keeper_ready != 2) usleep(1000);
	} else {
		while (leader_state() != 'Z') usleep(1000);
	}
	printf("ready %d\n", fd);
	fflush(stdout);
	for (;;) pause();
	return 0;
}

int main(int argc, char **argv) {
	char line[64];
	if (argc < 2 || !fgets(line, sizeof line, stdin)) return 2;
	fd = open(argv[1], O_RDWR | O_CLOEXEC);
	if (fd < 0) { perror("open"); return 1; }
	unshared = argc > 2 && strcmp(argv[2], "unshare") == 0;
	pthread_t t;
	if (pthread_create(&t, 0, keeper, 0) != 0) return 1;
	if (unshared) {
		while (keeper_ready != 1) usleep(1000);
		close(fd); /* the leader's table no longer has it; the keeper's copy does */
		keeper_ready = 2;
		for (;;) pause();
	}
	syscall(SYS_exit, 0);
	return 0;
}
`

// ThreadHolder is a running leaderExitC process.
type ThreadHolder struct {
	Cmd *exec.Cmd
	FD  int
}

// StartThreadHolder builds and starts the helper (C compiler needed: cc);
// before anything is opened, setup runs with its PID (join a cgroup). Then
// the helper opens path and takes its shape: the leader exited (unshare
// false) or a thread with its own fd table (unshare true).
func StartThreadHolder(tb testing.TB, path string, unshare bool, setup func(pid int)) *ThreadHolder {
	tb.Helper()
	args := []string{path}
	if unshare {
		args = append(args, "unshare")
	}
	cmd, line := runC(tb, "the thread-shape helper", leaderExitC, []string{"-O1", "-pthread"}, args, setup)
	f := strings.Fields(line)
	if len(f) != 2 || f[0] != "ready" {
		tb.Fatalf("thread-shape helper said %q", line)
	}
	fd, _ := strconv.Atoi(f[1])
	return &ThreadHolder{Cmd: cmd, FD: fd}
}

// runC builds a C helper (a C compiler needed: cc) and starts it with
// args, killed at the end of the test; setup runs with its PID (join a
// cgroup), then a line on its stdin lets it go, and its first line of
// output is returned. what names the helper in failures.
func runC(tb testing.TB, what, src string, cflags, args []string, setup func(pid int)) (*exec.Cmd, string) {
	tb.Helper()
	dir := tb.TempDir()
	file := filepath.Join(dir, "helper.c")
	bin := filepath.Join(dir, "helper")
	if err := os.WriteFile(file, []byte(src), 0o644); err != nil {
		tb.Fatal(err)
	}
	cc, err := exec.LookPath("cc")
	if err != nil {
		Skip(tb, "no C compiler (cc) for "+what+": apt-get install gcc libc6-dev")
	}
	if out, err := exec.Command(cc, append(append(cflags, "-o", bin), file)...).CombinedOutput(); err != nil {
		tb.Fatalf("building %s: %v\n%s", what, err, out)
	}
	cmd := exec.Command(bin, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		tb.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	if setup != nil {
		setup(cmd.Process.Pid)
	}
	if _, err := stdin.Write([]byte("go\n")); err != nil {
		tb.Fatal(err)
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		tb.Fatalf("%s: %v", what, err)
	}
	return cmd, line
}

// PID is the helper's process id (its exited leader's, when it exited).
func (h *ThreadHolder) PID() int { return h.Cmd.Process.Pid }
