package nvidia

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// TestCheckpointAPINotThere: not wanted, nothing is loaded nor said; wanted
// and missing, preemptions are told to take the fallback.
func TestCheckpointAPINotThere(t *testing.T) {
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	missing := Load{Library: "/usr/lib/libcuda.so.1", DriverRoot: t.TempDir()}
	if c := CheckpointAPI(false, missing, "kill", time.Second, log); c != nil || logs.Len() != 0 {
		t.Fatalf("not wanted: %v, logs %q", c, logs.String())
	}
	if c := CheckpointAPI(true, missing, "kill", time.Second, log); c != nil {
		t.Fatalf("a missing library loaded: %v", c)
	}
	if !strings.Contains(logs.String(), "uses its fallback") || !strings.Contains(logs.String(), "fallback=kill") {
		t.Fatalf("the fallback is not said: %q", logs.String())
	}
}
