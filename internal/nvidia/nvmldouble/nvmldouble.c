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
//	driver version=570.86.15 [mismatch=1]
//	gpu index=0 minor=1 uuid=GPU-... name=NVIDIA_H100 memory_total=17179869184 [memory_used=N] [mig=1] [lost=1]
//	process gpu=0 pid=123 memory=1073741824|na [work=1]
//	sample gpu=0 pid=123 ts=<µs since the epoch> sm=50 mem=10
//	event gpu=0 seq=1 type=xid|dbe|sbe data=79
//	eventerr id=1 code=timeout|unknown|gpu_is_lost [gpu=N] [count=N]
//	slow fn=nvmlDeviceGetProcessUtilization ms=2000 [gpu=N]
//	mig gpu=0 gi=1 ci=0 uuid=MIG-... profile=1g.10gb memory_total=N [memory_used=N]
//	gpu ... [pci=0000:3b:00.0] [nvlinks=18]
//	nvlink gpu=0 link=0 remote=0000:3c:00.0 [active=0]
//
// Where the real library is awkward the double is too (docs/real-gpu.md
// lists each behaviour with the nvml.h text it follows): utilization
// samples are those newer than the caller's timestamp, NVML_ERROR_NOT_FOUND
// when there are none; a size query answers NVML_ERROR_INSUFFICIENT_SIZE;
// the process list is the _v3 layout; a lost GPU answers
// NVML_ERROR_GPU_IS_LOST, from its handle on if it is lost before Init;
// NVML indexes need not follow minor numbers; a driver/library mismatch
// fails nvmlInit_v2; per-process utilization of a MIG-enabled GPU is
// NVML_ERROR_NOT_SUPPORTED; a process's memory may be
// NVML_VALUE_NOT_AVAILABLE; event waits fail (eventerr: the next count
// waits, once per id); any call may be slow (slow: it sleeps ms first,
// outside the double's lock, so other calls go on as in the thread-safe
// library).
//
// A process with work=1 is fake GPU work (issue 30 item 7): its
// utilization samples are not scripted but follow the time it really gets
// from the CPU scheduler (see "Fake GPU work" below and docs/real-gpu.md).
#define _GNU_SOURCE
#include <dirent.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <time.h>
#include <unistd.h>

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
	// nvml.h: "NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18, //!< RM detects a
	// driver/library version mismatch" (a driver upgraded under a
	// running node: the kernel module and the library disagree).
	NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18,
	NVML_ERROR_UNKNOWN = 999,
};

