// A test double of NVIDIA's libcuda.so.1: the CUDA checkpoint driver API
// gpud calls (cuInit, cuDriverGetVersion, cuCheckpointProcess{Lock,
// Checkpoint,Restore,Unlock,GetState}), and the driver-API calls of
// tools/gpucheck/cudaprobe.c (scripts/gpu-check.sh --double): devices, a
// context, memory, a module, launches. Built by the tests
// (internal/testutil.BuildCUDADouble) and by gpu-check.sh: gcc -shared -fPIC.
//
// The script is "cuda-double.txt" in the library's own directory, re-read
// at every call. One record a line:
//
//	driver version=12080          (cuDriverGetVersion; below 12080: no checkpoint API)
//	pid pid=123 lock=ok|timeout|hang|fail checkpoint=ok|fail restore=ok|fail
//	device node=/dev/nvidia0 uuid=GPU-... nvml=0 [name=NVIDIA_H100] [cap=/dev/nvidia-caps/nvidia-capM]
//	                              (CUDA ordinal: the record's order; cap: a MIG device, uuid MIG-...)
//	nvml script=/path/to/nvml-double.txt
//
// A process not named is not a CUDA process (CUDA_ERROR_INVALID_VALUE).
// Each process's state (running, locked, checkpointed, failed) is kept
// in memory: lock needs running, checkpoint locked, restore checkpointed,
// unlock locked; a scripted checkpoint or restore failure leaves the
// process FAILED, as the driver can. lock=hang never returns (an NCCL job).
//
// CUDA_VISIBLE_DEVICES, when set, picks and orders the devices as the
// driver does: a comma list of ordinals or UUIDs (GPU-... or MIG-..., or a
// prefix of one), ending at the first entry that names none; set but
// empty, no device.
//
// The probe's calls, as the driver does them: cuCtxCreate opens the
// device's node (as libcuda opens /dev/nvidiaN; held until cuCtxDestroy)
// and, for a MIG device, its GPU instance's capability node beside it (as
// libcuda does with CUDA_VISIBLE_DEVICES=MIG-...: the node gpud keys the
// slice by)
// and names the process a CUDA process (a "pid ... =ok" record appended to
// this script, so that gpud's checkpoint calls find it); the driver's
// accounting reaches NVML as the real driver's does: a "process" record
// (the process's allocations) and, while it launches, "sample" records
// (sm=90, at most one each 100 ms) in the NVML double's script, rewritten
// under flock and renamed into place, records of dead processes dropped.
// Device memory is host memory (CUdeviceptr is the host address). A
// launch runs the one kernel it knows, gpucheck_step, on the CPU, then
// takes 2 ms more (GPU time, spent asleep); the double cannot compile or
// check PTX: cuModuleLoadData only looks for ".entry gpucheck_step".
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdint.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <time.h>
#include <unistd.h>

typedef int CUresult;
enum {
	CUDA_SUCCESS = 0,
	CUDA_ERROR_INVALID_VALUE = 1,
	CUDA_ERROR_OUT_OF_MEMORY = 2,
	CUDA_ERROR_NOT_INITIALIZED = 3,
	CUDA_ERROR_NO_DEVICE = 100,
	CUDA_ERROR_INVALID_DEVICE = 101,
	CUDA_ERROR_INVALID_IMAGE = 200,
	CUDA_ERROR_INVALID_CONTEXT = 201,
	CUDA_ERROR_INVALID_SOURCE = 300,
	CUDA_ERROR_FILE_NOT_FOUND = 301,
	CUDA_ERROR_INVALID_HANDLE = 400,
	CUDA_ERROR_NOT_FOUND = 500,
	CUDA_ERROR_NOT_SUPPORTED = 801,
	CUDA_ERROR_ILLEGAL_STATE = 401,
	CUDA_ERROR_TIMEOUT = 909,
	CUDA_ERROR_UNKNOWN = 999,
};
enum { RUNNING = 0, LOCKED = 1, CHECKPOINTED = 2, FAILED = 3 };

