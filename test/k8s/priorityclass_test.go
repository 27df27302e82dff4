//go:build k8s

package k8s

import (
	"testing"
	"time"

	"github.com/gpud/gpud/internal/testutil"
)

// With --priority-classes high>=1000, a pod whose PriorityClass's value is
// above the threshold and that has no gpud.io/priority label is high, as
// the scheduler's preemption sees it: its open of the GPU a low pod holds
// kills the low pod.
func TestPriorityClassMakesAnUnlabelledPodHigh(t *testing.T) {
	dev, gpu := fakeGPU(t)
	state := startHostGpud(t, dev, "--kubeconfig", env(t, "KUBECONFIG"), "--node-name", env(t, "NODE_NAME"),
		"--reclaim", "none", "--nri-socket", "none", "--priority-classes", "high>=1000,low<1000")
	apply(t, "apiVersion: scheduling.k8s.io/v1\nkind: PriorityClass\nmetadata: {name: gpud-test-serving}\nvalue: 100000\n")
	t.Cleanup(func() { kubectl(t, "delete", "priorityclass", "gpud-test-serving", "--ignore-not-found") })

	gpuPod(t, "pc-low", "low", gpu)
	serving := testPod{name: "pc-serving", onNode: true, spec: "  priorityClassName: gpud-test-serving\n"}.withGPU(gpu)
	serving.run(t)
	serving.waitReady(t)
	if v := mustKubectl(t, "get", "pod", "pc-serving", "-o", "jsonpath={.spec.priority}"); v != "100000" {
		t.Fatalf("the pod's priority is %q, want the PriorityClass's 100000", v)
	}
	holders := fileHolders(state)
	lowPID := hold(t, holders, "pc-low")
	testutil.Eventually(t, 10*time.Second, "the low pod's holder is classified low", func() bool {
		for _, h := range holders() {
			if h.PID == lowPID {
				return h.Priority == "low"
			}
		}
		return false
	})
	highPID := hold(t, holders, "pc-serving")
	testutil.Eventually(t, 10*time.Second, "the unlabelled pod's holder is high by its PriorityClass", func() bool {
		for _, h := range holders() {
			if h.PID == highPID {
				return h.Priority == "high"
			}
		}
		return false
	})
	testutil.Eventually(t, 10*time.Second, "the low pod's process is dead", func() bool { return !testutil.Alive(lowPID) })
	if !testutil.Alive(highPID) {
		t.Fatal("the PriorityClass-high pod's process was killed")
	}
}
