package testutil

import (
	"encoding/json"
	"os"
	"testing"
	"time"

	v1 "github.com/gpud/gpud/api/v1"
)

// WaitStateFile waits until the state file at path satisfies ok and
// returns it; after timeout it fails the test with the file's last text.
func WaitStateFile(tb testing.TB, path string, timeout time.Duration, ok func(*v1.StateFile) bool) *v1.StateFile {
	tb.Helper()
	var f *v1.StateFile
	var err error
	if !Poll(timeout, func() bool { f, err = readState(path); return err == nil && ok(f) }) {
		b, _ := os.ReadFile(path)
		tb.Fatalf("state file never matched within %s (last error %v):\n%s", Wait(timeout), err, b)
	}
	return f
}

// HolderPriority is the class the state file gives pid on gpu ("" when it
// does not hold it).
func HolderPriority(f *v1.StateFile, gpu, pid int) v1.Priority {
	for _, h := range f.GPUs[gpu].Holders {
		if h.PID == pid {
			return h.Priority
		}
	}
	return ""
}

// readState reads a state file (testutil cannot import occupancy, whose
// tests use it).
func readState(path string) (*v1.StateFile, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var f v1.StateFile
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, err
	}
	return &f, nil
}
