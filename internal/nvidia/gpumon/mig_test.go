package gpumon

import (
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpud/gpud/internal/occupancy"
)

// migFake is the fake NVML with MIG devices per GPU.
type migFake struct {
	*fake
	devs map[int][]MIGDevice
}

func (f migFake) MIGDevices(gpu int) ([]MIGDevice, error) { return f.devs[gpu], nil }

// The driver's table: each instance's access capability and its minor;
// config, monitor and malformed lines are skipped.
func TestParseMIGMinors(t *testing.T) {
	in := "config 1\nmonitor 2\ngpu3/gi1/access 30\ngpu3/gi1/ci0/access 31\ngpu3/gix/access 9\nbogus\ngpu3/gi2/access -1\nfabric-imex-mgmt 4\n"
	got, err := ParseMIGMinors(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	want := map[MIGCap]int{{GPU: 3, GI: 1, CI: -1}: 30, {GPU: 3, GI: 1, CI: 0}: 31}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%+v = %d, want %d", k, got[k], v)
		}
	}
}

// A GPU in MIG mode: its GPU instances are GPUs (index above every
// /dev/nvidiaN, keyed by the capability node's number: here the node is
// not made yet, so the nvidia-caps major of /proc/devices and the table's
// minor), the parent left alone as their parent; an instance the table
// lacks is said, not hidden. Without the table the GPU is left alone whole.
func TestMIGSlicesFromNVMLAndTable(t *testing.T) {
	dir := t.TempDir()
	write := func(name, s string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	f := migFake{fake: newFake(), devs: map[int][]MIGDevice{0: {
		{GI: 1, CI: 0, UUID: "MIG-a", Profile: "3g.40gb"}, {GI: 1, CI: 1, UUID: "MIG-a2", Profile: "3g.40gb"},
		{GI: 5, CI: 0, UUID: "MIG-b", Profile: "1g.10gb"}, {GI: 9, CI: 0, UUID: "MIG-c", Profile: "1g.10gb"}}}}
	f.mig[0] = true
	m := &Monitor{Lib: f, Log: slog.New(slog.DiscardHandler), MIGNodes: MIGNodes{
		MinorsFile:  write("mig-minors", "config 1\ngpu7/gi1/access 12\ngpu7/gi1/ci0/access 13\ngpu7/gi5/access 48\n"),
		CapDir:      filepath.Join(dir, "nvidia-caps"),
		ProcDevices: write("devices", "Character devices:\n195 nvidia\n508 nvidia-caps\n"),
	}}
	gpus := m.Open([]occupancy.GPU{{Index: 0, Device: "/dev/nvidia0", Major: 195, Minor: 7, UUID: "GPU-p", Product: "NVIDIA H100"}})
	if len(gpus) != 2 {
		t.Fatalf("managed %+v, want the two keyed slices", gpus)
	}
	a, b := gpus[0], gpus[1]
	if a.Index != MIGIndexBase+12 || a.Major != 508 || a.Minor != 12 || a.UUID != "MIG-a" || a.Device != filepath.Join(dir, "nvidia-caps", "nvidia-cap12") ||
		a.MIG == nil || a.MIG.Parent != 0 || a.MIG.ParentUUID != "GPU-p" || a.MIG.GI != 1 || a.MIG.CI != 0 || a.MIG.Profile != "3g.40gb" || a.Product != "NVIDIA H100 MIG 3g.40gb" {
		t.Errorf("slice A %+v %+v", a, a.MIG)
	}
	if b.Index != MIGIndexBase+48 || b.MIG == nil || b.MIG.GI != 5 {
		t.Errorf("slice B %+v", b)
	}
	if len(m.leftAlone) != 1 || !strings.Contains(m.leftAlone[0].Reason, "the parent of 2 slices") || !strings.Contains(m.leftAlone[0].Reason, "gpu7/gi9/access") {
		t.Errorf("left alone %+v: want the parent of its 2 slices, and gi9 said untracked", m.leftAlone)
	}
	if all := m.AllGPUs(gpus); len(all) != 1 || all[0].Index != 0 {
		t.Errorf("AllGPUs %+v: want the device nodes only (the parent)", all)
	}

	m2 := &Monitor{Lib: f, Log: slog.New(slog.DiscardHandler), MIGNodes: MIGNodes{MinorsFile: filepath.Join(dir, "none")}}
	if gpus := m2.Open([]occupancy.GPU{{Index: 0, Device: "/dev/nvidia0", Minor: 7}}); len(gpus) != 0 || len(m2.leftAlone) != 1 {
		t.Errorf("without the table: managed %+v, left alone %+v; want the GPU left alone whole", gpus, m2.leftAlone)
	} else if r := m2.leftAlone[0].Reason; !strings.HasPrefix(r, "MIG enabled: its slices could not be mapped") ||
		!strings.HasSuffix(r, ": MIG capability minors: open "+filepath.Join(dir, "none")+": no such file or directory") {
		t.Errorf("without the table: reason %q; want the slices not mapped, and why", r)
	}
}
