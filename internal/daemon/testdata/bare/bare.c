// bare.c — the floor of the preemption benchmarks: what a bare program
// costs to do what gpud does to its victims, with nothing else (no event,
// no decision, no checks, no journal). It stays running and takes commands
// on stdin, one a line, so that no exec is timed; each answer is one line,
// the nanoseconds (CLOCK_MONOTONIC) the command took from its first
// syscall to its end, or "err ..." on a failure.
//
//   kill PID...   pidfd_open each (not timed), then SIGKILL each through
//                 its pidfd and wait until every pidfd is readable (dead)
//   freeze DIR    write "1" to DIR/cgroup.freeze and wait for "frozen 1"
//                 in DIR/cgroup.events (POLLPRI, read again every 50 µs:
//                 the kernel may hold a notification back up to 10 ms)
//   freezev1 DIR  write FROZEN to DIR/freezer.state and read it until it
//                 says FROZEN (v1 has no notification)
//   thaw DIR      write "0" to DIR/cgroup.freeze (or THAWED to
//                 freezer.state, whichever DIR has) and wait for thawed
//   rt            run at SCHED_FIFO priority 1 from now on (the class of
//                 gpud's preempting thread); answers 0
//   onopen FIFO CMD...
//                 answer 0, open FIFO for reading, which waits until
//                 something opens it for writing (10 s at most), and run
//                 CMD, whose answer follows with the CLOCK_MONOTONIC ns at
//                 which it started ("NS START"): a freeze triggered by an
//                 open, as gpud's is by the gate's event. A FIFO's opener
//                 wakes the reader at once; inotify's IN_OPEN came 3–30 ms
//                 after the open here.
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define MAXV 4096

// with_start: the freeze commands answer "NS START" (START: their first
// syscall's CLOCK_MONOTONIC ns), for onopen.
static int with_start;

static long long now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void answer(long long t0)
{
	long long ns = now_ns() - t0;
	if (with_start)
		printf("%lld %lld\n", ns, t0);
	else
		printf("%lld\n", ns);
}

static int pidfd_open(pid_t pid) { return (int)syscall(SYS_pidfd_open, pid, 0); }

static int pidfd_kill(int fd) { return (int)syscall(SYS_pidfd_send_signal, fd, SIGKILL, NULL, 0); }

static void do_kill(char *args)
{
	static int fds[MAXV];
	static struct pollfd p[MAXV];
	int n = 0;
	for (char *tok = strtok(args, " \t"); tok && n < MAXV; tok = strtok(NULL, " \t")) {
		int fd = pidfd_open(atoi(tok));
		if (fd < 0) {
			printf("err pidfd_open %s: %s\n", tok, strerror(errno));
			for (int i = 0; i < n; i++)
				close(fds[i]);
			return;
		}
		fds[n++] = fd;
	}
	long long t0 = now_ns();
	for (int i = 0; i < n; i++)
		pidfd_kill(fds[i]);
	int left = n;
	for (int i = 0; i < n; i++)
		p[i] = (struct pollfd){.fd = fds[i], .events = POLLIN};
	while (left > 0) {
		if (poll(p, n, 5000) <= 0 && errno != EINTR) {
			printf("err a victim survived SIGKILL for 5 s\n");
			goto out;
		}
		for (int i = 0; i < n; i++)
			if (p[i].fd >= 0 && p[i].revents) {
				p[i].fd = -1; // poll ignores negative fds
				left--;
			}
	}
	printf("%lld\n", now_ns() - t0);
out:
	for (int i = 0; i < n; i++)
		close(fds[i]);
}

static int open_in(const char *dir, const char *name, int flags)
{
	char path[4096];
	snprintf(path, sizeof path, "%s/%s", dir, name);
	return open(path, flags | O_CLOEXEC);
}

