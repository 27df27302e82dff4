//go:build cgo

package nvidia

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/dl"
	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/gpud/gpud/internal/nvidia/gpumon"
	"github.com/gpud/gpud/internal/occupancy"
)

// NVML is the part of the NVIDIA driver gpud uses: UUIDs for discovery,
// per-process utilization as activity, memory, MIG mode and health events.
type NVML struct {
	// Lib is go-nvml's library: set by tests to go-nvml's mock; nil loads
	// the file Load names (the driver's, or the NVML double in tests).
	Lib  nvml.Interface
	Load Load

	// libFile is the file Lib was loaded from through /proc/self/fd/N,
	// held open while it may be loaded: the dynamic loader knows it by
	// that name, so N reused (libcuda's load) would get this library again.
	libFile *os.File

	info    Info
	ownLib  bool                // Lib is the one open made: loaded again after Shutdown
	devices map[int]nvml.Device // minor number → device
	nvmlIdx map[int]int         // minor number → NVML's index of the device
	index   map[int]int         // minor number → GPU index, from Annotate
	byGPU   map[int]int         // GPU index → minor number, from Annotate

	// mu guards what changes while GPUs are sampled, each on its own
	// goroutine (NVML is thread-safe: "it is safe to make simultaneous
	// NVML calls from multiple threads", nvml.h).
	mu       sync.Mutex
	lastSeen map[int]uint64 // per device: newest sample timestamp (µs)
	// sharesSeen is lastSeen for SrcShares, sampled on its own: one
	// reader's samples are not taken from the other.
	sharesSeen map[int]uint64
	missing    map[int]error // NVML index → why Init could not reach it
}

// valueNotAvailable is NVML_VALUE_NOT_AVAILABLE in an unsigned long long
// field: nvml.h "#define NVML_VALUE_NOT_AVAILABLE (-1)", "Special constant
// that some fields take when they are not available" (usedGpuMemory among
// them). It is never a number.
const valueNotAvailable = ^uint64(0)

// dlFlags are go-nvml's own: the library is opened once more to learn why
// it cannot be, which go-nvml's Init does not say.
const dlFlags = dl.RTLD_LAZY | dl.RTLD_GLOBAL

// Init loads the library and maps devices by their minor number, which is N
// in /dev/nvidiaN. A device NVML cannot reach (NVML_ERROR_GPU_IS_LOST: "the
// target GPU has fallen off the bus or is otherwise inaccessible", or any
// other error of its own) does not fail Init: nvmlInit_v2 exists so that
// "NVML can communicate with a GPU when other GPUs in the system are
// unstable or in a bad state" (nvml.h); Missing lists it.
func (n *NVML) Init() error {
	if n.Lib == nil {
		release, err := n.open()
		if err != nil {
			return err
		}
		// Held until go-nvml has loaded the same file.
		defer release()
	}
	if ret := n.Lib.Init(); ret != nvml.SUCCESS {
		if n.ownLib && ret == nvml.ERROR_LIBRARY_NOT_FOUND {
			n.Lib = nil // never loaded: the next Init opens the file again
			n.closeLibFile()
		}
		return fmt.Errorf("%w: init: %v", ErrNVML, nvml.ErrorString(ret))
	}
	if v, ret := n.Lib.SystemGetDriverVersion(); ret == nvml.SUCCESS {
		n.info.DriverVersion = v
	}
	count, ret := n.Lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return fmt.Errorf("%w: device count: %v", ErrNVML, nvml.ErrorString(ret))
	}
	n.devices = map[int]nvml.Device{}
	n.nvmlIdx = map[int]int{}
	n.lastSeen = map[int]uint64{}
	n.sharesSeen = map[int]uint64{}
	n.missing = map[int]error{}
	for i := 0; i < count; i++ {
		d, minor, err := n.device(i)
		if err != nil {
			n.missing[i] = err
			continue
		}
		n.devices[minor] = d
		n.nvmlIdx[minor] = i
	}
	return nil
}

