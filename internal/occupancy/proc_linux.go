package occupancy

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unsafe"

	"github.com/gpud/gpud/internal/cgroups"
	"golang.org/x/sys/unix"
)

// ErrNoProcess is returned when a process is gone.
var ErrNoProcess = errors.New("occupancy: no such process")

// DevIndex maps a GPU's device number (unix.Mkdev) to its index.
type DevIndex map[uint64]int

// ProcFS reads GPU fds and process identity from a procfs mount.
type ProcFS struct {
	Root       string // usually /proc
	CgroupRoot string // cgroup v2 mount, to turn a v2 path into a cgroup id
	Devs       DevIndex
	Self       int // gpud's own pid: its NVML opens are not holders
	// Lookalikes hears of processes in cgroups named like a workload's
	// that no runtime made (cgroups.Info.Lookalike); nil: not counted.
	Lookalikes *cgroups.Lookalikes
	// Containers names the container whose cgroup, as its runtime reported
	// it, holds a v2 path (workload.Registry.ContainerAt): a Docker
	// --cgroup-parent container is believed by its runtime's word where
	// the path's place names none. nil: by place alone.
	Containers func(v2Path string) (id, dir string, ok bool)
}

// GPUFDs returns pid's GPU fds by GPU index, from the fd tables of all
// its threads: a thread may hold a GPU its thread-group leader does not
// (the leader exited, a zombie without a table, while another thread
// lives on; or a thread unshared its table). For one process at a time
// (events, kills, explain): the resync's scan of every process reads the
// leader's table only, and the others when it is empty (gpuFDs).
func (p *ProcFS) GPUFDs(pid int) (map[int][]int32, error) { return p.gpuFDs(pid, true) }

// gpuFDs reads pid's GPU fds. Without threads (the scan of every process)
// the threads' tables are read only when the leader's is empty (a zombie
// leader), so a scan of a node's thousands of processes costs one fd
// directory each.
func (p *ProcFS) gpuFDs(pid int, threads bool) (map[int][]int32, error) {
	base := filepath.Join(p.Root, strconv.Itoa(pid))
	out := map[int][]int32{}
	n, err := p.tableFDs(pid, base, out)
	if err != nil {
		return nil, err
	}
	if n > 0 && (!threads || singleThreaded(base)) {
		return out, nil // the leader's table is the only one
	}
	tasks, err := os.ReadDir(filepath.Join(base, "task"))
	if err != nil {
		return out, nil // the process is going; what the leader showed stands
	}
	read := []int{}
	if n > 0 {
		read = append(read, pid) // the leader's table, read above
	}
	seen := map[int]map[int32]bool{}
	for gpu, fds := range out {
		seen[gpu] = map[int32]bool{}
		for _, fd := range fds {
			seen[gpu][fd] = true
		}
	}
	for _, t := range tasks {
		tid, err := strconv.Atoi(t.Name())
		if err != nil || tid == pid {
			continue
		}
		if sharesTable(read, tid) {
			continue // threads usually share one table: read it once
		}
		one := map[int][]int32{}
		if _, err := p.tableFDs(pid, filepath.Join(base, "task", t.Name()), one); err != nil {
			continue // that thread exited meanwhile
		}
		read = append(read, tid)
		for gpu, fds := range one {
			if seen[gpu] == nil {
				seen[gpu] = map[int32]bool{}
			}
			for _, fd := range fds {
				if !seen[gpu][fd] {
					seen[gpu][fd] = true
					out[gpu] = append(out[gpu], fd)
				}
			}
		}
	}
	return out, nil
}

// singleThreaded reports whether the process at base (/proc/<pid>) has one
// thread: its task directory's link count is 2 plus its threads. One
// statx, where the task directory's read is five syscalls and allocations,
// for every open reported without fd (--hooks driver: thousands a second
// on a busy node). False when it cannot tell.
func singleThreaded(base string) bool {
	var path [96]byte
	b := append(append(path[:0], base...), "/task\x00"...)
	if len(b) > len(path) {
		return false
	}
	var stx unix.Statx_t
	return statxAt(unix.AT_FDCWD, b, &stx) == nil && stx.Mask&unix.STATX_NLINK != 0 && stx.Nlink == 3
}