typedef struct {
	unsigned int timeoutMs;
	unsigned int reserved0;
	unsigned long long reserved1[7];
} CUcheckpointLockArgs;

#define MAX_PIDS 64
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int pids[MAX_PIDS], states[MAX_PIDS], npids;

struct script {
	int version;
	int pid;
	char lock[16], checkpoint[16], restore[16];
};

// script_path is cuda-double.txt next to this library, found from the
// kernel's name of the file mapped here (/proc/self/maps): gpud loads the
// library through /proc/self/fd/N, which is the name dladdr would give.
static void script_path(char *out, size_t n) {
	char line[PATH_MAX + 256];
	unsigned long here = (unsigned long)(void *)script_path, lo, hi;
	FILE *f = fopen("/proc/self/maps", "re");
	snprintf(out, n, "cuda-double.txt");
	if (f == NULL) {
		return;
	}
	while (fgets(line, sizeof line, f)) {
		char *path = strchr(line, '/');
		if (sscanf(line, "%lx-%lx", &lo, &hi) != 2 || here < lo || here >= hi || path == NULL) {
			continue;
		}
		char *slash = strrchr(path, '/');
		*slash = 0;
		snprintf(out, n, "%s/cuda-double.txt", path);
		break;
	}
	fclose(f);
}

static void field(const char *line, const char *key, char *out, size_t n) {
	char k[32];
	snprintf(k, sizeof k, " %s=", key);
	const char *p = strstr(line, k);
	out[0] = 0;
	if (p == NULL) {
		return;
	}
	p += strlen(k);
	size_t i = 0;
	while (p[i] && p[i] != ' ' && p[i] != '\n' && i + 1 < n) {
		out[i] = p[i];
		i++;
	}
	out[i] = 0;
}

// lookup reads the script: the driver version, and pid's record (found 1).
static int lookup(int pid, struct script *s) {
	char path[PATH_MAX], line[512], v[32];
	memset(s, 0, sizeof *s);
	script_path(path, sizeof path);
	FILE *f = fopen(path, "r");
	if (f == NULL) {
		return 0;
	}
	int found = 0;
	while (fgets(line, sizeof line, f)) {
		if (strncmp(line, "driver ", 7) == 0) {
			field(line, "version", v, sizeof v);
			s->version = atoi(v);
		} else if (strncmp(line, "pid ", 4) == 0) {
			field(line, "pid", v, sizeof v);
			if (atoi(v) == pid && pid > 0) {
				found = 1;
				s->pid = pid;
				field(line, "lock", s->lock, sizeof s->lock);
				field(line, "checkpoint", s->checkpoint, sizeof s->checkpoint);
				field(line, "restore", s->restore, sizeof s->restore);
			}
		}
	}
	fclose(f);
	return found;
}

static int *state_of(int pid) {
	for (int i = 0; i < npids; i++) {
		if (pids[i] == pid) {
			return &states[i];
		}
	}
	if (npids == MAX_PIDS) {
		return NULL;
	}
	pids[npids] = pid;
	states[npids] = RUNNING;
	return &states[npids++];
}

CUresult cuInit(unsigned int flags) {
	(void)flags;
	return CUDA_SUCCESS;
}

CUresult cuDriverGetVersion(int *v) {
	struct script s;
	if (v == NULL) {
		return CUDA_ERROR_INVALID_VALUE;
	}
	lookup(0, &s);
	*v = s.version;
	return CUDA_SUCCESS;
}

// ---- Process states shared by every process that loads this library ----
// The driver keeps a process's checkpoint state with the process, not with
// its caller: a gpud killed and started again finds a process it
// checkpointed still checkpointed. So each state is also kept in
// "cuda-double-states" next to the script ("<pid> <state>" lines), read
// before a step and written after it under flock; the lines of processes
// gone are dropped at each write.
#define MAX_SHARED 256

