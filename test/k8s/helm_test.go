//go:build k8s

package k8s

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpud/gpud/internal/testutil"
	yamlv3 "go.yaml.in/yaml/v3"
	"k8s.io/apimachinery/pkg/util/yaml"
)

// The chart and the pinned helm that renders it (built once from the module
// proxy by scripts/helm.sh; the Makefile builds it before these tests).
func chartDir() string {
	root, _ := filepath.Abs("../..")
	return filepath.Join(root, "deploy/helm/gpud")
}

// chartArchive is the packaged chart `make test` installs: scripts/release.sh's
// bin/release/gpud-<chart version>.tgz of the version $GPUD_VERSION (the
// Makefile's), else the newest there. It returns the archive and its
// Chart.yaml's version and appVersion.
func chartArchive(t *testing.T) (archive, version, appVersion string) {
	t.Helper()
	root, _ := filepath.Abs("../..")
	files, _ := filepath.Glob(filepath.Join(root, "bin/release/gpud-*.tgz"))
	var newest time.Time
	for _, f := range files {
		meta := helm(t, "show", "chart", f)
		var c struct {
			Version    string `yaml:"version"`
			AppVersion string `yaml:"appVersion"`
		}
		if err := yamlv3.Unmarshal([]byte(meta), &c); err != nil {
			t.Fatalf("%s: Chart.yaml: %v", f, err)
		}
		st, err := os.Stat(f)
		if err != nil {
			t.Fatal(err)
		}
		if want := os.Getenv("GPUD_VERSION"); want != "" && c.AppVersion == want ||
			want == "" && st.ModTime().After(newest) {
			archive, version, appVersion, newest = f, c.Version, c.AppVersion, st.ModTime()
		}
	}
	if archive == "" {
		t.Fatalf("no packaged chart of version %q in bin/release (%v): `make test` runs scripts/release.sh first", os.Getenv("GPUD_VERSION"), files)
	}
	return archive, version, appVersion
}

func helm(t *testing.T, args ...string) string {
	t.Helper()
	root, _ := filepath.Abs("../..")
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(filepath.Join(root, "scripts/helm.sh"), args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("helm %v: %v\n%s%s", args, err, stdout.String(), stderr.String())
	}
	return stdout.String()
}

// testValues are the chart's values for the test cluster: the local image,
// the fake GPU directory, the API server reached directly (no kube-proxy),
// a quick readiness probe.
func testValues(t *testing.T, dev string) string {
	t.Helper()
	return clusterValues(t, dev, "{repository: gpud.local/gpud, tag: dev, pullPolicy: Never}")
}

// clusterValues are testValues with image as its image value.
func clusterValues(t *testing.T, dev, image string) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), "values.yaml")
	err := os.WriteFile(f, []byte(fmt.Sprintf(`image: %s
createNamespace: true
hostPaths: {dev: %s}
extraEnv:
  - {name: KUBERNETES_SERVICE_HOST, value: "127.0.0.1"}
  - {name: KUBERNETES_SERVICE_PORT, value: "6443"}
readinessProbe: {periodSeconds: 1}
uninstallHook: {hostNetwork: true}
`, image, dev)), 0o644)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// render runs helm template for release gpud in gpud-system, without the
// hooks (the uninstall hook would turn gpud into cleaners at once when
// applied: renderHooks has them).
func render(t *testing.T, args ...string) string {
	t.Helper()
	return helm(t, append([]string{"template", "gpud", chartDir(), "--namespace", "gpud-system", "--no-hooks"}, args...)...)
}

// renderHooks is render with the hooks.
func renderHooks(t *testing.T, args ...string) string {
	t.Helper()
	return helm(t, append([]string{"template", "gpud", chartDir(), "--namespace", "gpud-system"}, args...)...)
}

