//go:build cgo

package gpumon_test

import (
	"context"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/gpud/gpud/internal/nvidia"
	"github.com/gpud/gpud/internal/nvidia/gpumon"
	"github.com/gpud/gpud/internal/occupancy"
	"github.com/gpud/gpud/internal/testutil"
)

// The monitor on the NVML double (no root): the health watch survives the
// double's wait errors (timeouts, unknown errors) and still sees an XID,
// and an event wait's GPU_IS_LOST naming a GPU marks that GPU lost.
func TestMonitorHealthOnTheDouble(t *testing.T) {
	double := testutil.NewNVMLDouble(t, "",
		testutil.NVMLGPU{Index: 0, Minor: 1, UUID: "GPU-a", MemoryTotal: 16 << 30},
		testutil.NVMLGPU{Index: 1, Minor: 0, UUID: "GPU-b", MemoryTotal: 16 << 30})
	double.EventErr(t, "timeout", -1, 3)
	double.EventErr(t, "unknown", -1, 2)
	m := &gpumon.Monitor{Lib: nvidia.New(nvidia.Load{Library: double.Library}),
		Log: slog.New(slog.NewTextHandler(os.Stderr, nil))}
	gpus := m.Open([]occupancy.GPU{{Index: 0, Device: "/dev/nvidia0", Minor: 0}, {Index: 1, Device: "/dev/nvidia1", Minor: 1}})
	l := occupancy.NewLedger(gpus, time.Hour)
	m.Start(l)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { m.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	// One XID each half second: the double keeps 256 events, and a
	// watch backing off from its errors takes seconds to return.
	var last time.Time
	testutil.Eventually(t, 20*time.Second, "an XID after the wait errors", func() bool {
		if time.Since(last) > 500*time.Millisecond {
			last = time.Now()
			double.XID(t, 1, 79)
		} // NVML 1 = minor 0 = GPU 0 // NVML 1 = minor 0 = GPU 0
		return l.Snapshot(time.Now()).GPUs[0].Health.Reason == "XID 79"
	})
	double.EventErr(t, "gpu_is_lost", 0, 1) // NVML 0 = minor 1 = GPU 1
	testutil.Eventually(t, 10*time.Second, "GPU 1 lost", func() bool {
		return l.Snapshot(time.Now()).GPUs[1].Health.Unhealthy
	})
}