static void shared_path(char *out, size_t n) {
	const char *name = "cuda-double-states";
	script_path(out, n);
	char *slash = strrchr(out, '/');
	char *base = slash ? slash + 1 : out;
	if ((size_t)(base - out) + strlen(name) + 1 > n) {
		base = out;
	}
	memcpy(base, name, strlen(name) + 1);
}

// shared_state reads pid's shared state into *st (write 0; left as it is
// when none is kept) or keeps *st as pid's state (write 1).
static void shared_state(int pid, int *st, int write) {
	char path[PATH_MAX], buf[MAX_SHARED * 24];
	int ps[MAX_SHARED], ss[MAX_SHARED], n = 0;
	shared_path(path, sizeof path);
	int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
	if (fd < 0) {
		return;
	}
	flock(fd, LOCK_EX);
	ssize_t got = pread(fd, buf, sizeof buf - 1, 0);
	buf[got > 0 ? got : 0] = 0;
	for (char *line = strtok(buf, "\n"); line && n < MAX_SHARED; line = strtok(NULL, "\n")) {
		if (sscanf(line, "%d %d", &ps[n], &ss[n]) == 2) {
			n++;
		}
	}
	int found = 0;
	for (int i = 0; i < n; i++) {
		if (ps[i] == pid) {
			found = 1;
			if (write) {
				ss[i] = *st;
			} else {
				*st = ss[i];
			}
		}
	}
	if (write) {
		if (!found && n < MAX_SHARED) {
			ps[n] = pid;
			ss[n++] = *st;
		}
		size_t len = 0;
		for (int i = 0; i < n; i++) {
			char proc[32];
			snprintf(proc, sizeof proc, "/proc/%d", ps[i]);
			if (access(proc, F_OK) == 0 && len + 24 < sizeof buf) {
				len += (size_t)snprintf(buf + len, sizeof buf - len, "%d %d\n", ps[i], ss[i]);
			}
		}
		if (ftruncate(fd, 0) == 0 && pwrite(fd, buf, len, 0) < 0) {
			// a state not kept: this process's own memory still has it
		}
	}
	close(fd); // releases the flock
}

// step moves pid from state from to state to, or fails as scripted.
static CUresult step(int pid, int from, int to, const char *which) {
	struct script s;
	if (!lookup(pid, &s)) {
		return CUDA_ERROR_INVALID_VALUE;
	}
	if (s.version < 12080) {
		return CUDA_ERROR_NOT_SUPPORTED;
	}
	const char *how = strcmp(which, "lock") == 0 ? s.lock : strcmp(which, "checkpoint") == 0 ? s.checkpoint : strcmp(which, "restore") == 0 ? s.restore : "ok";
	if (strcmp(how, "hang") == 0) {
		for (;;) {
			pause();
		}
	}
	pthread_mutex_lock(&mu);
	int *st = state_of(pid);
	if (st != NULL) {
		shared_state(pid, st, 0);
	}
	CUresult r = CUDA_SUCCESS;
	if (st == NULL || *st != from) {
		r = CUDA_ERROR_ILLEGAL_STATE;
	} else if (strcmp(how, "timeout") == 0) {
		r = CUDA_ERROR_TIMEOUT;
	} else if (strcmp(how, "fail") == 0) {
		r = CUDA_ERROR_UNKNOWN;
		if (from != RUNNING) {
			*st = FAILED; // a failed checkpoint or restore: the driver's FAILED state
		}
	} else {
		*st = to;
	}
	if (st != NULL) {
		shared_state(pid, st, 1);
	}
	pthread_mutex_unlock(&mu);
	return r;
}

CUresult cuCheckpointProcessLock(int pid, CUcheckpointLockArgs *args) {
	(void)args;
	return step(pid, RUNNING, LOCKED, "lock");
}

CUresult cuCheckpointProcessCheckpoint(int pid, void *args) {
	(void)args;
	return step(pid, LOCKED, CHECKPOINTED, "checkpoint");
}

CUresult cuCheckpointProcessRestore(int pid, void *args) {
	(void)args;
	return step(pid, CHECKPOINTED, LOCKED, "restore");
}

