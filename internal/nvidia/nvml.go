//go:build cgo

package nvidia

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/dl"
	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/gpud/gpud/internal/occupancy"
)

// NVML is the part of the NVIDIA driver gpud uses: UUIDs for discovery,
// per-process utilization as activity, memory, MIG mode and health events.
type NVML struct {
	// Lib is go-nvml's library: set by tests to go-nvml's mock; nil loads
	// the file Load names (the driver's, or the NVML double in tests).
	Lib  nvml.Interface
	Load Load

	info     Info
	devices  map[int]nvml.Device // minor number → device
	nvmlIdx  map[int]int         // minor number → NVML's index of the device
	lastSeen map[int]uint64      // per device: newest sample timestamp (µs)
	index    map[int]int         // minor number → GPU index, from Annotate
}

// dlFlags are go-nvml's own: the library is opened once more to learn why
// it cannot be, which go-nvml's Init does not say.
const dlFlags = dl.RTLD_LAZY | dl.RTLD_GLOBAL

// Init loads the library and maps devices by their minor number, which is N
// in /dev/nvidiaN.
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
	for i := 0; i < count; i++ {
		d, ret := n.Lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			return fmt.Errorf("%w: device %d: %v", ErrNVML, i, nvml.ErrorString(ret))
		}
		minor, ret := d.GetMinorNumber()
		if ret != nvml.SUCCESS {
			return fmt.Errorf("%w: device %d minor: %v", ErrNVML, i, nvml.ErrorString(ret))
		}
		n.devices[minor] = d
		n.nvmlIdx[minor] = i
	}
	return nil
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
		n.Lib = nvml.New()
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
	n.Lib = nvml.New(nvml.WithLibraryPath(fdPath))
	return func() { _ = lib.Close(); f.Close() }, nil
}

// Info says which library was loaded and the driver's version.
func (n *NVML) Info() Info { return n.info }

// Annotate fills in the UUID and NVML's index of each GPU that NVML knows
// by its minor number, and reports the GPUs NVML does not know.
func (n *NVML) Annotate(gpus []occupancy.GPU) (unknown []int) {
	n.index = map[int]int{}
	for i := range gpus {
		n.index[int(gpus[i].Minor)] = gpus[i].Index
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

// Sample reads each GPU: the newest time a process used it (SM or memory
// utilization above zero) since the previous call and which processes did,
// its memory and its processes' memory, MIG mode, and whether it is lost.
func (n *NVML) Sample() (map[int]Reading, error) {
	out := map[int]Reading{}
	var errs []error
	fail := func(what string, idx int, ret nvml.Return) {
		errs = append(errs, fmt.Errorf("%w: %s of GPU %d: %v", ErrNVML, what, idx, nvml.ErrorString(ret)))
	}
	for minor, d := range n.devices {
		key, ok := n.key(minor)
		if !ok {
			continue
		}
		var r Reading
		samples, ret := d.GetProcessUtilization(n.lastSeen[minor])
		switch ret {
		case nvml.SUCCESS:
			for _, s := range samples {
				n.lastSeen[minor] = max(n.lastSeen[minor], s.TimeStamp)
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
		case nvml.ERROR_NOT_FOUND: // no samples since lastSeen
		case nvml.ERROR_GPU_IS_LOST:
			r.Lost = true
		default:
			fail("utilization", minor, ret)
		}
		if m, ret := d.GetMemoryInfo(); ret == nvml.SUCCESS {
			r.Memory = &Memory{Total: m.Total, Used: m.Used}
		} else if ret == nvml.ERROR_GPU_IS_LOST {
			r.Lost = true
		} else if ret != nvml.ERROR_NOT_SUPPORTED {
			fail("memory", minor, ret)
		}
		if ps, ret := d.GetComputeRunningProcesses(); ret == nvml.SUCCESS {
			r.ProcessMemory = make(map[uint32]uint64, len(ps))
			for _, p := range ps {
				r.ProcessMemory[p.Pid] += p.UsedGpuMemory
			}
		} else if ret == nvml.ERROR_GPU_IS_LOST {
			r.Lost = true
		} else if ret != nvml.ERROR_NOT_SUPPORTED {
			fail("processes", minor, ret)
		}
		if cur, _, ret := d.GetMigMode(); ret == nvml.SUCCESS {
			r.MIG = cur == nvml.DEVICE_MIG_ENABLE
		} else if ret == nvml.ERROR_GPU_IS_LOST {
			r.Lost = true
		}
		out[key] = r
	}
	return out, errors.Join(errs...)
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
		if ret == nvml.ERROR_TIMEOUT {
			continue
		}
		if ret != nvml.SUCCESS {
			return fmt.Errorf("%w: waiting for events: %v", ErrNVML, nvml.ErrorString(ret))
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
}

// New returns the driver's NVML, loaded at Init from the file load names.
func New(load Load) Library { return &NVML{Load: load} }
