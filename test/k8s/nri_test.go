//go:build k8s

package k8s

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpud/gpud/internal/preempt/journal"
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

// taskPod is a busybox pod of task (label gpud.io/task-id) in namespace
// ns, with the fake GPU mapped in when gpu is not "", Ready on return.
func taskPod(t *testing.T, name, ns, prio, task, gpu string) {
	t.Helper()
	p := testPod{name: name, namespace: ns, labels: []string{"gpud.io/task-id", task}, onNode: true}
	if prio != "" {
		p.labels = append(p.labels, "gpud.io/priority", prio)
	}
	if gpu != "" {
		p = p.withGPU(gpu)
	}
	p.run(t)
	p.waitReady(t)
}

// A preempted task's checkpoint directory reaches only its own pods,
// through NRI at container creation: a pod of another namespace claiming
// the same task id gets nothing, the first pod of the task to start after
// the kill (the one resuming it) may write it, a second pod of the task
// only reads it, and a pod of no preempted task gets nothing. gpud on the
// host, containerd's NRI, kubelet and the pods are real.
func TestCheckpointMountOnlyForTheTaskThroughNRI(t *testing.T) {
	dev, gpu := fakeGPU(t)
	ckpt := filepath.Join(t.TempDir(), "checkpoints")
	state := startHostGpud(t, dev, "--kubeconfig", env(t, "KUBECONFIG"), "--node-name", env(t, "NODE_NAME"),
		"--reclaim", "evict", "--nri-socket", env(t, "NRI_SOCK"), "--checkpoint-root", ckpt)
	log := filepath.Join(filepath.Dir(state), "gpud.log")
	testutil.Eventually(t, 20*time.Second, "gpud registers with containerd's NRI", func() bool {
		b, _ := os.ReadFile(log)
		return strings.Contains(string(b), "NRI plugin registered")
	})
	mustKubectl(t, "create", "namespace", "ckother")
	t.Cleanup(func() { kubectl(t, "delete", "namespace", "ckother", "--wait=false") })

	// The task is preempted: a high pod's open kills the low pod of task
	// train-42, whose notice gpud writes into the task's directory.
	holders := fileHolders(state)
	taskPod(t, "ckvictim", "default", "low", "train-42", gpu)
	victimPID := hold(t, holders, "ckvictim")
	gpuPod(t, "ckhigh", "high", gpu)
	hold(t, holders, "ckhigh")
	testutil.Eventually(t, 10*time.Second, "the low pod's process is dead", func() bool { return !testutil.Alive(victimPID) })
	notice := filepath.Join(ckpt, "default", "train-42", journal.CheckpointFile) // keyed by namespace
	testutil.Eventually(t, 10*time.Second, "the checkpoint notice is written", func() bool { _, err := os.Stat(notice); return err == nil })

	inside := func(ns, pod string) string {
		t.Helper()
		out, _ := kubectl(t, "-n", ns, "exec", pod, "--", "sh", "-c",
			`echo "env=$GPUD_RESUME_FROM"; cat /gpud-checkpoint/gpud-preempted.json >/dev/null 2>&1 && echo read; touch /gpud-checkpoint/w-$HOSTNAME 2>/dev/null && echo wrote; true`)
		return strings.ReplaceAll(out, "\n", " ")
	}
	// Another tenant's pod labelled with the task id, first in line: nothing.
	taskPod(t, "ckstranger", "ckother", "", "train-42", "")
	if got := inside("ckother", "ckstranger"); got != "env=" {
		t.Errorf("a pod of another namespace claiming the task: %q, want no mount", got)
	}
	// The first pod of the task in its namespace resumes it: read-write.
	taskPod(t, "ckresumer", "default", "", "train-42", "")
	if got := inside("default", "ckresumer"); got != "env=/gpud-checkpoint read wrote" {
		t.Errorf("the resuming pod: %q, want the directory read-write", got)
	}
	// A second pod of the task: read-only.
	taskPod(t, "ckreplica", "default", "", "train-42", "")
	if got := inside("default", "ckreplica"); got != "env=/gpud-checkpoint read" {
		t.Errorf("a second pod of the task: %q, want the directory read-only", got)
	}
	// A pod of a task gpud never preempted: nothing.
	taskPod(t, "ckplain", "default", "", "train-43", "")
	if got := inside("default", "ckplain"); got != "env=" {
		t.Errorf("a pod of another task: %q, want no mount", got)
	}
	// What the resuming pod wrote is there on the host; nothing else was.
	ents, _ := os.ReadDir(filepath.Join(ckpt, "default", "train-42"))
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if len(names) != 2 || !slices.Contains(names, journal.CheckpointFile) || !slices.Contains(names, "w-ckresumer") {
		t.Errorf("the task's directory holds %v, want the notice and the resuming pod's file", names)
	}
}
