package bpf_test

import (
	"os"
	"testing"
	"time"

	"github.com/cilium/ebpf/ringbuf"
	"github.com/gpud/gpud/bpf"
	"github.com/gpud/gpud/internal/cgroups"
	"github.com/gpud/gpud/internal/testutil"
)

func loadMonitor(t *testing.T, gpus []testutil.FakeGPU) *bpf.Monitor {
	t.Helper()
	root, _, err := cgroups.V2Root()
	if err != nil {
		t.Fatal(err)
	}
	m, err := bpf.Load(bpf.Options{CgroupRoot: root})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	devs := map[uint32]uint32{}
	for _, g := range gpus {
		dev, _ := bpf.KernelDev(g.Major, g.Minor)
		devs[dev] = uint32(g.Index)
	}
	if err := m.SetGPUs(devs); err != nil {
		t.Fatal(err)
	}
	return m
}

// nextEvent returns the next event of this process, skipping the rest.
func nextEvent(t *testing.T, m *bpf.Monitor, within time.Duration) (bpf.Event, bool) {
	t.Helper()
	var rec ringbuf.Record
	var ev bpf.Event
	deadline := time.Now().Add(within)
	m.SetDeadline(deadline)
	for {
		if err := m.ReadEvent(&rec, &ev); err != nil {
			return bpf.Event{}, false
		}
		if ev.TGID == uint32(os.Getpid()) {
			return ev, true
		}
	}
}

func TestOpenCloseEvents(t *testing.T) {
	_, gpus := testutil.MakeFakeGPUs(t, 2)
	m := loadMonitor(t, gpus)

	f, ev := openObserved(t, m, gpus[1].Path, 1)
	if ev.CgroupID == 0 || ev.Comm == "" || ev.PID == 0 {
		t.Errorf("open event lacks identity: %+v", ev)
	}
	fd := f.Fd()
	f.Close()
	ev, ok := nextEvent(t, m, 2*time.Second)
	if !ok || ev.Type != bpf.EventClose || ev.GPU != 1 || ev.FD != int32(fd) {
		t.Fatalf("after close: %+v ok=%v, want close of GPU 1", ev, ok)
	}

	// A non-GPU device and a regular file produce nothing.
	for _, p := range []string{"/dev/null", "/proc/self/status"} {
		g, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		g.Close()
	}
	if ev, ok := nextEvent(t, m, 200*time.Millisecond); ok {
		t.Fatalf("unexpected event for a non-GPU file: %+v", ev)
	}
	if n, _ := m.PendingMarks(); n != 0 {
		t.Errorf("pending marks = %d after all opens returned", n)
	}
}

func TestSwitchAndRegistration(t *testing.T) {
	_, gpus := testutil.MakeFakeGPUs(t, 1)
	m := loadMonitor(t, gpus)

	if err := m.SetMonitoring(false); err != nil {
		t.Fatal(err)
	}
	if on, _ := m.Monitoring(); on {
		t.Fatal("switch still on")
	}
	f, _ := os.OpenFile(gpus[0].Path, os.O_RDWR, 0)
	f.Close()
	if ev, ok := nextEvent(t, m, 200*time.Millisecond); ok {
		t.Fatalf("event while monitoring is off: %+v", ev)
	}
	if err := m.SetMonitoring(true); err != nil {
		t.Fatal(err)
	}
	// A registered consumer's own opens never count.
	if err := m.Register(uint32(os.Getpid()), 0); err != nil {
		t.Fatal(err)
	}
	f, _ = os.OpenFile(gpus[0].Path, os.O_RDWR, 0)
	f.Close()
	if ev, ok := nextEvent(t, m, 200*time.Millisecond); ok {
		t.Fatalf("event for the registered consumer: %+v", ev)
	}
	if err := m.Register(0, 0); err != nil {
		t.Fatal(err)
	}
	f, _ = os.OpenFile(gpus[0].Path, os.O_RDWR, 0)
	defer f.Close()
	if ev, ok := nextEvent(t, m, 2*time.Second); !ok || ev.Type != bpf.EventOpen {
		t.Fatalf("no open event after monitoring came back: %+v", ev)
	}
}

// openObserved opens path (GPU gpu) and expects the monitor's open event
// with the new fd; it returns the file and the event.
func openObserved(t *testing.T, m *bpf.Monitor, path string, gpu int32) (*os.File, bpf.Event) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	ev, ok := nextEvent(t, m, 2*time.Second)
	if !ok || ev.Type != bpf.EventOpen || ev.GPU != gpu || ev.FD != int32(f.Fd()) {
		t.Fatalf("after open: %+v ok=%v, want open of GPU %d fd %d", ev, ok, gpu, f.Fd())
	}
	return f, ev
}