// sharesTable reports whether thread tid shares its fd table with one of
// the threads in read (kcmp KCMP_FILES). When kcmp cannot tell (no
// CONFIG_KCMP), the table is read again: slower, never wrong.
func sharesTable(read []int, tid int) bool {
	for _, r := range read {
		ret, _, errno := unix.Syscall6(unix.SYS_KCMP, uintptr(r), uintptr(tid), kcmpFiles, 0, 0, 0)
		if errno == 0 && ret == 0 {
			return true
		}
	}
	return false
}

const kcmpFiles = 2 // KCMP_FILES (linux/kcmp.h)

// tableFDs adds the GPU fds of the fd table under base (/proc/<pid> or
// /proc/<pid>/task/<tid>) to out, and returns how many fds the table has.
//
// It runs for every process at each resync (minutes apart, thousands of
// processes), so it costs one statx per fd and no path string per entry:
// the fd directory is read through its own descriptor into a reused
// buffer and each fd is looked at relative to it. Only anonymous inodes
// (epoll, eventfd, io_uring, …) have their link read, to find io_uring
// rings; sockets, pipes, regular files and other devices are passed over
// on their type and device number. AT_STATX_DONT_SYNC: a file on a hung
// network filesystem is not asked about (its cached type is enough).
func (p *ProcFS) tableFDs(pid int, base string, out map[int][]int32) (int, error) {
	dir := filepath.Join(base, "fd")
	dfd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ESRCH) {
			return 0, fmt.Errorf("%w: %d", ErrNoProcess, pid)
		}
		return 0, fmt.Errorf("occupancy: reading %s: %w", dir, err)
	}
	defer unix.Close(dfd)
	sc := scratchPool.Get().(*scratch)
	defer scratchPool.Put(sc)
	count := 0
	for {
		n, err := unix.Getdents(dfd, sc.dents)
		if err != nil {
			if errors.Is(err, unix.ESRCH) || errors.Is(err, unix.ENOENT) {
				return 0, fmt.Errorf("%w: %d", ErrNoProcess, pid)
			}
			return 0, fmt.Errorf("occupancy: reading %s: %w", dir, err)
		}
		if n <= 0 {
			break
		}
		for buf := sc.dents[:n]; len(buf) > 0; {
			name, rest, ok := nextDirent(buf)
			if !ok {
				break
			}
			buf = rest
			fd, ok := atoiBytes(name)
			if !ok {
				continue // "." and ".."
			}
			count++
			sc.name = append(append(sc.name[:0], name...), 0)
			var stx unix.Statx_t
			if err := statxAt(dfd, sc.name, &stx); err != nil {
				continue // closed meanwhile
			}
			if uint32(stx.Mode)&unix.S_IFMT == unix.S_IFCHR {
				rdev := unix.Mkdev(stx.Rdev_major, stx.Rdev_minor)
				if gpu, ok := p.Devs[rdev]; ok && !pathOnly(base, fd) {
					out[gpu] = append(out[gpu], int32(fd))
				}
				continue
			}
			if ad := anonDev(); ad != 0 && unix.Mkdev(stx.Dev_major, stx.Dev_minor) != ad {
				continue
			}
			// Files registered in an io_uring's fixed-file table are held
			// without an fd of their own: slot k counts as fd -(k+1).
			if n, err := readlinkAt(dfd, sc.name, sc.link); err == nil && string(sc.link[:n]) == "anon_inode:[io_uring]" {
				for gpu, slots := range p.ringFiles(pid, base, fd) {
					out[gpu] = append(out[gpu], slots...)
				}
			}
		}
	}
	return count, nil
}

// HoldsGPU reports whether pid holds gpu now. The fds in hint (those the
// ledger knows) are checked first, one stat each; only when none of them
// is the GPU any more is the whole fd table read (GPUFDs), so a process
// that moved its hold to another fd still counts. The executor calls this
// for every victim just before its signal: for a batch of victims the
// full scan would cost a readlink per fd of each.
func (p *ProcFS) HoldsGPU(pid, gpu int, hint []int32) bool {
	for _, fd := range hint {
		if fd < 0 {
			continue // an io_uring slot: only the full scan reads those
		}
		var st unix.Stat_t
		if err := unix.Stat(filepath.Join(p.Root, strconv.Itoa(pid), "fd", strconv.Itoa(int(fd))), &st); err != nil {
			continue
		}
		if g, ok := p.Devs[st.Rdev]; ok && g == gpu && st.Mode&unix.S_IFMT == unix.S_IFCHR && !pathOnly(filepath.Join(p.Root, strconv.Itoa(pid)), int(fd)) {
			return true
		}
	}
	fds, err := p.GPUFDs(pid)
	return err == nil && len(fds[gpu]) > 0
}

