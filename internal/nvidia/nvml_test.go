//go:build cgo

package nvidia

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	"github.com/gpud/gpud/internal/nvidia/gpumon"
	"github.com/gpud/gpud/internal/occupancy"
)

// newServer returns a mock DGX A100 whose device i has minor number 7-i, so
// that NVML's order and the minor numbers differ.
func newServer() *dgxa100.Server {
	s := dgxa100.New()
	for i, d := range s.Devices {
		dd := d.(*dgxa100.Device)
		dd.Minor = len(s.Devices) - 1 - i
		dd.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) { return nil, nvml.SUCCESS }
		// go-nvml's DGX A100 answers no NVLink call (topology_test.go
		// asks the NVML double about NVLinks).
		dd.GetNvLinkStateFunc = func(int) (nvml.EnableState, nvml.Return) { return 0, nvml.ERROR_NOT_SUPPORTED }
	}
	return s
}

func device(s *dgxa100.Server, minor int) *dgxa100.Device {
	for _, d := range s.Devices {
		if dd := d.(*dgxa100.Device); dd.Minor == minor {
			return dd
		}
	}
	panic("no device of that minor")
}

func TestNVMLInitAnnotate(t *testing.T) {
	s := newServer()
	n := &NVML{Lib: s}
	if err := n.Init(); err != nil {
		t.Fatal(err)
	}
	gpus := testGPUs(8)
	gpus = append(gpus, occupancy.GPU{Index: 8, Device: "/dev/nvidia8", Minor: 8}, occupancy.GPU{Index: 11, Device: "/dev/nvidia11", Minor: 42})
	unknown := n.Annotate(gpus)
	if !slices.Equal(unknown, []int{8, 11}) {
		t.Errorf("unknown = %v, want [8 11]", unknown)
	}
	for _, g := range gpus[:8] {
		want := device(s, int(g.Minor)).UUID
		if g.UUID != want || !strings.HasPrefix(g.UUID, "GPU-") {
			t.Errorf("GPU %d (minor %d) UUID = %q, want %q", g.Index, g.Minor, g.UUID, want)
		}
	}
	// The mapping is by minor number, not NVML's index: minor 0 is NVML device 7.
	if got, want := gpus[0].UUID, s.Devices[7].(*dgxa100.Device).UUID; got != want {
		t.Errorf("minor 0 UUID = %q, want NVML device 7's %q", got, want)
	}
	// NVML's index is the device's place in NVML's list, not the minor.
	for _, g := range gpus[:8] {
		if g.NVMLIndex == nil || s.Devices[*g.NVMLIndex].(*dgxa100.Device).Minor != int(g.Minor) {
			t.Errorf("GPU %d (minor %d): NVML index %v, not the NVML device of that minor", g.Index, g.Minor, g.NVMLIndex)
		}
	}
	if gpus[0].NVMLIndex == nil || *gpus[0].NVMLIndex != 7 {
		t.Errorf("minor 0: NVML index %v, want 7", gpus[0].NVMLIndex)
	}
	for _, g := range gpus[8:] {
		if g.UUID != "" || g.NVMLIndex != nil {
			t.Errorf("unknown GPU %d got UUID %q, NVML index %v", g.Index, g.UUID, g.NVMLIndex)
		}
	}

	// A UUID NVML cannot give is left empty, and the GPU is still known.
	device(s, 3).GetUUIDFunc = func() (string, nvml.Return) { return "", nvml.ERROR_UNKNOWN }
	gpus = testGPUs(4)
	if unknown := n.Annotate(gpus); len(unknown) != 0 {
		t.Errorf("unknown = %v, want none", unknown)
	}
	if gpus[3].UUID != "" || gpus[2].UUID == "" {
		t.Errorf("UUIDs = %q %q, want one and none", gpus[2].UUID, gpus[3].UUID)
	}
}

func TestNVMLInitErrors(t *testing.T) {
	for _, tc := range []struct {
		name    string
		breakIt func(*dgxa100.Server)
		msg     string
	}{
		{"init", func(s *dgxa100.Server) {
			s.InitFunc = func() nvml.Return { return nvml.ERROR_LIBRARY_NOT_FOUND }
		}, "init"},
		{"count", func(s *dgxa100.Server) {
			s.DeviceGetCountFunc = func() (int, nvml.Return) { return 0, nvml.ERROR_UNINITIALIZED }
		}, "device count"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newServer()
			tc.breakIt(s)
			err := (&NVML{Lib: s}).Init()
			if !errors.Is(err, ErrNVML) {
				t.Fatalf("Init err = %v, want ErrNVML", err)
			}
			if !strings.Contains(err.Error(), tc.msg) {
				t.Errorf("Init err = %q, want it to name %q", err, tc.msg)
			}
		})
	}
}

