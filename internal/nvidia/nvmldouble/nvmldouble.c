// A test double of NVIDIA's libnvidia-ml.so.1: the NVML calls gpud makes,
// answered from a script file the test writes and may change while gpud
// runs. gpud loads it as it loads the driver's library (go-nvml's dlopen of
// the path --nvml-library names), so the whole production path runs; only
// the hardware is missing.
//
// Built by the tests (internal/testutil.NewNVMLDouble): gcc -shared -fPIC.
// The script is "nvml-double.txt" in the library's own directory, re-read
// at every call (what the test wrote last is what NVML says). One record a
// line, fields key=value:
//
//	driver version=570.86.15
//	gpu index=0 minor=1 uuid=GPU-... name=NVIDIA_H100 memory_total=17179869184 [memory_used=N] [mig=1] [lost=1]
//	process gpu=0 pid=123 memory=1073741824
//	sample gpu=0 pid=123 ts=<µs since the epoch> sm=50 mem=10
//	event gpu=0 seq=1 type=xid|dbe|sbe data=79
//
// Where the real library is awkward the double is too: utilization samples
// are those newer than the caller's timestamp, NVML_ERROR_NOT_FOUND when
// there are none; a size query answers NVML_ERROR_INSUFFICIENT_SIZE; the
// process list is the _v3 layout; a lost GPU answers NVML_ERROR_GPU_IS_LOST;
// NVML indexes need not follow minor numbers.
#define _GNU_SOURCE
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int nvmlReturn_t;
enum {
	NVML_SUCCESS = 0,
	NVML_ERROR_UNINITIALIZED = 1,
	NVML_ERROR_INVALID_ARGUMENT = 2,
	NVML_ERROR_NOT_SUPPORTED = 3,
	NVML_ERROR_NOT_FOUND = 6,
	NVML_ERROR_INSUFFICIENT_SIZE = 7,
	NVML_ERROR_DRIVER_NOT_LOADED = 9,
	NVML_ERROR_TIMEOUT = 10,
	NVML_ERROR_GPU_IS_LOST = 15,
	NVML_ERROR_UNKNOWN = 999,
};

#define MAX_GPUS 16
#define MAX_RECS 256
#define MAX_SETS 8

struct nvmlDevice_st {
	int slot; // position in the device table; stable across re-reads
};

typedef struct nvmlDevice_st *nvmlDevice_t;

typedef struct {
	unsigned long long total, free, used;
} nvmlMemory_t;

