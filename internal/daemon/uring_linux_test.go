package daemon_test

import (
	"fmt"
	"runtime"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// legacyOpen is open(2) itself, not openat: x86-64 still has it.
func legacyOpen(path string) (int, error) {
	if runtime.GOARCH != "amd64" {
		return -1, fmt.Errorf("no open(2) syscall on %s", runtime.GOARCH)
	}
	p, err := unix.BytePtrFromString(path)
	if err != nil {
		return -1, err
	}
	const sysOpen = 2 // __NR_open on x86-64
	fd, _, errno := unix.Syscall(sysOpen, uintptr(unsafe.Pointer(p)), unix.O_RDWR, 0)
	runtime.KeepAlive(p)
	if errno != 0 {
		return -1, errno
	}
	return int(fd), nil
}

// The io_uring ABI (linux/io_uring.h), as much as one IORING_OP_OPENAT
// needs: no liburing on the test machines, so the ring is set up by hand.
type uringSQOffsets struct {
	Head, Tail, RingMask, RingEntries, Flags, Dropped, Array, Resv1 uint32
	UserAddr                                                        uint64
}

type uringCQOffsets struct {
	Head, Tail, RingMask, RingEntries, Overflow, Cqes, Flags, Resv1 uint32
	UserAddr                                                        uint64
}

type uringParams struct {
	SQEntries, CQEntries, Flags, SQThreadCPU, SQThreadIdle, Features, WQFd uint32
	Resv                                                                   [3]uint32
	SQOff                                                                  uringSQOffsets
	CQOff                                                                  uringCQOffsets
}

const (
	sysIOUringSetup  = 425
	sysIOUringEnter  = 426
	ioringOffSQRing  = 0
	ioringOffCQRing  = 0x8000000
	ioringOffSQEs    = 0x10000000
	ioringOpOpenat   = 18
	ioringEnterGetev = 1
)

// uringOpen opens path O_RDWR through an io_uring (the open runs in the
// kernel's io_uring code, not in an open syscall); the ring is closed
// afterwards, the new fd kept.
func uringOpen(path string) (int, error) {
	var p uringParams
	rfd, _, errno := unix.Syscall(sysIOUringSetup, 4, uintptr(unsafe.Pointer(&p)), 0)
	if errno != 0 {
		return -1, fmt.Errorf("io_uring_setup: %w", errno)
	}
	ring := int(rfd)
	defer unix.Close(ring)
	sq, err := unix.Mmap(ring, ioringOffSQRing, int(p.SQOff.Array+p.SQEntries*4), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return -1, fmt.Errorf("mapping the submission ring: %w", err)
	}
	defer unix.Munmap(sq)
	cq, err := unix.Mmap(ring, ioringOffCQRing, int(p.CQOff.Cqes+p.CQEntries*16), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return -1, fmt.Errorf("mapping the completion ring: %w", err)
	}
	defer unix.Munmap(cq)
	sqes, err := unix.Mmap(ring, ioringOffSQEs, int(p.SQEntries*64), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return -1, fmt.Errorf("mapping the submission entries: %w", err)
	}
	defer unix.Munmap(sqes)
	name, err := unix.BytePtrFromString(path)
	if err != nil {
		return -1, err
	}
	u32 := func(b []byte, off uint32) *uint32 { return (*uint32)(unsafe.Pointer(&b[off])) }
	tail := atomic.LoadUint32(u32(sq, p.SQOff.Tail))
	idx := tail & atomic.LoadUint32(u32(sq, p.SQOff.RingMask))
	sqe := sqes[idx*64 : idx*64+64]
	clear(sqe)
	sqe[0] = ioringOpOpenat
	*(*int32)(unsafe.Pointer(&sqe[4])) = unix.AT_FDCWD
	*(*uint64)(unsafe.Pointer(&sqe[16])) = uint64(uintptr(unsafe.Pointer(name)))
	*(*uint32)(unsafe.Pointer(&sqe[28])) = unix.O_RDWR
	*(*uint64)(unsafe.Pointer(&sqe[32])) = 42 // user_data
	*u32(sq, p.SQOff.Array+idx*4) = idx
	atomic.StoreUint32(u32(sq, p.SQOff.Tail), tail+1)
	_, _, errno = unix.Syscall6(sysIOUringEnter, uintptr(ring), 1, 1, ioringEnterGetev, 0, 0)
	runtime.KeepAlive(name)
	if errno != 0 {
		return -1, fmt.Errorf("io_uring_enter: %w", errno)
	}
	head := atomic.LoadUint32(u32(cq, p.CQOff.Head))
	if head == atomic.LoadUint32(u32(cq, p.CQOff.Tail)) {
		return -1, fmt.Errorf("io_uring: no completion")
	}
	cqe := cq[p.CQOff.Cqes+(head&atomic.LoadUint32(u32(cq, p.CQOff.RingMask)))*16:]
	res := *(*int32)(unsafe.Pointer(&cqe[8]))
	atomic.StoreUint32(u32(cq, p.CQOff.Head), head+1)
	if res < 0 {
		return -1, fmt.Errorf("io_uring openat: %w", unix.Errno(-res))
	}
	return int(res), nil
}