// KnownFDsHold reports whether every fd in fds (GPU → fds, as the ledger
// knows them) still names its GPU in pid's fd table: one statx each, by
// path, with nothing allocated. The holders' re-read in --hooks driver
// (Tracker.RescanHolders) asks this first and reads the whole table and
// identity (Scan) only when it says false, so a holder that changed
// nothing costs a statx per GPU fd rather than a getdents, a statx per fd,
// the fdinfo of each GPU fd and its identity's five reads.
//
// False also when it cannot tell: an io_uring slot (negative fd: only the
// full read sees those), a zombie leader or a thread's own table (the
// leader's fd is not there), a name too long. A dup to a new fd is not
// looked for: it is found when the known fd goes (then the table is read)
// or at the next full resync. An fd closed and then re-used for the same
// GPU node, O_PATH, keeps the process counted as a holder until the next
// full resync: it could as well have kept the GPU open.
func (p *ProcFS) KnownFDsHold(pid int, fds map[int][]int32) bool {
	var path [96]byte
	b := append(path[:0], p.Root...)
	b = append(b, '/')
	b = strconv.AppendInt(b, int64(pid), 10)
	b = append(b, "/fd/"...)
	dir := len(b)
	for gpu, list := range fds {
		for _, fd := range list {
			if fd < 0 {
				return false
			}
			b = strconv.AppendInt(b[:dir], int64(fd), 10)
			b = append(b, 0)
			if len(b) > len(path) {
				return false // it spilled to the heap: a root path this long is not /proc
			}
			var stx unix.Statx_t
			if statxAt(unix.AT_FDCWD, b, &stx) != nil || uint32(stx.Mode)&unix.S_IFMT != unix.S_IFCHR {
				return false
			}
			if g, ok := p.Devs[unix.Mkdev(stx.Rdev_major, stx.Rdev_minor)]; !ok || g != gpu {
				return false
			}
		}
	}
	return true
}

// FDCount is how many fds pid's fd table has, as the size of
// /proc/PID/fd says (Linux 6.2 and later; 0 before, or when it cannot be
// read): one statx, so that the holders' re-read sees a table that changed
// (a dup) without reading it.
func (p *ProcFS) FDCount(pid int) int64 {
	var path [64]byte
	b := append(path[:0], p.Root...)
	b = append(b, '/')
	b = strconv.AppendInt(b, int64(pid), 10)
	b = append(b, "/fd\x00"...)
	var stx unix.Statx_t
	if err := statx(unix.AT_FDCWD, b, unix.STATX_SIZE, &stx); err != nil {
		return 0
	}
	return int64(stx.Size)
}

// scratch is GPUFDs' reused buffers: a getdents buffer, a NUL-terminated
// name, a link target.
type scratch struct{ dents, name, link []byte }

var scratchPool = sync.Pool{New: func() any {
	return &scratch{dents: make([]byte, 8<<10), name: make([]byte, 0, 16), link: make([]byte, 64)}
}}

// nextDirent splits the first linux_dirent64 off buf and returns its name.
func nextDirent(buf []byte) (name, rest []byte, ok bool) {
	const nameOff = 19 // d_ino 8, d_off 8, d_reclen 2, d_type 1
	if len(buf) < nameOff {
		return nil, nil, false
	}
	reclen := int(*(*uint16)(unsafe.Pointer(&buf[16])))
	if reclen < nameOff || reclen > len(buf) {
		return nil, nil, false
	}
	name = buf[nameOff:reclen]
	if i := bytes.IndexByte(name, 0); i >= 0 {
		name = name[:i]
	}
	return name, buf[reclen:], true
}

// atoiBytes parses a non-negative decimal fd number.
func atoiBytes(b []byte) (int, bool) {
	if len(b) == 0 || len(b) > 9 {
		return 0, false
	}
	n := 0
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int(c-'0')
	}
	return n, true
}

