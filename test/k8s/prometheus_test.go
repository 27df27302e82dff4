//go:build k8s

package k8s

import (
	"encoding/json"
	"fmt"
	"maps"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpud/gpud/internal/testutil"
	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/util/yaml"
)

// prometheus is Debian's Prometheus server, run by the test on a free port
// with its data in a temporary directory (no service, no systemd).
type prometheus struct{ url string }

// scrapeConfig is the chart's documented scrape job (prometheus-scrape.yaml)
// for a Prometheus in dir. Debian's prometheus is built without Kubernetes
// service discovery (Debian does not package client-go), so the test stands
// in for kubernetes_sd_configs, and only for that: it lists the pods that the
// job's selectors select from the real API server and writes them, with the
// labels kubernetes_sd gives a pod target (__meta_kubernetes_pod_*), to a
// file_sd file. Everything else in the job (honor_labels, relabel_configs:
// the annotation filter, path, port, node) is the chart's, unchanged.
func scrapeConfig(t *testing.T, dir string) []any {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(chartDir(), "prometheus-scrape.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		ScrapeConfigs []map[string]any `json:"scrape_configs"`
	}
	if err := yaml.Unmarshal(b, &doc); err != nil || len(doc.ScrapeConfigs) == 0 {
		t.Fatalf("the chart's prometheus-scrape.yaml: %v (%d jobs)", err, len(doc.ScrapeConfigs))
	}
	var jobs []any
	for i, job := range doc.ScrapeConfigs {
		sds, _ := job["kubernetes_sd_configs"].([]any)
		if len(sds) == 0 {
			t.Fatalf("job %v has no kubernetes_sd_configs", job["job_name"])
		}
		var files []string
		for j, sd := range sds {
			f := filepath.Join(dir, fmt.Sprintf("sd-%d-%d.json", i, j))
			writePodTargets(t, sd.(map[string]any), f)
			files = append(files, f)
		}
		delete(job, "kubernetes_sd_configs")
		job["file_sd_configs"] = []any{map[string]any{"files": files}}
		jobs = append(jobs, job)
	}
	return jobs
}

