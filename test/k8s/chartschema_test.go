//go:build k8s

package k8s

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// values.schema.json: a bad value or a typo fails `helm template` (and so
// install and upgrade) with the key's path, instead of rendering a pod
// that crash-loops or silently ignores the setting.
func TestHelmChartSchemaRejectsBadValues(t *testing.T) {
	root, _ := filepath.Abs("../..")
	for _, tc := range []struct{ set, want string }{
		{"--set=gpud.idleAfter=5", "/gpud/idleAfter"},                    // a number, no unit
		{"--set-string=gpud.idleAfter=5", "/gpud/idleAfter"},             // a string, still no unit
		{"--set=gpud.failOpenAfter=30sec", "/gpud/failOpenAfter"},        // not a Go duration
		{"--set=gpud.idleafter=5m", "additional properties 'idleafter'"}, // a typo
		{"--set=devicePlugin.enable=true", "additional properties 'enable'"},
		{"--set=devicePlugin.cdiKind=nvidia.com", "/devicePlugin/cdiKind"},       // no class
		{"--set=devicePlugin.cdiKind=nvidia.com/gpu=x", "/devicePlugin/cdiKind"}, // a device, not a kind
		{"--set=replicas=2", "additional properties 'replicas'"},
		{"--set=gpud.defaultPriority=medium", "/gpud/defaultPriority"},
		{"--set=gpud.reclaim=kill", "/gpud/reclaim"},
		{"--set=gpud.logLevel=verbose", "/gpud/logLevel"},
		{"--set=image.pullPolicy=Sometimes", "/image/pullPolicy"},
		{"--set=gpud.monitoring=yes", "/gpud/monitoring"},
		{"--set=gpud.pprofAddr=0.0.0.0:6060", "/gpud/pprofAddr"}, // loopback only
		{"--set=hostPaths.run=run/gpud", "/hostPaths/run"},       // relative
		{"--set=serviceMonitor.interval=30", "/serviceMonitor/interval"},
		{"--set=admissionPolicy.validationActions={Block}", "/admissionPolicy/validationActions"},
		{"--set=uninstallHook.timeoutSeconds=0", "/uninstallHook/timeoutSeconds"},
		{"--set=gpud.agentComms={nvidia-persistenced}", "/gpud/agentComms/0"}, // a comm keeps 15 bytes: never matches
		{"--set=gpud.agentLabels={app}", "/gpud/agentLabels/0"},               // not key=value
		{"--set=gpud.agentNamespaces={GPU_Operator}", "/gpud/agentNamespaces/0"},
		{"--set=gpud.cgroupParents={kubelet.slice}", "/gpud/cgroupParents/0"}, // relative
		{"--set=gpud.cgroupParents={/}", "/gpud/cgroupParents/0"},             // the root trusts every cgroup
	} {
		out, err := exec.Command(filepath.Join(root, "scripts/helm.sh"), "template", "gpud", chartDir(), tc.set).CombinedOutput()
		if err == nil {
			t.Errorf("%s rendered", tc.set)
			continue
		}
		if !strings.Contains(string(out), tc.want) {
			t.Errorf("%s: the error does not name %s:\n%s", tc.set, tc.want, out)
		}
	}
	// Good values of the same keys render.
	render(t, "--set", "gpud.idleAfter=1h30m,gpud.failOpenAfter=0s,gpud.monitoring=false,gpud.pprofAddr=127.0.0.1:6060,affinity=null",
		"--set", "gpud.cgroupParents={/kubelet/kubepods,/kubelet.slice/kubelet-kubepods.slice}",
		"--set", "admissionPolicy.enabled=true,admissionPolicy.validationActions={Warn,Audit}")
}

// kubeconform runs scripts/kubeconform.sh (strict, Kubernetes 1.36 schemas
// made from the module proxy's OpenAPI document) on a manifest.
func kubeconform(t *testing.T, manifest string, args ...string) (string, error) {
	t.Helper()
	root, _ := filepath.Abs("../..")
	cmd := exec.Command(filepath.Join(root, "scripts/kubeconform.sh"), append(args, "-summary", "-")...)
	cmd.Stdin = strings.NewReader(manifest)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// Every object the chart and the base render is valid for the Kubernetes
// version the cluster runs, with no field the API does not know (a typo
// the API server would drop silently, or refuse): the default chart, the
// chart with every option and its hooks, and deploy/base. A typo is caught.
func TestChartAndBaseValidAgainstKubernetesSchemas(t *testing.T) {
	// The Prometheus Operator's kinds are CRDs with no schema here; the
	// rules inside are checked by promtool (deploy/alerts).
	skip := []string{"-skip", "ServiceMonitor,PrometheusRule"}
	root, _ := filepath.Abs("../..")
	for name, m := range map[string]string{
		"chart (defaults)": render(t),
		"chart (everything, hooks)": renderHooks(t, "--set", "createNamespace=true,devicePlugin.enabled=true,service.enabled=true,serviceMonitor.enabled=true,prometheusRule.enabled=true",
			"--set", "admissionPolicy.enabled=true,admissionPolicy.highPriorityNamespaces={ml-prod},gpud.monitoring=true,gpud.pprofAddr=127.0.0.1:6060"),
		"deploy/base": mustKubectl(t, "kustomize", filepath.Join(root, "deploy/base")),
	} {
		out, err := kubeconform(t, m, skip...)
		if err != nil || !strings.Contains(out, "Invalid: 0, Errors: 0") {
			t.Errorf("%s: kubeconform: %v\n%s", name, err, out)
		} else {
			t.Logf("%s: %s", name, strings.TrimSpace(out))
		}
	}
	bad := strings.Replace(render(t), "hostNetwork: true", "hostNetwrok: true", 1)
	if out, err := kubeconform(t, bad, skip...); err == nil || !strings.Contains(out, "hostNetwrok") {
		t.Errorf("kubeconform accepted a DaemonSet with hostNetwrok: %v\n%s", err, out)
	}
}
