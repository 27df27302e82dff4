package occupancy

import (
	"errors"
	"fmt"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// ErrNVML wraps a failing NVML call.
var ErrNVML = errors.New("occupancy: nvml")

// NVML is the part of the NVIDIA driver gpud uses: UUIDs for discovery and
// per-process utilization as activity. Tests use go-nvml's own mock.
type NVML struct {
	Lib nvml.Interface

	devices  map[int]nvml.Device // GPU index (minor number) → device
	lastSeen map[int]uint64      // per device: newest sample timestamp (µs)
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
	}
	return nil
}

// Annotate fills in the UUID of each GPU that NVML knows by its minor
// number, and reports the GPUs NVML does not know.
func (n *NVML) Annotate(gpus []GPU) (unknown []int) {
	for i := range gpus {
		d, ok := n.devices[int(gpus[i].Minor)]
		if !ok {
			unknown = append(unknown, gpus[i].Index)
			continue
		}
		if uuid, ret := d.GetUUID(); ret == nvml.SUCCESS {
			gpus[i].UUID = uuid
		}
	}
	return unknown
}

// Sample reports, per GPU index, the newest time a process used it (SM or
// memory utilization above zero) since the previous call.
func (n *NVML) Sample() (map[int]time.Time, error) {
	out := map[int]time.Time{}
	var errs []error
	for idx, d := range n.devices {
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
			t := time.UnixMicro(int64(s.TimeStamp))
			if t.After(out[idx]) {
				out[idx] = t
			}
		}
	}
	return out, errors.Join(errs...)
}

// Shutdown releases the library.
func (n *NVML) Shutdown() { n.Lib.Shutdown() }