// One device NVML cannot reach (fallen off the bus, or failing a call of
// its own) does not fail Init: the others are named and sampled, and
// Missing says which and why, asking again each time.
func TestNVMLInitOneDeviceUnreachable(t *testing.T) {
	s := newServer()
	lost := true
	handle := s.DeviceGetHandleByIndexFunc
	s.DeviceGetHandleByIndexFunc = func(i int) (nvml.Device, nvml.Return) {
		if i == 2 && lost {
			return nil, nvml.ERROR_GPU_IS_LOST
		}
		if handle != nil {
			return handle(i)
		}
		return s.Devices[i], nvml.SUCCESS
	}
	s.Devices[5].(*dgxa100.Device).GetMinorNumberFunc = func() (int, nvml.Return) { return 0, nvml.ERROR_NOT_SUPPORTED }
	n := &NVML{Lib: s}
	if err := n.Init(); err != nil {
		t.Fatalf("Init with one lost device: %v, want the others named", err)
	}
	gpus := testGPUs(8)
	unknown := n.Annotate(gpus)
	// NVML device 2 is minor 5, device 5 minor 2 (newServer).
	if !slices.Equal(unknown, []int{2, 5}) {
		t.Errorf("unknown = %v, want [2 5] (the minors of NVML devices 5 and 2)", unknown)
	}
	miss := n.Missing()
	if len(miss) != 2 || !errors.Is(miss[2], gpumon.ErrGPUIsLost) || !errors.Is(miss[5], gpumon.ErrNotSupported) {
		t.Errorf("Missing = %v, want device 2 lost and device 5 not supported", miss)
	}
	if r := n.SampleGPU(0, gpumon.SrcMemory|gpumon.SrcProcesses); len(r.Failed) != 0 || r.Memory == nil {
		t.Errorf("GPU 0 = %+v, want read", r)
	}
	lost = false
	if miss := n.Missing(); len(miss) != 1 {
		t.Errorf("Missing after device 2 answers = %v, want device 5 alone", miss)
	}
}

// utilization makes a device report samples, recording the lastSeen it is
// asked with.
type utilization struct {
	mu      sync.Mutex
	asked   []uint64
	samples []nvml.ProcessUtilizationSample
	ret     nvml.Return
}

func (u *utilization) install(d *dgxa100.Device) {
	d.GetProcessUtilizationFunc = func(lastSeen uint64) ([]nvml.ProcessUtilizationSample, nvml.Return) {
		u.mu.Lock()
		defer u.mu.Unlock()
		u.asked = append(u.asked, lastSeen)
		return u.samples, u.ret
	}
}

func (u *utilization) set(ret nvml.Return, samples ...nvml.ProcessUtilizationSample) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.ret, u.samples = ret, samples
}

func TestNVMLSample(t *testing.T) {
	s := newServer()
	n := &NVML{Lib: s}
	if err := n.Init(); err != nil {
		t.Fatal(err)
	}
	util := map[int]*utilization{}
	for minor := 0; minor < 8; minor++ {
		u := &utilization{ret: nvml.ERROR_NOT_FOUND}
		u.install(device(s, minor))
		util[minor] = u
	}
	const base = uint64(1_740_000_000_000_000) // µs since the epoch
	util[0].set(nvml.SUCCESS,
		nvml.ProcessUtilizationSample{Pid: 1, TimeStamp: base + 100, SmUtil: 0, MemUtil: 0},
		nvml.ProcessUtilizationSample{Pid: 1, TimeStamp: base + 300, SmUtil: 5},
		nvml.ProcessUtilizationSample{Pid: 2, TimeStamp: base + 200, SmUtil: 90},
		nvml.ProcessUtilizationSample{Pid: 2, TimeStamp: base + 400, SmUtil: 0}, // newest, but idle
	)
	util[1].set(nvml.SUCCESS, nvml.ProcessUtilizationSample{Pid: 3, TimeStamp: base + 50, MemUtil: 1}) // memory only
	util[2].set(nvml.SUCCESS, nvml.ProcessUtilizationSample{Pid: 4, TimeStamp: base + 70})             // all zero
	util[3].set(nvml.SUCCESS)                                                                          // no samples
	util[4].set(nvml.ERROR_UNKNOWN)
	util[6].set(nvml.SUCCESS, nvml.ProcessUtilizationSample{Pid: 5, TimeStamp: base + 999, EncUtil: 50}) // encoder only

	got, err := n.Sample()
	if !errors.Is(err, ErrNVML) || !strings.Contains(err.Error(), "GPU 4") {
		t.Errorf("Sample err = %v, want ErrNVML for GPU 4", err)
	}
	want := map[int]time.Time{0: time.UnixMicro(int64(base + 300)), 1: time.UnixMicro(int64(base + 50))}
	if len(got) != 8 || len(active(got)) != len(want) {
		t.Errorf("Sample = %v, want %v", got, want)
	}
	for idx, w := range want {
		if !got[idx].At.Equal(w) {
			t.Errorf("GPU %d active at %v, want %v", idx, got[idx], w)
		}
	}
	if p := got[0].PIDs; len(p) != 2 || !slices.Contains(p, 1) || !slices.Contains(p, 2) {
		t.Errorf("GPU 0 used by %v, want pids 1 and 2", p)
	}
	for minor, u := range util {
		if len(u.asked) != 1 || u.asked[0] != 0 {
			t.Errorf("GPU %d asked with lastSeen %v, want [0]", minor, u.asked)
		}
	}

	// The next call asks for samples after the newest seen, active or not.
	util[0].set(nvml.ERROR_NOT_FOUND)
	util[1].set(nvml.ERROR_NOT_FOUND)
	util[4].set(nvml.SUCCESS, nvml.ProcessUtilizationSample{Pid: 6, TimeStamp: base + 1000, SmUtil: 1})
	got, err = n.Sample()
	if err != nil {
		t.Errorf("second Sample err = %v", err)
	}
	if a := active(got); len(a) != 1 || !got[4].At.Equal(time.UnixMicro(int64(base+1000))) {
		t.Errorf("second Sample = %v, want GPU 4 only", got)
	}
	for minor, wantSeen := range map[int]uint64{0: base + 400, 1: base + 50, 2: base + 70, 3: 0, 4: 0, 5: 0, 6: base + 999} {
		if a := util[minor].asked; len(a) != 2 || a[1] != wantSeen {
			t.Errorf("GPU %d asked with %v, want second lastSeen %d", minor, a, wantSeen)
		}
	}
}