CUresult cuCheckpointProcessUnlock(int pid, void *args) {
	(void)args;
	return step(pid, LOCKED, RUNNING, "unlock");
}

CUresult cuCheckpointProcessGetState(int pid, int *state) {
	struct script s;
	if (state == NULL || !lookup(pid, &s)) {
		return CUDA_ERROR_INVALID_VALUE;
	}
	if (s.version < 12080) {
		return CUDA_ERROR_NOT_SUPPORTED;
	}
	pthread_mutex_lock(&mu);
	int *st = state_of(pid);
	if (st != NULL) {
		shared_state(pid, st, 0);
	}
	*state = st ? *st : FAILED;
	pthread_mutex_unlock(&mu);
	return CUDA_SUCCESS;
}

// ---- The driver-API calls of tools/gpucheck/cudaprobe.c ----

typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct {
	char bytes[16];
} CUuuid;

#define MAX_DEVICES 16
struct device {
	char node[PATH_MAX], cap[PATH_MAX], uuid[96], name[96];
	int nvml;
};

// visible names a device as an entry of CUDA_VISIBLE_DEVICES does: its
// ordinal among all records, or its UUID (or a prefix of it, as the
// driver accepts; with or without the GPU-/MIG- prefix).
static int visible(const char *entry, const struct device *all, int n) {
	char *end;
	long i = strtol(entry, &end, 10);
	if (*entry && *end == 0) {
		return i >= 0 && i < n ? (int)i : -1;
	}
	for (int k = 0; k < n; k++) {
		const char *u = all[k].uuid;
		size_t len = strlen(entry);
		if (len > 0 && strncmp(u, entry, len) == 0) {
			return k;
		}
		if (len > 0 && (strncmp(u, "GPU-", 4) == 0 || strncmp(u, "MIG-", 4) == 0) && strncmp(u + 4, entry, len) == 0) {
			return k;
		}
	}
	return -1;
}

// select_visible keeps the devices CUDA_VISIBLE_DEVICES names, in its
// order; all of them when it is not set.
static int select_visible(struct device *d, int n) {
	const char *env = getenv("CUDA_VISIBLE_DEVICES");
	if (env == NULL) {
		return n;
	}
	static struct device all[MAX_DEVICES];
	char list[512], *save = NULL;
	memcpy(all, d, sizeof(struct device) * (size_t)n);
	snprintf(list, sizeof list, "%s", env);
	int m = 0;
	for (char *e = strtok_r(list, ",", &save); e && m < MAX_DEVICES; e = strtok_r(NULL, ",", &save)) {
		int k = visible(e, all, n);
		if (k < 0) {
			break; // the driver stops at the first entry that names no device
		}
		d[m++] = all[k];
	}
	return m;
}

// devices reads the script's device records (CUDA ordinals in order, as
// CUDA_VISIBLE_DEVICES picks them) and the NVML script's path.
static int devices(struct device *out, char *nvml, size_t nvmln) {
	char path[PATH_MAX], line[2 * PATH_MAX + 256];
	int n = 0;
	script_path(path, sizeof path);
	if (nvml) {
		nvml[0] = 0;
	}
	FILE *f = fopen(path, "r");
	if (f == NULL) {
		return 0;
	}
	while (fgets(line, sizeof line, f)) {
		if (strncmp(line, "device ", 7) == 0 && n < MAX_DEVICES) {
			char v[32];
			struct device *d = &out[n++];
			memset(d, 0, sizeof *d);
			field(line, "node", d->node, sizeof d->node);
			field(line, "cap", d->cap, sizeof d->cap);
			field(line, "uuid", d->uuid, sizeof d->uuid);
			field(line, "name", d->name, sizeof d->name);
			for (char *p = d->name; *p; p++) {
				if (*p == '_') {
					*p = ' ';
				}
			}
			field(line, "nvml", v, sizeof v);
			d->nvml = atoi(v);
		} else if (strncmp(line, "nvml ", 5) == 0 && nvml) {
			field(line, "script", nvml, nvmln);
		}
	}
	fclose(f);
	return select_visible(out, n);
}

