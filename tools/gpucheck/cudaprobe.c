// cudaprobe: the CUDA program of `make gpu-check` (scripts/gpu-check.sh).
// Built there with gcc alone (no CUDA toolkit): it dlopen()s libcuda.so.1
// and speaks the driver API, and its kernel is PTX in a string that the
// driver compiles itself (cuModuleLoadData), so only the driver is needed.
//
//	cudaprobe [--lib PATH] [--device N] [--mem MiB] [--n WORDS] [--reps R]
//	          [--ready-file F] [--log-file F] PHASE...
//	    a context on CUDA device N, MiB of device memory (one allocation,
//	    seen by NVML), the kernel loaded; prints "ready pid=... uuid=..."
//	    then runs the phases in order: busy:S (launches for S seconds,
//	    checking the buffer against the CPU's arithmetic at least every
//	    0.5 s: "check ok launches=N t=T"), idle:S (holds the context,
//	    launches nothing), queue:N (N launches back to back, no
//	    synchronization: "queued n=N t=T"; then waits for them,
//	    "drained t=T"), hold (idles until SIGTERM); then "done ok".
//	    Exit 3 on a wrong checksum, 2 on a driver error.
//	cudaprobe --info            the driver's API version, the checkpoint
//	                            API, and each device's UUID and name
//	cudaprobe --park            sleeps until signalled (a container's main)
//	cudaprobe --sigkill PID     SIGKILL through a pidfd; prints killed_us=
//	                            (signal → PID gone: its exit, files closed)
//	cudaprobe --open-node NODE [--victim PID] [--hold S]
//	                            opens NODE (a high-priority opener); with
//	                            --victim prints killed_us= (open → PID
//	                            gone), then holds the node S seconds
//	cudaprobe --freeze-drain CGROUP --uuid UUID [--nvml-lib PATH]
//	          [--below P] [--timeout S]
//	                            freezes the cgroup v2 CGROUP (cgroup.freeze)
//	                            and polls NVML's utilization of GPU UUID
//	                            (nvmlDeviceGetUtilizationRates) every 10 ms
//	                            until it is at most P % (default 5):
//	                            util_before= drain_ms= util_after=; a
//	                            frozen process's queued kernels run on
//	                            (the freeze stops launches, not the GPU)
//
// The kernel, gpucheck_step(buf, n, reps): each thread i < n does reps
// times buf[i] = buf[i] * 1664525 + (2i + 1) (mod 2^32). After K steps an
// element is a^K * x0 + (2i + 1) * (1 + a + ... + a^(K-1)), so the CPU
// checks every element in one pass however many launches ran.
//
// The PTX is what LLVM's NVPTX back end gives for that kernel
// (llc -march=nvptx64 -mcpu=sm_50 -O2, LLVM 14): ISA 4.0 for sm_50, which
// every driver since CUDA 7 JIT-compiles for any later GPU.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
#ifndef SYS_pidfd_send_signal
#define SYS_pidfd_send_signal 424
#endif

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext;
typedef void *CUmodule;
typedef void *CUfunction;
typedef struct {
	unsigned char bytes[16];
} CUuuid;

