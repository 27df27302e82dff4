// Package testutil holds helpers shared by gpud's privileged tests.
package testutil

import (
	"bytes"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

// InCI reports whether the tests run under CI (CI=true), where a skipped
// privileged test is a failure: a green CI must mean the kernel path ran.
func InCI() bool { return os.Getenv("CI") == "true" }

// Skip skips the test, or fails it under CI.
func Skip(tb testing.TB, why string) {
	tb.Helper()
	if InCI() {
		tb.Fatalf("cannot run under CI=true: %s", why)
	}
	tb.Skip(why)
}

// RequireRoot skips (fails under CI) unless the test runs as root.
func RequireRoot(tb testing.TB) {
	tb.Helper()
	if os.Geteuid() != 0 {
		Skip(tb, "needs root (BPF, mknod, cgroups)")
	}
}

// FakeGPU is a device node standing in for /dev/nvidiaN. It reuses the
// numbers of drivers that nothing else in the test machine opens, so opens
// and closes are real kernel events (see DESIGN.md, Testing without a GPU).
type FakeGPU struct {
	Index        int
	Path         string
	Major, Minor uint32
}

// fakeNumbers are (major, minor) pairs of character devices whose open and
// close succeed and that nothing else opens during tests.
var fakeNumbers = [][2]uint32{
	{1, 7},    // /dev/full
	{10, 229}, // /dev/fuse
	{1, 11},   // /dev/kmsg
	{1, 4},    // /dev/port... never opened here; opens need CAP_SYS_RAWIO
}

// MakeFakeGPUs creates n fake GPU nodes nvidia0..nvidia(n-1) in a new
// temporary directory and returns it with the nodes.
func MakeFakeGPUs(tb testing.TB, n int) (string, []FakeGPU) {
	tb.Helper()
	return makeFakeGPUs(tb, n, fakeNumbers)
}

// driverNumbers are the fake GPUs whose drivers have a release function
// that can be probed (/dev/full's file_operations have no
// release), for gpud's driver hooks (--hooks driver): see
// FakeDriverSymbols.
var driverNumbers = [][2]uint32{
	{10, 229}, // /dev/fuse: fuse_dev_open, fuse_dev_release
	{1, 11},   // /dev/kmsg: devkmsg_open, devkmsg_release
}

// FakeDriverSymbols is --driver-symbols for the GPUs of MakeFakeDriverGPUs:
// their drivers' release stands in for nvidia_close (same arguments:
// inode, file).
const FakeDriverSymbols = "release=fuse_dev_release,devkmsg_release"

// MakeFakeDriverGPUs is MakeFakeGPUs for the driver hooks: at most two
// GPUs, whose drivers' releases are FakeDriverSymbols.
func MakeFakeDriverGPUs(tb testing.TB, n int) (string, []FakeGPU) {
	tb.Helper()
	return makeFakeGPUs(tb, n, driverNumbers)
}

func makeFakeGPUs(tb testing.TB, n int, numbers [][2]uint32) (string, []FakeGPU) {
	tb.Helper()
	RequireRoot(tb)
	if n > len(numbers) {
		tb.Fatalf("at most %d fake GPUs", len(numbers))
	}
	fakeNumbers := numbers
	dir := tb.TempDir()
	var gpus []FakeGPU
	for i := 0; i < n; i++ {
		maj, min := fakeNumbers[i][0], fakeNumbers[i][1]
		p := filepath.Join(dir, "nvidia"+itoa(i))
		if err := unix.Mknod(p, unix.S_IFCHR|0o666, int(unix.Mkdev(maj, min))); err != nil {
			tb.Fatalf("mknod %s: %v", p, err)
		}
		gpus = append(gpus, FakeGPU{Index: i, Path: p, Major: maj, Minor: min})
	}
	return dir, gpus
}

func itoa(i int) string {
	if i < 10 {
		return string(rune('0' + i))
	}
	return itoa(i/10) + string(rune('0'+i%10))
}

// Buffer is a bytes.Buffer safe for concurrent writers (a logger) and a
// reader (the test).
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *Buffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *Buffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