// The one context of this process (the probe makes one).
static struct {
	int live, fd, capfd, nvml;
	char nvmlscript[PATH_MAX];
	unsigned long long memory;
	struct timespec last_sample;
	int launched; // launches since the last sample
} ctx;

struct alloc {
	void *p;
	size_t size;
};
#define MAX_ALLOCS 64
static struct alloc allocs[MAX_ALLOCS];

static unsigned long long now_us(void) {
	struct timespec t;
	clock_gettime(CLOCK_REALTIME, &t);
	return (unsigned long long)t.tv_sec * 1000000ULL + (unsigned long long)t.tv_nsec / 1000;
}

// line_pid is the pid= of a process or sample record (0: none).
static int line_pid(const char *line) {
	const char *p = strstr(line, " pid=");
	return p ? atoi(p + 5) : 0;
}

static int dead(int pid) { return pid > 0 && kill(pid, 0) != 0 && errno == ESRCH; }

// nvml_write rewrites the NVML double's script as the driver's accounting
// changes: this process's process record replaced (memory, or dropped when
// gone is set), a sample added when sample is set, records of dead
// processes dropped and samples kept to the last 100. Under flock of
// <script>.lock, and renamed into place: NVML readers never see half.
static void nvml_write(int gone, int sample) {
	if (ctx.nvmlscript[0] == 0) {
		return;
	}
	char lockpath[PATH_MAX + 8], tmp[PATH_MAX + 32], line[1024];
	snprintf(lockpath, sizeof lockpath, "%s.lock", ctx.nvmlscript);
	snprintf(tmp, sizeof tmp, "%s.%d.tmp", ctx.nvmlscript, (int)getpid());
	int lk = open(lockpath, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
	if (lk < 0) {
		return;
	}
	flock(lk, LOCK_EX);
	FILE *in = fopen(ctx.nvmlscript, "re");
	FILE *out = fopen(tmp, "we");
	if (out == NULL) {
		if (in) {
			fclose(in);
		}
		close(lk);
		return;
	}
	enum { KEEP = 100 };
	int samples = 0, seen = 0;
	if (in) {
		while (fgets(line, sizeof line, in)) {
			if (strncmp(line, "sample ", 7) == 0 && !dead(line_pid(line))) {
				samples++;
			}
		}
		rewind(in);
		while (fgets(line, sizeof line, in)) {
			int isproc = strncmp(line, "process ", 8) == 0, issample = strncmp(line, "sample ", 7) == 0;
			if (isproc || issample) {
				int pid = line_pid(line);
				if (dead(pid) || (isproc && pid == (int)getpid())) {
					continue;
				}
				if (issample && seen++ < samples - KEEP) {
					continue;
				}
			}
			fputs(line, out);
		}
		fclose(in);
	}
	if (!gone) {
		fprintf(out, "process gpu=%d pid=%d memory=%llu\n", ctx.nvml, (int)getpid(), ctx.memory);
	}
	if (sample) {
		fprintf(out, "sample gpu=%d pid=%d ts=%llu sm=90 mem=40\n", ctx.nvml, (int)getpid(), now_us());
	}
	fclose(out);
	rename(tmp, ctx.nvmlscript);
	close(lk);
}

// cuda_process appends this process's checkpoint record to the script:
// it is a CUDA process now, which gpud's checkpoint calls must find.
static void cuda_process(void) {
	char path[PATH_MAX];
	struct script s;
	if (lookup((int)getpid(), &s)) {
		return;
	}
	script_path(path, sizeof path);
	int fd = open(path, O_WRONLY | O_APPEND | O_CLOEXEC);
	if (fd < 0) {
		return;
	}
	char line[128];
	int n = snprintf(line, sizeof line, "pid pid=%d lock=ok checkpoint=ok restore=ok\n", (int)getpid());
	flock(fd, LOCK_EX);
	if (write(fd, line, (size_t)n) != n) {
		// A short append leaves the process unknown to gpud's checkpoint
		// calls, which is what a failed write should mean.
	}
	close(fd);
}

CUresult cuDeviceGetCount(int *count) {
	struct device d[MAX_DEVICES];
	if (count == NULL) {
		return CUDA_ERROR_INVALID_VALUE;
	}
	*count = devices(d, NULL, 0);
	return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice *dev, int ordinal) {
	struct device d[MAX_DEVICES];
	if (dev == NULL) {
		return CUDA_ERROR_INVALID_VALUE;
	}
	if (ordinal < 0 || ordinal >= devices(d, NULL, 0)) {
		return CUDA_ERROR_INVALID_DEVICE;
	}
	*dev = ordinal;
	return CUDA_SUCCESS;
}

CUresult cuDeviceGetName(char *name, int len, CUdevice dev) {
	struct device d[MAX_DEVICES];
	if (name == NULL || len <= 0) {
		return CUDA_ERROR_INVALID_VALUE;
	}
	if (dev < 0 || dev >= devices(d, NULL, 0)) {
		return CUDA_ERROR_INVALID_DEVICE;
	}
	snprintf(name, (size_t)len, "%s", d[dev].name[0] ? d[dev].name : "NVIDIA Test GPU");
	return CUDA_SUCCESS;
}

// cuDeviceGetUuid: the 16 bytes NVML writes as GPU-xxxxxxxx-xxxx-....
CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev) {
	struct device d[MAX_DEVICES];
	if (uuid == NULL) {
		return CUDA_ERROR_INVALID_VALUE;
	}
	if (dev < 0 || dev >= devices(d, NULL, 0)) {
		return CUDA_ERROR_INVALID_DEVICE;
	}
	memset(uuid, 0, sizeof *uuid);
	const char *p = d[dev].uuid;
	if (strncmp(p, "GPU-", 4) == 0 || strncmp(p, "MIG-", 4) == 0) {
		p += 4;
	}
	for (int i = 0; i < 16 && *p;) {
		unsigned int b;
		if (*p == '-') {
			p++;
			continue;
		}
		if (sscanf(p, "%2x", &b) != 1) {
			break;
		}
		uuid->bytes[i++] = (char)b;
		p += 2;
	}
	return CUDA_SUCCESS;
}

CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev) { return cuDeviceGetUuid(uuid, dev); }

CUresult cuCtxCreate_v2(void **pctx, unsigned int flags, CUdevice dev) {
	struct device d[MAX_DEVICES];
	char nvml[PATH_MAX];
	(void)flags;
	if (pctx == NULL) {
		return CUDA_ERROR_INVALID_VALUE;
	}
	if (dev < 0 || dev >= devices(d, nvml, sizeof nvml)) {
		return CUDA_ERROR_INVALID_DEVICE;
	}
	if (ctx.live) {
		return CUDA_ERROR_INVALID_CONTEXT; // the probe makes one
	}
	int fd = open(d[dev].node, O_RDWR | O_CLOEXEC);
	if (fd < 0) {
		// libcuda cannot open /dev/nvidiaN (EPERM from the gate: refused).
		return errno == EPERM || errno == EACCES ? CUDA_ERROR_NO_DEVICE : CUDA_ERROR_FILE_NOT_FOUND;
	}
	int capfd = -1;
	if (d[dev].cap[0]) {
		// A MIG device: its GPU instance's capability node too.
		capfd = open(d[dev].cap, O_RDWR | O_CLOEXEC);
		if (capfd < 0) {
			int e = errno;
			close(fd);
			return e == EPERM || e == EACCES ? CUDA_ERROR_NO_DEVICE : CUDA_ERROR_FILE_NOT_FOUND;
		}
	}
	ctx.live = 1;
	ctx.fd = fd;
	ctx.capfd = capfd;
	ctx.nvml = d[dev].nvml;
	ctx.memory = 0;
	snprintf(ctx.nvmlscript, sizeof ctx.nvmlscript, "%s", nvml);
	cuda_process();
	nvml_write(0, 0);
	*pctx = &ctx;
	return CUDA_SUCCESS;
}