typedef struct {
	unsigned int pid;
	unsigned long long usedGpuMemory;
	unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_t;

typedef struct {
	unsigned int pid;
	unsigned long long timeStamp;
	unsigned int smUtil, memUtil, encUtil, decUtil;
} nvmlProcessUtilizationSample_t;

typedef struct {
	nvmlDevice_t device;
	unsigned long long eventType, eventData;
	unsigned int gpuInstanceId, computeInstanceId;
} nvmlEventData_t;

struct nvmlEventSet_st {
	int used;
	unsigned long long mask[MAX_GPUS];
	unsigned long long delivered; // highest seq returned
};
typedef struct nvmlEventSet_st *nvmlEventSet_t;

enum { EV_SBE = 1, EV_DBE = 2, EV_XID = 8 };

struct gpu {
	int index, minor, mig, lost;
	char uuid[96], name[96];
	unsigned long long mem_total, mem_used;
	int mem_used_set;
};
struct proc {
	int gpu;
	unsigned int pid;
	unsigned long long memory;
};
struct sample {
	int gpu;
	unsigned int pid, sm, mem;
	unsigned long long ts;
};
struct event {
	int gpu;
	unsigned long long seq, type, data;
};

struct script {
	char driver[80];
	int ngpus, nprocs, nsamples, nevents;
	struct gpu gpus[MAX_GPUS];
	struct proc procs[MAX_RECS];
	struct sample samples[MAX_RECS];
	struct event events[MAX_RECS];
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int initialized;
static struct nvmlDevice_st handles[MAX_GPUS];
static struct nvmlEventSet_st sets[MAX_SETS];

// script_path is nvml-double.txt next to this library, found from the
// kernel's name of the file mapped here (/proc/self/maps): gpud loads the
// library through /proc/self/fd/N, which is the name dladdr would give.
static int script_path(char *out, size_t n) {
	char line[PATH_MAX + 256];
	unsigned long here = (unsigned long)(void *)script_path, lo, hi;
	int found = -1;
	FILE *f = fopen("/proc/self/maps", "re");
	if (!f)
		return -1;
	while (found != 0 && fgets(line, sizeof(line), f)) {
		char *path = strchr(line, '/');
		if (sscanf(line, "%lx-%lx", &lo, &hi) != 2 || here < lo || here >= hi || !path)
			continue;
		char *nl = strchr(path, '\n');
		if (nl)
			*nl = 0;
		char *slash = strrchr(path, '/');
		size_t dir = (size_t)(slash - path);
		if (dir + sizeof("/nvml-double.txt") > n)
			break;
		memcpy(out, path, dir);
		strcpy(out + dir, "/nvml-double.txt");
		found = 0;
	}
	fclose(f);
	return found;
}

static const char *field(char *line, const char *key) {
	size_t k = strlen(key);
	for (char *p = line; (p = strstr(p, key)) != NULL; p += k) {
		if ((p == line || p[-1] == ' ' || p[-1] == '\t') && p[k] == '=')
			return p + k + 1;
	}
	return NULL;
}

static unsigned long long num(char *line, const char *key, unsigned long long def) {
	const char *v = field(line, key);
	return v ? strtoull(v, NULL, 0) : def;
}

static void str(char *line, const char *key, char *out, size_t n) {
	const char *v = field(line, key);
	size_t i = 0;
	if (!v)
		return;
	for (; v[i] && v[i] != ' ' && v[i] != '\t' && v[i] != '\n' && i + 1 < n; i++)
		out[i] = v[i] == '_' ? ' ' : v[i];
	out[i] = 0;
}

// load reads the script; the caller holds mu. A missing script is a node
// whose driver is not loaded.
static nvmlReturn_t load(struct script *s) {
	char path[PATH_MAX], line[1024];
	memset(s, 0, sizeof(*s));
	strcpy(s->driver, "570.86.15");
	if (script_path(path, sizeof(path)) != 0)
		return NVML_ERROR_UNKNOWN;
	FILE *f = fopen(path, "re");
	if (!f)
		return NVML_ERROR_DRIVER_NOT_LOADED;
	while (fgets(line, sizeof(line), f)) {
		char *nl = strchr(line, '\n');
		if (nl)
			*nl = 0;
		if (!strncmp(line, "driver ", 7)) {
			str(line, "version", s->driver, sizeof(s->driver));
		} else if (!strncmp(line, "gpu ", 4) && s->ngpus < MAX_GPUS) {
			struct gpu *g = &s->gpus[s->ngpus++];
			g->index = (int)num(line, "index", (unsigned long long)(s->ngpus - 1));
			g->minor = (int)num(line, "minor", (unsigned long long)g->index);
			g->mig = (int)num(line, "mig", 0);
			g->lost = (int)num(line, "lost", 0);
			g->mem_total = num(line, "memory_total", 16ULL << 30);
			g->mem_used_set = field(line, "memory_used") != NULL;
			g->mem_used = num(line, "memory_used", 0);
			snprintf(g->uuid, sizeof(g->uuid), "GPU-00000000-0000-0000-0000-%012d", g->index);
			str(line, "uuid", g->uuid, sizeof(g->uuid));
			strcpy(g->name, "NVIDIA Test GPU");
			str(line, "name", g->name, sizeof(g->name));
		} else if (!strncmp(line, "process ", 8) && s->nprocs < MAX_RECS) {
			struct proc *p = &s->procs[s->nprocs++];
			p->gpu = (int)num(line, "gpu", 0);
			p->pid = (unsigned int)num(line, "pid", 0);
			p->memory = num(line, "memory", 0);
		} else if (!strncmp(line, "sample ", 7) && s->nsamples < MAX_RECS) {
			struct sample *p = &s->samples[s->nsamples++];
			p->gpu = (int)num(line, "gpu", 0);
			p->pid = (unsigned int)num(line, "pid", 0);
			p->ts = num(line, "ts", 0);
			p->sm = (unsigned int)num(line, "sm", 0);
			p->mem = (unsigned int)num(line, "mem", 0);
		} else if (!strncmp(line, "event ", 6) && s->nevents < MAX_RECS) {
			struct event *e = &s->events[s->nevents++];
			char type[16] = "xid";
			e->gpu = (int)num(line, "gpu", 0);
			e->seq = num(line, "seq", (unsigned long long)s->nevents);
			e->data = num(line, "data", 0);
			str(line, "type", type, sizeof(type));
			e->type = !strcmp(type, "dbe") ? EV_DBE : !strcmp(type, "sbe") ? EV_SBE : EV_XID;
		}
	}
	fclose(f);
	return NVML_SUCCESS;
}

// gpu_of finds the scripted GPU behind a handle (by its NVML index).
static struct gpu *gpu_of(struct script *s, nvmlDevice_t d) {
	if (d < handles || d >= handles + MAX_GPUS)
		return NULL;
	for (int i = 0; i < s->ngpus; i++)
		if (s->gpus[i].index == d->slot)
			return &s->gpus[i];
	return NULL;
}

static void free_script(struct script **s) { free(*s); }

// fresh loads the script into a new copy, freed when the caller returns.
#define FRESH(s)                                                              \
	struct script *s __attribute__((cleanup(free_script))) = malloc(sizeof(struct script)); \
	if (!s)                                                               \
		return NVML_ERROR_UNKNOWN;                                    \
	pthread_mutex_lock(&mu);                                              \
	nvmlReturn_t _r = initialized ? load(s) : NVML_ERROR_UNINITIALIZED;   \
	pthread_mutex_unlock(&mu);                                            \
	if (_r != NVML_SUCCESS)                                               \
		return _r;

// WITH_DEVICE loads the script and finds the device, or says why not.
#define WITH_DEVICE(s, g, d)                    \
	FRESH(s)                                \
	struct gpu *g = gpu_of(s, d);           \
	if (!g)                                 \
		return NVML_ERROR_INVALID_ARGUMENT; \
	if (g->lost)                            \
		return NVML_ERROR_GPU_IS_LOST;

nvmlReturn_t nvmlInit_v2(void) {
	struct script *s __attribute__((cleanup(free_script))) = malloc(sizeof(struct script));
	if (!s)
		return NVML_ERROR_UNKNOWN;
	pthread_mutex_lock(&mu);
	nvmlReturn_t r = load(s);
	if (r == NVML_SUCCESS)
		initialized++;
	pthread_mutex_unlock(&mu);
	return r;
}

nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
	(void)flags;
	return nvmlInit_v2();
}

nvmlReturn_t nvmlInit(void) { return nvmlInit_v2(); }

nvmlReturn_t nvmlShutdown(void) {
	pthread_mutex_lock(&mu);
	nvmlReturn_t r = initialized ? NVML_SUCCESS : NVML_ERROR_UNINITIALIZED;
	if (initialized)
		initialized--;
	pthread_mutex_unlock(&mu);
	return r;
}

const char *nvmlErrorString(nvmlReturn_t r) {
	switch (r) {
	case NVML_SUCCESS: return "Success";
	case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
	case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
	case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
	case NVML_ERROR_NOT_FOUND: return "Not Found";
	case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
	case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
	case NVML_ERROR_TIMEOUT: return "Timeout";
	case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
	default: return "Unknown Error";
	}
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
	FRESH(s)
	if (!version || strlen(s->driver) + 1 > length)
		return NVML_ERROR_INSUFFICIENT_SIZE;
	strcpy(version, s->driver);
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
	FRESH(s)
	if (!count)
		return NVML_ERROR_INVALID_ARGUMENT;
	*count = (unsigned int)s->ngpus;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
	FRESH(s)
	if (!device || index >= MAX_GPUS)
		return NVML_ERROR_INVALID_ARGUMENT;
	for (int i = 0; i < s->ngpus; i++) {
		if (s->gpus[i].index == (int)index) {
			handles[index].slot = (int)index;
			*device = &handles[index];
			return s->gpus[i].lost ? NVML_ERROR_GPU_IS_LOST : NVML_SUCCESS;
		}
	}
	return NVML_ERROR_INVALID_ARGUMENT;
}

nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index) {
	WITH_DEVICE(s, g, device)
	*index = (unsigned int)g->index;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minor) {
	WITH_DEVICE(s, g, device)
	*minor = (unsigned int)g->minor;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
	WITH_DEVICE(s, g, device)
	if (!uuid || strlen(g->uuid) + 1 > length)
		return NVML_ERROR_INSUFFICIENT_SIZE;
	strcpy(uuid, g->uuid);
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
	WITH_DEVICE(s, g, device)
	if (!name || strlen(g->name) + 1 > length)
		return NVML_ERROR_INSUFFICIENT_SIZE;
	strcpy(name, g->name);
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
	WITH_DEVICE(s, g, device)
	unsigned long long used = g->mem_used;
	if (!g->mem_used_set) // the processes' memory, as on a GPU without reserved memory
		for (int i = 0; i < s->nprocs; i++)
			if (s->procs[i].gpu == g->index)
				used += s->procs[i].memory;
	if (used > g->mem_total)
		used = g->mem_total;
	memory->total = g->mem_total;
	memory->used = used;
	memory->free = g->mem_total - used;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *count, nvmlProcessInfo_t *infos) {
	WITH_DEVICE(s, g, device)
	if (!count)
		return NVML_ERROR_INVALID_ARGUMENT;
	unsigned int n = 0;
	for (int i = 0; i < s->nprocs; i++)
		if (s->procs[i].gpu == g->index)
			n++;
	if (n > *count || (n > 0 && !infos)) {
		*count = n;
		return NVML_ERROR_INSUFFICIENT_SIZE;
	}
	*count = 0;
	for (int i = 0; i < s->nprocs; i++) {
		if (s->procs[i].gpu != g->index)
			continue;
		infos[*count].pid = s->procs[i].pid;
		infos[*count].usedGpuMemory = s->procs[i].memory;
		infos[*count].gpuInstanceId = 0xFFFFFFFF;
		infos[*count].computeInstanceId = 0xFFFFFFFF;
		(*count)++;
	}
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t device, nvmlProcessUtilizationSample_t *util,
					     unsigned int *count, unsigned long long lastSeen) {
	WITH_DEVICE(s, g, device)
	if (!count)
		return NVML_ERROR_INVALID_ARGUMENT;
	unsigned int n = 0;
	for (int i = 0; i < s->nsamples; i++)
		if (s->samples[i].gpu == g->index && s->samples[i].ts > lastSeen)
			n++;
	if (n == 0)
		return NVML_ERROR_NOT_FOUND;
	if (!util || n > *count) {
		*count = n;
		return NVML_ERROR_INSUFFICIENT_SIZE;
	}
	*count = 0;
	for (int i = 0; i < s->nsamples; i++) {
		struct sample *p = &s->samples[i];
		if (p->gpu != g->index || p->ts <= lastSeen)
			continue;
		util[*count] = (nvmlProcessUtilizationSample_t){.pid = p->pid, .timeStamp = p->ts, .smUtil = p->sm, .memUtil = p->mem};
		(*count)++;
	}
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *current, unsigned int *pending) {
	WITH_DEVICE(s, g, device)
	*current = *pending = (unsigned int)g->mig;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device, unsigned long long *types) {
	WITH_DEVICE(s, g, device)
	*types = EV_SBE | EV_DBE | EV_XID;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) {
	pthread_mutex_lock(&mu);
	for (int i = 0; i < MAX_SETS; i++) {
		if (!sets[i].used) {
			memset(&sets[i], 0, sizeof(sets[i]));
			sets[i].used = 1;
			*set = &sets[i];
			pthread_mutex_unlock(&mu);
			return NVML_SUCCESS;
		}
	}
	pthread_mutex_unlock(&mu);
	return NVML_ERROR_UNKNOWN;
}

nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) {
	pthread_mutex_lock(&mu);
	if (set >= sets && set < sets + MAX_SETS)
		set->used = 0;
	pthread_mutex_unlock(&mu);
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long types, nvmlEventSet_t set) {
	WITH_DEVICE(s, g, device)
	if (set < sets || set >= sets + MAX_SETS || !set->used)
		return NVML_ERROR_INVALID_ARGUMENT;
	pthread_mutex_lock(&mu);
	set->mask[device->slot] |= types;
	// Events already in the script happened before the registration.
	for (int i = 0; i < s->nevents; i++)
		if (s->events[i].seq > set->delivered)
			set->delivered = s->events[i].seq;
	pthread_mutex_unlock(&mu);
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms) {
	struct script *s __attribute__((cleanup(free_script))) = malloc(sizeof(struct script));
	struct timespec start, now, pause = {0, 20 * 1000 * 1000};
	if (!s)
		return NVML_ERROR_UNKNOWN;
	if (set < sets || set >= sets + MAX_SETS || !set->used || !data)
		return NVML_ERROR_INVALID_ARGUMENT;
	clock_gettime(CLOCK_MONOTONIC, &start);
	for (;;) {
		pthread_mutex_lock(&mu);
		nvmlReturn_t r = initialized ? load(s) : NVML_ERROR_UNINITIALIZED;
		if (r != NVML_SUCCESS) {
			pthread_mutex_unlock(&mu);
			return r;
		}
		struct event *best = NULL;
		for (int i = 0; i < s->nevents; i++) {
			struct event *e = &s->events[i];
			if (e->seq <= set->delivered || e->gpu < 0 || e->gpu >= MAX_GPUS || !(set->mask[e->gpu] & e->type))
				continue;
			if (!best || e->seq < best->seq)
				best = e;
		}
		if (best) {
			set->delivered = best->seq;
			handles[best->gpu].slot = best->gpu;
			*data = (nvmlEventData_t){.device = &handles[best->gpu], .eventType = best->type,
				.eventData = best->type == EV_XID ? best->data : 0,
				.gpuInstanceId = 0xFFFFFFFF, .computeInstanceId = 0xFFFFFFFF};
			pthread_mutex_unlock(&mu);
			return NVML_SUCCESS;
		}
		pthread_mutex_unlock(&mu);
		clock_gettime(CLOCK_MONOTONIC, &now);
		long long ms = (now.tv_sec - start.tv_sec) * 1000LL + (now.tv_nsec - start.tv_nsec) / 1000000;
		if (ms >= (long long)timeoutms)
			return NVML_ERROR_TIMEOUT;
		nanosleep(&pause, NULL);
	}
}
