package nvidia

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/gpud/gpud/internal/occupancy"
	"github.com/gpud/gpud/internal/testutil"
	"golang.org/x/sys/unix"
)

func TestDiscoverGPUsErrors(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	// A directory with things named like GPUs that are not character devices.
	noGPUs := filepath.Join(dir, "dev")
	if err := os.MkdirAll(filepath.Join(noGPUs, "nvidia1"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"nvidia0", "nvidiactl", "nvidia-uvm", "null"} {
		if err := os.WriteFile(filepath.Join(noGPUs, name), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(file, filepath.Join(noGPUs, "nvidia2")); err != nil {
		t.Fatal(err)
	}
	empty := filepath.Join(dir, "empty")
	if err := os.Mkdir(empty, 0o755); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name     string
		dir      string
		noGPUs   bool
		notExist bool
	}{
		{"missing dir", filepath.Join(dir, "missing"), false, true},
		{"file, not a dir", file, false, false},
		{"empty dir", empty, true, false},
		{"no character devices", noGPUs, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			gpus, err := DiscoverGPUs(tc.dir)
			if err == nil || gpus != nil {
				t.Fatalf("DiscoverGPUs = %v, %v; want an error", gpus, err)
			}
			if errors.Is(err, ErrNoGPUs) != tc.noGPUs {
				t.Errorf("err = %v; ErrNoGPUs want %v", err, tc.noGPUs)
			}
			if errors.Is(err, fs.ErrNotExist) != tc.notExist {
				t.Errorf("err = %v; ErrNotExist want %v", err, tc.notExist)
			}
		})
	}
}

// TestDiscoverGPUsSymlinks needs no root: nodes may be links to character
// devices, which stat follows.
func TestDiscoverGPUsSymlinks(t *testing.T) {
	dir := t.TempDir()
	for name, target := range map[string]string{"nvidia3": "/dev/null", "nvidia1": "/dev/zero", "nvidiactl": "/dev/null"} {
		if err := os.Symlink(target, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	gpus, err := DiscoverGPUs(dir)
	if err != nil {
		t.Fatal(err)
	}
	want := []occupancy.GPU{
		{Index: 1, Device: filepath.Join(dir, "nvidia1"), Major: 1, Minor: 5},
		{Index: 3, Device: filepath.Join(dir, "nvidia3"), Major: 1, Minor: 3},
	}
	if !reflect.DeepEqual(gpus, want) {
		t.Errorf("DiscoverGPUs = %+v, want %+v", gpus, want)
	}
}

func TestDiscoverGPUs(t *testing.T) {
	testutil.RequireRoot(t)
	dir, fakes := testutil.MakeFakeGPUs(t, 3)
	// Extra nodes: nvidia10 sorts before nvidia2 by name, not by index;
	// nvidiactl and nvidia-uvm are character devices but not GPUs; a
	// regular file named nvidia5 is not a device.
	mknod := func(name string, major, minor uint32) {
		if err := unix.Mknod(filepath.Join(dir, name), unix.S_IFCHR|0o600, int(unix.Mkdev(major, minor))); err != nil {
			t.Fatal(err)
		}
	}
	mknod("nvidia10", 1, 8)
	mknod("nvidiactl", 1, 3)
	mknod("nvidia-uvm", 1, 5)
	mknod("nvidia007x", 1, 5)
	if err := os.WriteFile(filepath.Join(dir, "nvidia5"), []byte("not a device"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mkfifo(filepath.Join(dir, "nvidia6"), 0o600); err != nil {
		t.Fatal(err)
	}

	gpus, err := DiscoverGPUs(dir)
	if err != nil {
		t.Fatal(err)
	}
	var want []occupancy.GPU
	for _, f := range fakes {
		want = append(want, occupancy.GPU{Index: f.Index, Device: f.Path, Major: f.Major, Minor: f.Minor})
	}
	want = append(want, occupancy.GPU{Index: 10, Device: filepath.Join(dir, "nvidia10"), Major: 1, Minor: 8})
	if !reflect.DeepEqual(gpus, want) {
		t.Errorf("DiscoverGPUs =\n%+v\nwant\n%+v", gpus, want)
	}

	devs := occupancy.Devs(gpus)
	if len(devs) != 4 {
		t.Errorf("Devs = %v, want 4 entries", devs)
	}
	for _, g := range want {
		if idx, ok := devs[unix.Mkdev(g.Major, g.Minor)]; !ok || idx != g.Index {
			t.Errorf("Devs[%d:%d] = %d %v, want %d", g.Major, g.Minor, idx, ok, g.Index)
		}
	}
}

// A GPU is its device number (issue 14, item 3): two names of one device
// are one GPU with the other name as an alias (at the old code, two GPUs);
// two devices claiming one index, or an index no kernel minor can be, are
// errors naming the nodes.
func TestDiscoverGPUsByDeviceNumber(t *testing.T) {
	testutil.RequireRoot(t)
	mk := func(dir, name string, major, minor uint32) {
		t.Helper()
		if err := unix.Mknod(filepath.Join(dir, name), unix.S_IFCHR|0o600, int(unix.Mkdev(major, minor))); err != nil {
			t.Fatal(err)
		}
	}
	dir := t.TempDir()
	mk(dir, "nvidia0", 195, 0)
	mk(dir, "nvidia8", 195, 0) // an operator's second name for GPU 0
	mk(dir, "nvidia1", 195, 1)
	mk(dir, "nvidia300", 195, 300)
	gpus, err := DiscoverGPUs(dir)
	if err != nil {
		t.Fatal(err)
	}
	want := []occupancy.GPU{
		{Index: 0, Device: filepath.Join(dir, "nvidia0"), Major: 195, Minor: 0, Aliases: []string{filepath.Join(dir, "nvidia8")}},
		{Index: 1, Device: filepath.Join(dir, "nvidia1"), Major: 195, Minor: 1},
		{Index: 300, Device: filepath.Join(dir, "nvidia300"), Major: 195, Minor: 300},
	}
	if !reflect.DeepEqual(gpus, want) {
		t.Fatalf("DiscoverGPUs:\n got %+v\nwant %+v", gpus, want)
	}
	if d := occupancy.Devs(gpus); len(d) != 3 || d[unix.Mkdev(195, 0)] != 0 {
		t.Errorf("Devs = %v", d)
	}

	clash := t.TempDir()
	mk(clash, "nvidia1", 195, 1)
	mk(clash, "nvidia01", 195, 2)
	if _, err := DiscoverGPUs(clash); !errors.Is(err, ErrBadGPUNode) {
		t.Errorf("nvidia1 and nvidia01 as different devices: err = %v, want ErrBadGPUNode", err)
	}
	huge := t.TempDir()
	mk(huge, "nvidia0", 195, 0)
	mk(huge, "nvidia99999999999999999999", 195, 5)
	if _, err := DiscoverGPUs(huge); !errors.Is(err, ErrBadGPUNode) {
		t.Errorf("nvidia99999999999999999999: err = %v, want ErrBadGPUNode", err)
	}
}

// WaitGPUs: at once when the nodes are there, after they appear when
// not (telling once that it waits), at once for an error waiting cannot
// mend, and ctx's error when stopped.
func TestWaitGPUs(t *testing.T) {
	testutil.RequireRoot(t)
	dev := t.TempDir()
	ctx := context.Background()
	var waits int
	type result struct {
		gpus []occupancy.GPU
		err  error
	}
	done := make(chan result, 1)
	go func() {
		g, err := WaitGPUs(ctx, dev, 10*time.Millisecond, func(err error) {
			if !errors.Is(err, ErrNoGPUs) {
				t.Errorf("waiting on %v, want ErrNoGPUs", err)
			}
			waits++
		})
		done <- result{g, err}
	}()
	select {
	case r := <-done:
		t.Fatalf("returned %v, %v with no GPU node", r.gpus, r.err)
	case <-time.After(100 * time.Millisecond):
	}
	if err := unix.Mknod(filepath.Join(dev, "nvidia0"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 7))); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-done:
		if r.err != nil || len(r.gpus) != 1 || r.gpus[0].Minor != 7 || waits != 1 {
			t.Errorf("after mknod: %v, %v, %d waiting calls; want one GPU, one call", r.gpus, r.err, waits)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("still waiting 5 s after the node appeared")
	}

	// There already: no waiting call.
	g, err := WaitGPUs(ctx, dev, time.Hour, func(error) { t.Error("waited with a GPU node there") })
	if err != nil || len(g) != 1 {
		t.Errorf("%v, %v", g, err)
	}
	// No such directory: waiting would not mend it.
	if _, err := WaitGPUs(ctx, filepath.Join(dev, "missing"), time.Hour, nil); err == nil || errors.Is(err, ErrNoGPUs) {
		t.Errorf("missing directory: %v, want an error other than ErrNoGPUs", err)
	}
	// Stopped while waiting.
	cctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if _, err := WaitGPUs(cctx, t.TempDir(), 10*time.Millisecond, nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("stopped: %v, want the context's error", err)
	}
}

func TestSameNodes(t *testing.T) {
	a := []occupancy.GPU{{Index: 0, Device: "/dev/nvidia0", Major: 195, Minor: 0}, {Index: 1, Device: "/dev/nvidia1", Major: 195, Minor: 1}}
	b := []occupancy.GPU{{Index: 0, Device: "/dev/nvidia0", Major: 195, Minor: 0, UUID: "GPU-x"}, {Index: 1, Device: "/dev/nvidia1", Major: 195, Minor: 1}}
	if !SameNodes(a, b) {
		t.Error("NVML's UUID made two discoveries differ")
	}
	for name, c := range map[string][]occupancy.GPU{
		"one gone":     a[:1],
		"none":         nil,
		"other minor":  {a[0], {Index: 1, Device: "/dev/nvidia1", Major: 195, Minor: 2}},
		"other index":  {a[0], {Index: 2, Device: "/dev/nvidia1", Major: 195, Minor: 1}},
		"other path":   {a[0], {Index: 1, Device: "/dev/gpu1", Major: 195, Minor: 1}},
		"one appeared": append(append([]occupancy.GPU{}, a...), occupancy.GPU{Index: 2, Device: "/dev/nvidia2", Major: 195, Minor: 2}),
	} {
		if SameNodes(a, c) {
			t.Errorf("%s: same", name)
		}
	}
}

// TestWatchNodes: an unreadable directory changes nothing, an emptied one
// (the driver unloaded) does, stop ends the watch, and so does ctx.
func TestWatchNodes(t *testing.T) {
	dir := t.TempDir()
	gone := []occupancy.GPU{{Index: 0, Device: filepath.Join(dir, "nvidia0")}}
	never := func() bool { return false }
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, changed := WatchNodes(ctx, filepath.Join(dir, "missing"), gone, time.Millisecond, never); changed {
		t.Fatal("a directory that cannot be read changed the GPU set")
	}
	now, changed := WatchNodes(context.Background(), dir, gone, time.Millisecond, never)
	if !changed || len(now) != 0 {
		t.Fatalf("no GPU node left: changed %v, now %v", changed, now)
	}
	if _, changed := WatchNodes(context.Background(), dir, nil, time.Millisecond, func() bool { return true }); !changed {
		t.Fatal("stop did not end the watch")
	}
}