// object is the part of a Kubernetes object the checks read.
type object struct {
	Kind     string `json:"kind"`
	Metadata struct {
		Name        string            `json:"name"`
		Namespace   string            `json:"namespace"`
		Annotations map[string]string `json:"annotations"`
		Labels      map[string]string `json:"labels"`
	} `json:"metadata"`
	Rules []map[string]any `json:"rules"`
	Spec  struct {
		Template struct {
			Metadata struct {
				Annotations map[string]string `json:"annotations"`
			} `json:"metadata"`
			Spec struct {
				HostPID     bool             `json:"hostPID"`
				HostNetwork bool             `json:"hostNetwork"`
				Affinity    map[string]any   `json:"affinity"`
				Tolerations []map[string]any `json:"tolerations"`
				Containers  []struct {
					Image           string           `json:"image"`
					Args            []string         `json:"args"`
					Env             []map[string]any `json:"env"`
					Ports           []map[string]any `json:"ports"`
					VolumeMounts    []map[string]any `json:"volumeMounts"`
					SecurityContext map[string]any   `json:"securityContext"`
					ReadinessProbe  map[string]any   `json:"readinessProbe"`
					LivenessProbe   map[string]any   `json:"livenessProbe"`
				} `json:"containers"`
				Volumes []map[string]any `json:"volumes"`
			} `json:"spec"`
		} `json:"template"`
	} `json:"spec"`
}

// objects decodes a multi-document YAML stream, by kind.
func objects(t *testing.T, manifest string) map[string]object {
	t.Helper()
	out := map[string]object{}
	dec := yaml.NewYAMLOrJSONDecoder(strings.NewReader(manifest), 4096)
	for {
		var o object
		err := dec.Decode(&o)
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatalf("decoding the manifest: %v\n%s", err, manifest)
		}
		if o.Kind != "" {
			out[o.Kind] = o
		}
	}
}

func kustomizeBase(t *testing.T) map[string]object {
	t.Helper()
	root, _ := filepath.Abs("../..")
	return objects(t, mustKubectl(t, "kustomize", filepath.Join(root, "deploy/base")))
}

