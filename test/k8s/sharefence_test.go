//go:build k8s

package k8s

import (
	"fmt"
	"strings"
	"testing"
	"time"

	v1 "github.com/gpud/gpud/api/v1"
	"github.com/gpud/gpud/internal/testutil"
)

// claimPod runs a privileged pod (every device node is allowed to it, so
// only gpud's gate stands between it and a GPU) with the fake GPUs'
// directory at /gpus. claim names a ResourceClaim it references ("" for
// none); with one, its container holds its claim's GPU open.
func claimPod(t *testing.T, name, claim, dev string) {
	t.Helper()
	p := testPod{name: name, labels: []string{"gpud.io/priority", "low"}, restart: "Never",
		container: "    securityContext: {privileged: true}\n    volumeMounts: [{name: gpus, mountPath: /gpus}]\n",
		spec:      fmt.Sprintf("  volumes:\n  - name: gpus\n    hostPath: {path: %s}\n", dev),
	}
	if claim != "" {
		p.command = "exec 3<>$(ls /dev/nvidia[0-9]*); " + sleepUntilTerm
		p.container += claimedGPU
		p.spec += fmt.Sprintf("  resourceClaims:\n  - name: gpu\n    resourceClaimName: %s\n", claim)
	}
	p.run(t)
	if out, err := kubectl(t, "wait", "--for=condition=Ready", "pod/"+name, "--timeout=90s"); err != nil {
		desc, _ := kubectl(t, "describe", "pod", name)
		t.Fatalf("pod %s never Ready: %v %s\n%s", name, err, out, desc)
	}
}

// openIn opens node in pod's container and says "ok" or the error.
func openIn(t *testing.T, pod, node string) string {
	t.Helper()
	out, _ := kubectl(t, "exec", pod, "--", "sh", "-c", "exec 4<>"+node+" && echo OPENED")
	if strings.Contains(out, "OPENED") {
		return "ok"
	}
	return strings.TrimSpace(out)
}

// #32 class 5 on the cluster: two pods that reference ONE ResourceClaim
// (kubelet prepares it once, for the first) are both claimants: both
// listed with the share, both fenced (each one's open of the other GPU is
// refused). A pod without a claim opening the shared GPU's node is
// refused; it still opens the GPU nobody shares.
func TestOneClaimTwoPodsBothFencedOnTheCluster(t *testing.T) {
	_, _, dev := deploySharingDev(t)
	testutil.Eventually(t, 60*time.Second, "the node's ResourceSlice", func() bool {
		out, _ := kubectl(t, "get", "resourceslices", "--field-selector", "spec.driver=gpud.io", "-o", "jsonpath={.items[*].spec.devices[*].name}")
		return strings.Count(out, "gpu-") == 2
	})
	apply(t, fmt.Sprintf(`apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: onefortwo, namespace: default}
spec:
  devices:
    requests:
    - name: gpu
      exactly:
        deviceClassName: gpu-mem.gpud.io
        selectors: [{cel: {expression: 'device.attributes["gpud.io"].uuid == "%s"'}}]
        capacity: {requests: {memory: 4Gi}}
`, shareUUID0))
	t.Cleanup(func() { kubectl(t, "delete", "resourceclaim", "onefortwo", "--ignore-not-found") })
	claimPod(t, "oft-a", "onefortwo", dev)
	claimPod(t, "oft-b", "onefortwo", dev)
	t.Cleanup(func() {
		if t.Failed() {
			rc, _ := kubectl(t, "get", "resourceclaim", "onefortwo", "-o", "jsonpath={.status}")
			t.Logf("claim status %s\nstate GPU 0: %+v", rc, hostState(t))
		}
	})
	uids := map[string]string{"oft-a": podUID(t, "oft-a"), "oft-b": podUID(t, "oft-b")}
	waitHostState(t, 30*time.Second, "both pods listed with the claim's share of GPU 0", func(f *v1.StateFile) bool {
		seen := 0
		for _, s := range f.GPUs[0].Shares {
			if s.ClaimName == "onefortwo" && (s.PodUID == uids["oft-a"] || s.PodUID == uids["oft-b"]) {
				seen++
			}
		}
		return seen == 2
	})
	for _, p := range []string{"oft-a", "oft-b"} {
		var got string
		if !testutil.Poll(20*time.Second, func() bool {
			got = openIn(t, p, "/gpus/nvidia1")
			return strings.Contains(got, "not permitted")
		}) {
			t.Errorf("%s (a claimant of GPU 0 only) opening GPU 1: %s, want EPERM", p, got)
		}
		if got := openIn(t, p, "/gpus/nvidia0"); got != "ok" {
			t.Errorf("%s opening its claim's GPU 0: %s", p, got)
		}
	}

	claimPod(t, "oft-none", "", dev)
	var got string
	if !testutil.Poll(20*time.Second, func() bool {
		got = openIn(t, "oft-none", "/gpus/nvidia0")
		return strings.Contains(got, "not permitted")
	}) {
		t.Errorf("a pod without a claim opening the shared GPU 0: %s, want EPERM", got)
	}
	if got := openIn(t, "oft-none", "/gpus/nvidia1"); got != "ok" {
		t.Errorf("a pod without a claim opening GPU 1 (not shared): %s", got)
	}
}