static const char ptx[] =
	".version 4.0\n"
	".target sm_50\n"
	".address_size 64\n"
	".visible .entry gpucheck_step(\n"
	"\t.param .u64 gpucheck_step_param_0,\n"
	"\t.param .u32 gpucheck_step_param_1,\n"
	"\t.param .u32 gpucheck_step_param_2\n"
	")\n"
	"{\n"
	"\t.reg .pred \t%p<4>;\n"
	"\t.reg .b32 \t%r<19>;\n"
	"\t.reg .b64 \t%rd<4>;\n"
	"\tld.param.u32 \t%r10, [gpucheck_step_param_1];\n"
	"\tmov.u32 \t%r11, %ctaid.x;\n"
	"\tmov.u32 \t%r12, %ntid.x;\n"
	"\tmov.u32 \t%r13, %tid.x;\n"
	"\tmad.lo.s32 \t%r1, %r11, %r12, %r13;\n"
	"\tsetp.ge.u32 \t%p1, %r1, %r10;\n"
	"\t@%p1 bra \tLBB0_5;\n"
	"\tld.param.u32 \t%r9, [gpucheck_step_param_2];\n"
	"\tld.param.u64 \t%rd2, [gpucheck_step_param_0];\n"
	"\tmul.wide.u32 \t%rd3, %r1, 4;\n"
	"\tadd.s64 \t%rd1, %rd2, %rd3;\n"
	"\tld.volatile.global.u32 \t%r18, [%rd1];\n"
	"\tsetp.eq.s32 \t%p2, %r9, 0;\n"
	"\t@%p2 bra \tLBB0_4;\n"
	"\tshl.b32 \t%r14, %r1, 1;\n"
	"\tor.b32  \t%r3, %r14, 1;\n"
	"\tmov.u32 \t%r16, 0;\n"
	"LBB0_3:                                 // %loop\n"
	"\tmad.lo.s32 \t%r18, %r18, 1664525, %r3;\n"
	"\tadd.s32 \t%r16, %r16, 1;\n"
	"\tsetp.lt.u32 \t%p3, %r16, %r9;\n"
	"\t@%p3 bra \tLBB0_3;\n"
	"LBB0_4:                                 // %store\n"
	"\tst.volatile.global.u32 \t[%rd1], %r18;\n"
	"LBB0_5:                                 // %done\n"
	"\tret;\n"
	"}\n";

static struct {
	CUresult (*Init)(unsigned int);
	CUresult (*DriverGetVersion)(int *);
	CUresult (*DeviceGetCount)(int *);
	CUresult (*DeviceGet)(CUdevice *, int);
	CUresult (*DeviceGetName)(char *, int, CUdevice);
	CUresult (*DeviceGetUuid)(CUuuid *, CUdevice);
	CUresult (*CtxCreate)(CUcontext *, unsigned int, CUdevice);
	CUresult (*CtxDestroy)(CUcontext);
	CUresult (*CtxSynchronize)(void);
	CUresult (*MemAlloc)(CUdeviceptr *, size_t);
	CUresult (*MemFree)(CUdeviceptr);
	CUresult (*MemcpyHtoD)(CUdeviceptr, const void *, size_t);
	CUresult (*MemcpyDtoH)(void *, CUdeviceptr, size_t);
	CUresult (*ModuleLoadData)(CUmodule *, const void *);
	CUresult (*ModuleGetFunction)(CUfunction *, CUmodule, const char *);
	CUresult (*LaunchKernel)(CUfunction, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int,
				 unsigned int, unsigned int, void *, void **, void **);
	CUresult (*GetErrorString)(CUresult, const char **);
	void *checkpoint; // cuCheckpointProcessLock: the checkpoint API is there
} cu;

static volatile sig_atomic_t stop;
static FILE *logfile;

static void on_term(int sig) {
	(void)sig;
	stop = 1;
}

