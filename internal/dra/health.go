package dra

import (
	"errors"
	"slices"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/dynamic-resource-allocation/resourceslice"

	"github.com/gpud/gpud/internal/nvidia/gpumon"
	"github.com/gpud/gpud/internal/occupancy"
)

// TaintKey is the key of the device taint a shared GPU found unhealthy
// carries in the slice; its value names the reason (xid-48, gpu-lost,
// double-bit-ecc).
const TaintKey = DriverName + "/unhealthy"

// TaintLostValue is the taint's value for a GPU fallen off the bus.
const TaintLostValue = "gpu-lost"

// xidLost is NVIDIA's "GPU has fallen off the bus": the same as NVML
// answering GPU_IS_LOST.
const xidLost = "XID 79"

// healthTaint is the device taint of a GPU with health h, nil when it is
// healthy. A lost GPU (GPU_IS_LOST, XID 79) gets NoExecute: nothing on it
// can go on, so the device-taint eviction controller deletes the pods
// whose claims have it. Any other critical event (a critical XID, a
// double-bit ECC error) gets NoSchedule: no new claim is allocated on it,
// and the pods already using it keep running, as NVIDIA's device plugin
// leaves them (many such errors hit one context, not the others). The
// taint's time is when gpud saw the event: the eviction controller counts
// tolerationSeconds from it.
func healthTaint(h occupancy.GPUHealth) *resourceapi.DeviceTaint {
	if !h.Unhealthy {
		return nil
	}
	t := &resourceapi.DeviceTaint{Key: TaintKey, Effect: resourceapi.DeviceTaintEffectNoSchedule, Value: taintValue(h.Reason)}
	if strings.HasPrefix(h.Reason, gpumon.LostReason) || h.Reason == xidLost {
		t.Effect = resourceapi.DeviceTaintEffectNoExecute
		if h.Reason != xidLost {
			t.Value = TaintLostValue
		}
	}
	if !h.Since.IsZero() {
		t.TimeAdded = &metav1.Time{Time: h.Since}
	}
	return t
}

// taintValue makes reason a label value (at most 63 of [a-z0-9._-],
// alphanumeric at both ends): "XID 48" is xid-48.
func taintValue(reason string) string {
	b := []byte(strings.ToLower(reason))
	for i, c := range b {
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '.' && c != '_' {
			b[i] = '-'
		}
	}
	v := string(b)
	if len(v) > 63 {
		v = v[:63]
	}
	v = strings.Trim(v, "-._")
	if v == "" {
		return "unhealthy"
	}
	return v
}

// taintsOf is the device's taints in the slice.
func taintsOf(g GPU) []resourceapi.DeviceTaint {
	if g.Taint == nil {
		return nil
	}
	return []resourceapi.DeviceTaint{*g.Taint}
}

// memoryOf is the memory to publish for g: NVML's now, or, for a tainted
// GPU NVML no longer answers for (lost), the last it gave, so that the
// device stays in the slice with its taint.
func (d *Driver) memoryOf(g GPU) uint64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	name := g.deviceName()
	if g.MemoryTotal > 0 {
		if d.totals == nil {
			d.totals = map[string]uint64{}
		}
		d.totals[name] = g.MemoryTotal
		return g.MemoryTotal
	}
	if g.Taint != nil {
		return d.totals[name]
	}
	return 0
}

// taintsDropped reports whether err says the API server dropped the
// slice's device taints (DRADeviceTaints off): from then on an unhealthy
// GPU leaves the slice, as before taints, rather than stay schedulable.
func (d *Driver) taintsDropped(err error) bool {
	var dropped *resourceslice.DroppedFieldsError
	if !errors.As(err, &dropped) || !slices.Contains(dropped.DisabledFeatures(), "DRADeviceTaints") {
		return false
	}
	if !d.noTaints.Swap(true) {
		d.cfg.Log.Warn("the API server drops DRA device taints (feature gate DRADeviceTaints off): unhealthy GPUs leave the ResourceSlice instead", "error", err)
		d.Changed()
	}
	return true
}
