package dra

import (
	"testing"
	"time"

	v1 "github.com/gpud/gpud/api/v1"
	"github.com/gpud/gpud/internal/occupancy"
	"github.com/prometheus/client_golang/prometheus"
)

type fakeLedger []occupancy.GPUView

func (f fakeLedger) Snapshot(time.Time) occupancy.Snapshot { return occupancy.Snapshot{GPUs: f} }

func TestGPUSourceOffersSharedHealthyGPUsWithTheirMemory(t *testing.T) {
	mem := &occupancy.Memory{Total: 80 << 30}
	view := func(i int, uuid string, m *occupancy.Memory, unhealthy string) occupancy.GPUView {
		return occupancy.GPUView{GPU: occupancy.GPU{Index: i, UUID: uuid, Device: "/gpudev/nvidia" + string(rune('0'+i)), Minor: uint32(i)},
			Memory: m, Health: occupancy.GPUHealth{Unhealthy: unhealthy != "", Reason: unhealthy}}
	}
	drv := &Driver{}
	src := &GPUSource{
		Ledger: fakeLedger{
			view(0, "GPU-a", mem, ""), view(1, "GPU-b", mem, "XID 79"), view(2, "GPU-c", nil, ""), view(3, "", mem, ""), view(4, "GPU-e", mem, ""),
		},
		DriverVersion: func() string { return "580.1" }, Shared: []string{"0", "1", "2", "3", "GPU-x"},
		DevDir: "/gpudev", HostDevDir: "/dev", Driver: drv,
	}
	gpus := src.GPUs()
	want := []string{"", "unhealthy: XID 79", "memory not known yet", "no UUID from NVML", "not in --dra-shared-gpus or the node's " + SharedLabel + " label"}
	if len(gpus) != len(want) {
		t.Fatalf("%d GPUs, want %d", len(gpus), len(want))
	}
	for i, g := range gpus {
		if g.Why != want[i] || g.Offered != (want[i] == "") {
			t.Errorf("GPU %d: offered %v, why %q; want %q", i, g.Offered, g.Why, want[i])
		}
	}
	if g := gpus[0]; g.HostDevice != "/dev/nvidia0" || g.DriverVersion != "580.1" || g.MemoryTotal != 80<<30 || g.UUID != "GPU-a" {
		t.Errorf("GPU 0 as published: %+v", g)
	}
	// The node's label wins over the flag.
	drv.nodeShared = []string{"GPU-e"}
	if gpus := src.GPUs(); gpus[0].Offered || !gpus[4].Offered {
		t.Errorf("with the label naming GPU-e: GPU 0 offered %v, GPU 4 offered %v", gpus[0].Offered, gpus[4].Offered)
	}
	drv.nodeShared = []string{"none"}
	for _, g := range src.GPUs() {
		if g.Offered {
			t.Errorf("label none: GPU %d offered", g.Index)
		}
	}
}

func TestGPUSourceHostDevice(t *testing.T) {
	for _, tc := range []struct{ dev, host, path, want string }{
		{"/host/dev", "/dev", "/host/dev/nvidia3", "/dev/nvidia3"},
		{"/dev", "", "/dev/nvidia3", "/dev/nvidia3"},
		{"/host/dev", "/dev", "/elsewhere/nvidia3", "/elsewhere/nvidia3"},
	} {
		s := &GPUSource{DevDir: tc.dev, HostDevDir: tc.host}
		if got := s.hostDevice(tc.path); got != tc.want {
			t.Errorf("hostDevice(%q) under %q→%q = %q, want %q", tc.path, tc.dev, tc.host, got, tc.want)
		}
	}
}

func TestDriverMetricsAndState(t *testing.T) {
	src := &GPUSource{Ledger: fakeLedger{{GPU: occupancy.GPU{Index: 0, UUID: "GPU-a"}}}, DriverVersion: func() string { return "" }}
	drv := &Driver{cfg: Config{GPUs: src.GPUs}}
	src.Driver = drv
	drv.stats.Prepared, drv.stats.Unprepared, drv.stats.Collected = 3, 2, 1
	reg := prometheus.NewRegistry()
	drv.RegisterMetrics(reg)
	got := map[string]float64{}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			name := mf.GetName()
			for _, l := range m.GetLabel() {
				name += "," + l.GetName() + "=" + l.GetValue()
			}
			got[name] = m.GetGauge().GetValue() + m.GetCounter().GetValue()
		}
	}
	for name, v := range map[string]float64{
		"gpud_dra_claims_prepared": 0, "gpud_dra_devices_offered": 0, "gpud_dra_devices_tainted": 0, "gpud_dra_slice_publishes_total": 0,
		"gpud_dra_prepares_total,result=prepared": 3, "gpud_dra_prepares_total,result=already": 0, "gpud_dra_prepares_total,result=failed": 0,
		"gpud_dra_unprepares_total,by=kubelet": 1, "gpud_dra_unprepares_total,by=collected": 1,
	} {
		if g, ok := got[name]; !ok || g != v {
			t.Errorf("%s = %v (present %v), want %v", name, g, ok, v)
		}
	}
	if len(got) != 9 {
		t.Errorf("%d series, want 9: %v", len(got), got)
	}
	f := &v1.StateFile{GPUs: []v1.StateGPU{{Index: 0, UUID: "GPU-a"}}}
	drv.Decorate(f)
	want := v1.StateNotOffered{Index: 0, UUID: "GPU-a", Reason: "not in --dra-shared-gpus or the node's " + SharedLabel + " label"}
	if f.DRA == nil || f.DRA.Driver != DriverName || len(f.DRA.NotOffered) != 1 || f.DRA.NotOffered[0] != want {
		t.Errorf("state: %+v", f.DRA)
	}
}