CUresult cuCtxDestroy_v2(void *c) {
	if (c != &ctx || !ctx.live) {
		return CUDA_ERROR_INVALID_CONTEXT;
	}
	for (int i = 0; i < MAX_ALLOCS; i++) {
		free(allocs[i].p);
		allocs[i].p = NULL;
	}
	close(ctx.fd);
	if (ctx.capfd >= 0) {
		close(ctx.capfd);
	}
	nvml_write(1, 0);
	ctx.live = 0;
	return CUDA_SUCCESS;
}

CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t size) {
	if (!ctx.live) {
		return CUDA_ERROR_INVALID_CONTEXT;
	}
	if (dptr == NULL || size == 0) {
		return CUDA_ERROR_INVALID_VALUE;
	}
	for (int i = 0; i < MAX_ALLOCS; i++) {
		if (allocs[i].p == NULL) {
			// calloc of a large block maps zero pages: untouched memory
			// costs the host nothing.
			allocs[i].p = calloc(1, size);
			if (allocs[i].p == NULL) {
				return CUDA_ERROR_OUT_OF_MEMORY;
			}
			allocs[i].size = size;
			ctx.memory += size;
			*dptr = (CUdeviceptr)(uintptr_t)allocs[i].p;
			nvml_write(0, 0);
			return CUDA_SUCCESS;
		}
	}
	return CUDA_ERROR_OUT_OF_MEMORY;
}

CUresult cuMemFree_v2(CUdeviceptr dptr) {
	for (int i = 0; i < MAX_ALLOCS; i++) {
		if (allocs[i].p != NULL && (CUdeviceptr)(uintptr_t)allocs[i].p == dptr) {
			free(allocs[i].p);
			allocs[i].p = NULL;
			ctx.memory -= allocs[i].size;
			nvml_write(0, 0);
			return CUDA_SUCCESS;
		}
	}
	return CUDA_ERROR_INVALID_VALUE;
}

// in_alloc says whether [p, p+n) lies in one allocation.
static int in_alloc(CUdeviceptr p, size_t n) {
	for (int i = 0; i < MAX_ALLOCS; i++) {
		CUdeviceptr lo = (CUdeviceptr)(uintptr_t)allocs[i].p;
		if (allocs[i].p != NULL && p >= lo && p + n <= lo + allocs[i].size) {
			return 1;
		}
	}
	return 0;
}

CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n) {
	if (!ctx.live) {
		return CUDA_ERROR_INVALID_CONTEXT;
	}
	if (!in_alloc(dst, n) || src == NULL) {
		return CUDA_ERROR_INVALID_VALUE;
	}
	memcpy((void *)(uintptr_t)dst, src, n);
	return CUDA_SUCCESS;
}

CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n) {
	if (!ctx.live) {
		return CUDA_ERROR_INVALID_CONTEXT;
	}
	if (!in_alloc(src, n) || dst == NULL) {
		return CUDA_ERROR_INVALID_VALUE;
	}
	memcpy(dst, (void *)(uintptr_t)src, n);
	return CUDA_SUCCESS;
}

static int the_module, the_function;

CUresult cuModuleLoadData(void **mod, const void *image) {
	if (!ctx.live) {
		return CUDA_ERROR_INVALID_CONTEXT;
	}
	if (mod == NULL || image == NULL) {
		return CUDA_ERROR_INVALID_VALUE;
	}
	// The double cannot compile PTX: it knows one kernel by its name.
	if (strstr((const char *)image, ".entry gpucheck_step") == NULL) {
		return CUDA_ERROR_INVALID_IMAGE;
	}
	*mod = &the_module;
	return CUDA_SUCCESS;
}

CUresult cuModuleGetFunction(void **fn, void *mod, const char *name) {
	if (mod != &the_module || fn == NULL || name == NULL) {
		return CUDA_ERROR_INVALID_HANDLE;
	}
	if (strcmp(name, "gpucheck_step") != 0) {
		return CUDA_ERROR_NOT_FOUND;
	}
	*fn = &the_function;
	return CUDA_SUCCESS;
}