// device asks NVML for device i's handle and minor number.
func (n *NVML) device(i int) (nvml.Device, int, error) {
	d, ret := n.Lib.DeviceGetHandleByIndex(i)
	if ret != nvml.SUCCESS {
		return nil, 0, retErr(fmt.Sprintf("device %d", i), ret)
	}
	minor, ret := d.GetMinorNumber()
	if ret != nvml.SUCCESS {
		return nil, 0, retErr(fmt.Sprintf("device %d minor", i), ret)
	}
	return d, minor, nil
}

// retErr is a failing call's error: ErrNVML, and gpumon's ErrGPUIsLost or
// ErrNotSupported where NVML said so.
func retErr(what string, ret nvml.Return) error {
	switch ret {
	case nvml.ERROR_GPU_IS_LOST:
		return fmt.Errorf("%w: %s: %w", ErrNVML, what, gpumon.ErrGPUIsLost)
	case nvml.ERROR_NOT_SUPPORTED:
		return fmt.Errorf("%w: %s: %w", ErrNVML, what, gpumon.ErrNotSupported)
	}
	return fmt.Errorf("%w: %s: %v", ErrNVML, what, nvml.ErrorString(ret))
}

// Missing asks NVML again for each device Init could not reach, and returns
// those it still cannot (NVML index → why). One that answers now is not
// added: the caller starts again to use it.
func (n *NVML) Missing() map[int]error {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := map[int]error{}
	for i := range n.missing {
		if _, _, err := n.device(i); err != nil {
			n.missing[i] = err
			out[i] = err
		}
	}
	return out
}

// open prepares the loading of the file Load names: checked and held
// open, then loaded through /proc/self/fd so that what was checked is what
// runs. It loads it once itself, to learn why it cannot be (go-nvml's Init
// does not say); release closes both after go-nvml's Init.
func (n *NVML) open() (release func(), err error) {
	root := n.Load.DriverRoot
	if n.Load.Library == "" && (root == "" || root == "/") {
		n.info.Library = "libnvidia-ml.so.1"
		lib := dl.New(n.info.Library, dlFlags)
		if err := lib.Open(); err != nil {
			return nil, fmt.Errorf("%w: loading %s (the dynamic loader's search): %w", ErrNVML, n.info.Library, err)
		}
		n.Lib, n.ownLib = nvml.New(), true
		return func() { _ = lib.Close() }, nil
	}
	var f *os.File
	if n.Load.Library == "" {
		f, err = FindLibrary(root)
	} else {
		f, err = OpenLibrary(root, n.Load.Library)
	}
	if err != nil {
		return nil, err
	}
	n.info.Library = f.Name()
	fdPath := fmt.Sprintf("/proc/self/fd/%d", f.Fd())
	lib := dl.New(fdPath, dlFlags)
	if err := lib.Open(); err != nil {
		f.Close()
		return nil, fmt.Errorf("%w: loading %s: %w", ErrNVML, f.Name(), err)
	}
	n.Lib, n.ownLib, n.libFile = nvml.New(nvml.WithLibraryPath(fdPath)), true, f
	return func() { _ = lib.Close() }, nil
}

func (n *NVML) closeLibFile() {
	if n.libFile != nil {
		n.libFile.Close()
		n.libFile = nil
	}
}

// Info says which library was loaded and the driver's version.
func (n *NVML) Info() Info { return n.info }

// Annotate fills in the UUID and NVML's index of each GPU that NVML knows
// by its minor number, and reports the GPUs NVML does not know.
func (n *NVML) Annotate(gpus []occupancy.GPU) (unknown []int) {
	n.index, n.byGPU = map[int]int{}, map[int]int{}
	for i := range gpus {
		n.index[int(gpus[i].Minor)] = gpus[i].Index
		n.byGPU[gpus[i].Index] = int(gpus[i].Minor)
		d, ok := n.devices[int(gpus[i].Minor)]
		if !ok {
			unknown = append(unknown, gpus[i].Index)
			continue
		}
		idx := n.nvmlIdx[int(gpus[i].Minor)]
		gpus[i].NVMLIndex = &idx
		if uuid, ret := d.GetUUID(); ret == nvml.SUCCESS {
			gpus[i].UUID = uuid
		}
		if name, ret := d.GetName(); ret == nvml.SUCCESS {
			gpus[i].Product = name
		}
	}
	n.annotateTopology(gpus)
	return unknown
}