// The chart renders the kustomize base's objects with the same RBAC rules,
// privileges, mounts and arguments; every `gpud run` flag has a value.
func TestHelmChartRendersTheBase(t *testing.T) {
	helm(t, "lint", "--strict", chartDir())
	helm(t, "lint", "--strict", chartDir(), "-f", testValues(t, "/dev"), "--set", "serviceMonitor.enabled=true,devicePlugin.enabled=true")

	base := kustomizeBase(t)
	chart := objects(t, render(t, "--set", "createNamespace=true"))
	for kind := range base {
		if _, ok := chart[kind]; !ok {
			t.Errorf("the chart renders no %s (the base has one)", kind)
		}
	}
	for _, kind := range []string{"Service", "ServiceMonitor"} {
		if _, ok := chart[kind]; ok {
			t.Errorf("a %s by default", kind)
		}
	}
	if !reflect.DeepEqual(chart["ClusterRole"].Rules, base["ClusterRole"].Rules) {
		t.Errorf("RBAC rules differ from deploy/base:\nchart %v\nbase  %v", chart["ClusterRole"].Rules, base["ClusterRole"].Rules)
	}
	// gpud's pod is privileged: its namespace must allow it under Pod Security.
	for src, objs := range map[string]map[string]object{"chart": chart, "base": base} {
		if l := objs["Namespace"].Metadata.Labels["pod-security.kubernetes.io/enforce"]; l != "privileged" {
			t.Errorf("the %s's Namespace enforces Pod Security level %q, want privileged", src, l)
		}
	}
	for _, kind := range []string{"ServiceAccount", "DaemonSet"} {
		if ns := chart[kind].Metadata.Namespace; ns != "gpud-system" {
			t.Errorf("%s in namespace %q, want the release's", kind, ns)
		}
	}
	bs, cs := base["DaemonSet"].Spec.Template.Spec, chart["DaemonSet"].Spec.Template.Spec
	if !cs.HostPID || !cs.HostNetwork || cs.Containers[0].SecurityContext["privileged"] != true {
		t.Errorf("not privileged with hostPID and hostNetwork: %+v", cs)
	}
	for _, a := range bs.Containers[0].Args {
		if !slices.Contains(cs.Containers[0].Args, a) {
			t.Errorf("the base's argument %s is not rendered: %v", a, cs.Containers[0].Args)
		}
	}
	if !reflect.DeepEqual(cs.Volumes, bs.Volumes) || !reflect.DeepEqual(cs.Containers[0].VolumeMounts, bs.Containers[0].VolumeMounts) {
		t.Errorf("volumes differ from the base:\nchart %v\n      %v\nbase  %v\n      %v", cs.Volumes, cs.Containers[0].VolumeMounts, bs.Volumes, bs.Containers[0].VolumeMounts)
	}
	if !reflect.DeepEqual(cs.Containers[0].Env, bs.Containers[0].Env) {
		t.Errorf("env differs from the base: %v, %v", cs.Containers[0].Env, bs.Containers[0].Env)
	}
	ann := chart["DaemonSet"].Spec.Template.Metadata.Annotations
	if ann["prometheus.io/scrape"] != "true" || ann["prometheus.io/port"] != "9407" || ann["prometheus.io/path"] != "/metrics" {
		t.Errorf("scrape annotations: %v", ann)
	}
	c := cs.Containers[0]
	if c.ReadinessProbe["httpGet"].(map[string]any)["path"] != "/readyz" || c.LivenessProbe["httpGet"].(map[string]any)["path"] != "/healthz" {
		t.Errorf("probes: readiness %v, liveness %v", c.ReadinessProbe, c.LivenessProbe)
	}
	if len(c.Ports) != 1 || c.Ports[0]["containerPort"] != float64(9407) || c.Ports[0]["hostPort"] != float64(9407) {
		t.Errorf("ports: %v", c.Ports)
	}
	// The base has the chart's probes, port, scrape annotations, affinity
	// and tolerations: a kustomize user gets the same pod.
	bc := bs.Containers[0]
	for what, pair := range map[string][2]any{
		"readiness probe":    {c.ReadinessProbe, bc.ReadinessProbe},
		"liveness probe":     {c.LivenessProbe, bc.LivenessProbe},
		"ports":              {c.Ports, bc.Ports},
		"scrape annotations": {ann, base["DaemonSet"].Spec.Template.Metadata.Annotations},
		"affinity":           {cs.Affinity, bs.Affinity},
		"tolerations":        {cs.Tolerations, bs.Tolerations},
	} {
		if !reflect.DeepEqual(pair[0], pair[1]) {
			t.Errorf("%s differ from the base:\nchart %v\nbase  %v", what, pair[0], pair[1])
		}
	}
	// Only GPU nodes by default, on the labels NVIDIA's charts use.
	terms := fmt.Sprint(cs.Affinity)
	for _, l := range []string{"nvidia.com/gpu.present", "feature.node.kubernetes.io/pci-10de.present"} {
		if !strings.Contains(terms, l) {
			t.Errorf("the default affinity does not select %s: %s", l, terms)
		}
	}
	if a := objects(t, render(t, "--set", "affinity=null"))["DaemonSet"].Spec.Template.Spec.Affinity; a != nil {
		t.Errorf("affinity=null still renders %v", a)
	}

	// Every flag of `gpud run` is a value of the chart, passed only when
	// set: cmd/gpud TestChartPassesEverySetting and TestChartDefaultsAreTheBinarys.
	all := objects(t, render(t, "--set", "devicePlugin.enabled=true,dra.enabled=true,serviceMonitor.enabled=true,gpud.monitoring=false",
		"--set", "gpud.metricsAddr=127.0.0.1:9410"))
	if _, ok := all["ServiceMonitor"]; !ok {
		t.Error("serviceMonitor.enabled renders no ServiceMonitor")
	}
	if _, ok := all["Service"]; !ok {
		t.Error("serviceMonitor.enabled renders no Service")
	}
	if p := all["DaemonSet"].Spec.Template.Metadata.Annotations["prometheus.io/port"]; p != "9410" {
		t.Errorf("scrape port %q, want the one of gpud.metricsAddr", p)
	}
	none := objects(t, render(t, "--set", "gpud.metricsAddr="))
	if c := none["DaemonSet"].Spec.Template.Spec.Containers[0]; len(c.Ports) != 0 || none["DaemonSet"].Spec.Template.Metadata.Annotations != nil {
		t.Errorf("metrics off but ports or annotations: %+v", c)
	}
	// kubelet's probes never use the metrics port (any pod reaches it and
	// could fill its slots): the loopback health port, metrics on or off,
	// credentials or not.
	for what, set := range map[string]string{"default": "createNamespace=true", "metrics off": "gpud.metricsAddr=", "metricsAuth": "metricsAuth.secretName=s"} {
		c := objects(t, render(t, "--set", set))["DaemonSet"].Spec.Template.Spec.Containers[0]
		for _, p := range []map[string]any{c.LivenessProbe, c.ReadinessProbe} {
			if g, _ := p["httpGet"].(map[string]any); g["host"] != "127.0.0.1" || g["port"] != float64(9408) {
				t.Errorf("%s: a probe not on 127.0.0.1:9408: %v", what, p)
			}
		}
		if !slices.Contains(c.Args, "--health-addr=127.0.0.1:9408") {
			t.Errorf("%s: no loopback health address: %v", what, c.Args)
		}
	}
}

