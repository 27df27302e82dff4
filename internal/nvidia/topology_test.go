//go:build cgo

package nvidia

import (
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/gpud/gpud/internal/occupancy"
	"github.com/gpud/gpud/internal/testutil"
)

// Six GPUs (NVML index i is minor 5-i): 0 and 1 joined directly (two
// links), 2 and 3 through an NVSwitch, 4 without NVLink, 5 with NVLink
// whose links are all down. The groups are {0,1} (named 0), {2,3} (named
// 2); 4 and 5 have none.
func TestTopologyFromNVLinks(t *testing.T) {
	pci := func(i int) string {
		return []string{"0000:18:00.0", "0000:2a:00.0", "0000:3a:00.0", "0000:5d:00.0", "0000:9a:00.0", "0000:ab:00.0"}[i]
	}
	const nvswitch = "0000:e1:00.0"
	gpus := make([]testutil.NVMLGPU, 6)
	for i := range gpus {
		gpus[i] = testutil.NVMLGPU{Index: i, Minor: 5 - i, MemoryTotal: 16 << 30, PCI: pci(i)}
	}
	gpus[0].NVLinks = []string{pci(1), pci(1), "", ""}
	gpus[1].NVLinks = []string{pci(0), pci(0), "", ""}
	gpus[2].NVLinks = []string{nvswitch, ""}
	gpus[3].NVLinks = []string{"", nvswitch}
	gpus[5].NVLinks = []string{"", "", ""}
	double := testutil.NewNVMLDouble(t, "", gpus...)
	t.Cleanup(func() { double.SetGPUs(t, doubleGPUs()...) })
	lib := New(Load{Library: double.Library, DriverRoot: "/"}).(*NVML)
	if err := lib.Init(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(lib.Shutdown)

	// nvml.h's answers: NOT_SUPPORTED without NVLink, INVALID_ARGUMENT
	// past the GPU's links, the remote's PCI info on an active link.
	noLink, fourLinks := lib.devices[5-4], lib.devices[5-0]
	if _, ret := noLink.GetNvLinkState(0); ret != nvml.ERROR_NOT_SUPPORTED {
		t.Errorf("NVLink state of a GPU without NVLink: %v, want NOT_SUPPORTED", nvml.ErrorString(ret))
	}
	if _, ret := fourLinks.GetNvLinkState(4); ret != nvml.ERROR_INVALID_ARGUMENT {
		t.Errorf("link 4 of a GPU of 4 links: %v, want INVALID_ARGUMENT", nvml.ErrorString(ret))
	}
	if st, ret := fourLinks.GetNvLinkState(2); ret != nvml.SUCCESS || st != nvml.FEATURE_DISABLED {
		t.Errorf("a link down: %v %v", st, nvml.ErrorString(ret))
	}
	if p, ret := fourLinks.GetNvLinkRemotePciInfo(1); ret != nvml.SUCCESS || busID(p) != pci(1) || cstr(p.BusId[:]) != "00000000:2A:00.0" {
		t.Errorf("remote of link 1: %s (%s) %v, want %s", busID(p), cstr(p.BusId[:]), nvml.ErrorString(ret), pci(1))
	}

	occ := make([]occupancy.GPU, 6)
	for m := range occ {
		occ[m] = occupancy.GPU{Index: m, Minor: uint32(m)}
	}
	if unknown := lib.Annotate(occ); len(unknown) != 0 {
		t.Fatalf("unknown %v", unknown)
	}
	want := map[int]int{0: 0, 1: 0, 2: 2, 3: 2} // NVML index → group
	for m, g := range occ {
		idx := 5 - m
		if g.PCIBusID != pci(idx) {
			t.Errorf("NVML %d: PCI %q, want %q", idx, g.PCIBusID, pci(idx))
		}
		w, linked := want[idx]
		switch {
		case !linked && g.NVLinkGroup != nil:
			t.Errorf("NVML %d: group %d, want none", idx, *g.NVLinkGroup)
		case linked && (g.NVLinkGroup == nil || *g.NVLinkGroup != w):
			t.Errorf("NVML %d: group %v, want %d", idx, g.NVLinkGroup, w)
		}
	}
}

func cstr(b []uint8) string {
	for i, c := range b {
		if c == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}
