// Package grafana holds gpud's Grafana dashboard (gpud.json) and its test:
// every metric a panel queries is one gpud serves, so renaming a metric
// breaks this test rather than the dashboard.
package grafana

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/gpud/gpud/internal/testutil"

	"github.com/gpud/gpud/internal/metrics"
)

type ds struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

type panel struct {
	Type       string `json:"type"`
	Title      string `json:"title"`
	Datasource ds     `json:"datasource"`
	Targets    []struct {
		Expr       string `json:"expr"`
		Datasource ds     `json:"datasource"`
	} `json:"targets"`
	Panels []panel `json:"panels"` // a collapsed row's
}

type dashboard struct {
	Inputs []struct {
		Name     string `json:"name"`
		Type     string `json:"type"`
		PluginID string `json:"pluginId"`
	} `json:"__inputs"`
	Templating struct {
		List []struct {
			Name       string          `json:"name"`
			Type       string          `json:"type"`
			Datasource ds              `json:"datasource"`
			Query      json.RawMessage `json:"query"` // a string or {"query": ...}
		} `json:"list"`
	} `json:"templating"`
	Panels []panel `json:"panels"`
}

func load(t *testing.T) dashboard {
	t.Helper()
	b, err := os.ReadFile("gpud.json")
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("gpud.json: %v", err)
	}
	return d
}

// expr is one PromQL expression of the dashboard and where it is.
type expr struct{ where, promql string }

func exprs(t *testing.T, d dashboard) []expr {
	t.Helper()
	var out []expr
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			for _, tg := range p.Targets {
				out = append(out, expr{"panel " + p.Title, tg.Expr})
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		var q string
		if json.Unmarshal(v.Query, &q) != nil {
			var o struct {
				Query string `json:"query"`
			}
			if err := json.Unmarshal(v.Query, &o); err != nil {
				t.Fatalf("variable %s: query %s", v.Name, v.Query)
			}
			q = o.Query
		}
		out = append(out, expr{"variable " + v.Name, q})
	}
	return out
}

// served returns the metric families gpud's registry serves, every one of
// them populated (a labelled counter never incremented has no series).
func served(t *testing.T) map[string]string {
	t.Helper()
	m := metrics.New("test", func() metrics.Snapshot {
		return metrics.Snapshot{
			GPUs: []metrics.GPU{{Index: 0, UUID: "GPU-x", Device: "/dev/nvidia0", State: "busy",
				Holders: []metrics.Holder{{Namespace: "ns", Pod: "p", Container: "c", Priority: "low"}}}},
			Events:  map[string]uint64{"open": 1},
			Resyncs: map[string]uint64{"start": 1},
		}
	})
	m.Opens(metrics.LabelsOf(0, nil, "GPU-x", "/dev/nvidia0"), metrics.VerdictAllow).Inc()
	m.Preemption("kill", time.Millisecond)
	fams, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, f := range fams {
		out[f.GetName()] = f.GetType().String()
	}
	return out
}

var metricName = regexp.MustCompile(`\bgpud_[a-zA-Z0-9_]+`)