// deployChart renders the packaged chart with the test values (and extra --set
// arguments), applies it, and returns gpud's pod once it is Ready (its
// readiness probe is /readyz). Everything is deleted after the test.
func deployChart(t *testing.T, dev string, set ...string) string {
	t.Helper()
	// What is installed is what a release ships: the packaged chart.
	archive, _, _ := chartArchive(t)
	args := []string{"template", "gpud", archive, "--namespace", "gpud-system", "--no-hooks", "-f", testValues(t, dev)}
	for _, s := range set {
		args = append(args, "--set", s)
	}
	manifest := helm(t, args...)
	freshHostState(t)
	apply(t, manifest)
	t.Cleanup(func() {
		cmd := exec.Command(env(t, "KUBECTL"), "delete", "-f", "-", "--wait=true", "--timeout=90s", "--ignore-not-found")
		cmd.Stdin = strings.NewReader(manifest)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Logf("deleting the chart's objects: %v\n%s", err, out)
		}
		// The namespace is gone, so is gpud's pod; its gate stays pinned
		// (gpud.keepEnforcing) and would judge the next test's pods.
		uninstallGate(t)
	})

	var gp string
	testutil.Eventually(t, 60*time.Second, "the chart's gpud pod exists", func() bool {
		out, err := kubectl(t, "-n", "gpud-system", "get", "pod", "-l", "app.kubernetes.io/instance=gpud",
			"-o", "jsonpath={.items[*].metadata.name}")
		if err != nil || out == "" {
			return false
		}
		gp = out
		return true
	})
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := kubectl(t, "-n", "gpud-system", "logs", gp, "--tail=40")
			desc, _ := kubectl(t, "-n", "gpud-system", "describe", "pod", gp)
			t.Logf("gpud's log:\n%s\n%s", out, desc)
		}
	})
	if out, err := kubectl(t, "-n", "gpud-system", "wait", "--for=condition=Ready", "pod/"+gp, "--timeout=90s"); err != nil {
		t.Fatalf("gpud's pod never Ready (readiness on /readyz): %v\n%s", err, out)
	}
	return gp
}

// httpGet fetches a URL of gpud on this node (hostNetwork); an error fails the test.
func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	code, body, err := testutil.HTTPGet(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	return code, body
}

// The chart on the real cluster: gpud's pod becomes Ready through /readyz,
// and its metrics are served on the node's port.
func TestHelmChartOnARealCluster(t *testing.T) {
	dev, _ := fakeGPU(t)
	deployChart(t, dev)
	for _, p := range []string{"/healthz", "/readyz"} {
		if code, body := httpGet(t, "http://127.0.0.1:9407"+p); code != http.StatusOK {
			t.Errorf("%s: %d %s", p, code, body)
		}
	}
	_, body := httpGet(t, "http://127.0.0.1:9407/metrics")
	for _, want := range []string{"gpud_build_info{", `gpud_gpu_info{`} {
		if !strings.Contains(body, "\n"+want) {
			t.Errorf("no %s in the metrics:\n%s", want, body)
		}
	}
	if !regexp.MustCompile(`(?m)^gpud_gpu_info\{[^}]*gpu="0"[^}]*\} 1$`).MatchString(body) {
		t.Errorf("gpud_gpu_info has no gpu=\"0\" (the fake GPU):\n%s", body)
	}
}

// devicePlugin.enabled: gpud in the chart's pod registers its device plugin
// with the real kubelet through the mounted kubelet directories. (A resource
// name of its own: gpud.io/idle-gpu must stay unregistered until
// TestPodAdmittedBeforeRegistrationIsReported.)
func TestHelmChartLendsThroughTheDevicePlugin(t *testing.T) {
	dev, _ := fakeGPU(t)
	deployChart(t, dev, "devicePlugin.enabled=true", "devicePlugin.resourceName=gpud.io/helm-idle-gpu",
		"hostPaths.podResources="+filepath.Join(env(t, "KUBELET_ROOT"), "pod-resources"), "gpud.idleAfter=2s")
	testutil.Eventually(t, 30*time.Second, "kubelet lists gpud.io/helm-idle-gpu", func() bool {
		return allocatable(t, "gpud.io/helm-idle-gpu") != ""
	})
	if _, body := httpGet(t, "http://127.0.0.1:9407/metrics"); !strings.Contains(body, "\ngpud_device_plugin_registered 1\n") {
		t.Errorf("gpud_device_plugin_registered is not 1:\n%s", body)
	}
}