// nvml.h: "#define NVML_VALUE_NOT_AVAILABLE (-1)", in an unsigned long long
// field; usedGpuMemory: "Set to NVML_VALUE_NOT_AVAILABLE if
// nvmlProcessInfo_t->usedGpuMemory is not supported".
#define NVML_VALUE_NOT_AVAILABLE ((unsigned long long)-1)

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
	unsigned int pci_domain, pci_bus, pci_dev; // topology (issue 30 item 1)
	int nvlinks;                               // links it has; 0: no NVLink
};
struct proc {
	int gpu, work;
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
struct eventerr {
	unsigned long long id;
	int gpu, code, count;
};
struct slow {
	char fn[64];
	int gpu; // -1: every GPU
	long ms;
};

// ---- MIG (issue 28 item 3) ----------------------------------------------
// A "mig" record is one MIG device (a compute instance of a GPU instance)
// of the MIG-enabled GPU of NVML index gpu. Its handle is mig_handles[k]
// for the k-th mig record; the parent answers nvmlDeviceGetMaxMigDeviceCount
// and nvmlDeviceGetMigDeviceHandleByIndex, the MIG handle its ids, UUID,
// name ("<parent name> MIG <profile>", as NVML names MIG devices) and
// memory.
#define MAX_MIGS 32

struct mig {
	int gpu, gi, ci;
	char uuid[96], profile[32];
	unsigned long long mem_total, mem_used;
};

#define MAX_ERRS 32

// ---- Topology (issue 30 item 1) -------------------------------------------
// A GPU's PCI address is pci= on its gpu record (default 0000:<index+1>:00.0);
// nvlinks= is how many NVLinks it has (0, the default: none, and every
// NVLink call answers NVML_ERROR_NOT_SUPPORTED, as on a GPU without
// NVLink). An "nvlink" record is one active link (active=0: down) of the
// GPU of NVML index gpu, to the device at remote (a peer GPU, or an
// NVSwitch: any address); a link of the GPU's without a record is down.
#define MAX_LINKS 128
#define NVLINK_MAX_LINKS 18 // nvml.h NVML_NVLINK_MAX_LINKS

struct nvlink {
	int gpu, link, active;
	unsigned int domain, bus, dev;
};

struct script {
	char driver[80];
	int mismatch;
	int ngpus, nprocs, nsamples, nevents, nerrs, nslow;
	struct gpu gpus[MAX_GPUS];
	struct proc procs[MAX_RECS];
	struct sample samples[MAX_RECS];
	struct event events[MAX_RECS];
	struct eventerr errs[MAX_ERRS];
	struct slow slows[MAX_ERRS];
	int nmigs;
	struct mig migs[MAX_MIGS];
	int nlinks;
	struct nvlink links[MAX_LINKS];
};

// consumed counts, per eventerr id, the waits it has failed: the script is
// re-read at every call, its records are not.
static struct {
	unsigned long long id;
	int valid, used;
} consumed[MAX_ERRS];

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int initialized;
static struct nvmlDevice_st handles[MAX_GPUS];
static struct nvmlEventSet_st sets[MAX_SETS];

// script_path is nvml-double.txt next to this library, found from the
// kernel's name of the file mapped here (/proc/self/maps): gpud loads the
// library through /proc/self/fd/N, which is the name dladdr would give.
//
// Found once and kept (script_cached): the library's mapping does not
// move while it is loaded, and reading gpud's whole /proc/self/maps at
// every NVML call cost gpud CPU that real NVML does not (a tenth of a
// compute-sharing gpud's, issue 30). The caller holds mu.
static char script_cached[PATH_MAX];

static int script_path_uncached(char *out, size_t n);

static int script_path(char *out, size_t n) {
	if (!script_cached[0] && script_path_uncached(script_cached, sizeof(script_cached)) != 0) {
		script_cached[0] = 0;
		return -1;
	}
	if (strlen(script_cached) + 1 > n)
		return -1;
	strcpy(out, script_cached);
	return 0;
}

static int script_path_uncached(char *out, size_t n) {
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

// pci_addr reads a PCI address "dddd:bb:dd.f" (hex) at key; 0 if there.
static int pci_addr(char *line, const char *key, unsigned int *domain, unsigned int *bus, unsigned int *dev) {
	const char *v = field(line, key);
	unsigned int fn;
	return v && sscanf(v, "%x:%x:%x.%x", domain, bus, dev, &fn) == 4 ? 0 : -1;
}

static void load_topology(struct script *s, struct gpu *g, char *line) {
	(void)s;
	if (pci_addr(line, "pci", &g->pci_domain, &g->pci_bus, &g->pci_dev) != 0) {
		g->pci_domain = 0;
		g->pci_bus = (unsigned int)g->index + 1;
		g->pci_dev = 0;
	}
	g->nvlinks = (int)num(line, "nvlinks", 0);
	if (g->nvlinks > NVLINK_MAX_LINKS)
		g->nvlinks = NVLINK_MAX_LINKS;
}

static void load_nvlink(struct script *s, char *line) {
	if (s->nlinks >= MAX_LINKS)
		return;
	struct nvlink *l = &s->links[s->nlinks];
	l->gpu = (int)num(line, "gpu", 0);
	l->link = (int)num(line, "link", 0);
	l->active = (int)num(line, "active", 1);
	if (pci_addr(line, "remote", &l->domain, &l->bus, &l->dev) == 0)
		s->nlinks++;
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
			s->mismatch = (int)num(line, "mismatch", 0);
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
			load_topology(s, g, line);
		} else if (!strncmp(line, "process ", 8) && s->nprocs < MAX_RECS) {
			struct proc *p = &s->procs[s->nprocs++];
			p->gpu = (int)num(line, "gpu", 0);
			p->pid = (unsigned int)num(line, "pid", 0);
			const char *m = field(line, "memory");
			p->memory = m && !strncmp(m, "na", 2) ? NVML_VALUE_NOT_AVAILABLE : num(line, "memory", 0);
			p->work = (int)num(line, "work", 0);
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
		} else if (!strncmp(line, "eventerr ", 9) && s->nerrs < MAX_ERRS) {
			struct eventerr *e = &s->errs[s->nerrs++];
			char code[16] = "unknown";
			e->id = num(line, "id", (unsigned long long)s->nerrs);
			e->gpu = (int)num(line, "gpu", (unsigned long long)-1);
			e->count = (int)num(line, "count", 1);
			str(line, "code", code, sizeof(code));
			e->code = !strcmp(code, "timeout") ? NVML_ERROR_TIMEOUT
				: !strcmp(code, "gpu is lost") ? NVML_ERROR_GPU_IS_LOST : NVML_ERROR_UNKNOWN; // str() reads _ as a space
		} else if (!strncmp(line, "nvlink ", 7)) {
			load_nvlink(s, line);
		} else if (!strncmp(line, "mig ", 4) && s->nmigs < MAX_MIGS) {
			struct mig *m = &s->migs[s->nmigs++];
			m->gpu = (int)num(line, "gpu", 0);
			m->gi = (int)num(line, "gi", 0);
			m->ci = (int)num(line, "ci", 0);
			m->mem_total = num(line, "memory_total", 10ULL << 30);
			m->mem_used = num(line, "memory_used", 0);
			snprintf(m->uuid, sizeof(m->uuid), "MIG-00000000-0000-0000-0000-%06d%06d", m->gpu, s->nmigs);
			str(line, "uuid", m->uuid, sizeof(m->uuid));
			strcpy(m->profile, "1g.10gb");
			str(line, "profile", m->profile, sizeof(m->profile));
		} else if (!strncmp(line, "slow ", 5) && s->nslow < MAX_ERRS) {
			struct slow *w = &s->slows[s->nslow++];
			str(line, "fn", w->fn, sizeof(w->fn));
			w->gpu = (int)num(line, "gpu", (unsigned long long)-1);
			w->ms = (long)num(line, "ms", 0);
		}
	}
	fclose(f);
	return NVML_SUCCESS;
}