CUresult cuModuleUnload(void *mod) { return mod == &the_module ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE; }

// cuLaunchKernel runs gpucheck_step(buf, n, reps) on the CPU, as the
// probe's PTX says: for each thread i < n, reps times
// buf[i] = buf[i] * 1664525 + (2i + 1) (mod 2^32).
CUresult cuLaunchKernel(void *fn, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx, unsigned int by,
			unsigned int bz, unsigned int shmem, void *stream, void **params, void **extra) {
	(void)shmem;
	(void)stream;
	(void)extra;
	if (!ctx.live) {
		return CUDA_ERROR_INVALID_CONTEXT;
	}
	if (fn != &the_function || params == NULL) {
		return CUDA_ERROR_INVALID_HANDLE;
	}
	if (gy != 1 || gz != 1 || by != 1 || bz != 1) {
		return CUDA_ERROR_INVALID_VALUE;
	}
	CUdeviceptr buf = *(CUdeviceptr *)params[0];
	uint32_t n = *(uint32_t *)params[1], reps = *(uint32_t *)params[2];
	uint64_t threads = (uint64_t)gx * bx;
	if (threads < n) {
		n = (uint32_t)threads;
	}
	if (!in_alloc(buf, (size_t)n * 4)) {
		return CUDA_ERROR_INVALID_VALUE; // the GPU would fault (XID 13/31)
	}
	uint32_t *x = (uint32_t *)(uintptr_t)buf;
	for (uint32_t i = 0; i < n; i++) {
		uint32_t v = x[i], c = 2 * i + 1;
		for (uint32_t k = 0; k < reps; k++) {
			v = v * 1664525u + c;
		}
		x[i] = v;
	}
	struct timespec gpu = {0, 2 * 1000 * 1000};
	nanosleep(&gpu, NULL);
	ctx.launched++;
	return CUDA_SUCCESS;
}

// cuCtxSynchronize: the launches are done; the driver's sampler has seen
// them (one sample each 100 ms at most, as NVML's are periodic).
CUresult cuCtxSynchronize(void) {
	if (!ctx.live) {
		return CUDA_ERROR_INVALID_CONTEXT;
	}
	struct timespec now;
	clock_gettime(CLOCK_MONOTONIC, &now);
	long long ms = (now.tv_sec - ctx.last_sample.tv_sec) * 1000LL + (now.tv_nsec - ctx.last_sample.tv_nsec) / 1000000;
	if (ctx.launched > 0 && ms >= 100) {
		nvml_write(0, 1);
		ctx.last_sample = now;
		ctx.launched = 0;
	}
	return CUDA_SUCCESS;
}

CUresult cuGetErrorString(CUresult r, const char **s) {
	if (s == NULL) {
		return CUDA_ERROR_INVALID_VALUE;
	}
	switch (r) {
	case CUDA_SUCCESS: *s = "no error"; break;
	case CUDA_ERROR_INVALID_VALUE: *s = "invalid argument"; break;
	case CUDA_ERROR_OUT_OF_MEMORY: *s = "out of memory"; break;
	case CUDA_ERROR_NO_DEVICE: *s = "no CUDA-capable device is detected"; break;
	case CUDA_ERROR_INVALID_DEVICE: *s = "invalid device ordinal"; break;
	case CUDA_ERROR_INVALID_IMAGE: *s = "device kernel image is invalid"; break;
	case CUDA_ERROR_INVALID_CONTEXT: *s = "invalid device context"; break;
	case CUDA_ERROR_FILE_NOT_FOUND: *s = "file not found"; break;
	case CUDA_ERROR_INVALID_HANDLE: *s = "invalid resource handle"; break;
	case CUDA_ERROR_NOT_FOUND: *s = "named symbol not found"; break;
	default: *s = "unknown error"; break;
	}
	return CUDA_SUCCESS;
}
