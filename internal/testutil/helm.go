package testutil

import (
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// Helm returns the path of the pinned helm scripts/helm.sh builds. When it
// is not built: outside CI the test skips; under CI it is built, since the
// chart is always checked there.
func Helm(tb testing.TB) string {
	tb.Helper()
	_, file, _, _ := runtime.Caller(0)
	script := filepath.Join(filepath.Dir(file), "..", "..", "scripts", "helm.sh")
	out, err := exec.Command(script, "--built").Output()
	if err != nil {
		if !InCI() {
			Skip(tb, "helm is not built: `make k8s` (scripts/helm.sh) builds it")
		}
		if out, err = exec.Command(script, "--path").Output(); err != nil {
			tb.Fatalf("scripts/helm.sh --path: %v", err)
		}
	}
	return strings.TrimSpace(string(out))
}
