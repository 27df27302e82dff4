//go:build cgo

package nvidia

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpud/gpud/internal/nvidia/gpumon"
	"github.com/gpud/gpud/internal/occupancy"
	"github.com/gpud/gpud/internal/testutil"
)

// doubleGPUs are two GPUs whose NVML indexes are not their minors, as on
// nodes where the PCI order and the device nodes disagree.
func doubleGPUs() []testutil.NVMLGPU {
	return []testutil.NVMLGPU{
		{Index: 0, Minor: 1, UUID: "GPU-aaaaaaaa-0000-0000-0000-000000000001", Name: "NVIDIA H100 80GB HBM3", MemoryTotal: 16 << 30},
		{Index: 1, Minor: 0, UUID: "GPU-bbbbbbbb-0000-0000-0000-000000000000", Name: "NVIDIA H100 80GB HBM3", MemoryTotal: 16 << 30},
	}
}

// The NVML double, loaded as the driver's library is (a file checked and
// held open, dlopen through /proc/self/fd): names, memory, per-process
// use, MIG and a lost GPU, changed while loaded.
func TestNVMLDoubleThroughTheLoadPath(t *testing.T) {
	double := testutil.NewNVMLDouble(t, "", doubleGPUs()...)
	lib := New(Load{Library: double.Library, DriverRoot: "/"})
	if err := lib.Init(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(lib.Shutdown)
	if info := lib.Info(); info.Library != double.Library || info.DriverVersion != "570.86.15" {
		t.Errorf("info = %+v, want %s and 570.86.15", info, double.Library)
	}
	gpus := []occupancy.GPU{{Index: 0, Device: "/dev/nvidia0", Minor: 0}, {Index: 1, Device: "/dev/nvidia1", Minor: 1}}
	if unknown := lib.Annotate(gpus); len(unknown) != 0 {
		t.Fatalf("unknown = %v", unknown)
	}
	// By minor, not by NVML's index.
	if gpus[0].UUID != doubleGPUs()[1].UUID || gpus[1].UUID != doubleGPUs()[0].UUID {
		t.Errorf("UUIDs = %s %s, want the minors' (NVML index 1 then 0)", gpus[0].UUID, gpus[1].UUID)
	}

	r := sample(t, lib)
	if !r[0].At.IsZero() || !r[1].At.IsZero() || r[1].Memory == nil || r[1].Memory.Total != 16<<30 || r[1].Memory.Used != 0 {
		t.Errorf("idle GPUs read %+v %+v", r[0], r[1])
	}

	// NVML index 0 is minor 1, gpud's GPU 1.
	double.SetProcesses(t, testutil.NVMLProcess{GPU: 0, PID: 4242, Memory: 3 << 30})
	double.Compute(t, 0, 4242, 70)
	r = sample(t, lib)
	if r[1].At.IsZero() || !slices.Equal(r[1].PIDs, []uint32{4242}) || !r[0].At.IsZero() {
		t.Errorf("after compute on GPU 1: %+v / %+v", r[1], r[0])
	}
	if r[1].Memory == nil || r[1].Memory.Used != 3<<30 || r[1].ProcessMemory[4242] != 3<<30 {
		t.Errorf("memory = %+v %v, want 3 GiB used by 4242", r[1].Memory, r[1].ProcessMemory)
	}
	// Samples already seen are not seen again (the timestamp NVML is asked
	// from moves on).
	if r = sample(t, lib); !r[1].At.IsZero() {
		t.Errorf("the same sample read twice: %+v", r[1])
	}

	double.Update(t, 1, func(g *testutil.NVMLGPU) { g.MIG = true })
	double.Update(t, 0, func(g *testutil.NVMLGPU) { g.Lost = true })
	r, _ = lib.(*NVML).Sample() // a MIG GPU's utilization is not supported
	if !r[0].MIG || r[0].Lost || !r[1].Lost {
		t.Errorf("MIG/lost: %+v / %+v", r[0], r[1])
	}
}

func sample(t *testing.T, lib Library) map[int]Reading {
	t.Helper()
	r, err := lib.(*NVML).Sample()
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// XID and ECC events come through NVML's event set: an application's XID
// is reported, not critical; a GPU's own fault is.
func TestNVMLDoubleHealthEvents(t *testing.T) {
	double := testutil.NewNVMLDouble(t, "", doubleGPUs()...)
	lib := New(Load{Library: double.Library})
	if err := lib.Init(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(lib.Shutdown)
	lib.Annotate([]occupancy.GPU{{Index: 0, Minor: 0}, {Index: 1, Minor: 1}})
	ctx, cancel := context.WithCancel(context.Background())
	var mu sync.Mutex
	var got []HealthEvent
	done := make(chan error, 1)
	go func() {
		done <- lib.WatchHealth(ctx, func(e HealthEvent) { mu.Lock(); got = append(got, e); mu.Unlock() })
	}()
	events := func() []HealthEvent { mu.Lock(); defer mu.Unlock(); return slices.Clone(got) }
	// Registration races the first event: events before it are not
	// delivered (as NVML's), so the test repeats until one is.
	testutil.Eventually(t, 10*time.Second, "an XID event", func() bool {
		double.XID(t, 1, 13) // NVML index 1 = minor 0 = GPU 0
		return len(events()) > 0
	})
	double.XID(t, 0, 79)
	double.DoubleBitECC(t, 1)
	testutil.Eventually(t, 10*time.Second, "three kinds of events", func() bool {
		var xid79, dbe bool
		for _, e := range events() {
			xid79 = xid79 || (e.Kind == "xid" && e.XID == 79 && e.GPU == 1 && e.Critical)
			dbe = dbe || (e.Kind == "double-bit-ecc" && e.GPU == 0 && e.Critical)
		}
		return xid79 && dbe
	})
	for _, e := range events() {
		if e.Kind == "xid" && e.XID == 13 && (e.Critical || e.GPU != 0) {
			t.Errorf("XID 13 (an application's fault) = %+v", e)
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("WatchHealth: %v", err)
	}
}

// A library file anyone but root could change is never loaded: loading it
// would run that user's code as root.
func TestOpenLibraryRefusesUnsafeFiles(t *testing.T) {
	testutil.RequireRoot(t)
	root := t.TempDir()
	os.Chmod(root, 0o755)
	lib := filepath.Join(root, "usr/lib/x86_64-linux-gnu")
	if err := os.MkdirAll(lib, 0o755); err != nil {
		t.Fatal(err)
	}
	real := filepath.Join(lib, "libnvidia-ml.so.570.86.15")
	if err := os.WriteFile(real, []byte("\x7fELF"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("libnvidia-ml.so.570.86.15", filepath.Join(lib, "libnvidia-ml.so.1")); err != nil {
		t.Fatal(err)
	}
	// An absolute symlink resolves under the driver root, not gpud's /.
	if err := os.Symlink("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1", filepath.Join(lib, "abs.so")); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1", "/usr/lib/x86_64-linux-gnu/abs.so"} {
		f, err := OpenLibrary(root, p)
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		if want := filepath.Join(root, "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.570.86.15"); f.Name() != want {
			t.Errorf("%s opened as %s, want %s", p, f.Name(), want)
		}
		f.Close()
	}
	for name, breakIt := range map[string]func() func(){
		"file writable by others": func() func() {
			os.Chmod(real, 0o777)
			return func() { os.Chmod(real, 0o755) }
		},
		"file of another user": func() func() {
			os.Chown(real, 65534, 65534)
			return func() { os.Chown(real, 0, 0) }
		},
		"directory writable by others": func() func() {
			os.Chmod(lib, 0o777)
			return func() { os.Chmod(lib, 0o755) }
		},
		"symlink of another user": func() func() {
			os.Lchown(filepath.Join(lib, "libnvidia-ml.so.1"), 65534, 65534)
			return func() { os.Lchown(filepath.Join(lib, "libnvidia-ml.so.1"), 0, 0) }
		},
	} {
		undo := breakIt()
		f, err := OpenLibrary(root, "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1")
		undo()
		if err == nil {
			f.Close()
			t.Errorf("%s: loaded", name)
		} else if !strings.Contains(err.Error(), "unsafe") {
			t.Errorf("%s: %v, want an unsafe-file error", name, err)
		}
	}
	if _, err := OpenLibrary(root, "usr/lib/libnvidia-ml.so.1"); err == nil {
		t.Error("a relative path was accepted")
	}
}

// A library that is missing or cannot load says why, and gpud goes on
// without NVML.
func TestNVMLLoadErrorsSayWhy(t *testing.T) {
	dir := t.TempDir()
	os.Chmod(dir, 0o755)
	bad := filepath.Join(dir, "libnvidia-ml.so.1")
	if err := os.WriteFile(bad, []byte("not an ELF file"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ path, want string }{
		{filepath.Join(dir, "missing.so"), "no such file"},
		{bad, "loading " + bad},
	} {
		err := New(Load{Library: tc.path}).Init()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.path, err, tc.want)
		}
	}
}

// With a driver root and no library path, gpud finds libnvidia-ml.so.1 in
// the distributions' directories under it (Debian's here), and says where
// it looked when it is in none.
func TestFindLibraryUnderDriverRoot(t *testing.T) {
	root := t.TempDir()
	os.Chmod(root, 0o755)
	if _, err := FindLibrary(root); err == nil || !strings.Contains(err.Error(), "/usr/lib64") {
		t.Fatalf("empty driver root: %v", err)
	}
	dir := filepath.Join(root, "usr/lib/x86_64-linux-gnu")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "libnvidia-ml.so.1"), []byte("\x7fELF"), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := FindLibrary(root)
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	if want := filepath.Join(dir, "libnvidia-ml.so.1"); f.Name() != want {
		t.Errorf("found %s, want %s", f.Name(), want)
	}
	// A copy that is there but unsafe is refused, not passed over for
	// another.
	os.Chmod(filepath.Join(dir, "libnvidia-ml.so.1"), 0o666)
	if _, err := FindLibrary(root); err == nil || !strings.Contains(err.Error(), "writable by other users") {
		t.Errorf("unsafe library: %v", err)
	}
}

// The double as awkward as the real library (issue 28 item 2), each
// through the load path: a driver/library mismatch fails Init until it is
// fixed; a GPU lost before Init leaves the other named; a MIG GPU's
// per-process utilization is NOT_SUPPORTED; a process's memory may be
// NVML_VALUE_NOT_AVAILABLE; one slow call slows that GPU only.
func TestNVMLDoubleAwkward(t *testing.T) {
	double := testutil.NewNVMLDouble(t, "", doubleGPUs()...)
	double.SetMismatch(t, true)
	lib := New(Load{Library: double.Library})
	if err := lib.Init(); err == nil || !strings.Contains(err.Error(), "mismatch") {
		t.Fatalf("Init with a version mismatch: %v, want the mismatch", err)
	}
	double.SetMismatch(t, false)
	double.Update(t, 0, func(g *testutil.NVMLGPU) { g.Lost = true }) // minor 1
	if err := lib.Init(); err != nil {
		t.Fatalf("Init again, one GPU lost: %v, want the other named", err)
	}
	t.Cleanup(lib.Shutdown)
	gpus := []occupancy.GPU{{Index: 0, Device: "/dev/nvidia0", Minor: 0}, {Index: 1, Device: "/dev/nvidia1", Minor: 1}}
	if unknown := lib.Annotate(gpus); !slices.Equal(unknown, []int{1}) {
		t.Errorf("unknown = %v, want [1] (lost at Init)", unknown)
	}
	if miss := lib.Missing(); len(miss) != 1 || !errors.Is(miss[0], gpumon.ErrGPUIsLost) {
		t.Errorf("Missing = %v, want NVML device 0 lost", miss)
	}
	double.Update(t, 1, func(g *testutil.NVMLGPU) { g.MIG = true }) // minor 0 = GPU 0
	double.Compute(t, 1, 4242, 50)
	double.SetProcesses(t, testutil.NVMLProcess{GPU: 1, PID: 4242, MemoryNA: true}, testutil.NVMLProcess{GPU: 1, PID: 7, Memory: 1 << 30})
	r := lib.SampleGPU(0, gpumon.AllSources)
	if err := r.Failed[gpumon.SrcUtilization]; !errors.Is(err, gpumon.ErrNotSupported) || !r.MIG {
		t.Errorf("MIG GPU utilization: %v (mig %v), want not supported", err, r.MIG)
	}
	if _, ok := r.ProcessMemory[4242]; ok || r.ProcessMemory[7] != 1<<30 {
		t.Errorf("process memory = %v, want 4242 unknown (NVML_VALUE_NOT_AVAILABLE), 7 at 1 GiB", r.ProcessMemory)
	}
	double.Slow(t, "nvmlDeviceGetMemoryInfo", 1, 600)
	start := time.Now()
	lib.SampleGPU(0, gpumon.SrcMemory)
	if d := time.Since(start); d < 500*time.Millisecond {
		t.Errorf("a slow call took %v, want 600 ms", d)
	}
}

// Event waits fail as the real library's may: timeouts are the quiet
// node's answer, an unknown error and a GPU fallen off the bus end the
// watch (the caller watches again), the latter reported as that GPU lost.
func TestNVMLDoubleEventErrors(t *testing.T) {
	double := testutil.NewNVMLDouble(t, "", doubleGPUs()...)
	lib := New(Load{Library: double.Library})
	if err := lib.Init(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(lib.Shutdown)
	lib.Annotate([]occupancy.GPU{{Index: 0, Minor: 0}, {Index: 1, Minor: 1}})
	watch := func() ([]HealthEvent, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		var got []HealthEvent
		err := lib.WatchHealth(ctx, func(e HealthEvent) { got = append(got, e) })
		return got, err
	}
	double.EventErr(t, "timeout", -1, 3)
	double.EventErr(t, "unknown", -1, 1)
	if _, err := watch(); err == nil || !strings.Contains(err.Error(), "Unknown") {
		t.Errorf("watch: %v, want the unknown error after three timeouts", err)
	}
	double.EventErr(t, "gpu_is_lost", 0, 1) // NVML index 0 = minor 1 = GPU 1
	got, err := watch()
	if !errors.Is(err, gpumon.ErrGPUIsLost) || len(got) != 1 || got[0].Kind != "lost" || got[0].GPU != 1 || !got[0].Critical {
		t.Errorf("watch: %v, %+v; want GPU 1 lost", err, got)
	}
	if _, err := watch(); err != nil {
		t.Errorf("watch after the scripted errors: %v, want it to run until the context ends", err)
	}
}
