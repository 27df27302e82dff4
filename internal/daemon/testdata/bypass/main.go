// Command gpud-bypass tries to open a (fake) GPU device node the ways a
// low-priority container might try to get past gpud's gate: plain open,
// openat2 with RESOLVE_* flags, io_uring IORING_OP_OPENAT (inline, forced
// to an io-wq worker, into a fixed-file slot), pidfd_getfd of another
// process's fd, and a reopen of an O_PATH fd through /proc/self/fd. The
// bypass tests build it with CGO_ENABLED=0 and mount it into a busybox
// container, which has no libc.
//
// Usage: gpud-bypass METHOD ARGS... [hold]
//
//	open PATH
//	openat2 DIR PATH FLAG[,FLAG...]   (FLAG: NO_XDEV NO_MAGICLINKS NO_SYMLINKS BENEATH IN_ROOT CACHED, or none)
//	uring PATH [async] [direct]
//	getfd PID FD
//	opath PATH                        (O_PATH open, then open /proc/self/fd/N read-write)
//	opathhold PATH                    (O_PATH open only, held)
//	recvfd SOCK recvmsg|recvmmsg      (listen on the unix socket SOCK, take one fd passed by SCM_RIGHTS)
//
// It prints "ok FD PID" or "err ERRNO" (e.g. "err EPERM"), and with "hold" as
// the last argument keeps what it opened until killed.
package main

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

func main() {
	args := os.Args[1:]
	hold := len(args) > 0 && args[len(args)-1] == "hold"
	if hold {
		args = args[:len(args)-1]
	}
	if len(args) == 0 {
		fmt.Fprintln(os.Stderr, "usage: gpud-bypass METHOD ARGS... [hold]")
		os.Exit(2)
	}
	fd, err := run(args)
	if err != nil {
		var errno unix.Errno
		if errors.As(err, &errno) {
			fmt.Println("err", unix.ErrnoName(errno))
		} else {
			fmt.Println("err", err)
		}
		os.Exit(1)
	}
	fmt.Println("ok", fd, os.Getpid())
	if hold {
		for {
			time.Sleep(time.Hour)
		}
	}
}

func run(args []string) (int, error) {
	switch args[0] {
	case "open":
		return unix.Open(args[1], unix.O_RDWR, 0)
	case "openat2":
		return openat2(args[1], args[2], args[3])
	case "uring":
		return uringOpen(args[1], has(args[2:], "async"), has(args[2:], "direct"))
	case "getfd":
		pid, _ := strconv.Atoi(args[1])
		fd, _ := strconv.Atoi(args[2])
		pidfd, err := unix.PidfdOpen(pid, 0)
		if err != nil {
			return -1, fmt.Errorf("pidfd_open: %w", err)
		}
		return unix.PidfdGetfd(pidfd, fd, 0)
	case "opath":
		p, err := unix.Open(args[1], unix.O_PATH, 0)
		if err != nil {
			return -1, fmt.Errorf("O_PATH: %w", err)
		}
		return unix.Open(fmt.Sprintf("/proc/self/fd/%d", p), unix.O_RDWR, 0)
	case "opathhold":
		return unix.Open(args[1], unix.O_PATH, 0)
	case "recvfd":
		return recvFD(args[1], args[2] == "recvmmsg")
	}
	return -1, fmt.Errorf("unknown method %q", args[0])
}

func has(args []string, w string) bool {
	for _, a := range args {
		if a == w {
			return true
		}
	}
	return false
}

var resolveFlags = map[string]uint64{
	"NO_XDEV": unix.RESOLVE_NO_XDEV, "NO_MAGICLINKS": unix.RESOLVE_NO_MAGICLINKS,
	"NO_SYMLINKS": unix.RESOLVE_NO_SYMLINKS, "BENEATH": unix.RESOLVE_BENEATH,
	"IN_ROOT": unix.RESOLVE_IN_ROOT, "CACHED": resolveCached,
}

