//go:build k8s

// Package k8s holds the end-to-end test of gpud on a real one-node cluster
// (etcd, kube-apiserver, kubelet, containerd, scheduler, controller-manager;
// scripts/cluster.sh), with gpud running in its DaemonSet pod from deploy/.
// Run it with `make test-k8s`, which builds the image and brings the
// cluster up and down around it.
package k8s

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpud/gpud/internal/testutil"
	"golang.org/x/sys/unix"
)

func env(t *testing.T, k string) string {
	t.Helper()
	v := os.Getenv(k)
	if v == "" {
		t.Fatalf("%s is not set: run through make test-k8s (or source the cluster's env file)", k)
	}
	return v
}

func kubectl(t *testing.T, args ...string) (string, error) {
	t.Helper()
	out, err := exec.Command(env(t, "KUBECTL"), args...).CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

func mustKubectl(t *testing.T, args ...string) string {
	t.Helper()
	out, err := kubectl(t, args...)
	if err != nil {
		t.Fatalf("kubectl %v: %v\n%s", args, err, out)
	}
	return out
}

func apply(t *testing.T, manifest string) {
	t.Helper()
	cmd := exec.Command(env(t, "KUBECTL"), "apply", "-f", "-")
	cmd.Stdin = strings.NewReader(manifest)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("kubectl apply: %v\n%s\n%s", err, out, manifest)
	}
}

// testPod is a pod of the cluster tests: one busybox container "c" with a
// 2 s grace; the fields add what a test needs.
type testPod struct {
	name      string
	namespace string   // "": default
	labels    []string // key, value pairs
	onNode    bool     // nodeName: this node (else the scheduler places it)
	restart   string   // restartPolicy ("": kubelet's default, Always)
	command   string   // "": sleep until TERM
	container string   // more lines of the container, indented four spaces
	spec      string   // more lines of the pod's spec, indented two spaces
}

const sleepUntilTerm = "trap 'exit 0' TERM; sleep 3600 & wait"

// claimedGPU is a container's use of the pod's resource claim "gpu".
const claimedGPU = "    resources: {claims: [{name: gpu}]}\n"

func (p testPod) ns() string {
	if p.namespace == "" {
		return "default"
	}
	return p.namespace
}

func (p testPod) manifest(t *testing.T) string {
	t.Helper()
	var labels []string
	for i := 0; i+1 < len(p.labels); i += 2 {
		labels = append(labels, fmt.Sprintf("%q: %q", p.labels[i], p.labels[i+1]))
	}
	meta := ""
	if len(labels) > 0 {
		meta = ", labels: {" + strings.Join(labels, ", ") + "}"
	}
	var spec strings.Builder
	if p.onNode {
		fmt.Fprintf(&spec, "  nodeName: %s\n", env(t, "NODE_NAME"))
	}
	spec.WriteString("  terminationGracePeriodSeconds: 2\n")
	if p.restart != "" {
		fmt.Fprintf(&spec, "  restartPolicy: %s\n", p.restart)
	}
	command := p.command
	if command == "" {
		command = sleepUntilTerm
	}
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: %s, namespace: %s%s}
spec:
%s  containers:
  - name: c
    image: gpud.local/busybox:1
    imagePullPolicy: Never
    command: ["sh", "-c", %q]