// statxAt is statx(dirfd, name) with the type and device numbers only,
// from cached attributes: name is NUL-terminated, so nothing is allocated.
func statxAt(dirfd int, name []byte, stx *unix.Statx_t) error {
	return statx(dirfd, name, unix.STATX_TYPE, stx)
}

// statx is statx(dirfd, name, AT_STATX_DONT_SYNC, mask); name is
// NUL-terminated.
func statx(dirfd int, name []byte, mask int, stx *unix.Statx_t) error {
	_, _, e := unix.Syscall6(unix.SYS_STATX, uintptr(dirfd), uintptr(unsafe.Pointer(&name[0])),
		uintptr(unix.AT_STATX_DONT_SYNC), uintptr(mask), uintptr(unsafe.Pointer(stx)), 0)
	if e != 0 {
		return e
	}
	return nil
}

// readlinkAt is readlinkat(dirfd, name) into buf; name is NUL-terminated.
func readlinkAt(dirfd int, name, buf []byte) (int, error) {
	n, _, e := unix.Syscall6(unix.SYS_READLINKAT, uintptr(dirfd), uintptr(unsafe.Pointer(&name[0])),
		uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf)), 0, 0)
	if e != 0 {
		return 0, e
	}
	return int(n), nil
}

// anonDev is the device number of the anonymous-inode filesystem (where
// io_uring rings, epoll and eventfd files live), learnt once from an
// eventfd of gpud's own. 0 if unknown: then every fd that is not a
// character device has its link read, as before this shortcut.
var anonDev = sync.OnceValue(func() uint64 {
	fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC)
	if err != nil {
		return 0
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return 0
	}
	return st.Dev
})

// oPath is O_PATH as /proc/<pid>/fdinfo prints flags (octal).
const oPath = 0o10000000

// pathOnly reports whether fd was opened O_PATH: a handle on the node, not
// an open of the device (no driver, no GPU access, no gate).
func pathOnly(base string, fd int) bool {
	b, err := os.ReadFile(filepath.Join(base, "fdinfo", strconv.Itoa(fd)))
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "flags:"); ok {
			flags, err := strconv.ParseUint(strings.TrimSpace(v), 8, 64)
			return err == nil && flags&oPath != 0
		}
	}
	return false
}

// ringFiles returns the GPUs in the fixed-file table of the io_uring at
// fd, as pseudo fds -(slot+1). The table is listed in the ring's fdinfo
// ("UserFiles:" then "  <slot>: <path>"), paths as the process sees them.
func (p *ProcFS) ringFiles(pid int, base string, fd int) map[int][]int32 {
	b, err := os.ReadFile(filepath.Join(base, "fdinfo", strconv.Itoa(fd)))
	if err != nil {
		return nil
	}
	var out map[int][]int32
	in := false
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "UserFiles:") {
			in = true
			continue
		}
		if !in {
			continue
		}
		slotStr, path, ok := strings.Cut(strings.TrimSpace(line), ": ")
		slot, err := strconv.Atoi(slotStr)
		if !ok || err != nil || !strings.HasPrefix(line, " ") {
			break // the table ends where the indented lines do
		}
		var st unix.Stat_t
		if err := unix.Stat(filepath.Join(p.Root, strconv.Itoa(pid), "root", path), &st); err != nil ||
			st.Mode&unix.S_IFMT != unix.S_IFCHR {
			continue
		}
		if gpu, ok := p.Devs[st.Rdev]; ok {
			if out == nil {
				out = map[int][]int32{}
			}
			out[gpu] = append(out[gpu], int32(-(slot + 1)))
		}
	}
	return out
}

