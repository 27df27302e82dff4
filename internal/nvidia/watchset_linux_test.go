package nvidia

import (
	"bytes"
	"context"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpud/gpud/internal/occupancy"
)

// TestWatchGPUSet: a changed node set starts gpud again, said with the
// managed count; a restart NVML asked for says nothing more; ctx ends it.
func TestWatchGPUSet(t *testing.T) {
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	dir := t.TempDir()
	gone := []occupancy.GPU{{Index: 0, Device: filepath.Join(dir, "nvidia0")}}
	never := func() bool { return false }
	if !WatchGPUSet(context.Background(), dir, gone, 1, time.Millisecond, never, log) ||
		!strings.Contains(logs.String(), "the GPU device nodes changed") || !strings.Contains(logs.String(), "gpus_before=1 gpus_now=0") {
		t.Fatalf("the driver unloaded: logs %q", logs.String())
	}
	logs.Reset()
	if !WatchGPUSet(context.Background(), dir, nil, 0, time.Millisecond, func() bool { return true }, log) || logs.Len() != 0 {
		t.Fatalf("NVML's restart: logs %q, want a restart said by NVML alone", logs.String())
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if WatchGPUSet(ctx, dir, gone, 1, time.Millisecond, never, log) {
		t.Fatal("a stopped gpud restarts")
	}
}
