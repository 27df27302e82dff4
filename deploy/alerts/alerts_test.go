// Package alerts tests gpud's alerting rules
// (deploy/helm/gpud/files/gpud-rules.yaml): promtool checks them and runs
// their unit tests (gpud-rules_test.yaml), and every gpud_* metric they
// query is one gpud defines.
package alerts

import (
	"os"
	"os/exec"
	"regexp"
	"testing"

	"github.com/gpud/gpud/internal/testutil"
)

const rules = "../helm/gpud/files/gpud-rules.yaml"

func promtool(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("CI") == "" {
			testutil.Skip(t, "promtool not installed (make test installs Debian's prometheus)")
		}
		t.Fatal("promtool not installed: scripts/deps.sh test installs it")
	}
	return p
}

// Every alert fires on the series that should fire it and on no other
// (gpud-rules_test.yaml), and the file is valid.
func TestAlertRules(t *testing.T) {
	p := promtool(t)
	if out, err := exec.Command(p, "check", "rules", rules).CombinedOutput(); err != nil {
		t.Fatalf("promtool check rules: %v\n%s", err, out)
	}
	if out, err := exec.Command(p, "test", "rules", "gpud-rules_test.yaml").CombinedOutput(); err != nil {
		t.Fatalf("promtool test rules: %v\n%s", err, out)
	}
}

// A renamed metric breaks this test, not the alert (which would then
// never fire).
func TestAlertRulesQueryDefinedMetrics(t *testing.T) {
	r, err := os.ReadFile(rules)
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile("../../internal/metrics/metrics.go")
	if err != nil {
		t.Fatal(err)
	}
	defined := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?:desc\(|Name:\s*)"([a-z_]+)"`).FindAllSubmatch(src, -1) {
		defined["gpud_"+string(m[1])] = true
	}
	used := regexp.MustCompile(`\bgpud_[a-z_]+\b`).FindAll(r, -1)
	if len(used) == 0 {
		t.Fatal("no gpud metric in the rules")
	}
	for _, u := range used {
		if !defined[string(u)] {
			t.Errorf("the rules query %s, which gpud does not define (internal/metrics)", u)
		}
	}
}
