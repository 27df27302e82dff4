//go:build k8s

package k8s

import (
	"strings"
	"testing"
	"time"

	v1 "github.com/gpud/gpud/api/v1"
	"github.com/gpud/gpud/internal/testutil"
)

// deviceTaints is each gpud.io device's taints in the node's slice, as
// "uuid=key=value:effect,...;".
func deviceTaints(t *testing.T) string {
	t.Helper()
	out, _ := kubectl(t, "get", "resourceslices", "--field-selector", "spec.driver=gpud.io", "-o",
		`jsonpath={range .items[*].spec.devices[*]}{.attributes.uuid.string}={range .taints[*]}{.key}={.value}:{.effect},{end};{end}`)
	return out
}

// waitTaint polls the slice until the device of uuid has exactly taint
// (key=value:effect, "" for none) and returns how long it took.
func waitTaint(t *testing.T, uuid, taint string, within time.Duration) time.Duration {
	t.Helper()
	want := uuid + "="
	if taint != "" {
		want += taint + ","
	}
	want += ";"
	t0 := time.Now()
	for {
		got := deviceTaints(t)
		if strings.Contains(got, want) {
			return time.Since(t0)
		}
		if time.Since(t0) > within {
			t.Fatalf("the slice's taints %q; want %s", got, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// pendingWhy waits for pod to be Pending Unschedulable, its claim not
// allocated, and returns the scheduler's message. The scheduler (1.36)
// says only that it cannot allocate the claim: the taint itself is in the
// slice, where `kubectl get resourceslice` shows it.
func pendingWhy(t *testing.T, pod string) string {
	t.Helper()
	testutil.Eventually(t, 30*time.Second, pod+" unschedulable", func() bool {
		out, _ := kubectl(t, "get", "pod", pod, "-o", `jsonpath={.status.phase} {.status.conditions[?(@.type=="PodScheduled")].reason}`)
		return out == "Pending Unschedulable"
	})
	msg := mustKubectl(t, "get", "pod", pod, "-o", `jsonpath={.status.conditions[?(@.type=="PodScheduled")].message}`)
	if !strings.Contains(msg, "cannot allocate all claims") {
		t.Errorf("%s: the scheduler says %q, want that it cannot allocate the claim", pod, msg)
	}
	claim := mustKubectl(t, "get", "pod", pod, "-o", "jsonpath={.status.resourceClaimStatuses[0].resourceClaimName}")
	if out := mustKubectl(t, "get", "resourceclaim", claim, "-o", "jsonpath={.status.allocation}"); out != "" {
		t.Errorf("%s's claim allocated on a tainted GPU: %s", pod, out)
	}
	return msg
}

// Health as the scheduler reads it: an unhealthy shared GPU stays in the
// ResourceSlice with a gpud.io/unhealthy device taint. A critical XID on
// GPU 0: NoSchedule within 1 s, the pod on it keeps running, a new claim
// for it is not allocated. GPU 1 fallen off the bus (the double answers
// GPU_IS_LOST): NoExecute within 1 s, kube-controller-manager's
// device-taint eviction deletes the pod using it (DisruptionTarget
// DeletionByDeviceTaintManager), kubelet unprepares its claim, a new claim
// is not allocated. GPU 1 back and gpud restarted: no taint, a claim lands.
func TestUnhealthyGPUIsTaintedInTheSlice(t *testing.T) {
	double, gp := deploySharing(t)
	testutil.Eventually(t, 60*time.Second, "both GPUs in the slice, untainted", func() bool {
		got := deviceTaints(t)
		return strings.Contains(got, shareUUID0+"=;") && strings.Contains(got, shareUUID1+"=;")
	})
	sharePodOn(t, "tnt0", "4Gi", shareUUID0)
	sharePodOn(t, "tnt1", "4Gi", shareUUID1)
	for _, p := range []string{"tnt0", "tnt1"} {
		if out, err := kubectl(t, "wait", "--for=condition=Ready", "pod/"+p, "--timeout=90s"); err != nil {
			desc, _ := kubectl(t, "describe", "pod", p)
			t.Fatalf("%s never Ready: %v %s\n%s", p, err, out, desc)
		}
	}
	claim1 := mustKubectl(t, "get", "pod", "tnt1", "-o", "jsonpath={.status.resourceClaimStatuses[0].resourceClaimName}")
	claim1UID := mustKubectl(t, "get", "resourceclaim", claim1, "-o", "jsonpath={.metadata.uid}")

	// A critical XID: NoSchedule. The pod on the GPU stays; a new claim
	// for it is not allocated.
	double.XID(t, 0, 48)
	took := waitTaint(t, shareUUID0, "gpud.io/unhealthy=xid-48:NoSchedule", 10*time.Second)
	t.Logf("XID 48 → NoSchedule taint in the slice: %s", took.Round(time.Millisecond))
	if took > time.Second {
		t.Errorf("the XID's taint took %s, want within 1s", took.Round(time.Millisecond))
	}
	sharePodOn(t, "tnt0b", "4Gi", shareUUID0)
	t.Logf("a new claim for the NoSchedule GPU: %s", pendingWhy(t, "tnt0b"))
	kubectl(t, "delete", "pod", "tnt0b", "--grace-period=0", "--force")

	// GPU 1 falls off the bus: every NVML call on it answers GPU_IS_LOST,
	// and so does the event wait (as a real driver's does at once).
	double.Update(t, 1, func(g *testutil.NVMLGPU) { g.Lost = true })
	double.EventErr(t, "gpu_is_lost", 1, 1)
	took = waitTaint(t, shareUUID1, "gpud.io/unhealthy=gpu-lost:NoExecute", 10*time.Second)
	t.Logf("GPU lost → NoExecute taint in the slice: %s", took.Round(time.Millisecond))
	if took > time.Second {
		t.Errorf("the lost GPU's taint took %s, want within 1s", took.Round(time.Millisecond))
	}
	testutil.Eventually(t, 30*time.Second, "tnt1 evicted by the device-taint eviction controller", func() bool {
		out, err := kubectl(t, "get", "pod", "tnt1", "-o", `jsonpath={.status.conditions[?(@.type=="DisruptionTarget")].reason}`)
		return err != nil || out == "DeletionByDeviceTaintManager" // gone, or going for that reason
	})
	testutil.Eventually(t, 90*time.Second, "tnt1 gone and its claim unprepared by gpud", func() bool {
		_, err := kubectl(t, "get", "pod", "tnt1")
		_, prepared := draCheckpoint(t)[claim1UID]
		return err != nil && !prepared
	})
	if out := mustKubectl(t, "get", "pod", "tnt0", "-o", "jsonpath={.status.phase}"); out != "Running" {
		t.Errorf("tnt0 on the NoSchedule GPU: %s, want Running", out)
	}
	sharePodOn(t, "tnt1b", "4Gi", shareUUID1)
	t.Logf("a new claim for the NoExecute GPU: %s", pendingWhy(t, "tnt1b"))
	waitHostState(t, 10*time.Second, "the state file: GPU 1 not offered, lost", func(f *v1.StateFile) bool {
		return f.DRA != nil && f.DRA.Offered == 0 && len(f.DRA.NotOffered) == 2
	})

	// GPU 1 answers again and gpud starts again (health stays until
	// then): its taint is gone and the pending claim lands on it.
	double.ClearFaults(t)
	double.Update(t, 1, func(g *testutil.NVMLGPU) { g.Lost = false })
	mustKubectl(t, "-n", "gpud-system", "delete", "pod", gp, "--wait=true")
	waitTaint(t, shareUUID1, "", 90*time.Second)
	if out, err := kubectl(t, "wait", "--for=condition=Ready", "pod/tnt1b", "--timeout=90s"); err != nil {
		desc, _ := kubectl(t, "describe", "pod", "tnt1b")
		t.Fatalf("tnt1b never Ready on the recovered GPU: %v %s\n%s", err, out, desc)
	}
}
