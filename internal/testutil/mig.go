package testutil

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// NVMLMIG is one MIG device the NVML double lists on a MIG-enabled GPU.
type NVMLMIG struct {
	GPU         int // the parent's NVML index
	GI, CI      int
	UUID        string // MIG-...
	Profile     string // e.g. 1g.10gb
	MemoryTotal uint64
}

// SetMIG replaces the MIG devices.
func (n *NVMLDouble) SetMIG(tb testing.TB, migs ...NVMLMIG) {
	n.mu.Lock()
	n.migs = migs
	n.mu.Unlock()
	n.write(tb)
}

// FakeMIG is a GPU in MIG mode made of fake device nodes: its parent
// nvidia0 and one capability node per slice, as the driver lays them out
// (/dev/nvidia-caps/nvidia-capM), with the mig-minors table naming them.
type FakeMIG struct {
	DevDir     string
	Parent     FakeGPU
	Caps       []FakeGPU // Index is the slice's GPU instance id
	CapMinors  []int     // M of each nvidia-capM, as mig-minors says
	MinorsFile string    // the fake /proc/driver/nvidia-caps/mig-minors
}

// MakeFakeMIG makes a MIG GPU with two slices, GPU instances 1 and 2, in a
// new device directory: the parent takes the first fake GPU's numbers,
// the slices' capability nodes the next two (drivers nobody opens, so each
// slice is a device number of its own). mig-minors lists them, with their
// compute instances' and the config and monitor entries, under the
// parent's minor number (gpuN is the GPU's minor, as the driver writes it).
func MakeFakeMIG(tb testing.TB) FakeMIG {
	tb.Helper()
	RequireRoot(tb)
	dir := tb.TempDir()
	f := FakeMIG{DevDir: dir, CapMinors: []int{12, 21}}
	mk := func(p string, num [2]uint32) {
		if err := unix.Mknod(p, unix.S_IFCHR|0o666, int(unix.Mkdev(num[0], num[1]))); err != nil {
			tb.Fatalf("mknod %s: %v", p, err)
		}
	}
	f.Parent = FakeGPU{Index: 0, Path: filepath.Join(dir, "nvidia0"), Major: fakeNumbers[0][0], Minor: fakeNumbers[0][1]}
	mk(f.Parent.Path, fakeNumbers[0])
	if err := os.Mkdir(filepath.Join(dir, "nvidia-caps"), 0o755); err != nil {
		tb.Fatal(err)
	}
	table := "config 1\nmonitor 2\n"
	for i, m := range f.CapMinors {
		num := fakeNumbers[1+i]
		c := FakeGPU{Index: i + 1, Path: filepath.Join(dir, "nvidia-caps", fmt.Sprintf("nvidia-cap%d", m)), Major: num[0], Minor: num[1]}
		mk(c.Path, num)
		f.Caps = append(f.Caps, c)
		table += fmt.Sprintf("gpu%d/gi%d/access %d\ngpu%d/gi%d/ci0/access %d\n", f.Parent.Minor, i+1, m, f.Parent.Minor, i+1, m+1)
	}
	f.MinorsFile = filepath.Join(tb.TempDir(), "mig-minors")
	if err := os.WriteFile(f.MinorsFile, []byte(table), 0o644); err != nil {
		tb.Fatal(err)
	}
	return f
}