func openat2(dir, path, flags string) (int, error) {
	how := unix.OpenHow{Flags: unix.O_RDWR}
	for _, f := range strings.Split(flags, ",") {
		if f == "none" || f == "" {
			continue
		}
		v, ok := resolveFlags[f]
		if !ok {
			return -1, fmt.Errorf("unknown RESOLVE flag %q", f)
		}
		how.Resolve |= v
	}
	dirfd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return -1, fmt.Errorf("opening %s: %w", dir, err)
	}
	for i := 0; ; i++ {
		fd, err := unix.Openat2(dirfd, path, &how)
		// RESOLVE_CACHED answers EAGAIN until the lookup is in the dcache;
		// the first try puts it there.
		if err == unix.EAGAIN && how.Resolve&resolveCached != 0 && i < 3 {
			continue
		}
		return fd, err
	}
}

// --- io_uring by raw system calls (no liburing in a static Go binary) ---

type sqringOffsets struct {
	Head, Tail, RingMask, RingEntries, Flags, Dropped, Array, Resv1 uint32
	UserAddr                                                        uint64
}

type cqringOffsets struct {
	Head, Tail, RingMask, RingEntries, Overflow, Cqes, Flags, Resv1 uint32
	UserAddr                                                        uint64
}

type uringParams struct {
	SqEntries, CqEntries, Flags, SqThreadCPU, SqThreadIdle, Features, WqFd uint32
	Resv                                                                   [3]uint32
	SqOff                                                                  sqringOffsets
	CqOff                                                                  cqringOffsets
}

type sqe struct {
	Opcode      uint8
	Flags       uint8
	Ioprio      uint16
	Fd          int32
	Off         uint64
	Addr        uint64
	Len         uint32
	OpenFlags   uint32
	UserData    uint64
	BufIndex    uint16
	Personality uint16
	FileIndex   uint32
	Addr3       uint64
	Pad         uint64
}

type cqe struct {
	UserData uint64
	Res      int32
	Flags    uint32
}

type rsrcRegister struct {
	Nr    uint32
	Flags uint32
	Resv2 uint64
	Data  uint64
	Tags  uint64
}

const (
	ioringOpOpenat        = 18
	resolveCached         = 0x20 // RESOLVE_CACHED (Linux 5.12), not in x/sys/unix
	iosqeAsync            = 1 << 4
	ioringEnterGetevents  = 1
	ioringOffSqRing       = 0
	ioringOffCqRing       = 0x8000000
	ioringOffSqes         = 0x10000000
	ioringRegisterFiles2  = 13
	ioringRsrcRegSparse   = 1
	ioringFeatSingleMmap  = 1
	atFdcwd               = -100
	directSlot            = 0
	directFileIndexOffset = 1 // file_index is slot + 1
)