// writePodTargets writes the targets kubernetes_sd_configs (role: pod) would
// discover as a file_sd file: one per container port (one per container
// without ports), each with the pod's __meta_kubernetes_* labels.
func writePodTargets(t *testing.T, sd map[string]any, file string) {
	t.Helper()
	if sd["role"] != "pod" {
		t.Fatalf("kubernetes_sd_configs role %v: the test stands in for role pod only", sd["role"])
	}
	args := []string{"get", "pods", "-o", "json"}
	if ns, ok := sd["namespaces"].(map[string]any); ok && ns["names"] != nil {
		for _, n := range ns["names"].([]any) {
			args = append(args, "-n", fmt.Sprint(n)) // kubectl keeps the last: one namespace supported
		}
	} else {
		args = append(args, "-A")
	}
	sels, _ := sd["selectors"].([]any)
	for _, s := range sels {
		s := s.(map[string]any)
		if s["role"] != "pod" {
			continue
		}
		if l, ok := s["label"].(string); ok {
			args = append(args, "-l", l)
		}
		if f, ok := s["field"].(string); ok {
			args = append(args, "--field-selector", f)
		}
	}
	var pods struct {
		Items []struct {
			Metadata struct {
				Name        string            `json:"name"`
				Namespace   string            `json:"namespace"`
				UID         string            `json:"uid"`
				Labels      map[string]string `json:"labels"`
				Annotations map[string]string `json:"annotations"`
			} `json:"metadata"`
			Spec struct {
				NodeName   string `json:"nodeName"`
				Containers []struct {
					Name  string `json:"name"`
					Image string `json:"image"`
					Ports []struct {
						Name          string `json:"name"`
						ContainerPort int    `json:"containerPort"`
						Protocol      string `json:"protocol"`
					} `json:"ports"`
				} `json:"containers"`
			} `json:"spec"`
			Status struct {
				Phase      string `json:"phase"`
				PodIP      string `json:"podIP"`
				HostIP     string `json:"hostIP"`
				Conditions []struct {
					Type   string `json:"type"`
					Status string `json:"status"`
				} `json:"conditions"`
			} `json:"status"`
		} `json:"items"`
	}
	if err := json.Unmarshal([]byte(mustKubectl(t, args...)), &pods); err != nil {
		t.Fatalf("kubectl %v: %v", args, err)
	}
	sanitize := regexp.MustCompile(`[^a-zA-Z0-9_]`)
	var groups []map[string]any
	for _, p := range pods.Items {
		base := map[string]string{
			"__meta_kubernetes_namespace":          p.Metadata.Namespace,
			"__meta_kubernetes_pod_name":           p.Metadata.Name,
			"__meta_kubernetes_pod_uid":            p.Metadata.UID,
			"__meta_kubernetes_pod_ip":             p.Status.PodIP,
			"__meta_kubernetes_pod_host_ip":        p.Status.HostIP,
			"__meta_kubernetes_pod_node_name":      p.Spec.NodeName,
			"__meta_kubernetes_pod_phase":          p.Status.Phase,
			"__meta_kubernetes_pod_ready":          "false",
			"__meta_kubernetes_pod_container_init": "false",
		}
		for _, c := range p.Status.Conditions {
			if c.Type == "Ready" {
				base["__meta_kubernetes_pod_ready"] = strings.ToLower(c.Status)
			}
		}
		for k, v := range p.Metadata.Labels {
			base["__meta_kubernetes_pod_label_"+sanitize.ReplaceAllString(k, "_")] = v
			base["__meta_kubernetes_pod_labelpresent_"+sanitize.ReplaceAllString(k, "_")] = "true"
		}
		for k, v := range p.Metadata.Annotations {
			base["__meta_kubernetes_pod_annotation_"+sanitize.ReplaceAllString(k, "_")] = v
			base["__meta_kubernetes_pod_annotationpresent_"+sanitize.ReplaceAllString(k, "_")] = "true"
		}
		for _, c := range p.Spec.Containers {
			target := func(addr string, port map[string]string) {
				labels := map[string]string{"__meta_kubernetes_pod_container_name": c.Name, "__meta_kubernetes_pod_container_image": c.Image}
				maps.Copy(labels, base)
				maps.Copy(labels, port)
				groups = append(groups, map[string]any{"targets": []string{addr}, "labels": labels})
			}
			if len(c.Ports) == 0 {
				target(p.Status.PodIP, nil)
			}
			for _, port := range c.Ports {
				target(net.JoinHostPort(p.Status.PodIP, strconv.Itoa(port.ContainerPort)), map[string]string{
					"__meta_kubernetes_pod_container_port_name":     port.Name,
					"__meta_kubernetes_pod_container_port_number":   strconv.Itoa(port.ContainerPort),
					"__meta_kubernetes_pod_container_port_protocol": port.Protocol,
				})
			}
		}
	}
	if len(groups) == 0 {
		t.Fatalf("kubectl %v: no pod for the scrape job", args)
	}
	b, err := json.Marshal(groups)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func startPrometheus(t *testing.T) *prometheus {
	t.Helper()
	bin, err := exec.LookPath("prometheus")
	if err != nil {
		t.Fatalf("Debian's prometheus is not installed (scripts/deps.sh test): %v", err)
	}
	dir := t.TempDir()
	cfg, err := json.Marshal(map[string]any{ // JSON is YAML
		"global":         map[string]any{"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
		"scrape_configs": scrapeConfig(t, dir),
	})
	if err != nil {
		t.Fatal(err)
	}
	cfgFile := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfgFile, cfg, 0o644); err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	logf, err := os.Create(filepath.Join(dir, "prometheus.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--config.file="+cfgFile, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr, "--log.level=warn")
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(unix.SIGTERM)
		cmd.Wait()
		logf.Close()
		if t.Failed() {
			b, _ := os.ReadFile(filepath.Join(dir, "prometheus.log"))
			t.Logf("prometheus config:\n%s\nprometheus log:\n%s", cfg, b)
		}
	})
	p := &prometheus{url: "http://" + addr}
	testutil.Eventually(t, 30*time.Second, "prometheus is ready", func() bool {
		resp, err := http.Get(p.url + "/-/ready")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return p
}

type sample struct {
	Metric map[string]string
	Value  float64
}

// query evaluates an instant PromQL query through the HTTP API.
func (p *prometheus) query(t *testing.T, q string) []sample {
	t.Helper()
	resp, err := http.Get(p.url + "/api/v1/query?query=" + url.QueryEscape(q))
	if err != nil {
		t.Fatalf("query %s: %v", q, err)
	}
	defer resp.Body.Close()
	var r struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			ResultType string `json:"resultType"`
			Result     []struct {
				Metric map[string]string `json:"metric"`
				Value  [2]any            `json:"value"`
			} `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		t.Fatalf("query %s: %v", q, err)
	}
	if r.Status != "success" || r.Data.ResultType != "vector" {
		t.Fatalf("query %s: %s %s (%s)", q, r.Status, r.Error, r.Data.ResultType)
	}
	var out []sample
	for _, s := range r.Data.Result {
		v, err := strconv.ParseFloat(fmt.Sprint(s.Value[1]), 64)
		if err != nil {
			t.Fatalf("query %s: value %v", q, s.Value)
		}
		out = append(out, sample{s.Metric, v})
	}
	return out
}

// value is the single value of q, or 0 when q has no result (a counter
// never incremented has no series).
func (p *prometheus) value(t *testing.T, q string) float64 {
	t.Helper()
	s := p.query(t, q)
	switch len(s) {
	case 0:
		return 0
	case 1:
		return s[0].Value
	}
	t.Fatalf("query %s: %d series, want one: %+v", q, len(s), s)
	return 0
}

// Debian's Prometheus, with the chart's scrape job, scrapes gpud deployed
// by the chart and sees a preemption: the low pod's holder, then the kill
// in gpud_preemptions_total and the high pod's holder. (promtool's check of
// /metrics is in internal/metrics and internal/daemon.)
func TestPrometheusSeesAPreemption(t *testing.T) {
	dev, gpu := fakeGPU(t)
	gp := deployChart(t, dev)
	prom := startPrometheus(t)
	node := env(t, "NODE_NAME")
	testutil.Eventually(t, 60*time.Second, "prometheus scrapes gpud's pod", func() bool {
		s := prom.query(t, `up{job="gpud"} == 1`)
		return len(s) == 1 && s[0].Metric["node"] == node
	})
	testutil.Eventually(t, 10*time.Second, "gpud_build_info and gpud_gpu_info in prometheus", func() bool {
		return prom.value(t, `count(gpud_build_info)`) == 1 && prom.value(t, `count(gpud_gpu_info{gpu="0"})`) == 1
	})
	kills := prom.value(t, `sum(gpud_preemptions_total{action="kill"})`)
	t.Cleanup(func() {
		if t.Failed() {
			for _, q := range []string{`gpud_gpu_holders`, `gpud_workload_gpu_holders`, `gpud_preemptions_total`, `gpud_gpu_state == 1`} {
				t.Logf("prometheus: %s: %v", q, prom.query(t, q))
			}
		}
	})

	holders := podHolders(t, gp)
	gpuPod(t, "promlow", "low", gpu)
	gpuPod(t, "promhigh", "high", gpu)
	lowPID := hold(t, holders, "promlow")
	testutil.Eventually(t, 15*time.Second, "prometheus shows the low pod holding GPU 0", func() bool {
		return prom.value(t, `gpud_workload_gpu_holders{gpu="0",namespace="default",pod="promlow",container="c",priority="low"}`) == 1 &&
			prom.value(t, `gpud_gpu_holders{gpu="0",priority="low"}`) == 1
	})

	// The high pod's open preempts the low pod.
	if out := mustKubectl(t, "exec", "promhigh", "--", "sh", "-c", "exec 3<>/dev/nvidia0 && echo opened"); out != "opened" {
		t.Fatalf("high open: %q", out)
	}
	hold(t, holders, "promhigh")
	testutil.Eventually(t, 10*time.Second, "the low pod's process is dead", func() bool { return !testutil.Alive(lowPID) })
	testutil.Eventually(t, 15*time.Second, "prometheus shows the kill and the high holder", func() bool {
		return prom.value(t, `sum(gpud_preemptions_total{action="kill"})`) > kills &&
			prom.value(t, `gpud_preemption_latency_seconds_count`) >= 1 &&
			prom.value(t, `gpud_workload_gpu_holders{gpu="0",namespace="default",pod="promhigh",priority="high"}`) >= 1 &&
			prom.value(t, `gpud_gpu_holders{gpu="0",priority="high"}`) >= 1 &&
			prom.value(t, `gpud_gpu_holders{gpu="0",priority="low"}`) == 0 &&
			prom.value(t, `sum(gpud_workload_gpu_holders{pod="promlow"})`) == 0
	})
	checkDashboard(t, prom, node)
	t.Logf("preemptions (kill) %v → %v; preemption latency p99 (histogram_quantile) %v s", kills,
		prom.value(t, `sum(gpud_preemptions_total{action="kill"})`),
		prom.value(t, `histogram_quantile(0.99, sum by (le) (gpud_preemption_latency_seconds_bucket))`))
}

// checkDashboard runs the Grafana dashboard's panel queries
// (deploy/grafana/gpud.json) against the Prometheus that just saw a
// preemption: every one evaluates (the node label the scrape job adds
// included), and those about GPUs, holders, opens and preemptions have data.
func checkDashboard(t *testing.T, prom *prometheus, node string) {
	t.Helper()
	root, _ := filepath.Abs("../..")
	b, err := os.ReadFile(filepath.Join(root, "deploy/grafana/gpud.json"))
	if err != nil {
		t.Fatal(err)
	}
	type panel struct {
		Title   string `json:"title"`
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
		Panels []json.RawMessage `json:"panels"`
	}
	var d struct {
		Panels []json.RawMessage `json:"panels"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	vars := strings.NewReplacer("$__rate_interval", "1m", "$__interval", "1m", "$__range", "5m",
		"$node", regexp.QuoteMeta(node), "$gpu", ".*")
	withData := map[string]bool{"GPU state": true, "GPUs by state": true, "Holders by priority": true,
		"Holders by workload": true, "Opens by verdict": true, "Preemptions by action": true,
		"Preemption latency": true, "Events received by type": true, "Resyncs by reason": true}
	// A counter's series starts at its first increment (no 0 sample before
	// it): rate() has data from the second scrape after the preemption on.
	var missing []string
	defer func() {
		if len(missing) > 0 {
			t.Logf("dashboard panels without data: %v", missing)
		}
	}()
	testutil.Eventually(t, 10*time.Second, "the dashboard's panels have data", func() bool {
		missing = nil
		seen := 0
		var walk func([]json.RawMessage)
		walk = func(ps []json.RawMessage) {
			for _, raw := range ps {
				var p panel
				if err := json.Unmarshal(raw, &p); err != nil {
					t.Fatal(err)
				}
				for _, tg := range p.Targets {
					if got := prom.query(t, vars.Replace(tg.Expr)); len(got) == 0 && withData[p.Title] {
						missing = append(missing, fmt.Sprintf("%q: %s", p.Title, tg.Expr))
					}
				}
				if withData[p.Title] {
					seen++
				}
				walk(p.Panels)
			}
		}
		walk(d.Panels)
		if seen != len(withData) {
			t.Fatalf("the dashboard has %d of the %d panels the test expects data in", seen, len(withData))
		}
		return len(missing) == 0
	})
}
