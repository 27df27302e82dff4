package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"go.yaml.in/yaml/v3"

	"github.com/gpud/gpud/internal/config"
	"github.com/gpud/gpud/internal/testutil"
)

// The chart (deploy/helm/gpud) passes a setting to `gpud run` only when the
// admin sets it: the binary's defaults are written once, in
// config.Defaults, and the chart's values.yaml leaves every setting null.
// These tests render the chart with the pinned helm (scripts/helm.sh) and
// parse what it renders with gpud's own flags.

const chartDir = "../../deploy/helm/gpud"

// podLayout are the flags the DaemonSet always passes: where the chart
// mounts the node's files and opens its ports, not settings with a default
// to repeat.
var podLayout = map[string]string{
	"dev-dir":      "/host/dev",      // hostPaths.dev is mounted there
	"host-dev-dir": "/dev",           // hostPaths.dev
	"driver-root":  "/driver-root",   // hostPaths.driverRoot is mounted there
	"health-addr":  "127.0.0.1:9408", // kubelet's probes: metricsAuth.healthPort on the loopback
	"docker-host":  "none",           // no Docker socket is mounted in the pod
}

// helmTemplate renders the chart as release gpud in gpud-system.
func helmTemplate(t *testing.T, args ...string) string {
	t.Helper()
	home := t.TempDir()
	cmd := exec.Command(testutil.Helm(t), append([]string{"template", "gpud", chartDir, "--namespace", "gpud-system"}, args...)...)
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+home, "HELM_CONFIG_HOME="+home, "HELM_DATA_HOME="+home)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("helm template %v: %v\n%s", args, err, stderr.String())
	}
	return stdout.String()
}