func TestNVMLAllFailing(t *testing.T) {
	s := newServer()
	n := &NVML{Lib: s}
	if err := n.Init(); err != nil {
		t.Fatal(err)
	}
	for minor := 0; minor < 8; minor++ {
		u := &utilization{ret: nvml.ERROR_UNKNOWN}
		u.install(device(s, minor))
	}
	got, err := n.Sample()
	if len(active(got)) != 0 {
		t.Errorf("Sample = %v, want no activity", got)
	}
	if !errors.Is(err, ErrNVML) || strings.Count(err.Error(), "utilization of GPU") != 8 {
		t.Errorf("Sample err = %v, want 8 joined ErrNVML errors", err)
	}

	// A GPU fallen off the bus is no error to log each second: it is lost.
	for minor := 0; minor < 8; minor++ {
		u := &utilization{ret: nvml.ERROR_GPU_IS_LOST}
		u.install(device(s, minor))
	}
	got, err = n.Sample()
	if err != nil || len(got) != 8 || !got[3].Lost {
		t.Errorf("lost GPUs: %v, %v; want every GPU lost, no error", got, err)
	}
}

// active keeps the readings with use.
func active(rs map[int]Reading) map[int]Reading {
	out := map[int]Reading{}
	for i, r := range rs {
		if !r.At.IsZero() {
			out[i] = r
		}
	}
	return out
}

func TestNVMLShutdown(t *testing.T) {
	s := newServer()
	var calls int
	s.ShutdownFunc = func() nvml.Return { calls++; return nvml.SUCCESS }
	n := &NVML{Lib: s}
	if err := n.Init(); err != nil {
		t.Fatal(err)
	}
	n.Shutdown()
	if calls != 1 {
		t.Errorf("Shutdown calls = %d, want 1", calls)
	}
}

// After Annotate, a device without a GPU node of ours is not sampled: its
// minor number must not pose as the index of another GPU.
func TestNVMLSampleOnlyAnnotatedDevices(t *testing.T) {
	s := newServer()
	n := &NVML{Lib: s}
	if err := n.Init(); err != nil {
		t.Fatal(err)
	}
	// Our only GPU is index 0 with minor 5; NVML's minor-0 device is busy.
	n.Annotate([]occupancy.GPU{{Index: 0, Device: "/dev/nvidia5", Minor: 5}})
	for minor := 0; minor < 8; minor++ {
		u := &utilization{ret: nvml.ERROR_NOT_FOUND}
		if minor == 0 {
			u.ret, u.samples = nvml.SUCCESS, []nvml.ProcessUtilizationSample{{Pid: 9, TimeStamp: 1_740_000_000_000_000, SmUtil: 80}}
		}
		u.install(device(s, minor))
	}
	got, err := n.Sample()
	if _, ok := got[0]; err != nil || len(got) != 1 || !ok || len(active(got)) != 0 {
		t.Fatalf("Sample = %v, %v; want GPU 0 only, idle (minor 0 is not one of our GPUs)", got, err)
	}
}

func testGPUs(n int) []occupancy.GPU {
	var gpus []occupancy.GPU
	for i := 0; i < n; i++ {
		gpus = append(gpus, occupancy.GPU{Index: i, Device: fmt.Sprintf("/dev/nvidia%d", i), Major: 195, Minor: uint32(i)})
	}
	return gpus
}
