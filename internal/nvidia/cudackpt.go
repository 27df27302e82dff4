//go:build cgo

package nvidia

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

typedef int (*ckpt_init_t)(unsigned int);
typedef int (*ckpt_version_t)(int *);
typedef int (*ckpt_pid_t)(int, void *);
typedef int (*ckpt_state_t)(int, int *);

typedef struct {
	unsigned int timeoutMs;
	unsigned int reserved0;
	unsigned long long reserved1[7];
} ckpt_lock_args;

static int ckpt_call_init(void *f) { return ((ckpt_init_t)f)(0); }
static int ckpt_call_version(void *f, int *v) { return ((ckpt_version_t)f)(v); }
static int ckpt_call_lock(void *f, int pid, unsigned int ms) {
	ckpt_lock_args a;
	memset(&a, 0, sizeof a);
	a.timeoutMs = ms;
	return ((ckpt_pid_t)f)(pid, &a);
}
static int ckpt_call_pid(void *f, int pid) { return ((ckpt_pid_t)f)(pid, NULL); }
static int ckpt_call_state(void *f, int pid, int *s) { return ((ckpt_state_t)f)(pid, s); }
*/
import "C"

import (
	"errors"
	"fmt"
	"time"
	"unsafe"
)

// MinCheckpointDriver is the CUDA driver version (cuDriverGetVersion) from
// which the checkpoint API has the lock with a timeout (driver 570, CUDA 12.8).
const MinCheckpointDriver = 12080

var (
	// ErrNoCheckpoint: the driver has no CUDA checkpoint API.
	ErrNoCheckpoint = errors.New("nvidia: no CUDA checkpoint API in this driver")
	// ErrLockHung: the lock did not return within its timeout and a
	// margin (a multi-process or NCCL job): the call is abandoned.
	ErrLockHung = errors.New("nvidia: cuCheckpointProcessLock did not return")
)

// CUDAError is a CUresult other than CUDA_SUCCESS.
type CUDAError struct {
	Call string
	Code int
}

func (e *CUDAError) Error() string { return fmt.Sprintf("nvidia: %s: CUresult %d", e.Call, e.Code) }

// Timeout reports whether the driver said CUDA_ERROR_TIMEOUT.
func (e *CUDAError) Timeout() bool { return e.Code == 909 }

// CUDACheckpoint is libcuda's checkpoint API, dlopened.
type CUDACheckpoint struct {
	Driver                                   int // cuDriverGetVersion
	lock, checkpoint, restore, unlock, state unsafe.Pointer
}

// OpenCUDACheckpoint dlopens libcuda (path; "" is libcuda.so.1 by the
// dynamic loader's search), initialises it and finds the checkpoint API.
// The error says why it is unusable: no library, an old driver, or
// missing symbols (ErrNoCheckpoint).
func OpenCUDACheckpoint(path string) (*CUDACheckpoint, error) {
	if path == "" {
		path = "libcuda.so.1"
	}
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	h := C.dlopen(cpath, C.RTLD_NOW|C.RTLD_LOCAL)
	if h == nil {
		return nil, fmt.Errorf("nvidia: loading %s: %s", path, C.GoString(C.dlerror()))
	}
	sym := func(name string) unsafe.Pointer {
		cs := C.CString(name)
		defer C.free(unsafe.Pointer(cs))
		return C.dlsym(h, cs)
	}
	initF, versionF := sym("cuInit"), sym("cuDriverGetVersion")
	if initF == nil || versionF == nil {
		return nil, fmt.Errorf("nvidia: %s is not libcuda (no cuInit/cuDriverGetVersion)", path)
	}
	if r := C.ckpt_call_init(initF); r != 0 {
		return nil, &CUDAError{"cuInit", int(r)}
	}
	var v C.int
	if r := C.ckpt_call_version(versionF, &v); r != 0 {
		return nil, &CUDAError{"cuDriverGetVersion", int(r)}
	}
	c := &CUDACheckpoint{Driver: int(v), lock: sym("cuCheckpointProcessLock"), checkpoint: sym("cuCheckpointProcessCheckpoint"),
		restore: sym("cuCheckpointProcessRestore"), unlock: sym("cuCheckpointProcessUnlock"), state: sym("cuCheckpointProcessGetState")}
	if c.Driver < MinCheckpointDriver {
		return nil, fmt.Errorf("%w: driver API version %d, want %d (driver 570) or later", ErrNoCheckpoint, c.Driver, MinCheckpointDriver)
	}
	if c.lock == nil || c.checkpoint == nil || c.restore == nil || c.unlock == nil || c.state == nil {
		return nil, fmt.Errorf("%w: cuCheckpointProcess* symbols missing (driver API version %d)", ErrNoCheckpoint, c.Driver)
	}
	return c, nil
}

// State reports pid's CUDA checkpoint state.
func (c *CUDACheckpoint) State(pid int) (string, error) {
	var s C.int
	if r := C.ckpt_call_state(c.state, C.int(pid), &s); r != 0 {
		return "", &CUDAError{"cuCheckpointProcessGetState", int(r)}
	}
	switch s {
	case 0:
		return CUDARunning, nil
	case 1:
		return CUDALocked, nil
	case 2:
		return CUDACheckpointed, nil
	}
	return CUDAFailed, nil
}

// lockMargin is how long past its own timeout a lock may take before it
// is taken for hung.
const lockMargin = 2 * time.Second

// Suspend locks pid's CUDA work (bounded by timeout, and by timeout +
// lockMargin on gpud's side: a lock that never returns is abandoned,
// ErrLockHung) and checkpoints its device memory to host memory, which
// releases the GPU. A failed checkpoint is unlocked again where the
// process is still locked; the error says the state it was left in.
func (c *CUDACheckpoint) Suspend(pid int, timeout time.Duration) error {
	ms := C.uint(max(1, timeout.Milliseconds()))
	done := make(chan C.int, 1)
	go func() { done <- C.ckpt_call_lock(c.lock, C.int(pid), ms) }()
	select {
	case r := <-done:
		if r != 0 {
			return &CUDAError{"cuCheckpointProcessLock", int(r)}
		}
	case <-time.After(timeout + lockMargin):
		return fmt.Errorf("%w within %s", ErrLockHung, timeout+lockMargin)
	}
	if r := C.ckpt_call_pid(c.checkpoint, C.int(pid)); r != 0 {
		err := error(&CUDAError{"cuCheckpointProcessCheckpoint", int(r)})
		if st, serr := c.State(pid); serr == nil && st == CUDALocked {
			if ur := C.ckpt_call_pid(c.unlock, C.int(pid)); ur != 0 {
				err = errors.Join(err, &CUDAError{"cuCheckpointProcessUnlock", int(ur)})
			}
		} else if serr == nil {
			err = fmt.Errorf("%w (process left %s)", err, st)
		}
		return err
	}
	return nil
}

// Resume restores pid's device memory and unlocks it.
func (c *CUDACheckpoint) Resume(pid int) error {
	if r := C.ckpt_call_pid(c.restore, C.int(pid)); r != 0 {
		err := error(&CUDAError{"cuCheckpointProcessRestore", int(r)})
		if st, serr := c.State(pid); serr == nil {
			err = fmt.Errorf("%w (process left %s)", err, st)
		}
		return err
	}
	if r := C.ckpt_call_pid(c.unlock, C.int(pid)); r != 0 {
		return &CUDAError{"cuCheckpointProcessUnlock", int(r)}
	}
	return nil
}
