//go:build k8s

package k8s

import (
	"encoding/json"
	"errors"
	"os"
	"sync"
	"testing"
	"time"
)

// hostStateFile is where the chart's gpud writes its state on the host
// (hostPaths.run's default, /run/gpud). A test's deployment is deleted
// without the chart's pre-delete hook (helm template), so the file of the
// previous test's gpud stays there until this test's gpud writes its own.
const hostStateFile = "/run/gpud/state.json"

// stateSince is when the running test deployed gpud (freshHostState):
// hostState and fileHolders take no state file written before it.
var stateSince struct {
	sync.Mutex
	at time.Time
}

// freshHostState removes the state file an earlier test's gpud left on
// the host and notes the time: from here on only a state this test's gpud
// wrote is read. Called before gpud is deployed.
func freshHostState(t *testing.T) {
	t.Helper()
	stateSince.Lock()
	// gpud's pod runs on this host: its updated_at and this are one clock.
	stateSince.at = time.Now()
	stateSince.Unlock()
	if err := os.Remove(hostStateFile); err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("removing the previous test's state file: %v", err)
	}
}

// stale reports whether a state file's updated_at is from before this
// test deployed gpud (an earlier run's gpud wrote it).
func stale(b []byte) bool {
	var st struct {
		UpdatedAt time.Time `json:"updated_at"`
	}
	if json.Unmarshal(b, &st) != nil {
		return true
	}
	stateSince.Lock()
	defer stateSince.Unlock()
	return st.UpdatedAt.Before(stateSince.at)
}
