package daemon_test

// Issue 32, class 1 (trusted parents): a workload's cgroup is believed only
// where its runtime made it. Beyond the default places, that is where the
// engine reports a Docker container's cgroup (its --cgroup-parent), and the
// parents the operator names (--cgroup-parents). And a look-alike of a LOW
// container is no more that container than a look-alike of a high one.

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/gpud/gpud/api/v1"
	"github.com/gpud/gpud/internal/cgroups"
	"github.com/gpud/gpud/internal/occupancy"
	"github.com/gpud/gpud/internal/preempt"
	"github.com/gpud/gpud/internal/testutil"
)

// cgroupParent returns a fresh cgroup parent name for docker run
// --cgroup-parent (cgroupfs driver: a path from each hierarchy's root),
// removed from every hierarchy when the test ends (after its containers:
// cleanups run last-registered first).
func cgroupParent(t *testing.T) string {
	t.Helper()
	b := make([]byte, 4)
	rand.Read(b)
	p := "/gpudtest-parent-" + hex.EncodeToString(b)
	t.Cleanup(func() {
		dirs, _ := filepath.Glob("/sys/fs/cgroup/*" + p)
		dirs = append(dirs, "/sys/fs/cgroup"+p)
		for _, d := range dirs {
			os.Remove(d)
		}
	})
	return p
}

// containerOpts starts a labelled test container with the fake GPUs and
// extra docker run options, and waits until gpud has classified it and
// found its cgroup.
func (e *env) containerOpts(name string, opts []string, labels ...string) *ctr {
	e.t.Helper()
	return e.dockerRun(name, []string{"--device", e.gpus[0].Path + ":/dev/nvidia0", "--device", e.gpus[1].Path + ":/dev/nvidia1"}, opts, labels...)
}

// A low container started with --cgroup-parent holds a GPU; a high
// container opens it: the low holder is killed as a default-parent
// container's would be. It is believed (listed as that container, low, no
// look-alike) by the engine's word on its cgroup alone, and by
// --cgroup-parents naming its parent.
func TestCgroupParentContainerIsBelieved(t *testing.T) {
	for _, trusted := range []bool{false, true} {
		t.Run(fmt.Sprintf("cgroup-parents=%v", trusted), func(t *testing.T) {
			e := enforcingEnv(t, preempt.ReclaimNone)
			parent := cgroupParent(t)
			if trusted {
				e.cfg.CgroupParents = []string{parent}
				// It exists before the container is created: the kernel
				// classifies the container's cgroup as runc makes it.
				root, _, err := cgroups.V2Root()
				if err != nil {
					t.Fatal(err)
				}
				if err := os.MkdirAll(root+parent, 0o755); err != nil {
					t.Fatal(err)
				}
			}
			e.start()
			low := e.containerOpts("low", []string{"--cgroup-parent", parent}, "gpud.io/priority=low")
			if w, _ := e.d.Registry().Lookup(occupancy.ProcInfo{ContainerID: low.id}); !strings.HasPrefix(w.CgroupPath, parent+"/") {
				t.Fatalf("the low container's cgroup %q is not under --cgroup-parent %s", w.CgroupPath, parent)
			}
			victim := low.hold(0)
			f := waitHolder(t, e, 0, victim)
			for _, h := range f.GPUs[0].Holders {
				if h.PID == victim && (h.ContainerID != low.id || string(h.Priority) != string(occupancy.Low)) {
					t.Errorf("the low holder is listed as %+v, want container %s, low", h, low.id[:12])
				}
			}
			if ex, err := e.d.Explain(victim); err != nil || ex.ContainerID != low.id || ex.Reason != "label" {
				t.Errorf("explain: %+v, %v; want its container, by its label", ex, err)
			}
			high := e.container("high", "gpud.io/priority=high")
			if got := high.tryOpen(0); got != "opened" {
				t.Fatalf("high open on a GPU held by the --cgroup-parent low container: %q", got)
			}
			testutil.Eventually(t, 10*time.Second, "the low holder is dead", func() bool { return !testutil.Alive(victim) })
			// The kill's outcome is journaled once the signal is sent.
			testutil.Eventually(t, 5*time.Second, "the low container's kill journaled", func() bool {
				for _, r := range records(e, preempt.ActionKill) {
					if r.Victim.ContainerID == low.id {
						return true
					}
				}
				return false
			})
			if strings.Contains(e.logs.String(), "a cgroup named like a workload's") {
				t.Errorf("a real container's cgroup was taken for a look-alike")
			}
			if !strings.Contains(e.logs.String(), `"cgroup_parents":[`) {
				t.Errorf("the trusted parents are not logged at start")
			}
		})
	}
}

// A uid 65534 process in a delegated subtree makes a cgroup named as a LOW
// container's (its bare id) and opens a GPU a high container holds: it is
// a host process, so its open is no low request. Nothing waits or is
// reserved for the low container (at HEAD, the kernel classified the
// look-alike low at mkdir, refused its open, and the refusal queued the
// low container's waiter, reserved the GPU once high let go).
func TestLookalikeOfLowContainerIsNoWaiter(t *testing.T) {
	e := enforcingEnv(t, preempt.ReclaimNone)
	e.start()
	gpusOpenToAll(e)
	high := e.container("high", "gpud.io/priority=high")
	hp := high.hold(0)
	low := e.container("low", "gpud.io/priority=low")
	deleg := delegated(t)
	pid, opened := tryImpostor(t, deleg, low.id, e.gpus[0].Path)
	if !opened {
		t.Errorf("the look-alike's open was refused: it was taken for the low container")
	}
	f := testutil.WaitStateFile(t, e.cfg.StateFile, 5*time.Second, func(f *v1.StateFile) bool {
		for _, h := range f.GPUs[0].Holders {
			if h.PID == pid {
				return true
			}
		}
		return !opened
	})
	for _, h := range f.GPUs[0].Holders {
		if h.PID == pid && (string(h.Priority) != string(occupancy.Unmanaged) || h.ContainerID != "") {
			t.Errorf("the look-alike is listed as %+v, want an unmanaged host process", h)
		}
	}
	if ex, err := e.d.Explain(pid); err != nil || ex.ContainerID != "" || ex.Reason != "host" || ex.Workload != nil {
		t.Errorf("explain: %+v, %v; want a host process", ex, err)
	}
	for _, r := range records(e, preempt.ActionDeny) {
		t.Errorf("a refusal journaled: %+v", r)
	}
	// The high holder leaves: the GPU is reserved for nobody.
	exec.Command("kill", "-9", fmt.Sprint(hp)).Run()
	testutil.Eventually(t, 10*time.Second, "the high holder gone", func() bool { return !testutil.Alive(hp) })
	time.Sleep(time.Second) // a reservation comes with the release, within ms
	if id, ok := e.d.Reservation(0); ok {
		w, _ := e.d.Registry().Lookup(occupancy.ProcInfo{ContainerID: low.id})
		t.Errorf("GPU 0 reserved for cgroup %d (the low container's is %d) after a look-alike's open", id, w.CgroupID)
	}
	if got := low.tryOpen(0); got != "opened" {
		t.Errorf("the low container's own open after high left: %q", got)
	}
}