// v2: write v to cgroup.freeze, wait for "frozen <want>" in cgroup.events.
static void freeze_v2(const char *dir, const char *v, char want)
{
	int ctl = open_in(dir, "cgroup.freeze", O_WRONLY);
	int ev = open_in(dir, "cgroup.events", O_RDONLY);
	if (ctl < 0 || ev < 0) {
		printf("err %s: %s\n", dir, strerror(errno));
		goto out;
	}
	char buf[512], needle[] = "frozen 0";
	needle[7] = want;
	long long t0 = now_ns();
	if (write(ctl, v, 1) != 1) {
		printf("err writing %s/cgroup.freeze: %s\n", dir, strerror(errno));
		goto out;
	}
	for (;;) {
		ssize_t r = pread(ev, buf, sizeof buf - 1, 0);
		if (r > 0) {
			buf[r] = 0;
			if (strstr(buf, needle))
				break;
		}
		if (now_ns() - t0 > 5000000000LL) {
			printf("err %s not %s in 5 s\n", dir, needle);
			goto out;
		}
		struct pollfd p = {.fd = ev, .events = POLLPRI};
		struct timespec ts = {0, 50000};
		ppoll(&p, 1, &ts, NULL);
	}
	answer(t0);
out:
	if (ctl >= 0)
		close(ctl);
	if (ev >= 0)
		close(ev);
}

// v1: write v to freezer.state and read it until it says want.
static void freeze_v1(const char *dir, const char *v, const char *want)
{
	int st = open_in(dir, "freezer.state", O_RDWR);
	if (st < 0) {
		printf("err %s: %s\n", dir, strerror(errno));
		return;
	}
	char buf[64];
	long long t0 = now_ns();
	if (write(st, v, strlen(v)) < 0) {
		printf("err writing %s/freezer.state: %s\n", dir, strerror(errno));
		close(st);
		return;
	}
	for (;;) {
		ssize_t r = pread(st, buf, sizeof buf - 1, 0);
		if (r > 0) {
			buf[r] = 0;
			if (strncmp(buf, want, strlen(want)) == 0)
				break;
		}
		if (now_ns() - t0 > 5000000000LL) {
			printf("err %s not %s in 5 s\n", dir, want);
			break;
		}
		struct timespec ts = {0, 20000};
		nanosleep(&ts, NULL);
	}
	if (strncmp(buf, want, strlen(want)) == 0)
		answer(t0);
	close(st);
}

static void do_rt(void)
{
	struct sched_param sp = {.sched_priority = 1};
	if (sched_setscheduler(0, SCHED_FIFO, &sp) != 0) {
		printf("err sched_setscheduler SCHED_FIFO 1: %s\n", strerror(errno));
		return;
	}
	printf("0\n");
}

static void run(char *line);

static void on_alarm(int sig) { (void)sig; }

// onopen: the command in rest, once the FIFO args is opened for writing.
static void do_onopen(char *args)
{
	char *rest = strchr(args, ' ');
	if (!rest) {
		printf("err onopen FIFO CMD...\n");
		return;
	}
	*rest++ = 0;
	// SIGALRM without SA_RESTART ends the open's wait with EINTR.
	struct sigaction sa = {.sa_handler = on_alarm};
	sigaction(SIGALRM, &sa, NULL);
	printf("0\n");
	alarm(10);
	int fd = open(args, O_RDONLY | O_CLOEXEC);
	alarm(0);
	if (fd < 0) {
		printf("err no open of %s in 10 s: %s\n", args, strerror(errno));
		return;
	}
	close(fd);
	with_start = 1;
	run(rest);
	with_start = 0;
}

static void run(char *line)
{
	char *arg = strchr(line, ' ');
	if (arg)
		*arg++ = 0;
	else
		arg = line + strlen(line);
	if (strcmp(line, "kill") == 0)
		do_kill(arg);
	else if (strcmp(line, "freeze") == 0)
		freeze_v2(arg, "1", '1');
	else if (strcmp(line, "freezev1") == 0)
		freeze_v1(arg, "FROZEN", "FROZEN");
	else if (strcmp(line, "thaw") == 0) {
		int v1 = open_in(arg, "freezer.state", O_RDONLY);
		if (v1 >= 0) {
			close(v1);
			freeze_v1(arg, "THAWED", "THAWED");
		} else
			freeze_v2(arg, "0", '0');
	} else if (strcmp(line, "rt") == 0)
		do_rt();
	else if (strcmp(line, "onopen") == 0)
		do_onopen(arg);
	else
		printf("err unknown command %s\n", line);
}

int main(void)
{
	char line[65536];
	setvbuf(stdout, NULL, _IOLBF, 0);
	while (fgets(line, sizeof line, stdin)) {
		line[strcspn(line, "\n")] = 0;
		run(line);
	}
	return 0;
}