// be_slow sleeps as the script says fn is slow (on gpu, -1 for a call of no
// GPU); the caller holds no lock.
static void be_slow(struct script *s, const char *fn, int gpu) {
	for (int i = 0; i < s->nslow; i++) {
		struct slow *w = &s->slows[i];
		if (strcmp(w->fn, fn) || (w->gpu >= 0 && w->gpu != gpu) || w->ms <= 0)
			continue;
		struct timespec d = {w->ms / 1000, (w->ms % 1000) * 1000000L};
		while (nanosleep(&d, &d) != 0)
			;
	}
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

// FRESH_SLOW is FRESH for a call of no device, slow if the script says so.
#define FRESH_SLOW(s) \
	FRESH(s)      \
	be_slow(s, __func__, -1);

// WITH_DEVICE loads the script and finds the device, or says why not; the
// call is slow if the script says so. nvml.h of every device call:
// "NVML_ERROR_GPU_IS_LOST if the target GPU has fallen off the bus or is
// otherwise inaccessible".
#define WITH_DEVICE(s, g, d)                    \
	FRESH(s)                                \
	struct gpu *g = gpu_of(s, d);           \
	if (!g)                                 \
		return NVML_ERROR_INVALID_ARGUMENT; \
	be_slow(s, __func__, g->index);         \
	if (g->lost)                            \
		return NVML_ERROR_GPU_IS_LOST;

// ---- MIG (issue 28 item 3): MIG device handles ---------------------------
static struct nvmlDevice_st mig_handles[MAX_MIGS];

static int is_mig(nvmlDevice_t d) { return d >= mig_handles && d < mig_handles + MAX_MIGS; }

// mig_of finds the scripted MIG device behind a MIG handle, and its parent.
static struct mig *mig_of(struct script *s, nvmlDevice_t d, struct gpu **parent) {
	if (!is_mig(d) || d->slot < 0 || d->slot >= s->nmigs)
		return NULL;
	struct mig *m = &s->migs[d->slot];
	*parent = NULL;
	for (int i = 0; i < s->ngpus; i++)
		if (s->gpus[i].index == m->gpu)
			*parent = &s->gpus[i];
	return *parent ? m : NULL;
}

// WITH_MIG is WITH_DEVICE for a MIG handle: a MIG device of a lost GPU is
// lost too.
#define WITH_MIG(s, m, d)                            \
	FRESH(s)                                     \
	struct gpu *m##_parent;                      \
	struct mig *m = mig_of(s, d, &m##_parent);   \
	if (!m)                                      \
		return NVML_ERROR_INVALID_ARGUMENT;  \
	be_slow(s, __func__, m##_parent->index);     \
	if (m##_parent->lost || !m##_parent->mig)    \
		return m##_parent->lost ? NVML_ERROR_GPU_IS_LOST : NVML_ERROR_INVALID_ARGUMENT;

// nvml.h: "Get the maximum number of MIG devices that can exist under a
// given parent NVML device. Returns zero if MIG is not supported or
// enabled." Seven, as on an A100 or H100.
nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count) {
	WITH_DEVICE(s, g, device)
	if (!count)
		return NVML_ERROR_INVALID_ARGUMENT;
	*count = g->mig ? 7 : 0;
	return NVML_SUCCESS;
}

// nvml.h: "NVML_ERROR_NOT_FOUND if no valid MIG device was found at index".
nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index, nvmlDevice_t *migDevice) {
	WITH_DEVICE(s, g, device)
	if (!migDevice || index >= 7)
		return NVML_ERROR_INVALID_ARGUMENT;
	if (!g->mig)
		return NVML_ERROR_NOT_SUPPORTED;
	unsigned int n = 0;
	for (int k = 0; k < s->nmigs; k++) {
		if (s->migs[k].gpu != g->index || n++ != index)
			continue;
		mig_handles[k].slot = k;
		*migDevice = &mig_handles[k];
		return NVML_SUCCESS;
	}
	return NVML_ERROR_NOT_FOUND;
}

nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t device, unsigned int *isMigDevice) {
	if (!isMigDevice)
		return NVML_ERROR_INVALID_ARGUMENT;
	*isMigDevice = (unsigned int)is_mig(device);
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t device, unsigned int *id) {
	WITH_MIG(s, m, device)
	if (!id)
		return NVML_ERROR_INVALID_ARGUMENT;
	*id = (unsigned int)m->gi;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t device, unsigned int *id) {
	WITH_MIG(s, m, device)
	if (!id)
		return NVML_ERROR_INVALID_ARGUMENT;
	*id = (unsigned int)m->ci;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t migDevice, nvmlDevice_t *device) {
	WITH_MIG(s, m, migDevice)
	if (!device)
		return NVML_ERROR_INVALID_ARGUMENT;
	handles[m_parent->index].slot = m_parent->index;
	*device = &handles[m_parent->index];
	return NVML_SUCCESS;
}

static nvmlReturn_t mig_uuid(nvmlDevice_t device, char *uuid, unsigned int length) {
	WITH_MIG(s, m, device)
	if (!uuid || strlen(m->uuid) + 1 > length)
		return NVML_ERROR_INSUFFICIENT_SIZE;
	strcpy(uuid, m->uuid);
	return NVML_SUCCESS;
}

static nvmlReturn_t mig_name(nvmlDevice_t device, char *name, unsigned int length) {
	WITH_MIG(s, m, device)
	if (!name || (unsigned int)snprintf(name, length, "%s MIG %s", m_parent->name, m->profile) >= length)
		return NVML_ERROR_INSUFFICIENT_SIZE;
	return NVML_SUCCESS;
}

static nvmlReturn_t mig_memory(nvmlDevice_t device, nvmlMemory_t *memory) {
	WITH_MIG(s, m, device)
	if (!memory)
		return NVML_ERROR_INVALID_ARGUMENT;
	unsigned long long used = m->mem_used < m->mem_total ? m->mem_used : m->mem_total;
	*memory = (nvmlMemory_t){.total = m->mem_total, .used = used, .free = m->mem_total - used};
	return NVML_SUCCESS;
}
// ---- end of MIG handles -------------------------------------------------

nvmlReturn_t nvmlInit_v2(void) {
	struct script *s __attribute__((cleanup(free_script))) = malloc(sizeof(struct script));
	if (!s)
		return NVML_ERROR_UNKNOWN;
	pthread_mutex_lock(&mu);
	nvmlReturn_t r = load(s);
	// nvml.h: "NVML_ERROR_LIB_RM_VERSION_MISMATCH ... RM detects a
	// driver/library version mismatch": Init fails, and keeps failing
	// until the script (the driver) says otherwise.
	if (r == NVML_SUCCESS && s->mismatch)
		r = NVML_ERROR_LIB_RM_VERSION_MISMATCH;
	if (r == NVML_SUCCESS)
		initialized++;
	pthread_mutex_unlock(&mu);
	if (r != NVML_ERROR_UNKNOWN)
		be_slow(s, __func__, -1);
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
	case NVML_ERROR_LIB_RM_VERSION_MISMATCH: return "RM has detected an NVML/RM version mismatch.";
	default: return "Unknown Error";
	}
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
	FRESH_SLOW(s)
	if (!version || strlen(s->driver) + 1 > length)
		return NVML_ERROR_INSUFFICIENT_SIZE;
	strcpy(version, s->driver);
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
	FRESH_SLOW(s)
	if (!count)
		return NVML_ERROR_INVALID_ARGUMENT;
	*count = (unsigned int)s->ngpus;
	return NVML_SUCCESS;
}