// key is the index a device is reported under: gpud's index after
// Annotate (false for a device with no GPU node of ours: keyed by its minor
// it could pose as another GPU), its minor before.
func (n *NVML) key(minor int) (int, bool) {
	if n.index == nil {
		return minor, true
	}
	i, ok := n.index[minor]
	return i, ok
}

// Sample reads every GPU's sources (SampleGPU), keyed by gpud's index
// after Annotate (by minor before), and joins their failures.
func (n *NVML) Sample() (map[int]Reading, error) {
	out := map[int]Reading{}
	var errs []error
	for minor, d := range n.devices {
		key, ok := n.key(minor)
		if !ok {
			continue
		}
		r := n.sample(minor, d, gpumon.AllSources)
		for _, s := range gpumon.Sources {
			if err := r.Failed[s]; err != nil && !errors.Is(err, gpumon.ErrGPUIsLost) {
				errs = append(errs, err)
			}
		}
		out[key] = r
	}
	return out, errors.Join(errs...)
}

// SampleGPU reads the sources asked of GPU gpu (gpud's index, after
// Annotate): the newest time a process used it (SM or memory utilization
// above zero) since the previous call and which processes did, its memory
// and its processes' memory, MIG mode, and whether it is lost. Each GPU
// may be sampled on its own goroutine.
func (n *NVML) SampleGPU(gpu int, sources gpumon.Source) Reading {
	minor, ok := n.byGPU[gpu]
	d := n.devices[minor]
	if !ok || d == nil {
		return Reading{Failed: map[gpumon.Source]error{sources: fmt.Errorf("%w: GPU %d: not an NVML device", ErrNVML, gpu)}}
	}
	return n.sample(minor, d, sources)
}

// processUtilization is d.GetProcessUtilization, retried. go-nvml asks
// NVML for the count, then for that many samples; a sample taken between
// the two calls makes the second answer INSUFFICIENT_SIZE with a larger
// count, which go-nvml (v0.13) slices its buffer with: a panic that took
// gpud down (found by scripts/gpu-check.sh --double, whose CUDA double
// samples every 100 ms). That answer means "ask again".
func processUtilization(d nvml.Device, seen uint64) (samples []nvml.ProcessUtilizationSample, ret nvml.Return) {
	for range 3 {
		samples, ret = func() (s []nvml.ProcessUtilizationSample, r nvml.Return) {
			defer func() {
				if recover() != nil {
					s, r = nil, nvml.ERROR_INSUFFICIENT_SIZE
				}
			}()
			return d.GetProcessUtilization(seen)
		}()
		if ret != nvml.ERROR_INSUFFICIENT_SIZE {
			return samples, ret
		}
	}
	return samples, ret
}

// shares is each process's mean SM utilization over the sample periods
// samples cover, and the newest sample's time. A period is a timestamp:
// the processes sampled together share it, and a process without a
// sample in a period had no utilization in it ("only processes with
// non-zero utilization", docs/real-gpu.md), so it counts 0 there. Per
// period the processes' utilization sums to at most 100, so their means
// do too.
func shares(samples []nvml.ProcessUtilizationSample) (map[uint32]uint32, time.Time) {
	periods := map[uint64]bool{}
	sum := map[uint32]uint64{}
	var newest uint64
	for _, s := range samples {
		periods[s.TimeStamp] = true
		sum[s.Pid] += uint64(s.SmUtil)
		newest = max(newest, s.TimeStamp)
	}
	out := make(map[uint32]uint32, len(sum))
	for pid, v := range sum {
		out[pid] = uint32(v / uint64(len(periods)))
	}
	if newest == 0 {
		return out, time.Time{}
	}
	return out, time.UnixMicro(int64(newest))
}

