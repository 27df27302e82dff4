//go:build k8s

package k8s

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpud/gpud/internal/config"
	"github.com/gpud/gpud/internal/preempt"
	"github.com/gpud/gpud/internal/testutil"
)

// counterPod is a borrower of the lent GPU that holds it and counts in a
// loop into /tmp/count, restarted by kubelet if it ever stops (so that a
// restart shows in restartCount); probes as given ("" none). Each count is
// written to a new file and renamed over /tmp/count: a freeze between the
// shell's truncating open and its write (a CI run beside a CPU hog caught
// one) left the file empty for as long as the pod was frozen.
func counterPod(t *testing.T, name, probe string) {
	t.Helper()
	testPod{name: name, onNode: true, restart: "Always",
		command:   "exec 3<>/dev/nvidia0; i=0; while :; do i=$((i+1)); echo $i > /tmp/count.new; mv /tmp/count.new /tmp/count 3<&-; sleep 0.1; done",
		container: limitOne("gpud.io/idle-gpu") + probe,
	}.run(t)
}

// readCount reads a process's /tmp/count through /proc (not kubectl exec:
// an exec into a frozen container freezes too); -1 when unreadable.
func readCount(pid int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/root/tmp/count", pid))
	if err != nil {
		return -1
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return -1
	}
	return n
}

// Lending with --preempt-mode freeze on the real kubelet: the owner of a
// lent GPU comes back (its compute, through NVML) → the borrower pod is
// frozen, its counter stops; the owner idles (--idle-after) → the GPU is
// lent again and the borrower thawed, its counter going on from where it
// stopped; twice; the pod is never restarted (no liveness probe). A
// borrower with a liveness probe is killed instead (preempt.FreezeSafe).
// NVML is go-nvml's mock, as in TestOwnerActiveOnNVMLTakesLentGPUBack.
func TestLentBorrowerFrozenAndResumedOnARealKubelet(t *testing.T) {
	dev, gpu := fakeGPU(t)
	startStandin(t, gpu)
	lib, ownerActive := ownerActivityMock()
	d, statePath := lendingGpud(t, dev, lib, func(r *config.Run) { r.PreemptMode, r.MaxFrozen = "freeze", 10*time.Minute })
	holders := fileHolders(statePath)
	testutil.Eventually(t, 30*time.Second, "gpud registered and kubelet lists both resources", func() bool {
		return d.Plugin().IsRegistered() && allocatable(t, "nvidia.com/gpu") == "1"
	})
	resourcePod(t, "frowner", "nvidia.com/gpu")
	mustKubectl(t, "wait", "--for=condition=Ready", "pod/frowner", "--timeout=60s")
	ownerPID := hold(t, holders, "frowner")
	testutil.Eventually(t, 30*time.Second, "the idle-gpu resource allocatable", func() bool { return allocatable(t, "gpud.io/idle-gpu") == "1" })

	counterPod(t, "frborrower", "")
	mustKubectl(t, "wait", "--for=condition=Ready", "pod/frborrower", "--timeout=60s")
	borrowerUID := podUID(t, "frborrower")
	borrowerPID := hold(t, holders, "frborrower")
	testutil.Eventually(t, 10*time.Second, "the borrower counts", func() bool { return readCount(borrowerPID) > 5 })

	stopped := func(round int) int {
		t.Helper()
		ownerActive.Store(int64(ownerPID))
		testutil.Eventually(t, 15*time.Second, fmt.Sprintf("round %d: the borrower's pod frozen", round), func() bool {
			for _, s := range d.Executor().Suspensions() {
				if s.PodUID == borrowerUID && !s.Paused {
					return true
				}
			}
			return false
		})
		// Frozen: the counter stands still.
		var last int
		testutil.Eventually(t, 10*time.Second, fmt.Sprintf("round %d: the counter stopped", round), func() bool {
			a := readCount(borrowerPID)
			time.Sleep(500 * time.Millisecond)
			last = readCount(borrowerPID)
			return a > 0 && a == last
		})
		if !testutil.Alive(borrowerPID) || !testutil.Alive(ownerPID) {
			t.Fatalf("round %d: a process died (borrower alive %v, owner alive %v)", round, testutil.Alive(borrowerPID), testutil.Alive(ownerPID))
		}
		return last
	}
	for round := 1; round <= 2; round++ {
		last := stopped(round)
		time.Sleep(time.Second)
		if n := readCount(borrowerPID); n != last {
			t.Fatalf("round %d: the counter moved while frozen: %d → %d", round, last, n)
		}
		// The owner idles: after --idle-after the GPU is lent again and
		// the borrower thawed; it counts on from where it stopped.
		ownerActive.Store(0)
		testutil.Eventually(t, 20*time.Second, fmt.Sprintf("round %d: the borrower thawed and counting on from %d", round, last), func() bool {
			return readCount(borrowerPID) > last+3
		})
		if n := readCount(borrowerPID); n < last {
			t.Fatalf("round %d: the counter went back from %d to %d: work lost", round, last, n)
		}
		var thawed bool
		for _, r := range d.Journal().Recent() {
			if r.Action == preempt.ActionThaw && r.Victim.PodUID == borrowerUID && r.Result == "done" {
				thawed = true
			}
		}
		if !thawed {
			t.Fatalf("round %d: no thaw record of the borrower", round)
		}
	}
	if out := mustKubectl(t, "get", "pod", "frborrower", "-o", "jsonpath={.status.containerStatuses[0].restartCount} {.metadata.uid}"); out != "0 "+borrowerUID {
		t.Errorf("the borrower pod: restartCount and uid %q, want 0 %s (never restarted nor replaced)", out, borrowerUID)
	}
	if !testutil.Alive(ownerPID) {
		t.Error("the owner was harmed")
	}

	// A borrower with a liveness probe is killed, not frozen: a frozen
	// container fails its probes and kubelet would restart it.
	mustKubectl(t, "delete", "pod", "frborrower", "--grace-period=0", "--force")
	testutil.Eventually(t, 30*time.Second, "the first borrower gone", func() bool { return !testutil.Alive(borrowerPID) })
	testutil.Eventually(t, 30*time.Second, "the idle-gpu resource allocatable again", func() bool {
		return allocatable(t, "gpud.io/idle-gpu") == "1"
	})
	counterPod(t, "frprobed", `    livenessProbe: {exec: {command: ["true"]}, periodSeconds: 60, initialDelaySeconds: 60}
`)
	mustKubectl(t, "wait", "--for=condition=Ready", "pod/frprobed", "--timeout=60s")
	probedUID := podUID(t, "frprobed")
	probedPID := hold(t, holders, "frprobed")
	ownerActive.Store(int64(ownerPID))
	testutil.Eventually(t, 15*time.Second, "the probed borrower killed", func() bool { return !testutil.Alive(probedPID) })
	for _, r := range d.Journal().Recent() {
		if r.Victim.PodUID == probedUID && r.Action == preempt.ActionFreeze {
			t.Errorf("a borrower with a liveness probe was frozen: %+v", r)
		}
	}
	if !testutil.Alive(ownerPID) {
		t.Error("the owner was harmed")
	}
}
