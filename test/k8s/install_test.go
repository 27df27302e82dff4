//go:build k8s

package k8s

import (
	"crypto/tls"
	"errors"
	"fmt"
	"github.com/cilium/ebpf"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpud/gpud/internal/testutil"
	"k8s.io/apimachinery/pkg/util/yaml"
)

// docs decodes a multi-document YAML stream into generic objects.
func docs(t *testing.T, manifest string) []map[string]any {
	t.Helper()
	var out []map[string]any
	dec := yaml.NewYAMLOrJSONDecoder(strings.NewReader(manifest), 4096)
	for {
		var o map[string]any
		err := dec.Decode(&o)
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatalf("decoding the manifest: %v\n%s", err, manifest)
		}
		if o != nil {
			out = append(out, o)
		}
	}
}

// field reads a nested field of a generic object ("" path element: none).
func field(o any, path ...string) any {
	for _, p := range path {
		m, ok := o.(map[string]any)
		if !ok {
			return nil
		}
		o = m[p]
	}
	return o
}

// The uninstall hook: pre-delete, its Job's arguments are the node's paths
// (hostPaths mapped), its Role only gpud's DaemonSet and pods.
func TestHelmChartUninstallHookRenders(t *testing.T) {
	objs := docs(t, renderHooks(t, "--set", "hostPaths.run=/run/other,hostPaths.state=/srv/gpud-state"))
	var job, role map[string]any
	for _, o := range objs {
		switch o["kind"] {
		case "Job":
			job = o
		case "Role":
			role = o
		}
	}
	if job == nil || role == nil {
		t.Fatalf("no hook Job or Role rendered: %v", objs)
	}
	for _, o := range []map[string]any{job, role} {
		if h := field(o, "metadata", "annotations", "helm.sh/hook"); h != "pre-delete" {
			t.Errorf("%s is no pre-delete hook: %v", o["kind"], h)
		}
	}
	ctr := field(job, "spec", "template", "spec", "containers").([]any)[0]
	var args []string
	for _, a := range field(ctr, "args").([]any) {
		args = append(args, a.(string))
	}
	for _, want := range []string{"uninstall", "--daemonset=gpud", "--namespace=gpud-system", "--host-root=/host",
		"--state-file=/run/other/state.json", "--control-socket=/run/other/gpud.sock",
		"--state-dir=/srv/gpud-state", "--checkpoint-root=/srv/gpud-state/checkpoints", "--bpf-pin-dir=/sys/fs/bpf/gpud",
		"--dra-cdi-dir=/var/run/cdi", "--remove-dra-claims=false"} {
		if !slices.Contains(args, want) {
			t.Errorf("the hook Job's arguments lack %s: %v", want, args)
		}
	}
	if field(job, "spec", "template", "spec", "securityContext", "runAsNonRoot") != true {
		t.Errorf("the hook Job runs as root: %v", field(job, "spec", "template", "spec", "securityContext"))
	}
	rules := fmt.Sprint(role["rules"])
	if strings.Contains(rules, "secrets") || strings.Contains(rules, "delete") || strings.Contains(rules, "*") ||
		!strings.Contains(rules, "resourceNames:[gpud]") {
		t.Errorf("the hook's Role is more than gpud's DaemonSet and pods: %s", rules)
	}
	// --no-hooks (how the tests and `helm template | kubectl apply` users
	// render) and uninstallHook.enabled=false leave it out.
	for _, m := range []string{render(t), renderHooks(t, "--set", "uninstallHook.enabled=false")} {
		if strings.Contains(m, "kind: Job") {
			t.Error("a hook Job rendered with the hooks off")
		}
	}
}

// helmCmd runs the pinned helm against the test cluster ($KUBECONFIG).
func helmCmd(t *testing.T, args ...string) (string, error) {
	t.Helper()
	root, _ := filepath.Abs("../..")
	out, err := exec.Command(filepath.Join(root, "scripts/helm.sh"), args...).CombinedOutput()
	return string(out), err
}