%s%s`, p.name, p.ns(), meta, spec.String(), command, p.container, p.spec)
}

// run applies the pod and deletes it when the test ends.
func (p testPod) run(t *testing.T) {
	t.Helper()
	apply(t, p.manifest(t))
	t.Cleanup(func() {
		kubectl(t, "-n", p.ns(), "delete", "pod", p.name, "--grace-period=0", "--force", "--ignore-not-found")
	})
}

// waitReady waits (60 s at most) until the pod is Ready.
func (p testPod) waitReady(t *testing.T) {
	t.Helper()
	mustKubectl(t, "-n", p.ns(), "wait", "--for=condition=Ready", "pod/"+p.name, "--timeout=60s")
}

// withGPU maps the fake GPU node gpu in as /dev/nvidia0 (a privileged
// container: every device node is allowed to it, so only gpud's gate
// stands between it and the GPU).
func (p testPod) withGPU(gpu string) testPod {
	p.container += "    securityContext: {privileged: true}\n    volumeMounts: [{name: gpu, mountPath: /dev/nvidia0}]\n"
	p.spec += fmt.Sprintf("  volumes: [{name: gpu, hostPath: {path: %s, type: CharDevice}}]\n", gpu)
	return p
}

// gpuPod is a pod with the fake GPU node mapped in as /dev/nvidia0, Ready
// on return.
func gpuPod(t *testing.T, name, prio, gpu string) {
	t.Helper()
	p := testPod{name: name, onNode: true}.withGPU(gpu)
	if prio != "" {
		p.labels = []string{"gpud.io/priority", prio}
	}
	p.run(t)
	p.waitReady(t)
}

// hold makes a process in the pod open the GPU and keep it; returns its host PID.
func hold(t *testing.T, holders func() []holder, pod string) int {
	t.Helper()
	cmd := exec.Command(env(t, "KUBECTL"), "exec", pod, "--", "sh", "-c", "exec 3<>/dev/nvidia0 && exec sleep 3600")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	var pid int
	defer func() {
		if t.Failed() {
			out, _ := kubectl(t, "exec", pod, "--", "sh", "-c", "exec 3<>/dev/nvidia0 && echo opened")
			ev, _ := kubectl(t, "get", "events", "--field-selector", "involvedObject.name="+pod, "-o", "jsonpath={range .items[*]}{.reason}: {.message}{\"\\n\"}{end}")
			t.Logf("%s: a new open now: %q; holders: %+v; events:\n%s", pod, out, holders(), ev)
		}
	}()
	testutil.Eventually(t, 20*time.Second, pod+" holds the GPU", func() bool {
		for _, h := range holders() {
			if h.PodUID == podUID(t, pod) {
				pid = h.PID
				return true
			}
		}
		return false
	})
	return pid
}

type holder struct {
	PID      int    `json:"pid"`
	PodUID   string `json:"pod_uid"`
	Priority string `json:"priority"`
}

// podHolders reads GPU 0's holders from gpud's own status, inside its pod.
func podHolders(t *testing.T, gp string) func() []holder {
	return func() []holder {
		out, err := kubectl(t, "-n", "gpud-system", "exec", gp, "--", "/gpud", "status", "-o", "json")
		if err != nil {
			return nil
		}
		return parseHolders([]byte(out))
	}
}

// fileHolders reads GPU 0's holders from a state file on this machine.
func fileHolders(path string) func() []holder {
	return func() []holder {
		b, err := os.ReadFile(path)
		if err != nil || stale(b) {
			return nil
		}
		return parseHolders(b)
	}
}

func parseHolders(b []byte) []holder {
	var st struct {
		GPUs []struct {
			Holders []holder `json:"holders"`
		} `json:"gpus"`
	}
	if json.Unmarshal(b, &st) != nil || len(st.GPUs) == 0 {
		return nil
	}
	return st.GPUs[0].Holders
}

func podUID(t *testing.T, pod string) string {
	out, _ := kubectl(t, "get", "pod", pod, "-o", "jsonpath={.metadata.uid}")
	return out
}

func TestDaemonSetPreemptsOnARealCluster(t *testing.T) {
	dev, gpu := fakeGPU(t)
	gp := deployGpud(t, dev)
	preemptionFlow(t, gpu, podHolders(t, gp))
}

// deployGpud applies deploy/base pointed at the fake GPU directory and the
// local image, with extra JSON patch operations on the DaemonSet, and
// returns gpud's pod once gpud runs in it. Its log is shown when the test fails.
func deployGpud(t *testing.T, dev string, extra ...string) string {
	t.Helper()
	root, _ := filepath.Abs("../..")
	ovl := t.TempDir()
	base, _ := filepath.Rel(ovl, filepath.Join(root, "deploy/base"))
	var more strings.Builder
	for _, op := range extra {
		more.WriteString("      - " + op + "\n")
	}
	os.WriteFile(filepath.Join(ovl, "kustomization.yaml"), []byte(fmt.Sprintf(`apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources: [%s]
