package daemon_test

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpud/gpud/bpf"
	"github.com/gpud/gpud/internal/preempt"
	"github.com/gpud/gpud/internal/testutil"
	"golang.org/x/sys/unix"
)

func pinDir(t *testing.T) string {
	dir := fmt.Sprintf("/sys/fs/bpf/gpud-test-%d", time.Now().UnixNano())
	t.Cleanup(func() {
		if err := bpf.Uninstall(dir); err != nil {
			t.Errorf("uninstall: %v", err)
		}
	})
	return dir
}

// Enforcement across restarts (issue 7, item 2), in three parts:
//  1. a stopped gpud that keeps enforcing leaves its gate pinned, which
//     goes on refusing a low open of a GPU a high-priority container holds,
//     until the heartbeat is older than --fail-open-after, then allows it;
//  2. the next gpud replaces the pinned gate's program, never stacks a
//     second one (the kernel allows 64 per cgroup), and enforces;
//  3. a clean stop without keep-enforcing, then Uninstall, leave nothing:
//     no program attached, no pin.
func TestPinnedGateAcrossRestarts(t *testing.T) {
	e := enforcingEnv(t, preempt.ReclaimNone)
	e.cfg.PinDir = pinDir(t)
	e.cfg.KeepEnforcing = true
	e.cfg.FailOpenAfter = 3 * time.Second
	before := testutil.DeviceGates(t)
	e.start()
	first := testutil.DeviceGates(t)
	if len(first) != len(before)+1 {
		t.Fatalf("gates attached: %v before, %v with gpud", before, first)
	}
	if _, err := os.Stat(filepath.Join(e.cfg.PinDir, "gate")); err != nil {
		t.Fatalf("no pinned gate: %v", err)
	}

	high := e.container("pin-high", "gpud.io/priority=high")
	highPID := high.hold(0)
	low := e.container("pin-low", "gpud.io/priority=low")
	e.stop() // as a crash does: the process's fds close, the pin stays
	stopped := time.Now()
	if got := testutil.DeviceGates(t); !slices.Equal(got, first) {
		t.Fatalf("gate after gpud stopped: %v, want %v", got, first)
	}
	if got := low.tryOpen(0); !strings.Contains(got, "Operation not permitted") {
		t.Fatalf("low open while gpud is down, before fail-open: %q, want EPERM", got)
	}
	// After --fail-open-after without a heartbeat, everything is allowed.
	testutil.Eventually(t, 10*time.Second, "the orphaned gate fails open", func() bool {
		return time.Since(stopped) > 3*time.Second && low.tryOpen(0) == "opened"
	})
	if !testutil.Alive(highPID) {
		t.Fatal("the high holder died while gpud was down")
	}

	// The next gpud: the same link, its own program on it.
	e.stop = e.startDaemon()
	testutil.Eventually(t, 10*time.Second, "the new gpud took the gate over", func() bool {
		got := testutil.DeviceGates(t)
		return len(got) == len(first) && !slices.Equal(got, first) && strings.Contains(e.logs.String(), "took over the gate")
	})
	low2 := e.container("pin-low2", "gpud.io/priority=low")
	if got := low2.tryOpen(0); !strings.Contains(got, "Operation not permitted") {
		t.Fatalf("low open after the restart: %q, want EPERM from the new gate", got)
	}
	if !testutil.Alive(highPID) {
		t.Fatal("the restart killed the high holder")
	}

	// A clean stop without keep-enforcing detaches and unpins.
	e.d.Monitor().KeepGate(false)
	e.stop()
	if got := testutil.DeviceGates(t); !slices.Equal(got, before) {
		t.Fatalf("gates after a clean stop: %v, want %v", got, before)
	}
	if _, err := os.Stat(filepath.Join(e.cfg.PinDir, "gate")); !os.IsNotExist(err) {
		t.Fatalf("pin left after a clean stop: %v", err)
	}
}

// Uninstall removes a gate a killed gpud left pinned.
func TestUninstallRemovesPinnedGate(t *testing.T) {
	e := enforcingEnv(t, preempt.ReclaimNone)
	e.cfg.PinDir = pinDir(t)
	e.cfg.KeepEnforcing = true
	before := testutil.DeviceGates(t)
	e.start()
	e.stop()
	if got := testutil.DeviceGates(t); len(got) != len(before)+1 {
		t.Fatalf("gates after a stop that keeps enforcing: %v (before %v)", got, before)
	}
	if err := bpf.Uninstall(e.cfg.PinDir); err != nil {
		t.Fatal(err)
	}
	if got := testutil.DeviceGates(t); !slices.Equal(got, before) {
		t.Fatalf("gates after uninstall: %v, want %v", got, before)
	}
	var st unix.Stat_t
	if err := unix.Stat(e.cfg.PinDir, &st); err == nil {
		t.Fatalf("pin directory left after uninstall")
	}
	// Twice is fine: nothing to remove.
	if err := bpf.Uninstall(e.cfg.PinDir); err != nil {
		t.Fatalf("second uninstall: %v", err)
	}
}
