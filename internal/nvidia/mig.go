//go:build cgo

package nvidia

import (
	"fmt"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/gpud/gpud/internal/nvidia/gpumon"
)

// MIGDevices lists the MIG devices of GPU gpu (gpud's index, after
// Annotate): each one's GPU and compute instance, MIG UUID, profile and
// memory. gpumon makes each GPU instance a GPU of its own.
func (n *NVML) MIGDevices(gpu int) ([]gpumon.MIGDevice, error) {
	minor, ok := n.byGPU[gpu]
	d := n.devices[minor]
	if !ok || d == nil {
		return nil, fmt.Errorf("%w: GPU %d: not an NVML device", ErrNVML, gpu)
	}
	// "Returns zero if MIG is not supported or enabled" (nvml.h).
	count, ret := d.GetMaxMigDeviceCount()
	if ret != nvml.SUCCESS {
		return nil, retErr(fmt.Sprintf("MIG device count of GPU %d", minor), ret)
	}
	var out []gpumon.MIGDevice
	for i := 0; i < count; i++ {
		md, ret := d.GetMigDeviceHandleByIndex(i)
		if ret == nvml.ERROR_NOT_FOUND {
			continue // "if no valid MIG device was found at index": a hole
		}
		if ret != nvml.SUCCESS {
			return nil, retErr(fmt.Sprintf("MIG device %d of GPU %d", i, minor), ret)
		}
		gi, ret := md.GetGpuInstanceId()
		if ret != nvml.SUCCESS {
			return nil, retErr(fmt.Sprintf("GPU instance of MIG device %d of GPU %d", i, minor), ret)
		}
		ci, ret := md.GetComputeInstanceId()
		if ret != nvml.SUCCESS {
			return nil, retErr(fmt.Sprintf("compute instance of MIG device %d of GPU %d", i, minor), ret)
		}
		m := gpumon.MIGDevice{GI: gi, CI: ci}
		if uuid, ret := md.GetUUID(); ret == nvml.SUCCESS {
			m.UUID = uuid
		}
		if name, ret := md.GetName(); ret == nvml.SUCCESS {
			m.Profile = migProfile(name)
		}
		if mem, ret := md.GetMemoryInfo(); ret == nvml.SUCCESS && mem.Total != valueNotAvailable {
			m.MemoryTotal = mem.Total
		}
		out = append(out, m)
	}
	return out, nil
}

// migProfile is the profile in a MIG device's name, which NVML gives as
// "<GPU name> MIG <profile>" (e.g. "NVIDIA A100-SXM4-40GB MIG 1g.5gb"); ""
// when the name has none.
func migProfile(name string) string {
	_, p, ok := strings.Cut(name, " MIG ")
	if !ok {
		return ""
	}
	return strings.TrimSpace(p)
}