// uringOpen opens path read-write through IORING_OP_OPENAT: inline in this
// task, or with async forced to an io-wq worker thread, and with direct
// into slot 0 of the ring's fixed-file table (no fd in the process's fd
// table at all; it prints the ring's fd then).
func uringOpen(path string, async, direct bool) (int, error) {
	var p uringParams
	r, _, e := unix.Syscall(unix.SYS_IO_URING_SETUP, 4, uintptr(unsafe.Pointer(&p)), 0)
	if e != 0 {
		return -1, fmt.Errorf("io_uring_setup: %w", e)
	}
	ring := int(r)
	sqSize := int(p.SqOff.Array + p.SqEntries*4)
	cqSize := int(p.CqOff.Cqes + p.CqEntries*uint32(unsafe.Sizeof(cqe{})))
	if p.Features&ioringFeatSingleMmap != 0 && cqSize > sqSize {
		sqSize = cqSize
	}
	sq, err := unix.Mmap(ring, ioringOffSqRing, sqSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return -1, fmt.Errorf("mmap sq ring: %w", err)
	}
	cq := sq
	if p.Features&ioringFeatSingleMmap == 0 {
		if cq, err = unix.Mmap(ring, ioringOffCqRing, cqSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE); err != nil {
			return -1, fmt.Errorf("mmap cq ring: %w", err)
		}
	}
	sqes, err := unix.Mmap(ring, ioringOffSqes, int(p.SqEntries)*int(unsafe.Sizeof(sqe{})), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return -1, fmt.Errorf("mmap sqes: %w", err)
	}
	if direct {
		reg := rsrcRegister{Nr: 1, Flags: ioringRsrcRegSparse}
		if _, _, e := unix.Syscall6(unix.SYS_IO_URING_REGISTER, uintptr(ring), ioringRegisterFiles2,
			uintptr(unsafe.Pointer(&reg)), unsafe.Sizeof(reg), 0, 0); e != 0 {
			return -1, fmt.Errorf("io_uring_register files: %w", e)
		}
	}
	cpath, err := unix.BytePtrFromString(path)
	if err != nil {
		return -1, err
	}
	s := (*sqe)(unsafe.Pointer(&sqes[0]))
	*s = sqe{Opcode: ioringOpOpenat, Fd: atFdcwd, Addr: uint64(uintptr(unsafe.Pointer(cpath))),
		OpenFlags: unix.O_RDWR, UserData: 42}
	if async {
		s.Flags |= iosqeAsync
	}
	if direct {
		s.FileIndex = directSlot + directFileIndexOffset
	}
	mask := *(*uint32)(unsafe.Pointer(&sq[p.SqOff.RingMask]))
	tail := (*uint32)(unsafe.Pointer(&sq[p.SqOff.Tail]))
	array := unsafe.Pointer(&sq[p.SqOff.Array])
	t := atomic.LoadUint32(tail)
	*(*uint32)(unsafe.Add(array, 4*(t&mask))) = 0
	atomic.StoreUint32(tail, t+1)
	_, _, e = unix.Syscall6(unix.SYS_IO_URING_ENTER, uintptr(ring), 1, 1, ioringEnterGetevents, 0, 0)
	runtime.KeepAlive(cpath)
	if e != 0 {
		return -1, fmt.Errorf("io_uring_enter: %w", e)
	}
	head := (*uint32)(unsafe.Pointer(&cq[p.CqOff.Head]))
	cmask := *(*uint32)(unsafe.Pointer(&cq[p.CqOff.RingMask]))
	h := atomic.LoadUint32(head)
	c := (*cqe)(unsafe.Pointer(&cq[p.CqOff.Cqes+(h&cmask)*uint32(unsafe.Sizeof(cqe{}))]))
	res := c.Res
	atomic.StoreUint32(head, h+1)
	if res < 0 {
		return -1, unix.Errno(-res)
	}
	if direct {
		return ring, nil // the GPU is in the ring's slot 0, not in the fd table
	}
	return int(res), nil
}

// recvFD listens on a unix socket at path, accepts one connection and
// receives one fd passed over it, with recvmsg or recvmmsg.
func recvFD(path string, mmsg bool) (int, error) {
	l, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM, 0)
	if err != nil {
		return -1, fmt.Errorf("socket: %w", err)
	}
	if err := unix.Bind(l, &unix.SockaddrUnix{Name: path}); err != nil {
		return -1, fmt.Errorf("bind %s: %w", path, err)
	}
	if err := unix.Listen(l, 1); err != nil {
		return -1, fmt.Errorf("listen: %w", err)
	}
	c, _, err := unix.Accept(l)
	if err != nil {
		return -1, fmt.Errorf("accept: %w", err)
	}
	buf := make([]byte, 16)
	oob := make([]byte, unix.CmsgSpace(4*4))
	var oobn int
	if mmsg {
		iov := unix.Iovec{Base: &buf[0]}
		iov.SetLen(len(buf))
		var m unix.Mmsghdr
		m.Hdr.Iov = &iov
		m.Hdr.SetIovlen(1)
		m.Hdr.Control = &oob[0]
		m.Hdr.SetControllen(len(oob))
		if _, _, errno := unix.Syscall6(unix.SYS_RECVMMSG, uintptr(c), uintptr(unsafe.Pointer(&m)), 1, 0, 0, 0); errno != 0 {
			return -1, fmt.Errorf("recvmmsg: %w", errno)
		}
		oobn = int(m.Hdr.Controllen)
	} else {
		if _, oobn, _, _, err = unix.Recvmsg(c, buf, oob, 0); err != nil {
			return -1, fmt.Errorf("recvmsg: %w", err)
		}
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil {
		return -1, fmt.Errorf("control message: %w", err)
	}
	for _, msg := range msgs {
		if fds, err := unix.ParseUnixRights(&msg); err == nil && len(fds) > 0 {
			return fds[0], nil
		}
	}
	return -1, errors.New("no fd received")
}
