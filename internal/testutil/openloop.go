package testutil

import (
	"fmt"
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
	_, line := runC(tb, "the open loop", openLoopC, []string{"-O2"}, []string{path, fmt.Sprint(n)}, setup)
	if _, err := fmt.Sscanf(line, "opened %d refused %d other %d", &opened, &refused, &other); err != nil {
		tb.Fatalf("open loop said %q: %v", line, err)
	}
	return opened, refused, other
}