func (n *NVML) sample(minor int, d nvml.Device, sources gpumon.Source) Reading {
	r := Reading{Failed: map[gpumon.Source]error{}}
	fail := func(s gpumon.Source, ret nvml.Return) {
		if ret == nvml.ERROR_GPU_IS_LOST {
			r.Lost = true
		}
		r.Failed[s] = retErr(fmt.Sprintf("%s of GPU %d", s, minor), ret)
	}
	if sources&gpumon.SrcUtilization != 0 {
		n.mu.Lock()
		seen := n.lastSeen[minor]
		n.mu.Unlock()
		samples, ret := processUtilization(d, seen)
		switch ret {
		case nvml.SUCCESS:
			for _, s := range samples {
				seen = max(seen, s.TimeStamp)
				if s.SmUtil == 0 && s.MemUtil == 0 {
					continue
				}
				if t := time.UnixMicro(int64(s.TimeStamp)); t.After(r.At) {
					r.At = t
				}
				if !slices.Contains(r.PIDs, s.Pid) {
					r.PIDs = append(r.PIDs, s.Pid)
				}
			}
			n.mu.Lock()
			n.lastSeen[minor] = max(n.lastSeen[minor], seen)
			n.mu.Unlock()
		case nvml.ERROR_NOT_FOUND: // no samples since lastSeen
		default:
			// NOT_SUPPORTED too: "On MIG-enabled GPUs, querying process
			// utilization is not currently supported" (nvml.h). This GPU's
			// activity is then its opens; the others' are not touched.
			fail(gpumon.SrcUtilization, ret)
		}
	}
	if sources&gpumon.SrcShares != 0 {
		n.mu.Lock()
		seen := n.sharesSeen[minor]
		n.mu.Unlock()
		if seen == 0 {
			// The first read: the driver's buffer holds seconds of
			// samples, some of processes long gone; the last second is
			// the GPU as it is now.
			seen = uint64(time.Now().Add(-time.Second).UnixMicro())
		}
		samples, ret := processUtilization(d, seen)
		switch ret {
		case nvml.SUCCESS, nvml.ERROR_NOT_FOUND: // NOT_FOUND: no process used it since
			r.Shares, r.SharesAt = shares(samples)
			for _, s := range samples {
				seen = max(seen, s.TimeStamp)
			}
			n.mu.Lock()
			n.sharesSeen[minor] = max(n.sharesSeen[minor], seen)
			n.mu.Unlock()
		default:
			fail(gpumon.SrcShares, ret) // NOT_SUPPORTED on a MIG-enabled GPU
		}
	}
	if sources&gpumon.SrcMemory != 0 {
		if m, ret := d.GetMemoryInfo(); ret == nvml.SUCCESS {
			if m.Total != valueNotAvailable && m.Used != valueNotAvailable && m.Used <= m.Total {
				r.Memory = &Memory{Total: m.Total, Used: m.Used}
			}
		} else if ret != nvml.ERROR_NOT_SUPPORTED {
			fail(gpumon.SrcMemory, ret)
		}
	}
	if sources&gpumon.SrcProcesses != 0 {
		if ps, ret := d.GetComputeRunningProcesses(); ret == nvml.SUCCESS {
			r.ProcessMemory = make(map[uint32]uint64, len(ps))
			unknown := map[uint32]bool{}
			for _, p := range ps {
				// "Set to NVML_VALUE_NOT_AVAILABLE if
				// nvmlProcessInfo_t->usedGpuMemory is not supported"
				// (nvml.h): the process's memory is unknown, not 2^64-1.
				if p.UsedGpuMemory == valueNotAvailable {
					unknown[p.Pid] = true
					continue
				}
				r.ProcessMemory[p.Pid] += p.UsedGpuMemory
			}
			for pid := range unknown {
				delete(r.ProcessMemory, pid)
			}
		} else if ret != nvml.ERROR_NOT_SUPPORTED {
			fail(gpumon.SrcProcesses, ret)
		}
	}
	if sources&gpumon.SrcMIG != 0 {
		if cur, _, ret := d.GetMigMode(); ret == nvml.SUCCESS {
			r.MIG = cur == nvml.DEVICE_MIG_ENABLE
		} else if ret == nvml.ERROR_GPU_IS_LOST {
			fail(gpumon.SrcMIG, ret)
		}
	}
	return r
}

