package occupancy

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/gpud/gpud/internal/cgroups"
	"github.com/gpud/gpud/internal/testutil"
	"golang.org/x/sys/unix"
)

// statLine builds a /proc/<pid>/stat line with the given comm and starttime
// (field 22).
func statLine(pid int, comm string, start uint64) string {
	fields := []string{strconv.Itoa(pid), "(" + comm + ")", "S"}
	for f := 4; f <= 21; f++ {
		fields = append(fields, strconv.Itoa(f*11))
	}
	fields = append(fields, strconv.FormatUint(start, 10))
	for f := 23; f <= 52; f++ {
		fields = append(fields, strconv.Itoa(f))
	}
	return strings.Join(fields, " ") + "\n"
}

func TestParseStat(t *testing.T) {
	for _, tc := range []struct {
		name  string
		in    string
		comm  string
		start uint64
		ok    bool
	}{
		{"plain", statLine(1, "bash", 4242), "bash", 4242, true},
		{"spaces", statLine(1, "my prog  x", 7), "my prog  x", 7, true},
		{"close paren", statLine(1, "a) S 1 2 3", 99), "a) S 1 2 3", 99, true},
		{"parens", statLine(1, "(x)(y)", 1), "(x)(y)", 1, true},
		{"lone paren", statLine(1, ")", 5), ")", 5, true},
		{"empty comm", statLine(1, "", 8), "", 8, true},
		{"max start", statLine(1, "x", 1<<63), "x", 1 << 63, true},
		{"real", "1234 (python3) S 1 1234 1234 0 -1 4194560 1033 0 0 0 1 0 0 0 20 0 1 0 123456789 12345678 1000 18446744073709551615 1 1 0 0 0 0 0 16781312 2 0 0 0 17 3 0 0 0 0 0 0 0 0 0 0 0 0 0\n",
			"python3", 123456789, true},
		{"no comm", "1234 python3 S 1 2 3", "", 0, false},
		{"no open paren", "1234 python3) S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22", "", 0, false},
		{"close before open", "1 )x( S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20", "", 0, false},
		{"too few fields", "1 (x) S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18", "", 0, false},
		{"bad starttime", "1 (x) S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 -5 20", "", 0, false},
		{"empty", "", "", 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			comm, start, err := parseStat(tc.in)
			if (err == nil) != tc.ok {
				t.Fatalf("parseStat(%q) err = %v, want ok=%v", tc.in, err, tc.ok)
			}
			if tc.ok && (comm != tc.comm || start != tc.start) {
				t.Errorf("parseStat = %q %d, want %q %d", comm, start, tc.comm, tc.start)
			}
		})
	}
}

// fakeProc is a procfs tree whose fd entries are ordinary symlinks, which
// stat follows just like the kernel's magic links.
type fakeProc struct {
	t    *testing.T
	root string
}

func newFakeProc(t *testing.T) *fakeProc {
	return &fakeProc{t: t, root: t.TempDir()}
}

func (p *fakeProc) write(rel, content string) {
	p.t.Helper()
	path := filepath.Join(p.root, rel)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		p.t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		p.t.Fatal(err)
	}
}

func (p *fakeProc) link(pid int, name, target string) {
	p.t.Helper()
	dir := filepath.Join(p.root, strconv.Itoa(pid), "fd")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		p.t.Fatal(err)
	}
	if err := os.Symlink(target, filepath.Join(dir, name)); err != nil {
		p.t.Fatal(err)
	}
}

func (p *fakeProc) process(pid int, comm string, start uint64, cgroup string) {
	p.t.Helper()
	p.write(filepath.Join(strconv.Itoa(pid), "stat"), statLine(pid, comm, start))
	p.write(filepath.Join(strconv.Itoa(pid), "cgroup"), cgroup)
	if err := os.MkdirAll(filepath.Join(p.root, strconv.Itoa(pid), "fd"), 0o755); err != nil {
		p.t.Fatal(err)
	}
}

