package testutil

import (
	"fmt"
	"testing"
	"time"
)

// openLoopC opens argv[1] up to argv[2] times, for at most argv[3]
// milliseconds, as fast as it can (closing each fd it gets) after a line on
// stdin (the test moves it into a cgroup first), and prints "opened N
// refused M other K": the gate's verdicts counted at the syscall, without a
// Go runtime between the opens.
const openLoopC = `
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static long now_ms(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int main(int argc, char **argv) {
	char line[64];
	if (argc < 4 || !fgets(line, sizeof line, stdin)) return 2;
	long n = atol(argv[2]), end = now_ms() + atol(argv[3]), opened = 0, refused = 0, other = 0;
	for (long i = 0; i < n && ((i & 1023) || now_ms() < end); i++) {
		int fd = open(argv[1], O_RDWR | O_CLOEXEC);
		if (fd >= 0) { opened++; close(fd); }
		else if (errno == EPERM) refused++;
		else other++;
	}
	printf("opened %ld refused %ld other %ld\n", opened, refused, other);
	return 0;
}
`

// OpenLoop builds and runs the open loop (C compiler needed: cc) on path,
// n times or for d, whichever ends first (a slow machine, an emulated
// kernel, makes fewer opens); setup runs with its PID before the first open
// (join a cgroup). It returns how many opens succeeded, were refused
// (EPERM), and failed otherwise.
func OpenLoop(tb testing.TB, path string, n int, d time.Duration, setup func(pid int)) (opened, refused, other int) {
	tb.Helper()
	_, line := runC(tb, "the open loop", openLoopC, []string{"-O2"}, []string{path, fmt.Sprint(n), fmt.Sprint(d.Milliseconds())}, setup)
	if _, err := fmt.Sscanf(line, "opened %d refused %d other %d", &opened, &refused, &other); err != nil {
		tb.Fatalf("open loop said %q: %v", line, err)
	}
	return opened, refused, other
}