// nvml.h: "NVML_ERROR_GPU_IS_LOST if the target GPU has fallen off the bus
// or is otherwise inaccessible" (the handle of a GPU lost before Init).
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
	FRESH(s)
	if (!device || index >= MAX_GPUS)
		return NVML_ERROR_INVALID_ARGUMENT;
	be_slow(s, __func__, (int)index);
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
	if (is_mig(device))
		return mig_uuid(device, uuid, length); // MIG (issue 28 item 3)
	WITH_DEVICE(s, g, device)
	if (!uuid || strlen(g->uuid) + 1 > length)
		return NVML_ERROR_INSUFFICIENT_SIZE;
	strcpy(uuid, g->uuid);
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
	if (is_mig(device))
		return mig_name(device, name, length); // MIG (issue 28 item 3)
	WITH_DEVICE(s, g, device)
	if (!name || strlen(g->name) + 1 > length)
		return NVML_ERROR_INSUFFICIENT_SIZE;
	strcpy(name, g->name);
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
	if (is_mig(device))
		return mig_memory(device, memory); // MIG (issue 28 item 3)
	WITH_DEVICE(s, g, device)
	unsigned long long used = g->mem_used;
	if (!g->mem_used_set) // the processes' memory, as on a GPU without reserved memory
		for (int i = 0; i < s->nprocs; i++)
			if (s->procs[i].gpu == g->index && s->procs[i].memory != NVML_VALUE_NOT_AVAILABLE)
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
		infos[*count].usedGpuMemory = s->procs[i].memory; // NVML_VALUE_NOT_AVAILABLE for memory=na
		infos[*count].gpuInstanceId = 0xFFFFFFFF;
		infos[*count].computeInstanceId = 0xFFFFFFFF;
		(*count)++;
	}
	return NVML_SUCCESS;
}