const (
	podUID  = "1a2b3c4d-0000-1111-2222-333344445555"
	podPath = "/kubepods/burstable/pod" + podUID + "/" + ctrID
)

// Fake GPUs without root: /dev/null (1:3) is GPU 0, /dev/zero (1:5) GPU 1.
var fakeDevs = DevIndex{unix.Mkdev(1, 3): 0, unix.Mkdev(1, 5): 1}

func TestProcFSFake(t *testing.T) {
	p := newFakeProc(t)
	p.process(123, "python3 train.py", 5555, "0::"+podPath+"\n")
	p.link(123, "3", "/dev/null")
	p.link(123, "10", "/dev/null")
	p.link(123, "4", "/dev/zero")
	p.link(123, "5", "/dev/full") // a character device, not a GPU
	p.link(123, "6", filepath.Join(p.root, "123", "stat"))
	p.link(123, "7", "/nonexistent") // closed meanwhile
	p.link(123, "x", "/dev/null")    // not an fd number
	// Targets the kernel gives sockets, pipes and anon inodes: in the real
	// /proc they stat as what they are (TestProcFSRealGPUFDs), here they
	// resolve to nothing and are skipped.
	for i, target := range []string{"socket:[123]", "pipe:[456]", "anon_inode:[eventfd]", "[aio]"} {
		p.link(123, strconv.Itoa(20+i), target)
	}
	p.process(456, "idle", 1, "0::/system.slice/docker-"+ctrID+".scope\n")
	p.link(456, "1", "/dev/full")
	p.process(999, "gpud", 2, "0::/\n") // gpud itself
	p.link(999, "3", "/dev/zero")
	p.process(777, "host proc", 3, "0::/user.slice\n")
	p.link(777, "8", "/dev/zero")
	p.write("self/fd/3", "") // not a pid
	p.write("888", "")       // a file, not a process dir

	// A cgroup v2 hierarchy where the pod's container cgroup exists.
	cgRoot := t.TempDir()
	if err := os.MkdirAll(filepath.Join(cgRoot, podPath), 0o755); err != nil {
		t.Fatal(err)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(filepath.Join(cgRoot, podPath), &st); err != nil {
		t.Fatal(err)
	}

	fs := &ProcFS{Root: p.root, CgroupRoot: cgRoot, Devs: fakeDevs, Self: 999}

	t.Run("GPUFDs", func(t *testing.T) {
		fds, err := fs.GPUFDs(123)
		if err != nil {
			t.Fatal(err)
		}
		for _, v := range fds {
			slices.Sort(v)
		}
		if want := map[int][]int32{0: {3, 10}, 1: {4}}; !reflect.DeepEqual(fds, want) {
			t.Errorf("GPUFDs(123) = %v, want %v", fds, want)
		}
		fds, err = fs.GPUFDs(456)
		if err != nil || len(fds) != 0 {
			t.Errorf("GPUFDs(456) = %v, %v; want none", fds, err)
		}
		if _, err := fs.GPUFDs(4242); !errors.Is(err, ErrNoProcess) {
			t.Errorf("GPUFDs(missing) err = %v, want ErrNoProcess", err)
		}
	})

	t.Run("Info", func(t *testing.T) {
		info, err := fs.Info(123)
		if err != nil {
			t.Fatal(err)
		}
		want := ProcInfo{PID: 123, StartTime: 5555, Comm: "python3 train.py", CgroupID: st.Ino,
			ContainerID: ctrID, PodUID: podUID, Priority: Unclassified}
		if info != want {
			t.Errorf("Info(123) = %+v, want %+v", info, want)
		}
		// Without a cgroup root, or with a cgroup that does not exist there,
		// the id stays 0.
		info, err = (&ProcFS{Root: p.root}).Info(123)
		if err != nil || info.CgroupID != 0 || info.ContainerID != ctrID {
			t.Errorf("Info without cgroup root = %+v, %v", info, err)
		}
		// A container's cgroup that is not there (the process moved, or
		// the path is made up) names no container: none can be checked
		// to be root's.
		info, err = fs.Info(456)
		if err != nil || info.CgroupID != 0 || info.ContainerID != "" || info.PodUID != "" {
			t.Errorf("Info(456) = %+v, %v; want no container, no pod, no cgroup id", info, err)
		}
		info, err = fs.Info(777)
		if err != nil || info.ContainerID != "" || info.PodUID != "" || info.Comm != "host proc" {
			t.Errorf("Info(777) = %+v, %v; want a host process", info, err)
		}
	})

	t.Run("Scan", func(t *testing.T) {
		pf, err := fs.Scan(123)
		if err != nil {
			t.Fatal(err)
		}
		if pf.Info.Comm != "python3 train.py" || pf.Info.StartTime != 5555 || len(pf.FDs) != 2 {
			t.Errorf("Scan(123) = %+v", pf)
		}
		pf, err = fs.Scan(456)
		if err != nil || len(pf.FDs) != 0 || pf.Info != (ProcInfo{PID: 456, Priority: Unclassified}) {
			t.Errorf("Scan(456) = %+v, %v; want no fds and a bare identity", pf, err)
		}
		if _, err := fs.Scan(4242); !errors.Is(err, ErrNoProcess) {
			t.Errorf("Scan(missing) err = %v, want ErrNoProcess", err)
		}
	})

	t.Run("ScanAll", func(t *testing.T) {
		all, err := fs.ScanAll()
		if err != nil {
			t.Fatal(err)
		}
		var pids []int
		for _, pf := range all {
			pids = append(pids, pf.Info.PID)
			if pf.Info.StartTime == 0 {
				t.Errorf("pid %d without identity: %+v", pf.Info.PID, pf.Info)
			}
		}
		slices.Sort(pids)
		if !slices.Equal(pids, []int{123, 777}) {
			t.Errorf("ScanAll pids = %v, want [123 777] (not 456: no GPU; not 999: self)", pids)
		}
		if _, err := (&ProcFS{Root: filepath.Join(p.root, "missing")}).ScanAll(); err == nil {
			t.Error("ScanAll of a missing root succeeded")
		}
	})
}

func TestProcFSInfoErrors(t *testing.T) {
	p := newFakeProc(t)
	p.write("1/stat", "garbage")
	p.write("1/cgroup", "0::/\n")
	p.write("2/stat", statLine(2, "x", 1)) // no cgroup file
	p.write("3/stat", statLine(3, "x", 1))
	p.write("3/cgroup", "nonsense")
	fs := &ProcFS{Root: p.root, Devs: fakeDevs}
	for _, tc := range []struct {
		pid       int
		noProcess bool
		badCgroup bool
	}{
		{1, false, false},
		{2, true, false},
		{3, false, true},
		{4, true, false}, // no directory at all
	} {
		t.Run(fmt.Sprint(tc.pid), func(t *testing.T) {
			_, err := fs.Info(tc.pid)
			if err == nil {
				t.Fatal("Info succeeded")
			}
			if errors.Is(err, ErrNoProcess) != tc.noProcess {
				t.Errorf("err = %v; ErrNoProcess want %v", err, tc.noProcess)
			}
			if errors.Is(err, cgroups.ErrBadCgroupFile) != tc.badCgroup {
				t.Errorf("err = %v; ErrBadCgroupFile want %v", err, tc.badCgroup)
			}
		})
	}
}

// absentPID is above the kernel's largest pid_max.
const absentPID = 1 << 30

func TestProcFSRealSelf(t *testing.T) {
	fs := &ProcFS{Root: "/proc", Devs: fakeDevs}
	info, err := fs.Info(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	comm, err := os.ReadFile("/proc/self/comm")
	if err != nil {
		t.Fatal(err)
	}
	if info.PID != os.Getpid() || info.Comm != strings.TrimSuffix(string(comm), "\n") || info.StartTime == 0 {
		t.Errorf("Info(self) = %+v, want comm %q and a start time", info, comm)
	}
	if again, _ := fs.Info(os.Getpid()); again.StartTime != info.StartTime {
		t.Errorf("start time changed: %d then %d", info.StartTime, again.StartTime)
	}
	if init, err := fs.Info(1); err == nil && init.StartTime > info.StartTime {
		t.Errorf("pid 1 started at %d, after this process (%d)", init.StartTime, info.StartTime)
	}
	if _, err := fs.Scan(absentPID); !errors.Is(err, ErrNoProcess) {
		t.Errorf("Scan(absent) err = %v, want ErrNoProcess", err)
	}
	if _, err := fs.Info(absentPID); !errors.Is(err, ErrNoProcess) {
		t.Errorf("Info(absent) err = %v, want ErrNoProcess", err)
	}
}

func TestProcFSRealGPUFDs(t *testing.T) {
	testutil.RequireRoot(t)
	_, fakes := testutil.MakeFakeGPUs(t, 2)
	var gpus []GPU
	for _, f := range fakes {
		gpus = append(gpus, GPU{Index: f.Index, Device: f.Path, Major: f.Major, Minor: f.Minor})
	}
	open := func(path string) *os.File {
		f, err := os.OpenFile(path, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		return f
	}
	// Other kinds of fds around them, and more fds than one getdents
	// buffer holds, so the GPU fds come in a later read.
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	defer pw.Close()
	sp, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(sp[0])
	defer unix.Close(sp[1])
	efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(efd)
	for i := 0; i < 1000; i++ {
		open("/dev/null")
	}
	a, b, c := open(fakes[0].Path), open(fakes[0].Path), open(fakes[1].Path)

	fs := &ProcFS{Root: "/proc", Devs: Devs(gpus)}
	fds, err := fs.GPUFDs(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range fds {
		slices.Sort(v)
	}
	want := map[int][]int32{0: {int32(a.Fd()), int32(b.Fd())}, 1: {int32(c.Fd())}}
	slices.Sort(want[0])
	if !reflect.DeepEqual(fds, want) {
		t.Fatalf("GPUFDs(self) = %v, want %v", fds, want)
	}

	pf, err := fs.Scan(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if pf.Info.StartTime == 0 || pf.Info.Comm == "" || len(pf.FDs) != 2 {
		t.Errorf("Scan(self) = %+v", pf)
	}

	// ScanAll finds this process, unless it is Self.
	all, err := fs.ScanAll()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(all, func(pf ProcFDs) bool { return pf.Info.PID == os.Getpid() }) {
		t.Error("ScanAll misses this process")
	}
	fs.Self = os.Getpid()
	all, err = fs.ScanAll()
	if err != nil {
		t.Fatal(err)
	}
	if slices.ContainsFunc(all, func(pf ProcFDs) bool { return pf.Info.PID == os.Getpid() }) {
		t.Error("ScanAll reports Self")
	}

	// Closing shows at once.
	b.Close()
	fds, err = fs.GPUFDs(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if want := map[int][]int32{0: {int32(a.Fd())}, 1: {int32(c.Fd())}}; !reflect.DeepEqual(fds, want) {
		t.Errorf("after close: GPUFDs(self) = %v, want %v", fds, want)
	}
}

// BenchmarkProcFSScanAll: one full /proc reconciliation of this machine,
// as the periodic resync runs it (every process's fd directory). Root, to
// read other processes' fds.
func BenchmarkProcFSScanAll(b *testing.B) {
	testutil.RequireRoot(b)
	fs := &ProcFS{Root: "/proc", Devs: DevIndex{unix.Mkdev(1, 7): 0, unix.Mkdev(10, 229): 1}}
	procs, _ := filepath.Glob("/proc/[0-9]*")
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := fs.ScanAll(); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(len(procs)), "processes")
}