// valuesFile writes a values file and returns helm's -f for it.
func valuesFile(t *testing.T, content string) []string {
	t.Helper()
	f := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(f, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return []string{"-f", f}
}

// renderedPod is the part of a rendered pod template the tests read.
type renderedPod struct {
	Containers []struct {
		Args  []string `yaml:"args"`
		Ports []struct {
			ContainerPort int `yaml:"containerPort"`
		} `yaml:"ports"`
		VolumeMounts []struct {
			MountPath string `yaml:"mountPath"`
		} `yaml:"volumeMounts"`
	} `yaml:"containers"`
}

// podOf returns the pod template of the rendered object of kind.
func podOf(t *testing.T, manifest, kind string) renderedPod {
	t.Helper()
	dec := yaml.NewDecoder(strings.NewReader(manifest))
	for {
		var o struct {
			Kind string `yaml:"kind"`
			Spec struct {
				Template struct {
					Spec renderedPod `yaml:"spec"`
				} `yaml:"template"`
			} `yaml:"spec"`
		}
		err := dec.Decode(&o)
		if errors.Is(err, io.EOF) {
			t.Fatalf("no %s rendered:\n%s", kind, manifest)
		}
		if err != nil {
			t.Fatalf("decoding the manifest: %v", err)
		}
		if o.Kind == kind && len(o.Spec.Template.Spec.Containers) > 0 {
			return o.Spec.Template.Spec
		}
	}
}

// noEnv keeps the test's own GPUD_* variables out of the parse.
var noEnv = config.Sources{LookupEnv: func(string) (string, bool) { return "", false }}

// explicitFlags are the flags the args set, sorted.
func explicitFlags(s *config.Settings) []string {
	var out []string
	s.FS.Visit(func(f *pflag.Flag) { out = append(out, f.Name) })
	sort.Strings(out)
	return out
}

// `helm template` with an empty values file: the DaemonSet passes the
// pod's layout and nothing else, so gpud runs on config.Defaults(); the
// paths and port the chart mounts and opens for an unset setting are the
// defaults' own. A default written into values.yaml (equal to the binary's
// or not) fails here.
func TestChartDefaultsAreTheBinarys(t *testing.T) {
	def := config.Defaults()
	for _, tc := range []struct {
		name string
		set  []string
		more []string // flags set besides the layout
	}{
		{"defaults", nil, nil},
		// Lending and sharing switched on: their settings stay unset too.
		{"lending and sharing", []string{"--set", "devicePlugin.enabled=true,dra.enabled=true"},
			[]string{"device-plugin", "dra", "dra-plugin-dir", "dra-registry-dir"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			manifest := helmTemplate(t, append(valuesFile(t, ""), tc.set...)...)
			pod := podOf(t, manifest, "DaemonSet")
			args := pod.Containers[0].Args
			if len(args) == 0 || args[0] != "run" {
				t.Fatalf("the DaemonSet runs %q, want gpud run", args)
			}
			o, s, err := loadRun(args[1:], noEnv)
			if err != nil {
				t.Fatalf("gpud run %q: %v", args[1:], err)
			}
			want := slices.Clone(tc.more)
			for f := range podLayout {
				want = append(want, f)
			}
			sort.Strings(want)
			if got := explicitFlags(s); !slices.Equal(got, want) {
				for _, f := range got {
					if !slices.Contains(want, f) {
						t.Errorf("the chart passes --%s=%s by default (gpud's default: %q): leave the value null in values.yaml",
							f, s.FS.Lookup(f).Value, s.FS.Lookup(f).DefValue)
					}
				}
				t.Errorf("flags set: %v, want %v", got, want)
			}
			if tc.set == nil {
				// kubectl apply -k deploy/base runs the same gpud.
				b, err := os.ReadFile("../../deploy/base/daemonset.yaml")
				if err != nil {
					t.Fatal(err)
				}
				base := podOf(t, string(b), "DaemonSet").Containers[0].Args
				if !reflect.DeepEqual(slices.Sorted(slices.Values(base)), slices.Sorted(slices.Values(args))) {
					t.Errorf("deploy/base runs gpud %q, the chart %q", base, args)
				}
			}
			for f, v := range podLayout {
				if got := s.FS.Lookup(f).Value.String(); got != v {
					t.Errorf("--%s=%s, want %s", f, got, v)
				}
			}

			// What gpud runs with: config.Defaults() but for the layout.
			exp := def
			exp.DevDir, exp.HostDevDir, exp.DriverRoot = "/host/dev", "/dev", "/driver-root"
			exp.HealthAddr, exp.DockerHost = "127.0.0.1:9408", "none"
			exp.DevicePlugin, exp.DRA = slices.Contains(tc.more, "device-plugin"), slices.Contains(tc.more, "dra")
			// Complete: what the daemon fills in that no flag sets (ProcRoot, RingBytes).
			got := o.cfg.Run.Complete()
			exp.NodeName, exp.Version = got.NodeName, version // $NODE_NAME; the build's
			ge, ee := reflect.ValueOf(got), reflect.ValueOf(exp)
			for i := range ge.NumField() {
				if !reflect.DeepEqual(ge.Field(i).Interface(), ee.Field(i).Interface()) {
					t.Errorf("gpud in the chart's pod runs with %s = %v, config.Defaults() has %v",
						ge.Type().Field(i).Name, ge.Field(i).Interface(), ee.Field(i).Interface())
				}
			}

			// The chart mounts and opens what the defaults use.
			c := pod.Containers[0]
			_, port, _ := net.SplitHostPort(def.MetricsAddr)
			if len(c.Ports) != 1 || fmt.Sprint(c.Ports[0].ContainerPort) != port {
				t.Errorf("ports %+v, want the default metrics port %s", c.Ports, port)
			}
			var mounts []string
			for _, m := range c.VolumeMounts {
				mounts = append(mounts, m.MountPath)
			}
			need := []string{filepath.Dir(def.StateFile), def.StateDir, filepath.Dir(def.ControlSocket),
				filepath.Dir(def.PinDir), def.KubeletDir, filepath.Dir(def.PodResourcesSocket), filepath.Dir(def.NRISocket)}
			if exp.DevicePlugin {
				need = append(need, def.CDISpecDirs...)
			}
			if exp.DRA {
				need = append(need, def.DRACDIDir)
			}
			for _, p := range need {
				if !slices.ContainsFunc(mounts, func(m string) bool { return m == p || strings.HasPrefix(p, m+"/") }) {
					t.Errorf("nothing is mounted at %s, where gpud's default puts its files (mounts: %v)", p, mounts)
				}
			}
			if !strings.HasPrefix(def.CheckpointRoot, def.StateDir+"/") {
				t.Errorf("the default checkpoint root %s is outside the state directory %s, which the chart maps to hostPaths.state", def.CheckpointRoot, def.StateDir)
			}
		})
	}

	// The uninstall hook cleans where gpud's defaults put its files.
	hook := podOf(t, helmTemplate(t, valuesFile(t, "")...), "Job").Containers[0].Args
	for flag, v := range map[string]string{"state-file": def.StateFile, "control-socket": def.ControlSocket,
		"state-dir": def.StateDir, "checkpoint-root": def.CheckpointRoot, "bpf-pin-dir": def.PinDir, "dra-cdi-dir": def.DRACDIDir} {
		if !slices.Contains(hook, "--"+flag+"="+v) {
			t.Errorf("the uninstall hook's arguments lack --%s=%s (the default): %v", flag, v, hook)
		}
	}
}

// chartSettings are every value of the chart that is a `gpud run` setting:
// key, a YAML value other than the default, its flag and the flag's text.
var chartSettings = []struct{ key, yaml, flag, arg string }{
	{"gpud.logLevel", "debug", "log-level", "debug"},
	{"gpud.stateFile", "/run/gpud/s.json", "state-file", "/run/gpud/s.json"},
	{"gpud.stateDir", "/var/lib/gpud/d", "state-dir", "/var/lib/gpud/d"},
	{"gpud.controlSocket", `""`, "control-socket", ""},
	{"gpud.checkpointRoot", "/var/lib/gpud/cp", "checkpoint-root", "/var/lib/gpud/cp"},
	{"gpud.idleAfter", "7m", "idle-after", "7m"},
	{"gpud.resyncInterval", "0s", "resync-interval", "0s"},
	{"gpud.nodeName", "n1", "node-name", "n1"},
	{"gpud.cgroupRoot", "/c", "cgroup-root", "/c"},
	{"gpud.cgroupParents", "[/kubelet/kubepods, /k.slice]", "cgroup-parents", "/kubelet/kubepods,/k.slice"},
	{"gpud.pprofAddr", "127.0.0.1:6060", "pprof-addr", "127.0.0.1:6060"},
	{"gpud.nvml", `"off"`, "nvml", "off"},
	{"gpud.nvmlLibrary", "/usr/lib/libnvidia-ml.so.1", "nvml-library", "/usr/lib/libnvidia-ml.so.1"},
	{"gpud.monitoring", "false", "monitoring", "false"},
	{"gpud.enforce", "false", "enforce", "false"},
	{"gpud.bpfPinDir", `""`, "bpf-pin-dir", ""},
	{"gpud.keepEnforcing", "false", "keep-enforcing", "false"},
	{"gpud.failOpenAfter", "1m", "fail-open-after", "1m"},
	{"gpud.defaultPriority", "low", "default-priority", "low"},
	{"gpud.agentComms", "[]", "agent-comms", ""},
	{"gpud.agentNamespaces", "[ns1]", "agent-namespaces", "ns1"},
	{"gpud.priorityClasses", "[high>=1000, low<1000]", "priority-classes", "high>=1000,low<1000"},
	{"gpud.agentLabels", "[a=b*, c=d]", "agent-labels", "a=b*,c=d"},
	{"gpud.preemptGrace", "5s", "preempt-grace", "5s"},
	{"gpud.preemptMode", "freeze", "preempt-mode", "freeze"},
	{"gpud.preemptModeNamespaces", `["*=freeze"]`, "preempt-mode-namespaces", "*=freeze"},
	{"gpud.preemptModeContainers", "[checkpoint]", "preempt-mode-containers", "checkpoint"},
	{"gpud.maxFrozen", "1h", "max-frozen", "1h"},
	{"gpud.checkpointFallback", "kill", "checkpoint-fallback", "kill"},
	{"gpud.checkpointTimeout", "20s", "checkpoint-timeout", "20s"},
	{"gpud.cudaLibrary", "/usr/lib/libcuda.so.1", "cuda-library", "/usr/lib/libcuda.so.1"},
	{"gpud.reclaim", "delete", "reclaim", "delete"},
	{"gpud.reservationTTL", "1m", "reservation-ttl", "1m"},
	{"gpud.kubeconfig", "/k", "kubeconfig", "/k"},
	{"gpud.criEndpoint", "none", "cri-endpoint", "none"},
	{"gpud.nriSocket", "none", "nri-socket", "none"},
	{"gpud.dockerHost", "unix:///run/docker.sock", "docker-host", "unix:///run/docker.sock"},
	{"gpud.hooks", "syscalls", "hooks", "syscalls"},
	{"gpud.driverSymbols", "release=nvidia_close", "driver-symbols", "release=nvidia_close"},
	{"gpud.metricsAddr", "127.0.0.1:9410", "metrics-addr", "127.0.0.1:9410"},
	{"gpud.metricsWebConfig", "/etc/web.yml", "metrics-web-config", "/etc/web.yml"},
	{"gpud.healthAddr", "127.0.0.1:9999", "health-addr", "127.0.0.1:9999"},
	{"devicePlugin.resourceName", "gpud.io/x", "resource-name", "gpud.io/x"},
	{"devicePlugin.ownerResource", "nvidia.com/x", "owner-resource", "nvidia.com/x"},
	{"devicePlugin.cdiKind", `""`, "cdi-kind", ""},
	{"devicePlugin.cdiSpecDirs", "[/etc/cdi2]", "cdi-spec-dirs", "/etc/cdi2"},
	{"devicePlugin.lendFree", "true", "lend-free", "true"},
	{"devicePlugin.lendMinFreeMemory", `"2Gi"`, "lend-min-free-memory", "2Gi"},
	{"devicePlugin.kubeletDir", "/var/lib/kubelet/dp", "kubelet-dir", "/var/lib/kubelet/dp"},
	{"devicePlugin.podResourcesSocket", "/var/lib/kubelet/pr/k.sock", "pod-resources-socket", "/var/lib/kubelet/pr/k.sock"},
	{"dra.sharedGPUs", `["0"]`, "dra-shared-gpus", "0"},
	{"dra.memoryReserve", `"1Gi"`, "dra-memory-reserve", "1Gi"},
	{"dra.memoryMin", `"512Mi"`, "dra-memory-min", "512Mi"},
	{"dra.memoryStep", `"0"`, "dra-memory-step", "0"},
	{"dra.memoryDefault", `"8Gi"`, "dra-memory-default", "8Gi"},
	{"dra.cdiDir", "/etc/cdi3", "dra-cdi-dir", "/etc/cdi3"},
	{"dra.computeSlice", "10ms", "compute-slice", "10ms"},
	{"dra.computePeriod", "2s", "compute-period", "2s"},
}

// chartOnly are `gpud run` flags with no value of their own: the layout's
// (from hostPaths and the mounts), the switches devicePlugin.enabled and
// dra.enabled, an admin's one-off action and the file the flags replace.
var chartOnly = []string{"dev-dir", "host-dev-dir", "driver-root", "mig-minors-file", "host-checkpoint-root",
	"device-plugin", "dra", "dra-plugin-dir", "dra-registry-dir", "uninstall", config.FileFlag}

// Every `gpud run` setting is a value of the chart, and a value set (""
// and [] included) reaches gpud as its flag.
func TestChartPassesEverySetting(t *testing.T) {
	fs, _ := runFlags()
	fs.VisitAll(func(f *pflag.Flag) {
		if !slices.Contains(chartOnly, f.Name) && !slices.ContainsFunc(chartSettings, func(s struct{ key, yaml, flag, arg string }) bool { return s.flag == f.Name }) {
			t.Errorf("`gpud run --%s` has no value in the chart (add it to values.yaml, the DaemonSet and chartSettings)", f.Name)
		}
	})

	sections := map[string][]string{}
	for _, s := range chartSettings {
		sec, key, _ := strings.Cut(s.key, ".")
		sections[sec] = append(sections[sec], fmt.Sprintf("  %s: %s", key, s.yaml))
	}
	values := "devicePlugin:\n  enabled: true\n" + strings.Join(sections["devicePlugin"], "\n") +
		"\ndra:\n  enabled: true\n" + strings.Join(sections["dra"], "\n") +
		"\ngpud:\n" + strings.Join(sections["gpud"], "\n") + "\n"
	args := podOf(t, helmTemplate(t, valuesFile(t, values)...), "DaemonSet").Containers[0].Args
	fs, _ = runFlags()
	if err := fs.Parse(args[1:]); err != nil {
		t.Fatalf("gpud run %q: %v", args[1:], err)
	}
	for _, s := range chartSettings {
		want, _ := runFlags()
		if err := want.Set(s.flag, s.arg); err != nil {
			t.Fatalf("%s: --%s=%s: %v", s.key, s.flag, s.arg, err)
		}
		if f := fs.Lookup(s.flag); !fs.Changed(s.flag) || f.Value.String() != want.Lookup(s.flag).Value.String() {
			t.Errorf("%s: %s: gpud gets --%s=%q (set: %v), want %q", s.key, s.yaml, s.flag, f.Value, fs.Changed(s.flag), s.arg)
		}
	}
}

// A flag of another command that names a `gpud run` setting (status's
// --state-file, explain's --control-socket, uninstall's paths) finds the
// daemon where its defaults put it: the same default.
func TestCommandsShareRunsDefaults(t *testing.T) {
	run, _ := runFlags()
	checked := 0
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		if c.Name() != "run" {
			c.Flags().VisitAll(func(f *pflag.Flag) {
				if r := run.Lookup(f.Name); r != nil && f.Name != "help" {
					checked++
					if f.DefValue != r.DefValue {
						t.Errorf("gpud %s --%s defaults to %q, gpud run's to %q", c.Name(), f.Name, f.DefValue, r.DefValue)
					}
				}
			})
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(newRoot(io.Discard, io.Discard))
	if checked < 5 {
		t.Errorf("only %d flags shared with gpud run: status --state-file and uninstall's paths at least", checked)
	}
}
