//go:build k8s

package k8s

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/gpud/gpud/internal/testutil"
)

// A high pod holds the GPU; low pods whose first instruction opens it are
// started together. None may keep it: each is refused by the kernel gate
// (its class known when its cgroup was made) or, having got in before
// gpud knew it, killed as soon as its class is known. The test reports the
// share refused in the kernel.
//
// Here gpud learns classes from the API server's informer only (NRI off).
func TestFirstOpenPodsNeverKeepAHighGPU(t *testing.T) {
	firstOpens(t, "fo", "--kubeconfig", env(t, "KUBECONFIG"), "--node-name", env(t, "NODE_NAME"), "--reclaim", "none", "--nri-socket", "none")
}

// The same with classes from the runtime's NRI only (no API server, no CRI
// listing): containerd asks gpud about each pod before creating its
// containers, so every first open is judged by the kernel gate.
func TestFirstOpenPodsThroughNRI(t *testing.T) {
	opened := firstOpens(t, "nri", "--kubeconfig", "", "--cri-endpoint", "none", "--nri-socket", env(t, "NRI_SOCK"), "--reclaim", "none")
	if opened != 0 {
		t.Fatalf("%d low pods got a GPU fd before gpud knew them: through NRI, every first open must be judged by the gate", opened)
	}
}

// firstOpens runs the first-open flow with gpud on the host started with
// flags, and returns how many low pods got in before the gate knew them.
func firstOpens(t *testing.T, prefix string, flags ...string) (opened int) {
	dev, gpu := fakeGPU(t)
	state := startHostGpud(t, dev, flags...)
	holders := fileHolders(state)
	gpuPod(t, prefix+"-high", "high", gpu)
	highPID := hold(t, holders, prefix+"-high")

	n := testutil.Count(t, "GPUD_FIRST_OPEN_PODS", 100)
	var manifest strings.Builder
	for i := 0; i < n; i++ {
		// A subshell: a refused redirection must not end the pod's shell,
		// which then says what happened and stays (its logs are read).
		fmt.Fprintf(&manifest, `---
apiVersion: v1
kind: Pod
metadata: {name: %s-low-%d, namespace: default, labels: {gpud.io/priority: low, gpud-test: first-open}}
spec:
  nodeName: %s
  terminationGracePeriodSeconds: 0
  restartPolicy: Never
  containers:
  - name: c
    image: gpud.local/busybox:1
    imagePullPolicy: Never
    securityContext: {privileged: true}
    command: ["sh", "-c", "(exec 3<>/dev/nvidia0 && echo OPENED && exec sleep 3600) || echo REFUSED; exec sleep 3600"]
    volumeMounts: [{name: gpu, mountPath: /dev/nvidia0}]
  volumes: [{name: gpu, hostPath: {path: %s, type: CharDevice}}]
`, prefix, i, env(t, "NODE_NAME"), gpu)
	}
	t.Cleanup(func() {
		kubectl(t, "delete", "pod", "-l", "gpud-test=first-open", "--grace-period=0", "--force", "--ignore-not-found", "--wait=false")
	})
	start := time.Now()
	apply(t, manifest.String())
	// Every pod has said what its open did.
	said := map[string]string{}
	testutil.Eventually(t, 5*time.Minute, fmt.Sprintf("all %d low pods ran their first instruction", n), func() bool {
		for i := 0; i < n; i++ {
			name := fmt.Sprintf("%s-low-%d", prefix, i)
			if said[name] != "" {
				continue
			}
			out, err := kubectl(t, "logs", name)
			if err == nil && (strings.Contains(out, "OPENED") || strings.Contains(out, "REFUSED")) {
				said[name] = strings.TrimSpace(out)
			}
		}
		return len(said) == n
	})
	t.Logf("%d low pods started and opened in %v", n, time.Since(start).Round(time.Second))
	// No low pod keeps the GPU beside the high one.
	testutil.Eventually(t, 30*time.Second, "no low holder beside the high pod", func() bool {
		for _, h := range holders() {
			if h.Priority == "low" {
				return false
			}
		}
		return true
	})
	refused := 0
	for _, out := range said {
		// A holder killed after the fact ends its subshell, which then
		// says REFUSED too: OPENED is what tells.
		if strings.Contains(out, "OPENED") {
			opened++
		} else {
			refused++
		}
	}
	t.Logf("first opens of a high-held GPU by %d low pods: %d refused by the kernel gate (%.0f%%), %d got in before gpud knew them and were killed after the fact",
		n, refused, 100*float64(refused)/float64(n), opened)
	if !testutil.Alive(highPID) {
		t.Fatal("the high pod's holder died")
	}
	return opened
}
