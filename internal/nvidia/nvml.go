//go:build cgo

package nvidia

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/gpud/gpud/internal/occupancy"
)

// NVML is the part of the NVIDIA driver gpud uses: UUIDs for discovery and
// per-process utilization as activity. Tests use go-nvml's own mock.
type NVML struct {
	Lib nvml.Interface

	devices  map[int]nvml.Device // minor number → device
	nvmlIdx  map[int]int         // minor number → NVML's index of the device
	lastSeen map[int]uint64      // per device: newest sample timestamp (µs)
	index    map[int]int         // minor number → GPU index, from Annotate
}

// Init initializes the library and maps devices by their minor number,
// which is N in /dev/nvidiaN.
func (n *NVML) Init() error {
	if ret := n.Lib.Init(); ret != nvml.SUCCESS {
		return fmt.Errorf("%w: init: %v", ErrNVML, nvml.ErrorString(ret))
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
	}
	return unknown
}

// Sample reports, per GPU index (per minor number before Annotate), the
// newest time a process used it (SM or memory utilization above zero) since
// the previous call, and which processes did.
func (n *NVML) Sample() (map[int]Activity, error) {
	out := map[int]Activity{}
	var errs []error
	for idx, d := range n.devices {
		key := idx
		if n.index != nil {
			// After Annotate, a device with no GPU node of ours is not
			// sampled: keyed by its minor it could pose as another GPU.
			i, ok := n.index[idx]
			if !ok {
				continue
			}
			key = i
		}
		samples, ret := d.GetProcessUtilization(n.lastSeen[idx])
		if ret == nvml.ERROR_NOT_FOUND {
			continue // no samples since lastSeen
		}
		if ret != nvml.SUCCESS {
			errs = append(errs, fmt.Errorf("%w: utilization of GPU %d: %v", ErrNVML, idx, nvml.ErrorString(ret)))
			continue
		}
		for _, s := range samples {
			if s.TimeStamp > n.lastSeen[idx] {
				n.lastSeen[idx] = s.TimeStamp
			}
			if s.SmUtil == 0 && s.MemUtil == 0 {
				continue
			}
			a := out[key]
			if t := time.UnixMicro(int64(s.TimeStamp)); t.After(a.At) {
				a.At = t
			}
			if !slices.Contains(a.PIDs, s.Pid) {
				a.PIDs = append(a.PIDs, s.Pid)
			}
			out[key] = a
		}
	}
	return out, errors.Join(errs...)
}

// Shutdown releases the library.
func (n *NVML) Shutdown() { n.Lib.Shutdown() }

// New returns the driver's NVML, loaded from libnvidia-ml.so.1 at Init.
func New() Library { return &NVML{Lib: nvml.New()} }