// kubectlStdin runs kubectl with stdin.
func kubectlStdin(t *testing.T, stdin string, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(env(t, "KUBECTL"), args...)
	cmd.Stdin = strings.NewReader(stdin)
	out, err := cmd.CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

// `helm install` of the packaged chart (bin/release, as a release ships
// it) then `helm uninstall`: the pre-delete hook turns gpud's
// pod into a cleaner, which removes the gate gpud left pinned (and
// attached at the cgroup root), its state file, socket and directories.
func TestHelmUninstallLeavesNoGate(t *testing.T) {
	env(t, "KUBECONFIG")
	dev, _ := fakeGPU(t)
	before := testutil.DeviceGates(t)
	installed := false
	t.Cleanup(func() {
		if installed {
			helmCmd(t, "uninstall", "gpud", "-n", "gpud-system", "--no-hooks", "--wait", "--timeout=90s")
			uninstallGate(t)
		}
		kubectl(t, "delete", "namespace", "gpud-system", "--ignore-not-found", "--wait=true", "--timeout=60s")
	})
	// Helm keeps its release record in the namespace: it must exist first
	// (as `helm install --create-namespace` makes it), labelled for
	// gpud's privileged pod as the chart's own Namespace is.
	mustKubectl(t, "create", "namespace", "gpud-system")
	mustKubectl(t, "label", "namespace", "gpud-system", "pod-security.kubernetes.io/enforce=privileged")
	// From the release's packaged chart (scripts/release.sh), with its own
	// image: the repository release.sh stamped, the tag its appVersion
	// (make test tags the imported image so). Never pulled: the test
	// cluster reaches no registry.
	archive, version, appVersion := chartArchive(t)
	freshHostState(t)
	if out, err := helmCmd(t, "install", "gpud", archive, "-n", "gpud-system", "-f", clusterValues(t, dev, "{pullPolicy: Never}"),
		"--set", "createNamespace=false", "--wait", "--timeout=120s"); err != nil {
		t.Fatalf("helm install %s: %v\n%s", archive, err, out)
	}
	installed = true
	if out, _ := helmCmd(t, "list", "-n", "gpud-system", "-o", "json"); !strings.Contains(out, `"chart":"gpud-`+version+`"`) ||
		!strings.Contains(out, `"app_version":"`+appVersion+`"`) {
		t.Errorf("helm list: %s, want chart gpud-%s, app version %s", out, version, appVersion)
	}
	if img := mustKubectl(t, "-n", "gpud-system", "get", "daemonset", "gpud", "-o", "jsonpath={.spec.template.spec.containers[0].image}"); img != "gpud.local/gpud:"+appVersion {
		t.Errorf("the packaged chart runs image %s, want gpud.local/gpud:%s (release.sh's repository, the appVersion)", img, appVersion)
	}
	// helm's --wait can return before the DaemonSet controller has counted
	// the node (a DaemonSet that wants no pod yet reads as ready): wait
	// for gpud's gate itself.
	var gates []ebpf.ProgramID
	if !testutil.Poll(60*time.Second, func() bool { gates = testutil.DeviceGates(t); return len(gates) == len(before)+1 }) {
		t.Fatalf("device gates at the cgroup root: %v before, %v with gpud", before, gates)
	}
	// The gate is attached before the first state file is written.
	for _, f := range []string{"/sys/fs/bpf/gpud/gate", hostStateFile} {
		var err error
		if !testutil.Poll(30*time.Second, func() bool { _, err = os.Lstat(f); return err == nil }) {
			logs, _ := kubectl(t, "-n", "gpud-system", "logs", "daemonset/gpud", "--tail=40")
			t.Fatalf("gpud runs but %v; its log:\n%s", err, logs)
		}
	}

	start := time.Now()
	out, err := helmCmd(t, "uninstall", "gpud", "-n", "gpud-system", "--wait", "--timeout=180s")
	if err != nil {
		t.Fatalf("helm uninstall: %v\n%s", err, out)
	}
	installed = false
	t.Logf("helm uninstall took %v", time.Since(start).Round(time.Millisecond))
	if got := testutil.DeviceGates(t); !slices.Equal(got, before) {
		t.Errorf("device gates at the cgroup root after helm uninstall: %v, want %v (as before gpud)", got, before)
	}
	for _, f := range []string{"/sys/fs/bpf/gpud", "/run/gpud", "/var/lib/gpud/preemptions.jsonl"} {
		if _, err := os.Lstat(f); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s left after helm uninstall (%v)", f, err)
		}
	}
	testutil.Eventually(t, 60*time.Second, "gpud's pods are gone", func() bool {
		out, err := kubectl(t, "get", "pods", "-A", "-l", "app.kubernetes.io/name=gpud", "-o", "name")
		return err == nil && strings.TrimSpace(out) == ""
	})
}

