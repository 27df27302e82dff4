package dra

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/dynamic-resource-allocation/resourceslice"

	"github.com/gpud/gpud/internal/nvidia/gpumon"
	"github.com/gpud/gpud/internal/occupancy"
	"github.com/gpud/gpud/internal/sharing"
)

func TestHealthTaintSaysWhyWithTheEffectTheEventNeeds(t *testing.T) {
	since := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		reason, value string
		effect        resourceapi.DeviceTaintEffect
	}{
		{"XID 48", "xid-48", resourceapi.DeviceTaintEffectNoSchedule},
		{"double-bit-ecc", "double-bit-ecc", resourceapi.DeviceTaintEffectNoSchedule},
		{"XID 79", "xid-79", resourceapi.DeviceTaintEffectNoExecute}, // fallen off the bus
		{gpumon.LostReason, TaintLostValue, resourceapi.DeviceTaintEffectNoExecute},
		{gpumon.LostReason + " at start (NVML device 1)", TaintLostValue, resourceapi.DeviceTaintEffectNoExecute},
		{"", "unhealthy", resourceapi.DeviceTaintEffectNoSchedule},
		{strings.Repeat("x", 80) + " ", strings.Repeat("x", 63), resourceapi.DeviceTaintEffectNoSchedule},
	} {
		got := healthTaint(occupancy.GPUHealth{Unhealthy: true, Reason: tc.reason, Since: since})
		if got == nil || got.Key != TaintKey || got.Value != tc.value || got.Effect != tc.effect || got.TimeAdded == nil || !got.TimeAdded.Time.Equal(since) {
			t.Errorf("reason %q: taint %+v, want %s=%s:%s added %v", tc.reason, got, TaintKey, tc.value, tc.effect, since)
		}
	}
	if got := healthTaint(occupancy.GPUHealth{Events: 3}); got != nil {
		t.Errorf("healthy GPU (non-critical events only): taint %+v", got)
	}
}

// A shared GPU found unhealthy keeps its place in the source with a taint;
// one not shared gets none (it is not in the slice at all).
func TestGPUSourceTaintsOnlySharedUnhealthyGPUs(t *testing.T) {
	mem := &occupancy.Memory{Total: 16 << 30}
	sick := occupancy.GPUHealth{Unhealthy: true, Reason: "XID 48"}
	src := &GPUSource{Ledger: fakeLedger{
		{GPU: occupancy.GPU{Index: 0, UUID: "GPU-a"}, Memory: mem, Health: sick},
		{GPU: occupancy.GPU{Index: 1, UUID: "GPU-b"}, Memory: mem, Health: sick},
	}, DriverVersion: func() string { return "" }, Shared: []string{"0"}, Driver: &Driver{}}
	gpus := src.GPUs()
	if g := gpus[0]; g.Offered || g.Taint == nil || g.Taint.Value != "xid-48" || g.Why != "unhealthy: XID 48" {
		t.Errorf("shared unhealthy GPU: %+v", g)
	}
	if g := gpus[1]; g.Offered || g.Taint != nil {
		t.Errorf("unshared unhealthy GPU: %+v", g)
	}
}

// mutableLedger is a ledger whose GPUs a test changes while the driver runs.
type mutableLedger struct {
	mu   sync.Mutex
	gpus []occupancy.GPUView
}

func (l *mutableLedger) Snapshot(time.Time) occupancy.Snapshot {
	l.mu.Lock()
	defer l.mu.Unlock()
	return occupancy.Snapshot{GPUs: append([]occupancy.GPUView(nil), l.gpus...)}
}

func (l *mutableLedger) set(i int, f func(*occupancy.GPUView)) {
	l.mu.Lock()
	f(&l.gpus[i])
	l.mu.Unlock()
}