// Info reads pid's identity: start time, comm, cgroup, container and pod.
func (p *ProcFS) Info(pid int) (ProcInfo, error) {
	info := ProcInfo{PID: pid, Priority: Unclassified}
	base := filepath.Join(p.Root, strconv.Itoa(pid))
	stat, err := os.ReadFile(filepath.Join(base, "stat"))
	if err != nil {
		return info, fmt.Errorf("%w: %d: %v", ErrNoProcess, pid, err)
	}
	comm, start, err := parseStat(string(stat))
	if err != nil {
		return info, fmt.Errorf("occupancy: /proc/%d/stat: %w", pid, err)
	}
	info.Comm, info.StartTime = comm, start
	// Real uid 0 only from status: the owner of /proc/<pid> is no proof (a
	// process that makes itself non-dumpable shows as root's there).
	if status, err := os.ReadFile(filepath.Join(base, "status")); err == nil {
		info.Root = realRoot(status)
	}
	if p.Root == "/proc" {
		info.PidfdIno = PidfdIno(pid)
	}
	cg, err := os.ReadFile(filepath.Join(base, "cgroup"))
	if err != nil {
		return info, fmt.Errorf("%w: %d: %v", ErrNoProcess, pid, err)
	}
	ci, err := cgroups.Parse(string(cg))
	if err != nil {
		return info, err
	}
	if ci.ContainerID == "" && ci.PodUID == "" && ci.V2Path != "" && p.Containers != nil {
		if id, dir, ok := p.Containers(ci.V2Path); ok {
			ci.ContainerID, ci.Runtime, ci.ContainerDir, ci.Lookalike = id, "docker", dir, false
		}
	}
	if p.CgroupRoot != "" {
		// An id is believed only where root made the cgroup naming it.
		ci = cgroups.Owned(p.CgroupRoot, ci)
	}
	if ci.Lookalike {
		p.Lookalikes.Saw(ci.V2Path, pid)
	}
	info.ContainerID, info.PodUID = ci.ContainerID, ci.PodUID
	if p.CgroupRoot != "" && ci.V2Path != "" {
		if id, err := cgroups.ID(filepath.Join(p.CgroupRoot, ci.V2Path)); err == nil {
			info.CgroupID = id
		}
	}
	return info, nil
}

// realRoot reports whether a /proc/<pid>/status document says the real uid
// (the first of the Uid: line's four) is 0; false when it does not say.
func realRoot(status []byte) bool {
	for line := range bytes.Lines(status) {
		rest, ok := bytes.CutPrefix(line, []byte("Uid:"))
		if !ok {
			continue
		}
		f := bytes.Fields(rest)
		return len(f) == 4 && string(f[0]) == "0"
	}
	return false
}

// parseStat returns comm and starttime (field 22) of a /proc/<pid>/stat line.
// comm may hold spaces and parentheses, so fields are counted after the last ')'.
func parseStat(s string) (string, uint64, error) {
	open := strings.IndexByte(s, '(')
	closing := strings.LastIndexByte(s, ')')
	if open < 0 || closing < open {
		return "", 0, errors.New("no comm field")
	}
	rest := strings.Fields(s[closing+1:])
	// rest[0] is field 3 (state); starttime is field 22.
	if len(rest) < 20 {
		return "", 0, errors.New("too few fields")
	}
	start, err := strconv.ParseUint(rest[19], 10, 64)
	if err != nil {
		return "", 0, fmt.Errorf("starttime: %w", err)
	}
	return s[open+1 : closing], start, nil
}

// Scan reads one process: its identity and the GPU fds of all its threads.
func (p *ProcFS) Scan(pid int) (ProcFDs, error) { return p.scan(pid, true) }

func (p *ProcFS) scan(pid int, threads bool) (ProcFDs, error) {
	fds, err := p.gpuFDs(pid, threads)
	if err != nil {
		return ProcFDs{}, err
	}
	pf := ProcFDs{Info: ProcInfo{PID: pid, Priority: Unclassified}, FDs: fds}
	if len(fds) == 0 {
		return pf, nil
	}
	info, err := p.Info(pid)
	if err != nil && errors.Is(err, ErrNoProcess) {
		return ProcFDs{}, err
	}
	pf.Info = info
	return pf, nil
}

// ScanAll reads every process that holds a GPU fd: the ground truth.
func (p *ProcFS) ScanAll() ([]ProcFDs, error) {
	ents, err := os.ReadDir(p.Root)
	if err != nil {
		return nil, fmt.Errorf("occupancy: reading %s: %w", p.Root, err)
	}
	var out []ProcFDs
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || !e.IsDir() || pid == p.Self {
			continue
		}
		pf, err := p.scan(pid, false)
		if err != nil || len(pf.FDs) == 0 {
			continue // gone, or holds nothing
		}
		out = append(out, pf)
	}
	return out, nil
}