// A node without a GPU label runs no gpud: a second, CPU-only node is
// registered (no kubelet behind it; cordoned so that no other test's pod
// lands there, which gpud's chart tolerates like every taint) and the
// DaemonSet wants gpud on the GPU node only.
func TestHelmChartRunsOnGPUNodesOnly(t *testing.T) {
	const cpuNode = "gpud-test-cpu-only"
	apply(t, fmt.Sprintf(`apiVersion: v1
kind: Node
metadata:
  name: %s
  labels: {kubernetes.io/hostname: %s, kubernetes.io/os: linux}
spec:
  unschedulable: true
  taints: [{key: gpud.io/test-cpu-only, effect: NoSchedule}]
`, cpuNode, cpuNode))
	t.Cleanup(func() { kubectl(t, "delete", "node", cpuNode, "--ignore-not-found", "--wait=true") })
	dev, _ := fakeGPU(t)
	deployChart(t, dev)
	// The controller counts the nodes it wants gpud on: the GPU node only.
	testutil.Eventually(t, 30*time.Second, "the DaemonSet counts its nodes", func() bool {
		out, _ := kubectl(t, "-n", "gpud-system", "get", "daemonset", "gpud", "-o", "jsonpath={.status.desiredNumberScheduled} {.status.numberReady}")
		return out == "1 1"
	})
	if out := mustKubectl(t, "get", "pods", "-A", "--field-selector", "spec.nodeName="+cpuNode, "-o", "name"); out != "" {
		t.Errorf("pods on the CPU-only node: %s", out)
	}
	// Labelled as a GPU node, it gets gpud too: the affinity is what kept it off.
	mustKubectl(t, "label", "node", cpuNode, "nvidia.com/gpu.present=true")
	testutil.Eventually(t, 30*time.Second, "the DaemonSet wants the newly labelled node", func() bool {
		out, _ := kubectl(t, "-n", "gpud-system", "get", "daemonset", "gpud", "-o", "jsonpath={.status.desiredNumberScheduled}")
		return out == "2"
	})
}