static double now_real(void) {
	struct timespec t;
	clock_gettime(CLOCK_REALTIME, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static long long now_us(void) {
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (long long)t.tv_sec * 1000000LL + t.tv_nsec / 1000;
}

// say prints one line on stdout and, with --log-file, in the log.
static void say(const char *fmt, ...) {
	va_list ap;
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	fflush(stdout);
	if (logfile) {
		va_start(ap, fmt);
		vfprintf(logfile, fmt, ap);
		va_end(ap);
		fflush(logfile);
	}
}

static void check(CUresult r, const char *what) {
	if (r == 0) {
		return;
	}
	const char *s = "?";
	if (cu.GetErrorString) {
		cu.GetErrorString(r, &s);
	}
	say("error %s: CUresult %d (%s)\n", what, r, s);
	exit(2);
}

static void *sym(void *lib, const char *name, int need) {
	void *p = dlsym(lib, name);
	if (p == NULL && need) {
		say("error dlsym %s: %s\n", name, dlerror());
		exit(2);
	}
	return p;
}

static void load(const char *path) {
	void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (lib == NULL) {
		say("error dlopen %s: %s\n", path, dlerror());
		exit(2);
	}
	cu.Init = sym(lib, "cuInit", 1);
	cu.DriverGetVersion = sym(lib, "cuDriverGetVersion", 1);
	cu.DeviceGetCount = sym(lib, "cuDeviceGetCount", 1);
	cu.DeviceGet = sym(lib, "cuDeviceGet", 1);
	cu.DeviceGetName = sym(lib, "cuDeviceGetName", 1);
	// _v2 names MIG instances by their own UUID.
	cu.DeviceGetUuid = sym(lib, "cuDeviceGetUuid_v2", 0);
	if (cu.DeviceGetUuid == NULL) {
		cu.DeviceGetUuid = sym(lib, "cuDeviceGetUuid", 1);
	}
	cu.CtxCreate = sym(lib, "cuCtxCreate_v2", 1);
	cu.CtxDestroy = sym(lib, "cuCtxDestroy_v2", 1);
	cu.CtxSynchronize = sym(lib, "cuCtxSynchronize", 1);
	cu.MemAlloc = sym(lib, "cuMemAlloc_v2", 1);
	cu.MemFree = sym(lib, "cuMemFree_v2", 1);
	cu.MemcpyHtoD = sym(lib, "cuMemcpyHtoD_v2", 1);
	cu.MemcpyDtoH = sym(lib, "cuMemcpyDtoH_v2", 1);
	cu.ModuleLoadData = sym(lib, "cuModuleLoadData", 1);
	cu.ModuleGetFunction = sym(lib, "cuModuleGetFunction", 1);
	cu.LaunchKernel = sym(lib, "cuLaunchKernel", 1);
	cu.GetErrorString = sym(lib, "cuGetErrorString", 0);
	cu.checkpoint = sym(lib, "cuCheckpointProcessLock", 0);
}

static void uuid_string(CUdevice d, char *out, size_t n) {
	CUuuid u;
	check(cu.DeviceGetUuid(&u, d), "cuDeviceGetUuid");
	const unsigned char *b = u.bytes;
	snprintf(out, n, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1], b[2], b[3],
		 b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
}

static int info(void) {
	int v = 0, n = 0;
	check(cu.Init(0), "cuInit");
	check(cu.DriverGetVersion(&v), "cuDriverGetVersion");
	check(cu.DeviceGetCount(&n), "cuDeviceGetCount");
	// The checkpoint API: driver API 12.8 (driver 570) and its symbols.
	say("driver_api=%d devices=%d checkpoint_api=%s\n", v, n, cu.checkpoint && v >= 12080 ? "yes" : "no");
	for (int i = 0; i < n; i++) {
		CUdevice d;
		char uuid[64], name[128];
		check(cu.DeviceGet(&d, i), "cuDeviceGet");
		check(cu.DeviceGetName(name, sizeof name, d), "cuDeviceGetName");
		uuid_string(d, uuid, sizeof uuid);
		say("device ordinal=%d uuid=%s name=\"%s\"\n", i, uuid, name);
	}
	return 0;
}

static int pidfd_of(int pid) {
	int fd = (int)syscall(SYS_pidfd_open, pid, 0);
	if (fd < 0) {
		say("error pidfd_open %d: %s\n", pid, strerror(errno));
		exit(2);
	}
	return fd;
}

// gone waits until the process behind pidfd has exited (10 s at most) and
// prints the time since t0.
static int gone(int pidfd, long long t0) {
	struct pollfd p = {.fd = pidfd, .events = POLLIN};
	int r;
	do {
		r = poll(&p, 1, 10000);
	} while (r < 0 && errno == EINTR);
	long long us = now_us() - t0;
	if (r != 1) {
		say("error victim alive 10 s after t0\n");
		return 4;
	}
	say("killed_us=%lld\n", us);
	return 0;
}

static void sleep_s(double s) {
	double end = now_real() + s;
	while (!stop && now_real() < end) {
		struct timespec d = {0, 50 * 1000 * 1000};
		nanosleep(&d, NULL);
	}
}

typedef struct {
	unsigned int gpu, memory;
} nvml_util_t;

// freeze_drain freezes cgroup and measures how long GPU uuid stays busy:
// NVML's utilization is "percent of time over the past sample period
// during which one or more kernels was executing" (nvml.h), so the figure
// includes up to one sample period of NVML's own lag.
static int freeze_drain(const char *cgroup, const char *uuid, const char *nvmlpath, unsigned int below, double timeout) {
	void *lib = dlopen(nvmlpath, RTLD_NOW | RTLD_LOCAL);
	if (lib == NULL) {
		say("error dlopen %s: %s\n", nvmlpath, dlerror());
		return 2;
	}
	int (*init)(void) = sym(lib, "nvmlInit_v2", 1);
	int (*count)(unsigned int *) = sym(lib, "nvmlDeviceGetCount_v2", 1);
	int (*handle)(unsigned int, void **) = sym(lib, "nvmlDeviceGetHandleByIndex_v2", 1);
	int (*getuuid)(void *, char *, unsigned int) = sym(lib, "nvmlDeviceGetUUID", 1);
	int (*util)(void *, nvml_util_t *) = sym(lib, "nvmlDeviceGetUtilizationRates", 1);
	unsigned int n = 0;
	void *dev = NULL;
	if (init() != 0 || count(&n) != 0) {
		say("error nvmlInit_v2 or nvmlDeviceGetCount_v2\n");
		return 2;
	}
	for (unsigned int i = 0; i < n && dev == NULL; i++) {
		char u[96];
		void *d;
		if (handle(i, &d) == 0 && getuuid(d, u, sizeof u) == 0 && !strcmp(u, uuid)) {
			dev = d;
		}
	}
	if (dev == NULL) {
		say("error no NVML device %s\n", uuid);
		return 2;
	}
	nvml_util_t u;
	int r = util(dev, &u);
	if (r != 0) {
		say("error nvmlDeviceGetUtilizationRates: %d\n", r);
		return 2;
	}
	unsigned int before = u.gpu;
	char path[4096];
	snprintf(path, sizeof path, "%s/cgroup.freeze", cgroup);
	int fd = open(path, O_WRONLY | O_CLOEXEC);
	if (fd < 0 || write(fd, "1", 1) != 1) {
		say("error freezing %s: %s\n", path, strerror(errno));
		return 2;
	}
	close(fd);
	long long t0 = now_us();
	for (;;) {
		struct timespec d = {0, 10 * 1000 * 1000};
		nanosleep(&d, NULL);
		if ((r = util(dev, &u)) != 0) {
			say("error nvmlDeviceGetUtilizationRates: %d\n", r);
			return 2;
		}
		long long us = now_us() - t0;
		if (u.gpu <= below) {
			say("util_before=%u drain_ms=%.1f util_after=%u\n", before, (double)us / 1000, u.gpu);
			return 0;
		}
		if ((double)us / 1e6 > timeout) {
			say("error util_before=%u still %u %% after %.0f s frozen\n", before, u.gpu, timeout);
			return 4;
		}
	}
}

static int usage(void) {
	fprintf(stderr, "usage: cudaprobe [--lib PATH] [--device N] [--mem MiB] [--n WORDS] [--reps R] [--ready-file F] "
			"[--log-file F] busy:S|idle:S|hold ...\n"
			"       cudaprobe [--lib PATH] --info | --park | --sigkill PID | --open-node NODE [--victim PID] [--hold S]\n"
			"       cudaprobe --freeze-drain CGROUP --uuid UUID [--nvml-lib PATH] [--below P] [--timeout S]\n");
	return 1;
}

int main(int argc, char **argv) {
	const char *lib = getenv("GPUCHECK_LIBCUDA") ? getenv("GPUCHECK_LIBCUDA") : "libcuda.so.1";
	const char *ready = NULL, *node = NULL, *logpath = NULL, *freeze = NULL, *uuidarg = NULL;
	const char *nvmllib = "libnvidia-ml.so.1";
	unsigned int below = 5;
	double timeout = 30;
	int device = 0, do_info = 0, park = 0, sigkill = 0, victim = 0, first = argc;
	double hold = 0;
	size_t mem = 256;
	uint32_t n = 1u << 20, reps = 2048;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
		if (!strcmp(a, "--info")) {
			do_info = 1;
		} else if (!strcmp(a, "--park")) {
			park = 1;
		} else if (v && !strcmp(a, "--lib")) {
			lib = v, i++;
		} else if (v && !strcmp(a, "--device")) {
			device = atoi(v), i++;
		} else if (v && !strcmp(a, "--mem")) {
			mem = (size_t)strtoull(v, NULL, 10), i++;
		} else if (v && !strcmp(a, "--n")) {
			n = (uint32_t)strtoul(v, NULL, 10), i++;
		} else if (v && !strcmp(a, "--reps")) {
			reps = (uint32_t)strtoul(v, NULL, 10), i++;
		} else if (v && !strcmp(a, "--ready-file")) {
			ready = v, i++;
		} else if (v && !strcmp(a, "--log-file")) {
			logpath = v, i++;
		} else if (v && !strcmp(a, "--sigkill")) {
			sigkill = atoi(v), i++;
		} else if (v && !strcmp(a, "--open-node")) {
			node = v, i++;
		} else if (v && !strcmp(a, "--victim")) {
			victim = atoi(v), i++;
		} else if (v && !strcmp(a, "--hold")) {
			hold = atof(v), i++;
		} else if (v && !strcmp(a, "--freeze-drain")) {
			freeze = v, i++;
		} else if (v && !strcmp(a, "--uuid")) {
			uuidarg = v, i++;
		} else if (v && !strcmp(a, "--nvml-lib")) {
			nvmllib = v, i++;
		} else if (v && !strcmp(a, "--below")) {
			below = (unsigned int)strtoul(v, NULL, 10), i++;
		} else if (v && !strcmp(a, "--timeout")) {
			timeout = atof(v), i++;
		} else if (a[0] == '-') {
			return usage();
		} else {
			first = i;
			break;
		}
	}
	signal(SIGTERM, on_term);
	signal(SIGINT, on_term);
	if (logpath && (logfile = fopen(logpath, "ae")) == NULL) {
		fprintf(stderr, "cudaprobe: %s: %s\n", logpath, strerror(errno));
		return 2;
	}
	if (park) {
		while (!stop) {
			pause();
		}
		return 0;
	}
	if (freeze) {
		return uuidarg ? freeze_drain(freeze, uuidarg, nvmllib, below, timeout) : usage();
	}
	if (sigkill > 0) {
		int fd = pidfd_of(sigkill);
		long long t0 = now_us();
		if (syscall(SYS_pidfd_send_signal, fd, SIGKILL, NULL, 0) != 0) {
			say("error pidfd_send_signal: %s\n", strerror(errno));
			return 2;
		}
		return gone(fd, t0);
	}
	if (node) {
		int pfd = victim > 0 ? pidfd_of(victim) : -1, rc = 0;
		long long t0 = now_us();
		int fd = open(node, O_RDWR | O_CLOEXEC);
		if (fd < 0) {
			say("error open %s: %s\n", node, strerror(errno));
			return 4;
		}
		if (pfd >= 0) {
			rc = gone(pfd, t0);
		} else {
			say("opened %s\n", node);
		}
		sleep_s(hold);
		close(fd);
		return rc;
	}
	load(lib);
	if (do_info) {
		return info();
	}
	if (first >= argc || n == 0) {
		return usage();
	}
	CUdevice dev;
	CUcontext ctx;
	CUmodule mod;
	CUfunction fn;
	CUdeviceptr dbuf;
	int v = 0;
	char uuid[64], name[128];
	size_t bytes = mem << 20;
	if (bytes < (size_t)n * 4) {
		bytes = (size_t)n * 4;
	}
	check(cu.Init(0), "cuInit");
	check(cu.DriverGetVersion(&v), "cuDriverGetVersion");
	check(cu.DeviceGet(&dev, device), "cuDeviceGet");
	check(cu.DeviceGetName(name, sizeof name, dev), "cuDeviceGetName");
	uuid_string(dev, uuid, sizeof uuid);
	check(cu.CtxCreate(&ctx, 0, dev), "cuCtxCreate");
	check(cu.MemAlloc(&dbuf, bytes), "cuMemAlloc");
	check(cu.ModuleLoadData(&mod, ptx), "cuModuleLoadData (the driver's PTX JIT)");
	check(cu.ModuleGetFunction(&fn, mod, "gpucheck_step"), "cuModuleGetFunction");

	uint32_t *x0 = malloc((size_t)n * 4), *got = malloc((size_t)n * 4);
	if (x0 == NULL || got == NULL) {
		say("error malloc\n");
		return 2;
	}
	for (uint32_t i = 0; i < n; i++) {
		x0[i] = (i * 2654435761u) ^ 0x9e3779b9u;
	}
	check(cu.MemcpyHtoD(dbuf, x0, (size_t)n * 4), "cuMemcpyHtoD");
	// One launch maps x to ar*x + c*sr; launches compose to at*x + c*st.
	uint32_t ar = 1, sr = 0, at = 1, st = 0;
	for (uint32_t k = 0; k < reps; k++) {
		sr = sr * 1664525u + 1;
		ar *= 1664525u;
	}
	unsigned long long launches = 0;
	void *params[] = {&dbuf, &n, &reps};
	unsigned int block = 256, grid = (n + block - 1) / block;

	if (ready) {
		char tmp[4096];
		snprintf(tmp, sizeof tmp, "%s.tmp", ready);
		FILE *f = fopen(tmp, "w");
		if (f == NULL || fprintf(f, "ready pid=%d uuid=%s\n", (int)getpid(), uuid) < 0 || fclose(f) != 0 ||
		    rename(tmp, ready) != 0) {
			say("error ready file %s: %s\n", ready, strerror(errno));
			return 2;
		}
	}
	say("ready pid=%d device=%d uuid=%s name=\"%s\" mem_bytes=%zu driver_api=%d t=%.3f\n", (int)getpid(), device, uuid,
	    name, bytes, v, now_real());

	for (int p = first; p < argc && !stop; p++) {
		double secs = 0;
		if (!strncmp(argv[p], "busy:", 5)) {
			secs = atof(argv[p] + 5);
			say("phase busy %.1fs t=%.3f\n", secs, now_real());
			double end = now_real() + secs, next = now_real() + 0.5;
			for (int last = 0; !last;) {
				for (int b = 0; b < 8; b++) {
					check(cu.LaunchKernel(fn, grid, 1, 1, block, 1, 1, 0, NULL, params, NULL), "cuLaunchKernel");
					launches++;
					st = ar * st + sr;
					at = ar * at;
				}
				check(cu.CtxSynchronize(), "cuCtxSynchronize");
				last = stop || now_real() >= end;
				if (!last && now_real() < next) {
					continue;
				}
				next = now_real() + 0.5;
				check(cu.MemcpyDtoH(got, dbuf, (size_t)n * 4), "cuMemcpyDtoH");
				for (uint32_t i = 0; i < n; i++) {
					uint32_t want = at * x0[i] + (2 * i + 1) * st;
					if (got[i] != want) {
						say("check MISMATCH launches=%llu index=%u got=%u want=%u t=%.3f\n", launches, i,
						    got[i], want, now_real());
						return 3;
					}
				}
				say("check ok launches=%llu t=%.3f\n", launches, now_real());
			}
		} else if (!strncmp(argv[p], "idle:", 5)) {
			secs = atof(argv[p] + 5);
			say("phase idle %.1fs t=%.3f\n", secs, now_real());
			sleep_s(secs);
		} else if (!strncmp(argv[p], "queue:", 6)) {
			unsigned long q = strtoul(argv[p] + 6, NULL, 10);
			for (unsigned long k = 0; k < q && !stop; k++) {
				check(cu.LaunchKernel(fn, grid, 1, 1, block, 1, 1, 0, NULL, params, NULL), "cuLaunchKernel");
				launches++;
				st = ar * st + sr;
				at = ar * at;
			}
			say("queued n=%lu t=%.3f\n", q, now_real());
			check(cu.CtxSynchronize(), "cuCtxSynchronize");
			say("drained t=%.3f\n", now_real());
		} else if (!strcmp(argv[p], "hold")) {
			say("phase hold t=%.3f\n", now_real());
			while (!stop) {
				pause();
			}
		} else {
			return usage();
		}
	}
	check(cu.MemFree(dbuf), "cuMemFree");
	check(cu.CtxDestroy(ctx), "cuCtxDestroy");
	say("done ok launches=%llu t=%.3f\n", launches, now_real());
	return 0;
}