// From the ledger's health to the ResourceSlice in the API server (client-go's
// fake): a critical XID taints the GPU's device NoSchedule, a lost GPU (NVML
// no longer gives its memory) NoExecute with its last memory, each within a
// second of Changed (what gpumon's Unhealthy hook calls); the GPU healthy
// again (gpud restarted) has no taint. Tainted, it is not Offered.
func TestSliceTaintsAnUnhealthyGPUWithinASecond(t *testing.T) {
	state, cdi := dirs(t)
	dir := filepath.Dir(state)
	cs := fake.NewClientset()
	servedResources(cs)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if _, err := cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node1", UID: "node1-uid"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	mem := func() *occupancy.Memory { return &occupancy.Memory{Total: 16 << 30} }
	ledger := &mutableLedger{gpus: []occupancy.GPUView{
		{GPU: occupancy.GPU{Index: 0, UUID: uuid0}, Memory: mem()},
		{GPU: occupancy.GPU{Index: 1, UUID: uuid1}, Memory: mem()},
	}}
	src := &GPUSource{Ledger: ledger, DriverVersion: func() string { return "570.86.15" }, Shared: []string{"all"}}
	d, err := New(Config{NodeName: "node1", Client: cs, CDIDir: cdi, StateDir: state,
		PluginDir: filepath.Join(dir, "plugins/gpud.io"), RegistryDir: filepath.Join(dir, "registry"),
		Reserve: 512 << 20, Min: 256 << 20, Default: 4 << 30, GPUs: src.GPUs, Book: sharing.NewBook(),
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	src.Driver = d
	done := make(chan struct{})
	go func() { defer close(done); d.Run(ctx) }()
	defer func() { cancel(); <-done }()

	// device is GPU 1's device in the slice (nil while it is not there).
	device := func() *resourceapi.Device {
		l, err := cs.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
		if err != nil {
			return nil
		}
		for _, s := range l.Items {
			for i, dev := range s.Spec.Devices {
				if s.Spec.Driver == DriverName && dev.Name == strings.ToLower(uuid1) {
					return &s.Spec.Devices[i]
				}
			}
		}
		return nil
	}
	// waitFor waits for GPU 1's device to be as ok says and returns how long it took.
	waitFor := func(what string, ok func(*resourceapi.Device) bool) time.Duration {
		t.Helper()
		t0 := time.Now()
		for !ok(device()) {
			if time.Since(t0) > 10*time.Second {
				t.Fatalf("%s: never; device %+v", what, device())
			}
			time.Sleep(time.Millisecond)
		}
		return time.Since(t0)
	}
	tainted := func(effect resourceapi.DeviceTaintEffect, value string) func(*resourceapi.Device) bool {
		return func(dev *resourceapi.Device) bool {
			return dev != nil && len(dev.Taints) == 1 && dev.Taints[0].Key == TaintKey &&
				dev.Taints[0].Effect == effect && dev.Taints[0].Value == value
		}
	}
	waitFor("GPU 1 in the slice, untainted", func(dev *resourceapi.Device) bool { return dev != nil && len(dev.Taints) == 0 })
	if !d.Offers(1) {
		t.Error("healthy GPU 1 not offered")
	}

	// A critical XID: NoSchedule.
	since := time.Now()
	ledger.set(1, func(g *occupancy.GPUView) {
		g.Health = occupancy.GPUHealth{Unhealthy: true, Reason: "XID 48", Since: since}
	})
	d.Changed()
	if took := waitFor("NoSchedule xid-48", tainted(resourceapi.DeviceTaintEffectNoSchedule, "xid-48")); took > time.Second {
		t.Errorf("the XID's taint took %v, want within 1s", took)
	}
	if dev := device(); dev.Taints[0].TimeAdded == nil || !dev.Taints[0].TimeAdded.Time.Equal(since.Round(time.Second)) {
		t.Errorf("taint added at %v, want the event's time %v", dev.Taints[0].TimeAdded, since.Round(time.Second))
	}
	if s := d.Stats(); d.Offers(1) || s.Offered != 1 || s.Tainted != 1 {
		t.Errorf("tainted GPU 1: offered %v, stats offered %d tainted %d; want false, 1, 1", d.Offers(1), s.Offered, s.Tainted)
	}

	// Lost (a second daemon's view: the lost GPU's first reason), and NVML
	// gives no memory any more: NoExecute, the device keeps its capacity.
	ledger.set(1, func(g *occupancy.GPUView) {
		g.Health = occupancy.GPUHealth{Unhealthy: true, Reason: gpumon.LostReason, Since: time.Now()}
		g.Memory = nil
	})
	d.Changed()
	if took := waitFor("NoExecute gpu-lost", tainted(resourceapi.DeviceTaintEffectNoExecute, TaintLostValue)); took > time.Second {
		t.Errorf("the lost GPU's taint took %v, want within 1s", took)
	}
	if c := device().Capacity[MemoryCapacity]; c.Value.Value() != 16<<30-512<<20 {
		t.Errorf("lost GPU's memory capacity %v, want its last (16Gi less the reserve)", c.Value.String())
	}

	// Healthy again (gpud started again on a reset GPU): no taint.
	ledger.set(1, func(g *occupancy.GPUView) { g.Health, g.Memory = occupancy.GPUHealth{}, mem() })
	d.Changed()
	if took := waitFor("untainted again", func(dev *resourceapi.Device) bool { return dev != nil && len(dev.Taints) == 0 }); took > time.Second {
		t.Errorf("the taint's removal took %v, want within 1s", took)
	}
	if !d.Offers(1) {
		t.Error("recovered GPU 1 not offered")
	}
}

// An API server with DRADeviceTaints off drops the taints (the slice
// library reports it): the unhealthy GPU then leaves the slice, as it did
// before taints, rather than stay schedulable.
func TestDroppedTaintsTakeTheGPUOutOfTheSlice(t *testing.T) {
	d := &Driver{cfg: Config{Reserve: 512 << 20, Min: 256 << 20, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}, kick: make(chan struct{}, 1)}
	gpus := testGPUs()
	gpus[1].Offered, gpus[1].Taint = false, healthTaint(occupancy.GPUHealth{Unhealthy: true, Reason: "XID 48"})
	if devs := d.Devices(gpus); len(devs) != 2 || len(devs[1].Taints) != 1 || devs[1].Taints[0].Value != "xid-48" {
		t.Fatalf("devices %+v, want GPU 1 with its taint", devs)
	}
	d.HandleError(context.Background(), errors.New("conflict"), "publishing")
	if devs := d.Devices(gpus); len(devs) != 2 {
		t.Fatalf("another error: %d devices, want 2", len(devs))
	}
	desired := resourceapi.ResourceSlice{Spec: resourceapi.ResourceSliceSpec{Devices: d.Devices(gpus)}}
	actual := *desired.DeepCopy()
	actual.Spec.Devices[1].Taints = nil
	d.HandleError(context.Background(), &resourceslice.DroppedFieldsError{PoolName: "node1", DesiredSlice: &desired, ActualSlice: &actual}, "publishing")
	if devs := d.Devices(gpus); len(devs) != 1 || devs[0].Name != strings.ToLower(uuid0) {
		t.Errorf("taints dropped: devices %+v, want the healthy GPU alone", devs)
	}
	select {
	case <-d.kick:
	default:
		t.Error("no republish asked after taints were dropped")
	}
}
