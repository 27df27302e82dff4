// churn.c — the big node's open/close churn (BenchmarkBigNode): RATE
// open+close pairs a second, spread round-robin over PATH..., paced in 1 ms
// batches (the batch due at t is t × RATE pairs in all), until SIGTERM or
// MILLIS ms. Compiled C, so that the generator costs the node little and its
// pace holds on a busy machine. Prints "PAIRS FAILED" (failed opens: a gate
// refusing one is not an error here) on stdout at the end. Stopped with
// SIGSTOP (the benchmark's baseline trials), it does not make up for the
// time stopped when continued.
//
//   churn RATE MILLIS PATH...
#define _GNU_SOURCE
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static volatile sig_atomic_t stop;

static void on_term(int sig) { (void)sig; stop = 1; }

static long long now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

int main(int argc, char **argv)
{
	if (argc < 4) {
		fprintf(stderr, "usage: churn RATE MILLIS PATH...\n");
		return 2;
	}
	long long rate = atoll(argv[1]), ms = atoll(argv[2]);
	char **paths = argv + 3;
	int npaths = argc - 3;
	struct sigaction sa = {.sa_handler = on_term};
	sigaction(SIGTERM, &sa, NULL);
	long long start = now_ns(), end = start + ms * 1000000LL, pairs = 0, failed = 0, lost = 0;
	struct timespec tick;
	clock_gettime(CLOCK_MONOTONIC, &tick);
	while (!stop) {
		long long t = now_ns();
		if (t >= end)
			break;
		long long due = (t - start) / 1000 * rate / 1000000 - lost;
		if (due - pairs > rate / 100 + 1) {
			// Stopped (SIGSTOP) or starved for over 10 ms: no burst to
			// catch up, the pace goes on from now.
			lost += due - pairs;
			due = pairs;
		}
		for (; pairs < due && !stop; pairs++) {
			int fd = open(paths[pairs % npaths], O_RDWR | O_CLOEXEC);
			if (fd < 0) {
				failed++;
				continue;
			}
			close(fd);
		}
		tick.tv_nsec += 1000000;
		if (tick.tv_nsec >= 1000000000) {
			tick.tv_sec++;
			tick.tv_nsec -= 1000000000;
		}
		clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &tick, NULL);
	}
	printf("%lld %lld\n", pairs, failed);
	return 0;
}
