//go:build k8s

package k8s

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpud/gpud/internal/testutil"
)

// A wedged gpud (stopped with SIGSTOP while its NRI plugin is registered)
// never fails or blocks a pod's creation for long: containerd gives a plugin
// 2 s, then drops it and goes on. gpud resumed registers again and
// classifies the pod created meanwhile.
func TestPodsStartWhileGpudIsWedged(t *testing.T) {
	dev, gpu := fakeGPU(t)
	state := startHostGpud(t, dev, "--kubeconfig", "", "--cri-endpoint", "none", "--nri-socket", env(t, "NRI_SOCK"), "--reclaim", "none")
	log := filepath.Join(filepath.Dir(state), "gpud.log")
	registered := func() int {
		b, _ := os.ReadFile(log)
		return strings.Count(string(b), "NRI plugin registered")
	}
	testutil.Eventually(t, 20*time.Second, "gpud registers with containerd's NRI", func() bool { return registered() >= 1 })
	pid := gpudPID(t, state)
	if err := unix.Kill(pid, unix.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := true
	t.Cleanup(func() {
		if stopped {
			unix.Kill(pid, unix.SIGCONT)
		}
	})
	start := time.Now()
	gpuPod(t, "wedged-low", "low", gpu) // waits until Ready (60 s)
	t.Logf("a pod started in %v with gpud stopped", time.Since(start).Round(100*time.Millisecond))
	unix.Kill(pid, unix.SIGCONT)
	stopped = false
	testutil.Eventually(t, 30*time.Second, "gpud registers again after containerd dropped it", func() bool { return registered() >= 2 })
	// Its class reached gpud at re-registration: the pod is a low holder.
	gpuPod(t, "wedged-high", "high", gpu)
	holders := fileHolders(state)
	hold(t, holders, "wedged-high")
	out, _ := kubectl(t, "exec", "wedged-low", "--", "sh", "-c", "exec 3<>/dev/nvidia0 && echo opened")
	if !strings.Contains(out, "Operation not permitted") {
		t.Fatalf("the pod created while gpud was wedged opened a high-held GPU: %q, want EPERM", out)
	}
}

// gpudPID is the pid of the host gpud whose state file is state.
func gpudPID(t *testing.T, state string) int {
	t.Helper()
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		b, err := os.ReadFile(filepath.Join(d, "cmdline"))
		if err != nil || !strings.Contains(string(b), "bin/gpud\x00run\x00") || !strings.Contains(string(b), state) {
			continue
		}
		pid, err := strconv.Atoi(filepath.Base(d))
		if err == nil {
			return pid
		}
	}
	t.Fatalf("no gpud process with state file %s", state)
	return 0
}