// StartTime reads a process's start time (clock ticks since boot), which
// with the PID identifies it: a reused PID has a later start time.
func StartTime(procRoot string, pid int) (uint64, error) {
	b, err := os.ReadFile(filepath.Join(procRoot, strconv.Itoa(pid), "stat"))
	if err != nil {
		return 0, fmt.Errorf("%w: %d: %v", ErrNoProcess, pid, err)
	}
	_, start, err := parseStat(string(b))
	return start, err
}

// Comm reads a process's current name: an open, a read and a close (no
// fstat, no poller), as it runs for many holders every second.
func (p *ProcFS) Comm(pid int) (string, bool) {
	fd, err := unix.Open(filepath.Join(p.Root, strconv.Itoa(pid), "comm"), unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return "", false
	}
	defer unix.Close(fd)
	var buf [64]byte // TASK_COMM_LEN is 16
	n, err := unix.Read(fd, buf[:])
	if err != nil || n <= 0 {
		return "", false
	}
	return strings.TrimSuffix(string(buf[:n]), "\n"), true
}

// PidfdIno returns the inode number of a pidfd of pid: on pidfs (Linux ≥
// 6.9) it names the process uniquely for the life of the system, where a
// PID and even a start time (in clock ticks) can be reused. 0 when unknown.
func PidfdIno(pid int) uint64 {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return 0
	}
	defer unix.Close(fd)
	return PidfdInoOf(fd)
}

// PidfdInoOf is PidfdIno for an open pidfd.
func PidfdInoOf(pidfd int) uint64 {
	var st unix.Stat_t
	if err := unix.Fstat(pidfd, &st); err != nil {
		return 0
	}
	var fs unix.Statfs_t
	if err := unix.Fstatfs(pidfd, &fs); err != nil || fs.Type != pidfsMagic {
		return 0 // anon inode (before pidfs): the same inode for every pidfd
	}
	return st.Ino
}

const pidfsMagic = 0x50494446 // PID_FS_MAGIC, "PIDF"

// Devs returns the device-number index of gpus.
func Devs(gpus []GPU) DevIndex {
	d := DevIndex{}
	for _, g := range gpus {
		d[unix.Mkdev(g.Major, g.Minor)] = g.Index
	}
	return d
}

// openLike are the syscalls a thread can be in while a GPU open it started
// has not returned yet (its fd not installed): open, creat, openat,
// openat2, open_by_handle_at and io_uring_enter (an inline IORING_OP_OPENAT),
// by number on this architecture and, on x86-64, in the 32-bit ABI too (a
// number that means another syscall in the other ABI only makes the wait
// longer).
var openLike = map[string][]int{
	"amd64": {2, 85, 257, 437, 304, 426, 5, 8, 295, 342},
	"arm64": {56, 437, 265, 426},
}[runtime.GOARCH]

// readSmall reads the start of a small /proc file into buf.
func readSmall(path string, buf []byte) (int, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, err
	}
	defer unix.Close(fd)
	return unix.Read(fd, buf)
}

// Opening reports whether thread tid of process tgid may still be inside
// the open that the gate reported: it is in an open-like syscall, it is
// running (its syscall cannot be read then), it is an io_uring worker
// (which opens outside any syscall), or its state cannot be read. False
// means the open has returned (the new fd, if any, is installed) or the
// thread is gone.
func (p *ProcFS) Opening(tgid, tid int) bool {
	base := filepath.Join(p.Root, strconv.Itoa(tgid), "task", strconv.Itoa(tid))
	// An open, a read and a close into a buffer here (not os.ReadFile's
	// fstat, second read and allocations): it runs for every open
	// reported without fd.
	var buf [256]byte // "nr arg1..arg6 sp pc": the number is all that is read
	n, err := readSmall(filepath.Join(base, "syscall"), buf[:])
	if errors.Is(err, os.ErrNotExist) || errors.Is(err, unix.ESRCH) {
		return false
	}
	if err != nil {
		return true
	}
	field, _, _ := strings.Cut(strings.TrimSpace(string(buf[:n])), " ")
	nr, err := strconv.Atoi(field)
	if err != nil {
		return true // "running"
	}
	if nr < 0 {
		comm, _ := os.ReadFile(filepath.Join(base, "comm"))
		return strings.HasPrefix(string(comm), "iou-wrk")
	}
	return slices.Contains(openLike, nr)
}
