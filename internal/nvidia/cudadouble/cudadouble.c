// A test double of NVIDIA's libcuda.so.1: the CUDA checkpoint driver API
// gpud calls (cuInit, cuDriverGetVersion, cuCheckpointProcess{Lock,
// Checkpoint,Restore,Unlock,GetState}). Built by the tests
// (internal/testutil.BuildCUDADouble): gcc -shared -fPIC.
//
// The script is "cuda-double.txt" in the library's own directory, re-read
// at every call. One record a line:
//
//	driver version=12080          (cuDriverGetVersion; below 12080: no checkpoint API)
//	pid pid=123 lock=ok|timeout|hang|fail checkpoint=ok|fail restore=ok|fail
//
// A process not named is not a CUDA process (CUDA_ERROR_INVALID_VALUE).
// Each process's state (running, locked, checkpointed, failed) is kept
// in memory: lock needs running, checkpoint locked, restore checkpointed,
// unlock locked; a scripted checkpoint or restore failure leaves the
// process FAILED, as the driver can. lock=hang never returns (an NCCL job).
#define _GNU_SOURCE
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef int CUresult;
enum {
	CUDA_SUCCESS = 0,
	CUDA_ERROR_INVALID_VALUE = 1,
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
	*state = st ? *st : FAILED;
	pthread_mutex_unlock(&mu);
	return CUDA_SUCCESS;
}