// Every gpud_* name in a panel or variable query is a metric gpud serves
// (a histogram's _bucket, _sum and _count series included).
func TestDashboardQueriesServedMetrics(t *testing.T) {
	d := load(t)
	fams := served(t)
	used := map[string]bool{}
	for _, e := range exprs(t, d) {
		names := metricName.FindAllString(e.promql, -1)
		if len(names) == 0 {
			t.Errorf("%s: no gpud metric in %q", e.where, e.promql)
		}
		for _, n := range names {
			fam := n
			for _, suf := range []string{"_bucket", "_sum", "_count"} {
				if base, ok := strings.CutSuffix(n, suf); ok && fams[base] == "HISTOGRAM" {
					fam = base
				}
			}
			if _, ok := fams[fam]; !ok {
				t.Errorf("%s: %s is not a metric gpud serves (in %q)", e.where, n, e.promql)
			}
			used[fam] = true
		}
	}
	// The panels the dashboard must have (issue 6): each of these is queried.
	for _, want := range []string{
		"gpud_gpu_state", "gpud_gpu_holders", "gpud_workload_gpu_holders", "gpud_gpu_idle_seconds",
		"gpud_gpu_opens_total", "gpud_preemptions_total", "gpud_preemption_latency_seconds",
		"gpud_events_received_total", "gpud_events_dropped_total", "gpud_resyncs_total",
		"gpud_lent_gpus", "gpud_device_plugin_registered", "gpud_malformed_labels_total",
	} {
		if !used[want] {
			t.Errorf("no panel queries %s", want)
		}
	}
	var unused []string
	for f := range fams {
		if strings.HasPrefix(f, "gpud_") && !used[f] {
			unused = append(unused, f)
		}
	}
	sort.Strings(unused)
	if len(unused) > 0 {
		t.Logf("gpud metrics no panel shows: %v", unused)
	}
}

// The datasource is an import-time input (${DS_PROMETHEUS}), and the
// node and gpu variables exist and are used.
func TestDashboardInputsAndVariables(t *testing.T) {
	d := load(t)
	if len(d.Inputs) != 1 || d.Inputs[0].Name != "DS_PROMETHEUS" || d.Inputs[0].PluginID != "prometheus" {
		t.Errorf("__inputs: %+v, want the one Prometheus input DS_PROMETHEUS", d.Inputs)
	}
	want := ds{Type: "prometheus", UID: "${DS_PROMETHEUS}"}
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			if p.Type != "row" && p.Datasource != want {
				t.Errorf("panel %s: datasource %+v, want %+v", p.Title, p.Datasource, want)
			}
			for _, tg := range p.Targets {
				if tg.Datasource != want {
					t.Errorf("panel %s: target datasource %+v", p.Title, tg.Datasource)
				}
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	var vars []string
	for _, v := range d.Templating.List {
		vars = append(vars, v.Name)
		if v.Datasource != want {
			t.Errorf("variable %s: datasource %+v", v.Name, v.Datasource)
		}
	}
	for _, v := range []string{"node", "gpu"} {
		if !slices.Contains(vars, v) {
			t.Errorf("no %s variable (have %v)", v, vars)
		}
	}
	for _, e := range exprs(t, d) {
		if strings.HasPrefix(e.where, "panel ") && !strings.Contains(e.promql, `node=~"$node"`) {
			t.Errorf("%s: not filtered by $node: %q", e.where, e.promql)
		}
	}
}

// Every panel expression is valid PromQL: promtool (Debian's prometheus
// package, installed by make test) checks them as recording rules, with
// Grafana's variables replaced by values.
func TestDashboardPromQLParses(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("CI") == "" {
			testutil.Skip(t, "promtool not installed (make test installs Debian's prometheus)")
		}
		t.Fatal("promtool not installed: scripts/deps.sh test installs it")
	}
	vars := strings.NewReplacer("$__rate_interval", "1m", "$__interval", "1m", "$__range", "1h",
		"$node", ".*", "$gpu", ".*")
	var rules strings.Builder
	rules.WriteString("groups:\n  - name: dashboard\n    rules:\n")
	for i, e := range exprs(t, load(t)) {
		if strings.HasPrefix(e.where, "variable ") {
			continue // label_values() is Grafana's, not PromQL
		}
		q, err := json.Marshal(vars.Replace(e.promql)) // a JSON string is a YAML string
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&rules, "      - record: dashboard:expr%d\n        expr: %s\n", i, q)
	}
	f := filepath.Join(t.TempDir(), "rules.yml")
	if err := os.WriteFile(f, []byte(rules.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(promtool, "check", "rules", f).CombinedOutput(); err != nil {
		t.Errorf("promtool check rules: %v\n%s\n%s", err, out, rules.String())
	}
}