// ---- Fake GPU work (issue 30 item 7) -------------------------------------
// A work=1 process is busy on its GPU for the time it ran or waited to run
// on a CPU (/proc/<pid>/task/*/schedstat: "time spent on the cpu" plus
// "time spent waiting on a runqueue", in ns), as a kernel stream with work
// queued keeps a GPU busy however little CPU its host process gets; a
// frozen or stopped process neither runs nor waits, so it gets 0. Each
// GPU is sampled at most every TICK_US, at a call that finds the previous
// sample that old (NVML samples continuously; the double samples when
// asked, covering the whole time since its previous sample). Several busy
// processes share the GPU's 100 % in proportion to their demand, as a GPU
// time-slices between contexts: the sum per GPU never exceeds 100.
#define TICK_US 100000ULL
#define MAX_WORK 64
#define HIST 256

struct worker {
	unsigned int pid;
	unsigned long long busy_ns;
};

static struct {
	unsigned long long tick_ns; // CLOCK_MONOTONIC of the last sample; 0: none yet
	int nw;
	struct worker w[MAX_WORK];
	unsigned int util; // the GPU's utilization at the last sample
	int nhist, head;   // ring of the samples taken
	nvmlProcessUtilizationSample_t hist[HIST];
} work[MAX_GPUS];

static unsigned long long clock_ns(clockid_t c) {
	struct timespec t;
	clock_gettime(c, &t);
	return (unsigned long long)t.tv_sec * 1000000000ULL + (unsigned long long)t.tv_nsec;
}

// busy_ns is the time pid's threads ran or waited to run; 0 when it is
// gone (or unreadable).
static unsigned long long busy_ns(unsigned int pid) {
	char dir[64], path[128];
	unsigned long long sum = 0, run, wait;
	snprintf(dir, sizeof(dir), "/proc/%u/task", pid);
	DIR *d = opendir(dir);
	if (!d)
		return 0;
	for (struct dirent *e; (e = readdir(d)) != NULL;) {
		if (e->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "%s/%.16s/schedstat", dir, e->d_name);
		FILE *f = fopen(path, "re");
		if (!f)
			continue;
		if (fscanf(f, "%llu %llu", &run, &wait) == 2)
			sum += run + wait;
		fclose(f);
	}
	closedir(d);
	return sum;
}

// listed reports whether pid is work=1 on GPU g in the script: the
// samples of a process the script no longer lists are forgotten, as
// scripted samples are (the script is the driver).
static int listed(struct script *s, struct gpu *g, unsigned int pid) {
	for (int i = 0; i < s->nprocs; i++)
		if (s->procs[i].gpu == g->index && s->procs[i].work && s->procs[i].pid == pid)
			return 1;
	return 0;
}

