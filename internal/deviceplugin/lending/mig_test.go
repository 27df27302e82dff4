package lending

import (
	"log/slog"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/gpud/gpud/internal/occupancy"
	"github.com/gpud/gpud/internal/workload"
)

// MIG slices are lent one by one: each is a device named by its MIG UUID,
// and its borrower gets NVIDIA_VISIBLE_DEVICES = that UUID, the parent's
// /dev/nvidiaN once and each slice's capability node
// /dev/nvidia-caps/nvidia-capM, as NVIDIA's runtime gives a MIG device.
func TestMIGSlicesLentPerSlice(t *testing.T) {
	slice := func(capMinor, gi int, uuid string) occupancy.GPU {
		return occupancy.GPU{Index: 1<<20 + capMinor, UUID: uuid, Device: "/dev/nvidia-caps/nvidia-cap" + strconv.Itoa(capMinor), Major: 511, Minor: uint32(capMinor),
			MIG: &occupancy.MIGSlice{Parent: 0, ParentUUID: "GPU-aaa", ParentDevice: "/dev/nvidia0", GI: gi, Profile: "1g.10gb", CapMinor: capMinor}}
	}
	gpus := []occupancy.GPU{slice(12, 1, "MIG-aaa-1"), slice(21, 2, "MIG-aaa-2")}
	ledger := occupancy.NewLedger(gpus, time.Minute)
	l := New(Config{Resource: "gpud.io/idle-gpu", OwnerResource: "nvidia.com/gpu", DevDir: t.TempDir(), HostDevDir: "/host/dev", LendFree: true,
		GPUs: gpus}, ledger, &workload.Registry{Default: occupancy.Unmanaged}, &fakeGate{ledger: ledger}, &fakePodResources{})
	l.Log = slog.New(slog.DiscardHandler)
	var ids []string
	for _, d := range l.Devices() {
		ids = append(ids, d.ID)
	}
	if !slices.Equal(ids, []string{"MIG-aaa-1", "MIG-aaa-2"}) {
		t.Fatalf("device IDs %q, want the slices' MIG UUIDs", ids)
	}
	r, err := l.Allocate([]string{"MIG-aaa-1", "MIG-aaa-2"})
	if err != nil {
		t.Fatal(err)
	}
	if r.Envs["NVIDIA_VISIBLE_DEVICES"] != "MIG-aaa-1,MIG-aaa-2" {
		t.Errorf("NVIDIA_VISIBLE_DEVICES = %q", r.Envs["NVIDIA_VISIBLE_DEVICES"])
	}
	var got []string
	for _, d := range r.Devices {
		got = append(got, d.HostPath+":"+d.ContainerPath)
	}
	want := []string{"/host/dev/nvidia0:/dev/nvidia0", "/host/dev/nvidia-caps/nvidia-cap12:/dev/nvidia-caps/nvidia-cap12",
		"/host/dev/nvidia-caps/nvidia-cap21:/dev/nvidia-caps/nvidia-cap21"}
	if !slices.Equal(got, want) {
		t.Errorf("devices %q, want %q", got, want)
	}
}