// WatchHealth registers for XID and ECC events on every known GPU and
// reports them until ctx ends.
func (n *NVML) WatchHealth(ctx context.Context, report func(HealthEvent)) error {
	set, ret := n.Lib.EventSetCreate()
	if ret != nvml.SUCCESS {
		return fmt.Errorf("%w: event set: %v", ErrNVML, nvml.ErrorString(ret))
	}
	defer set.Free()
	const want = nvml.EventTypeXidCriticalError | nvml.EventTypeDoubleBitEccError | nvml.EventTypeSingleBitEccError
	registered := 0
	for minor, d := range n.devices {
		if _, ok := n.key(minor); !ok {
			continue
		}
		types, ret := d.GetSupportedEventTypes()
		if ret != nvml.SUCCESS || types&want == 0 {
			continue
		}
		if ret := d.RegisterEvents(types&want, set); ret == nvml.SUCCESS {
			registered++
		}
	}
	if registered == 0 {
		return fmt.Errorf("%w: no GPU offers XID or ECC events", ErrNVML)
	}
	for ctx.Err() == nil {
		data, ret := set.Wait(500)
		// "NVML_ERROR_TIMEOUT if no event arrived in specified timeout or
		// interrupt arrived" (nvml.h): the normal answer of a quiet node.
		if ret == nvml.ERROR_TIMEOUT {
			continue
		}
		if ret == nvml.ERROR_GPU_IS_LOST {
			// "if a GPU has fallen off the bus or is otherwise
			// inaccessible": that GPU is lost when the answer names it.
			if gpu, ok := n.gpuOf(data.Device); ok {
				report(HealthEvent{GPU: gpu, Kind: "lost", Critical: true})
			}
		}
		if ret != nvml.SUCCESS {
			// The caller watches again, with backoff, on a new set.
			return retErr("waiting for events", ret)
		}
		gpu, ok := n.gpuOf(data.Device)
		if !ok {
			continue
		}
		e := HealthEvent{GPU: gpu}
		switch {
		case data.EventType&nvml.EventTypeXidCriticalError != 0:
			e.Kind, e.XID, e.Critical = "xid", data.EventData, CriticalXID(data.EventData)
		case data.EventType&nvml.EventTypeDoubleBitEccError != 0:
			e.Kind, e.Critical = "double-bit-ecc", true
		case data.EventType&nvml.EventTypeSingleBitEccError != 0:
			e.Kind = "single-bit-ecc"
		default:
			continue
		}
		report(e)
	}
	return nil
}

// gpuOf finds gpud's index of an event's device: by handle, else by minor.
func (n *NVML) gpuOf(d nvml.Device) (int, bool) {
	for minor, dev := range n.devices {
		if dev == d {
			return n.key(minor)
		}
	}
	if d == nil {
		return 0, false
	}
	minor, ret := d.GetMinorNumber()
	if ret != nvml.SUCCESS {
		return 0, false
	}
	if _, ok := n.devices[minor]; !ok {
		return 0, false
	}
	return n.key(minor)
}

// Shutdown releases the library.
func (n *NVML) Shutdown() {
	if n.Lib != nil {
		n.Lib.Shutdown()
	}
	if n.ownLib {
		n.Lib = nil // go-nvml closed it: the next Init opens the file again
		// dlclose need not unload it (the NVML double stays): its name
		// stays taken, and so its descriptor (holdLoaded).
		if n.libFile != nil {
			holdLoaded(n.libFile)
			n.libFile = nil
		}
	}
}

// New returns the driver's NVML, loaded at Init from the file load names.
func New(load Load) Library { return &NVML{Load: load} }