// sample_work takes GPU g's work sample if the last is TICK_US old; the
// caller holds mu.
static void sample_work(struct script *s, struct gpu *g) {
	if (g->index < 0 || g->index >= MAX_GPUS)
		return;
	typeof(work[0]) *st = &work[g->index];
	unsigned long long now = clock_ns(CLOCK_MONOTONIC);
	if (st->tick_ns && now - st->tick_ns < TICK_US * 1000)
		return;
	unsigned long long elapsed = st->tick_ns ? now - st->tick_ns : 0;
	struct worker next[MAX_WORK];
	double demand[MAX_WORK], sum = 0;
	int nn = 0;
	for (int i = 0; i < s->nprocs && nn < MAX_WORK; i++) {
		struct proc *p = &s->procs[i];
		if (p->gpu != g->index || !p->work)
			continue;
		unsigned long long b = busy_ns(p->pid);
		demand[nn] = -1; // first seen: its baseline only
		for (int k = 0; k < st->nw && elapsed; k++) {
			if (st->w[k].pid != p->pid)
				continue;
			double d = b > st->w[k].busy_ns ? (double)(b - st->w[k].busy_ns) / (double)elapsed : 0;
			// At most 100 %: several threads are still one context, and
			// Linux 6.18 sometimes charges a task its whole frozen time as
			// time waiting to run at its first run after a thaw.
			demand[nn] = d > 1 ? 1 : d;
			sum += demand[nn];
		}
		next[nn++] = (struct worker){.pid = p->pid, .busy_ns = b};
	}
	unsigned long long ts = clock_ns(CLOCK_REALTIME) / 1000;
	double scale = sum > 1 ? 1 / sum : 1;
	st->util = 0;
	for (int k = 0; k < nn; k++) {
		if (demand[k] < 0)
			continue;
		// Rounded down: the shares' sum stays within 100.
		unsigned int sm = (unsigned int)(100 * demand[k] * scale);
		st->util += sm;
		if (sm == 0)
			continue; // no sample of a process that did not run
		st->hist[st->head] = (nvmlProcessUtilizationSample_t){.pid = next[k].pid, .timeStamp = ts, .smUtil = sm};
		st->head = (st->head + 1) % HIST;
		if (st->nhist < HIST)
			st->nhist++;
	}
	memcpy(st->w, next, sizeof(next[0]) * (size_t)nn);
	st->nw = nn;
	st->tick_ns = now;
}

// nvml.h, nvmlDeviceGetProcessUtilization: "Retrieves the current
// utilization and process ID"; lastSeenTimeStamp: "Return only samples
// with timestamp greater than lastSeenTimeStamp" (0: every sample kept);
// timeStamp: "CPU Timestamp in microseconds"; smUtil: "SM (3D/Compute)
// Util Value" (percent); with utilization NULL or processSamplesCount too
// small, NVML_ERROR_INSUFFICIENT_SIZE and the count needed;
// "NVML_ERROR_NOT_FOUND if sample entries are not found". Samples are of
// processes with non-zero utilization in the sample period (what NVML
// returns, as nvml-wrapper documents it): a frozen process has none.
nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t device, nvmlProcessUtilizationSample_t *util,
					     unsigned int *count, unsigned long long lastSeen) {
	WITH_DEVICE(s, g, device)
	if (!count)
		return NVML_ERROR_INVALID_ARGUMENT;
	// nvml.h: "On MIG-enabled GPUs, querying process utilization is not
	// currently supported"; "NVML_ERROR_NOT_SUPPORTED if the device does
	// not support this feature".
	if (g->mig)
		return NVML_ERROR_NOT_SUPPORTED;
	pthread_mutex_lock(&mu);
	sample_work(s, g);
	typeof(work[0]) *st = &work[g->index];
	unsigned int n = 0;
	for (int i = 0; i < s->nsamples; i++)
		if (s->samples[i].gpu == g->index && s->samples[i].ts > lastSeen)
			n++;
	for (int i = 0; i < st->nhist; i++)
		if (st->hist[i].timeStamp > lastSeen && listed(s, g, st->hist[i].pid))
			n++;
	nvmlReturn_t r = NVML_SUCCESS;
	if (n == 0)
		r = NVML_ERROR_NOT_FOUND;
	else if (!util || n > *count) {
		*count = n;
		r = NVML_ERROR_INSUFFICIENT_SIZE;
	}
	if (r != NVML_SUCCESS) {
		pthread_mutex_unlock(&mu);
		return r;
	}
	*count = 0;
	for (int i = 0; i < s->nsamples; i++) {
		struct sample *p = &s->samples[i];
		if (p->gpu != g->index || p->ts <= lastSeen)
			continue;
		util[*count] = (nvmlProcessUtilizationSample_t){.pid = p->pid, .timeStamp = p->ts, .smUtil = p->sm, .memUtil = p->mem};
		(*count)++;
	}
	// Oldest first, as they were taken.
	for (int i = 0; i < st->nhist; i++) {
		int k = (st->head - st->nhist + i + HIST) % HIST;
		if (st->hist[k].timeStamp > lastSeen && listed(s, g, st->hist[k].pid))
			util[(*count)++] = st->hist[k];
	}
	pthread_mutex_unlock(&mu);
	return NVML_SUCCESS;
}

typedef struct {
	unsigned int gpu, memory;
} nvmlUtilization_t;

