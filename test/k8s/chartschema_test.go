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
		"--set", "admissionPolicy.enabled=true,admissionPolicy.validationActions={Warn,Audit}")
}