patches:
  - target: {kind: DaemonSet, name: gpud}
    patch: |-
      - {op: replace, path: /spec/template/spec/volumes/0/hostPath/path, value: %s}
      - {op: replace, path: /spec/template/spec/containers/0/imagePullPolicy, value: Never}
      # the test cluster runs no kube-proxy: reach the API server directly
      - {op: add, path: /spec/template/spec/containers/0/env/-, value: {name: KUBERNETES_SERVICE_HOST, value: "127.0.0.1"}}
      - {op: add, path: /spec/template/spec/containers/0/env/-, value: {name: KUBERNETES_SERVICE_PORT, value: "6443"}}
%s`, base, dev, more.String())), 0o644)
	mustKubectl(t, "apply", "-k", ovl)
	t.Cleanup(func() {
		// Foreground: gone only once its pod is gone. A gpud still running
		// from one test would keep its gate attached (the same fake device
		// numbers) and judge the next test's pods too.
		kubectl(t, "delete", "-k", ovl, "--cascade=foreground", "--wait=true", "--timeout=60s")
		testutil.Eventually(t, 60*time.Second, "gpud's pod is gone", func() bool {
			out, err := kubectl(t, "-n", "gpud-system", "get", "pod", "-l", "app.kubernetes.io/name=gpud", "-o", "name")
			return err != nil || strings.TrimSpace(out) == ""
		})
		uninstallGate(t)
		waitUnallocatable(t, "gpud.io/idle-gpu")
	})

	var gp string
	testutil.Eventually(t, 60*time.Second, "the gpud DaemonSet pod runs", func() bool {
		out, _ := kubectl(t, "-n", "gpud-system", "get", "pod", "-l", "app.kubernetes.io/name=gpud",
			"-o", "jsonpath={.items[0].metadata.name} {.items[0].status.phase}")
		f := strings.Fields(out)
		if len(f) == 2 && f[1] == "Running" {
			gp = f[0]
			return true
		}
		return false
	})
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := kubectl(t, "-n", "gpud-system", "logs", gp)
			lines := strings.Split(out, "\n")
			if len(lines) > 40 {
				lines = lines[len(lines)-40:]
			}
			t.Logf("gpud's log:\n%s", strings.Join(lines, "\n"))
		}
	})
	testutil.Eventually(t, 30*time.Second, "gpud started in its pod", func() bool {
		out, _ := kubectl(t, "-n", "gpud-system", "logs", gp)
		return strings.Contains(out, "gpud started")
	})
	return gp
}

// uninstallGate removes the gate a stopped DaemonSet gpud left pinned
// (--keep-enforcing is on by default), and its files, as `gpud uninstall`
// does for an admin removing gpud from a node.
func uninstallGate(t *testing.T) {
	t.Helper()
	root, _ := filepath.Abs("../..")
	if out, err := exec.Command(filepath.Join(root, "bin/gpud"), "uninstall").CombinedOutput(); err != nil {
		t.Errorf("gpud uninstall: %v %s", err, out)
	}
}

// startHostGpud runs bin/gpud on the host (the development set-up) with
// the given extra flags; it returns the state file's path.
func startHostGpud(t *testing.T, dev string, flags ...string) string {
	t.Helper()
	root, _ := filepath.Abs("../..")
	state := t.TempDir()
	args := append([]string{"run", "--dev-dir", dev, "--state-file", filepath.Join(state, "state.json"),
		"--state-dir", state, "--control-socket", "", "--docker-host", "none", "--keep-enforcing=false"}, flags...)
	cmd := exec.Command(filepath.Join(root, "bin/gpud"), args...)
	cmd.Env = append(os.Environ(), "KUBERNETES_SERVICE_HOST=")
	logf, _ := os.Create(filepath.Join(state, "gpud.log"))
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(unix.SIGTERM)
		cmd.Wait()
		if t.Failed() {
			b, _ := os.ReadFile(filepath.Join(state, "gpud.log"))
			t.Logf("gpud log:\n%s", b)
		}
	})
	statePath := filepath.Join(state, "state.json")
	testutil.Eventually(t, 10*time.Second, "gpud running", func() bool { _, err := os.Stat(statePath); return err == nil })
	return statePath
}

func fakeGPU(t *testing.T) (dir, node string) {
	t.Helper()
	dir = t.TempDir()
	node = filepath.Join(dir, "nvidia0")
	if err := unix.Mknod(node, unix.S_IFCHR|0o666, int(unix.Mkdev(10, 229))); err != nil {
		t.Fatal(err)
	}
	return dir, node
}

// The same flow with gpud on the host, outside the cluster, with a kubeconfig.
func TestHostGpudPreemptsOnARealCluster(t *testing.T) {
	dev, gpu := fakeGPU(t)
	state := startHostGpud(t, dev, "--kubeconfig", env(t, "KUBECONFIG"), "--node-name", env(t, "NODE_NAME"), "--reclaim", "evict")
	preemptionFlow(t, gpu, fileHolders(state))
}

// preemptionFlow: an unlabeled, a low and a high pod; the high pod's open
// preempts the low pod (processes dead, pod evicted and gone, Events on
// both); a low open while the high pod holds the GPU gets EPERM; the
// unlabeled pod is never touched.
func preemptionFlow(t *testing.T, gpu string, holders func() []holder) {
	t.Helper()
	gpuPod(t, "plain", "", gpu)
	gpuPod(t, "low", "low", gpu)
	gpuPod(t, "high", "high", gpu)
	plainPID := hold(t, holders, "plain")
	lowPID := hold(t, holders, "low")
	lowUID := podUID(t, "low")
	testutil.Eventually(t, 10*time.Second, "the low pod's holder is classified low", func() bool {
		for _, h := range holders() {
			if h.PID == lowPID {
				return h.Priority == "low"
			}
		}
		return false
	})

	// The high pod's open preempts the low pod.
	if out := mustKubectl(t, "exec", "high", "--", "sh", "-c", "exec 3<>/dev/nvidia0 && echo opened"); out != "opened" {
		t.Fatalf("high open: %q", out)
	}
	hold(t, holders, "high")
	testutil.Eventually(t, 10*time.Second, "the low pod's process is dead", func() bool { return !testutil.Alive(lowPID) })
	testutil.Eventually(t, 30*time.Second, "the low pod is evicted and gone from the API", func() bool {
		_, err := kubectl(t, "get", "pod", "low")
		return err != nil
	})
	testutil.Eventually(t, 10*time.Second, "Events name both pods", func() bool {
		lowEv, _ := kubectl(t, "get", "events", "--field-selector", "involvedObject.uid="+lowUID, "-o", "jsonpath={range .items[*]}{.reason}: {.message}{\"\\n\"}{end}")
		highEv, _ := kubectl(t, "get", "events", "--field-selector", "involvedObject.name=high", "-o", "jsonpath={range .items[*]}{.reason}: {.message}{\"\\n\"}{end}")
		return strings.Contains(lowEv, "GPUPreempted: ") && strings.Contains(lowEv, "pod default/high") &&
			strings.Contains(highEv, "GPUPreemptedOther") && strings.Contains(highEv, "pod default/low")
	})

	// A low pod's open while the high pod holds the GPU fails with EPERM inside the pod.
	gpuPod(t, "late", "low", gpu)
	out, _ := kubectl(t, "exec", "late", "--", "sh", "-c", "exec 3<>/dev/nvidia0 && echo opened")
	if !strings.Contains(out, "Operation not permitted") {
		t.Fatalf("low open while high holds: %q, want EPERM", out)
	}

	// The pod without the label is never touched.
	if !testutil.Alive(plainPID) {
		t.Fatal("the unlabeled pod's process was killed")
	}
	if phase := mustKubectl(t, "get", "pod", "plain", "-o", "jsonpath={.status.phase}"); phase != "Running" {
		t.Fatalf("the unlabeled pod is %s", phase)
	}
}

// Without an API server gpud classifies pods from their sandboxes' labels
// over CRI (kubelet copies pod labels onto the sandbox): the rules apply;
// pods are not evicted (only the API server can).
func TestCRIFallbackWithoutAPIServer(t *testing.T) {
	dev, gpu := fakeGPU(t)
	state := startHostGpud(t, dev, "--kubeconfig", "", "--cri-endpoint", env(t, "CONTAINERD_SOCK"), "--reclaim", "none")
	gpuPod(t, "crilow", "low", gpu)
	gpuPod(t, "crihigh", "high", gpu)
	lowPID := hold(t, fileHolders(state), "crilow")
	testutil.Eventually(t, 10*time.Second, "the low pod's holder is classified low", func() bool {
		for _, h := range fileHolders(state)() {
			if h.PID == lowPID {
				return h.Priority == "low"
			}
		}
		return false
	})
	// CRI has no watch: gpud lists sandboxes every 500ms, so a pod is
	// classified within that of its start (a real workload spends longer
	// than that in CUDA initialisation before it opens a GPU).
	time.Sleep(time.Second)
	if got := mustKubectl(t, "exec", "crihigh", "--", "sh", "-c", "exec 3<>/dev/nvidia0 && echo opened"); got != "opened" {
		t.Fatalf("high open: %q", got)
	}
	testutil.Eventually(t, 10*time.Second, "the low pod's process is dead", func() bool { return !testutil.Alive(lowPID) })
}

// The ServiceAccount of deploy/ can do what the flow needs, and nothing
// else: no secrets, no nodes, no workloads, no writes to pods beyond
// eviction and the status condition.
func TestRBACIsLeastPrivilege(t *testing.T) {
	root, _ := filepath.Abs("../..")
	mustKubectl(t, "apply", "-k", filepath.Join(root, "deploy/base"))
	t.Cleanup(func() { kubectl(t, "delete", "-k", filepath.Join(root, "deploy/base"), "--wait=true", "--timeout=60s") })
	as := "--as=system:serviceaccount:gpud-system:gpud"
	can := func(verb, resource string, extra ...string) bool {
		args := []string{"auth", "can-i", verb, resource, as}
		if res, sub, ok := strings.Cut(resource, "/"); ok {
			args = []string{"auth", "can-i", verb, res, "--subresource=" + sub, as}
		}
		args = append(args, extra...)
		out, _ := kubectl(t, args...)
		return out == "yes"
	}
	for _, ok := range [][]string{
		{"get", "pods"}, {"list", "pods"}, {"watch", "pods"},
		{"create", "pods/eviction"}, {"patch", "pods/status"}, {"create", "events"},
	} {
		if !can(ok[0], ok[1], "-A") {
			t.Errorf("gpud cannot %s %s: the flow needs it", ok[0], ok[1])
		}
	}
	for _, no := range [][]string{
		{"get", "secrets"}, {"list", "secrets"}, {"get", "configmaps"},
		{"patch", "nodes"}, {"update", "nodes"}, {"delete", "nodes"}, {"patch", "nodes/status"},
		{"create", "pods"}, {"delete", "pods"}, {"update", "pods"}, {"patch", "pods"}, {"create", "pods/exec"},
		{"create", "deployments.apps"}, {"patch", "daemonsets.apps"}, {"delete", "statefulsets.apps"},
		{"create", "jobs.batch"}, {"create", "serviceaccounts/token"}, {"update", "events"},
		{"create", "clusterrolebindings.rbac.authorization.k8s.io"}, {"*", "*"},
	} {
		if can(no[0], no[1], "-A") {
			t.Errorf("gpud can %s %s: more than it needs", no[0], no[1])
		}
	}
}