// nvml.h, nvmlUtilization_t: "gpu: Percent of time over the past sample
// period during which one or more kernels was executing on the GPU;
// memory: Percent of time over the past sample period during which global
// (device) memory was being read or written." nvmlDeviceGetUtilizationRates:
// "On MIG-enabled GPUs, querying device utilization rates is not currently
// supported"; "NVML_ERROR_INVALID_ARGUMENT if device is invalid or
// utilization is NULL; NVML_ERROR_NOT_SUPPORTED if the device does not
// support this feature". The double's gpu is the sum of its processes'
// shares at the last sample (fake work) plus each scripted process's
// newest sample of the last second, at most 100; fake work reads no
// memory (a spin kernel), so memory is the scripted samples' only.
nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization) {
	WITH_DEVICE(s, g, device)
	if (!utilization)
		return NVML_ERROR_INVALID_ARGUMENT;
	if (g->mig)
		return NVML_ERROR_NOT_SUPPORTED;
	pthread_mutex_lock(&mu);
	sample_work(s, g);
	unsigned int gpu = work[g->index].util, mem = 0;
	pthread_mutex_unlock(&mu);
	unsigned long long since = clock_ns(CLOCK_REALTIME) / 1000 - 1000000ULL;
	for (int i = 0; i < s->nsamples; i++) {
		struct sample *p = &s->samples[i];
		int newest = p->gpu == g->index && p->ts > since;
		for (int j = i + 1; j < s->nsamples && newest; j++)
			if (s->samples[j].gpu == p->gpu && s->samples[j].pid == p->pid && s->samples[j].ts >= p->ts)
				newest = 0;
		if (newest) {
			gpu += p->sm;
			mem += p->mem;
		}
	}
	*utilization = (nvmlUtilization_t){.gpu = gpu > 100 ? 100 : gpu, .memory = mem > 100 ? 100 : mem};
	return NVML_SUCCESS;
}
// ---- end of fake GPU work -----------------------------------------------

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

// wait_error is the script's eventerr that fails this wait, counted; the
// caller holds mu.
static struct eventerr *wait_error(struct script *s) {
	// A count whose record the script dropped (ClearFaults, a new double)
	// frees its slot: a long-lived process meets many records.
	for (int j = 0; j < MAX_ERRS; j++) {
		int listed = 0;
		for (int i = 0; i < s->nerrs && !listed; i++)
			listed = consumed[j].id == s->errs[i].id;
		if (consumed[j].valid && !listed)
			consumed[j].valid = consumed[j].used = 0;
	}
	for (int i = 0; i < s->nerrs; i++) {
		struct eventerr *e = &s->errs[i];
		int slot = -1;
		for (int j = 0; j < MAX_ERRS && slot < 0; j++)
			if (consumed[j].valid && consumed[j].id == e->id)
				slot = j;
		for (int j = 0; j < MAX_ERRS && slot < 0; j++)
			if (!consumed[j].valid) {
				consumed[j].valid = 1;
				consumed[j].id = e->id;
				slot = j;
			}
		if (slot < 0 || consumed[slot].used >= e->count)
			continue;
		consumed[slot].used++;
		return e;
	}
	return NULL;
}

static void close_fd(int *fd) {
	if (*fd >= 0)
		close(*fd);
}

// watch_script returns an inotify descriptor that becomes readable when
// the script is replaced or rewritten (-1 when it cannot: the wait then
// polls). Real NVML's wait blocks in the driver and costs nothing while no
// event comes; a double that re-read its script every 20 ms put that cost
// on gpud (half of a compute-sharing gpud's CPU, issue 30).
static int watch_script(void) {
	char path[PATH_MAX];
	pthread_mutex_lock(&mu);
	int r = script_path(path, sizeof(path));
	pthread_mutex_unlock(&mu);
	char *slash = strrchr(path, '/');
	if (r != 0 || !slash)
		return -1;
	*slash = 0;
	int fd = inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
	if (fd < 0)
		return -1;
	if (inotify_add_watch(fd, path, IN_MOVED_TO | IN_CLOSE_WRITE | IN_CREATE | IN_DELETE | IN_MODIFY) < 0) {
		close(fd);
		return -1;
	}
	return fd;
}

nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms) {
	struct script *s __attribute__((cleanup(free_script))) = malloc(sizeof(struct script));
	struct timespec start, now, pause = {0, 20 * 1000 * 1000};
	if (!s)
		return NVML_ERROR_UNKNOWN;
	if (set < sets || set >= sets + MAX_SETS || !set->used || !data)
		return NVML_ERROR_INVALID_ARGUMENT;
	clock_gettime(CLOCK_MONOTONIC, &start);
	// Watched before the first read, so a change after it is not missed.
	int watch __attribute__((cleanup(close_fd))) = watch_script();
	for (int first = 1;; first = 0) {
		pthread_mutex_lock(&mu);
		nvmlReturn_t r = initialized ? load(s) : NVML_ERROR_UNINITIALIZED;
		if (r != NVML_SUCCESS) {
			pthread_mutex_unlock(&mu);
			return r;
		}
		if (first) {
			// nvml.h: "NVML_ERROR_TIMEOUT if no event arrived in
			// specified timeout or interrupt arrived", "NVML_ERROR_GPU_IS_LOST
			// if a GPU has fallen off the bus or is otherwise
			// inaccessible", "NVML_ERROR_UNKNOWN on any unexpected error".
			struct eventerr *e = wait_error(s);
			if (e) {
				*data = (nvmlEventData_t){.gpuInstanceId = 0xFFFFFFFF, .computeInstanceId = 0xFFFFFFFF};
				if (e->gpu >= 0 && e->gpu < MAX_GPUS) {
					handles[e->gpu].slot = e->gpu;
					data->device = &handles[e->gpu];
				}
				r = e->code;
				pthread_mutex_unlock(&mu);
				be_slow(s, __func__, -1);
				return r;
			}
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
		if (watch < 0) {
			nanosleep(&pause, NULL);
			continue;
		}
		struct pollfd p = {.fd = watch, .events = POLLIN};
		long long left = (long long)timeoutms - ms;
		if (poll(&p, 1, left > 1000 ? 1000 : (int)left) > 0) {
			char buf[4096];
			while (read(watch, buf, sizeof(buf)) > 0)
				;
		}
	}
}

// ---- Topology calls (issue 30 item 1) -------------------------------------
typedef int nvmlEnableState_t; // NVML_FEATURE_DISABLED = 0, NVML_FEATURE_ENABLED = 1

typedef struct {
	char busIdLegacy[16]; // NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE
	unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
	char busId[32]; // NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE
} nvmlPciInfo_t;

// fill_pci fills a PciInfo as NVML does: busId "%08X:%02X:%02X.0"
// (NVML_DEVICE_PCI_BUS_ID_FMT), busIdLegacy "%04X:%02X:%02X.0", the
// device and vendor ids of an H100 (0x2330, 0x10de).
static void fill_pci(nvmlPciInfo_t *pci, unsigned int domain, unsigned int bus, unsigned int dev) {
	memset(pci, 0, sizeof(*pci));
	pci->domain = domain;
	pci->bus = bus;
	pci->device = dev;
	pci->pciDeviceId = 0x233010deU;
	snprintf(pci->busIdLegacy, sizeof(pci->busIdLegacy), "%04X:%02X:%02X.0", domain & 0xffff, bus, dev);
	snprintf(pci->busId, sizeof(pci->busId), "%08X:%02X:%02X.0", domain, bus, dev);
}

static nvmlReturn_t pci_info(nvmlDevice_t device, nvmlPciInfo_t *pci) {
	WITH_DEVICE(s, g, device)
	if (!pci)
		return NVML_ERROR_INVALID_ARGUMENT;
	fill_pci(pci, g->pci_domain, g->pci_bus, g->pci_dev);
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci) { return pci_info(device, pci); }
nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t device, nvmlPciInfo_t *pci) { return pci_info(device, pci); }
nvmlReturn_t nvmlDeviceGetPciInfo(nvmlDevice_t device, nvmlPciInfo_t *pci) { return pci_info(device, pci); }

// link_of finds the record of GPU g's link; NULL when it is down. Its
// answer is nvml.h's: NOT_SUPPORTED on a GPU without NVLink ("the device
// doesn't support this feature"), INVALID_ARGUMENT for a link it does not
// have ("device or link is invalid").
static nvmlReturn_t link_of(struct script *s, struct gpu *g, unsigned int link, struct nvlink **out) {
	*out = NULL;
	if (g->nvlinks == 0)
		return NVML_ERROR_NOT_SUPPORTED;
	if (link >= (unsigned int)g->nvlinks)
		return NVML_ERROR_INVALID_ARGUMENT;
	for (int i = 0; i < s->nlinks; i++)
		if (s->links[i].gpu == g->index && s->links[i].link == (int)link && s->links[i].active)
			*out = &s->links[i];
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link, nvmlEnableState_t *isActive) {
	WITH_DEVICE(s, g, device)
	if (!isActive)
		return NVML_ERROR_INVALID_ARGUMENT;
	struct nvlink *l;
	nvmlReturn_t ret = link_of(s, g, link, &l);
	if (ret != NVML_SUCCESS)
		return ret;
	*isActive = l != NULL;
	return NVML_SUCCESS;
}

// The remote end of a link that is down: nvml.h does not say; the double
// answers NVML_ERROR_NOT_SUPPORTED (gpud asks only active links).
nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t device, unsigned int link, nvmlPciInfo_t *pci) {
	WITH_DEVICE(s, g, device)
	if (!pci)
		return NVML_ERROR_INVALID_ARGUMENT;
	struct nvlink *l;
	nvmlReturn_t ret = link_of(s, g, link, &l);
	if (ret != NVML_SUCCESS)
		return ret;
	if (!l)
		return NVML_ERROR_NOT_SUPPORTED;
	fill_pci(pci, l->domain, l->bus, l->dev);
	return NVML_SUCCESS;
}
