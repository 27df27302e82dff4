// loop.c — the syscall-tax benchmark's compiled loop: N rounds of one
// syscall pattern, timed with CLOCK_MONOTONIC, printing nanoseconds per
// round. A Go loop would add its own scheduler and runtime work to each
// round and hide part of a per-syscall cost, so the loop is C.
//
//   loop getppid|read|pipe|openclose N [FILE]
//
// getppid    one getppid(2) (raw syscall: libc never caches it)
// read       a 1-byte read(2) of /dev/zero
// pipe       a 1-byte write(2) into a pipe and a 1-byte read(2) back
// openclose  open(2)+close(2) of FILE, a regular file
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static double now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static void die(const char *what)
{
	perror(what);
	exit(2);
}

int main(int argc, char **argv)
{
	if (argc < 3) {
		fprintf(stderr, "usage: loop getppid|read|pipe|openclose N [FILE]\n");
		return 2;
	}
	const char *kind = argv[1];
	long n = atol(argv[2]);
	if (n <= 0) {
		fprintf(stderr, "loop: N must be positive\n");
		return 2;
	}
	char c = 0;
	int fd = -1, p[2];
	double t0, t1;
	if (strcmp(kind, "getppid") == 0) {
		t0 = now_ns();
		for (long i = 0; i < n; i++)
			syscall(SYS_getppid);
		t1 = now_ns();
	} else if (strcmp(kind, "read") == 0) {
		if ((fd = open("/dev/zero", O_RDONLY)) < 0)
			die("open /dev/zero");
		t0 = now_ns();
		for (long i = 0; i < n; i++)
			if (read(fd, &c, 1) != 1)
				die("read");
		t1 = now_ns();
	} else if (strcmp(kind, "pipe") == 0) {
		if (pipe(p) < 0)
			die("pipe");
		t0 = now_ns();
		for (long i = 0; i < n; i++)
			if (write(p[1], &c, 1) != 1 || read(p[0], &c, 1) != 1)
				die("pipe write/read");
		t1 = now_ns();
	} else if (strcmp(kind, "openclose") == 0) {
		if (argc < 4) {
			fprintf(stderr, "loop: openclose needs FILE\n");
			return 2;
		}
		t0 = now_ns();
		for (long i = 0; i < n; i++) {
			if ((fd = open(argv[3], O_RDONLY)) < 0)
				die("open");
			close(fd);
		}
		t1 = now_ns();
	} else {
		fprintf(stderr, "loop: unknown pattern %s\n", kind);
		return 2;
	}
	printf("%.2f\n", (t1 - t0) / (double)n);
	return 0;
}