// The admission policy: a high pod outside the allowed namespaces is
// rejected by the API server, in them admitted; low pods anywhere.
func TestAdmissionPolicyRestrictsHighPriority(t *testing.T) {
	manifest := render(t, "--set", "admissionPolicy.enabled=true,admissionPolicy.highPriorityNamespaces={ml-prod}",
		"--show-only", "templates/admissionpolicy.yaml")
	apply(t, manifest)
	t.Cleanup(func() { kubectlStdin(t, manifest, "delete", "-f", "-", "--ignore-not-found") })
	for _, ns := range []string{"ml-prod", "team-a"} {
		mustKubectl(t, "create", "namespace", ns)
		t.Cleanup(func() { kubectl(t, "delete", "namespace", ns, "--wait=false") })
	}
	pod := func(ns, prio string, more ...string) (string, error) {
		return kubectlStdin(t, fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: p-%s, namespace: %s, labels: {gpud.io/priority: %s}}
spec: {containers: [{name: c, image: %s, command: [sleep, "3600"]}], terminationGracePeriodSeconds: 0}
`, prio, ns, prio, env(t, "BUSYBOX_IMAGE")), append([]string{"create", "-f", "-"}, more...)...)
	}
	// The policy takes effect once the API server has compiled it.
	var out string
	testutil.Eventually(t, 30*time.Second, "a high pod in team-a is rejected", func() bool {
		var err error
		out, err = pod("team-a", "high", "--dry-run=server")
		return err != nil
	})
	if !strings.Contains(out, "gpud.io/priority=high is not allowed in namespace team-a") {
		t.Errorf("rejection without the policy's message: %s", out)
	}
	for _, c := range [][2]string{{"ml-prod", "high"}, {"ml-prod", "low"}} {
		if out, err := pod(c[0], c[1], "--dry-run=server"); err != nil {
			t.Errorf("a %s pod in %s rejected: %v\n%s", c[1], c[0], err, out)
		}
	}
	// A low pod in team-a is admitted; relabelled high later, it is not.
	if out, err := pod("team-a", "low"); err != nil {
		t.Fatalf("a low pod in team-a rejected: %v\n%s", err, out)
	}
	out, err := kubectl(t, "-n", "team-a", "label", "pod", "p-low", "gpud.io/priority=high", "--overwrite")
	if err == nil || !strings.Contains(out, "not allowed in namespace team-a") {
		t.Errorf("relabelling a team-a pod high: %v %s", err, out)
	}
}

// metricsAuth on the real cluster: the metrics port is HTTPS with basic
// auth from a Secret, kubelet's probes reach the plain loopback health
// port (the pod becomes Ready), and the node's :9407 gives nothing
// without the password.
func TestHelmChartMetricsAuthOnARealCluster(t *testing.T) {
	dir := t.TempDir()
	testutil.WebConfig(t, dir, "/etc/gpud/web", "prometheus", "s3cret")
	mustKubectl(t, "create", "namespace", "gpud-system")
	mustKubectl(t, "-n", "gpud-system", "create", "secret", "generic", "gpud-metrics-web",
		"--from-file=web.yml="+filepath.Join(dir, "web.yml"), "--from-file=tls.crt="+filepath.Join(dir, "tls.crt"),
		"--from-file=tls.key="+filepath.Join(dir, "tls.key"))
	dev, _ := fakeGPU(t)
	deployChart(t, dev, "metricsAuth.secretName=gpud-metrics-web")

	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	get := func(url, user, pass string) (int, string) {
		req, _ := http.NewRequest("GET", url, nil)
		if user != "" {
			req.SetBasicAuth(user, pass)
		}
		resp, err := client.Do(req)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := get("https://127.0.0.1:9407/metrics", "", ""); code != http.StatusUnauthorized {
		t.Errorf("metrics without credentials: %d %.200s", code, body)
	}
	if code, body := get("https://127.0.0.1:9407/metrics", "prometheus", "s3cret"); code != http.StatusOK || !strings.Contains(body, "gpud_build_info") {
		t.Errorf("metrics with credentials: %d %.200s", code, body)
	}
	if code, body := get("http://127.0.0.1:9407/metrics", "", ""); code == http.StatusOK {
		t.Errorf("plain HTTP served the metrics: %.200s", body)
	}
	// The probes' port: health only, plain HTTP, loopback.
	if code, body := httpGet(t, "http://127.0.0.1:9408/readyz"); code != http.StatusOK {
		t.Errorf("/readyz on the health port: %d %s", code, body)
	}
	if code, _ := httpGet(t, "http://127.0.0.1:9408/metrics"); code != http.StatusNotFound {
		t.Errorf("/metrics on the health port: %d, want 404", code)
	}
}
