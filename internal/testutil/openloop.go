package testutil

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
)

// openLoopC opens argv[1] argv[2] times as fast as it can (closing each fd
// it gets) after a line on stdin (the test moves it into a cgroup first),
// and prints "opened N refused M other K": the gate's verdicts counted at
// the syscall, without a Go runtime between the opens.
const openLoopC = `
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int main(int argc, char **argv) {
	char line[64];
	if (argc < 3 || !fgets(line, sizeof line, stdin)) return 2;
	long n = atol(argv[2]), opened = 0, refused = 0, other = 0;
	for (long i = 0; i < n; i++) {
		int fd = open(argv[1], O_RDWR | O_CLOEXEC);
		if (fd >= 0) { opened++; close(fd); }
		else if (errno == EPERM) refused++;
		else other++;
	}
	printf("opened %ld refused %ld other %ld\n", opened, refused, other);
	return 0;
}
`

// OpenLoop builds and runs the open loop (C compiler needed: cc) on path n
// times; setup runs with its PID before the first open (join a cgroup).
// It returns how many opens succeeded, were refused (EPERM), and failed
// otherwise.
func OpenLoop(tb testing.TB, path string, n int, setup func(pid int)) (opened, refused, other int) {
	tb.Helper()
	dir := tb.TempDir()
	src := filepath.Join(dir, "openloop.c")
	bin := filepath.Join(dir, "openloop")
	if err := os.WriteFile(src, []byte(openLoopC), 0o644); err != nil {
		tb.Fatal(err)
	}
	cc, err := exec.LookPath("cc")
	if err != nil {
		Skip(tb, "no C compiler (cc) for the open loop: apt-get install gcc libc6-dev")
	}
	if out, err := exec.Command(cc, "-O2", "-o", bin, src).CombinedOutput(); err != nil {
		tb.Fatalf("building the open loop: %v\n%s", err, out)
	}
	cmd := exec.Command(bin, path, fmt.Sprint(n))
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
	defer cmd.Wait()
	if setup != nil {
		setup(cmd.Process.Pid)
	}
	if _, err := stdin.Write([]byte("go\n")); err != nil {
		tb.Fatal(err)
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		tb.Fatalf("open loop: %v", err)
	}
	if _, err := fmt.Sscanf(line, "opened %d refused %d other %d", &opened, &refused, &other); err != nil {
		tb.Fatalf("open loop said %q: %v", line, err)
	}
	return opened, refused, other
}
