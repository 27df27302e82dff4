package main

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// groupAnnotation is the pflag annotation naming a `gpud run` flag's
// group in -h.
const groupAnnotation = "gpud_group"

// runGroups are the sections of `gpud run -h`, in order, each with its
// flags in order: every flag of runFlags is in exactly one (a test says
// so). docs/settings.md has the same sections, with each setting's long
// explanation.
var runGroups = []struct {
	title string
	flags []string
}{
	{"GPUs and kernel", []string{"dev-dir", "nvml", "nvml-library", "driver-root", "mig-minors-file", "monitoring", "hooks",
		"driver-symbols", "bpf-pin-dir", "cgroup-root", "cgroup-parents", "resync-interval"}},
	{"Priority and preemption", []string{"default-priority", "priority-classes", "enforce", "fail-open-after", "keep-enforcing",
		"preempt-mode", "preempt-mode-namespaces", "preempt-mode-containers", "preempt-grace",
		"checkpoint-fallback", "checkpoint-timeout", "cuda-library", "max-frozen", "reclaim", "reservation-ttl",
		"checkpoint-root", "host-checkpoint-root", "agent-comms", "agent-namespaces", "agent-labels"}},
	{"Lending", []string{"idle-after", "device-plugin", "resource-name", "owner-resource", "lend-free",
		"lend-min-free-memory", "kubelet-dir", "pod-resources-socket", "host-dev-dir", "cdi-kind", "cdi-spec-dirs"}},
	{"Sharing (DRA)", []string{"dra", "dra-shared-gpus", "dra-memory-reserve", "dra-memory-min", "dra-memory-step",
		"dra-memory-default", "compute-slice", "compute-period", "dra-plugin-dir", "dra-registry-dir", "dra-cdi-dir"}},
	{"Kubernetes and runtimes", []string{"node-name", "kubeconfig", "cri-endpoint", "nri-socket", "docker-host"}},
	{"Health, metrics and logs", []string{"log-level", "metrics-addr", "metrics-web-config", "health-addr", "pprof-addr"}},
	{"Files and security", []string{"config", "state-file", "state-dir", "control-socket", "uninstall"}},
}

// groupRunFlags annotates each flag of fs with its group.
func groupRunFlags(fs *pflag.FlagSet) {
	for _, g := range runGroups {
		for _, name := range g.flags {
			_ = fs.SetAnnotation(name, groupAnnotation, []string{g.title})
		}
	}
}

// flagLine finds the flag's name in a line of pflag's FlagUsages.
var flagLine = regexp.MustCompile(`^\s+(?:-[a-zA-Z], )?--([a-z0-9-]+)`)

// runUsage is `gpud run`'s usage: its flags in runGroups' sections, one
// line each, aligned alike across sections; a flag in no group (a new one
// not placed yet) is still shown, under "Other flags".
func runUsage(c *cobra.Command) error {
	w := c.OutOrStderr()
	fmt.Fprintf(w, "Usage:\n  %s\n", c.UseLine())
	line := map[string]string{}
	var order []string
	for _, l := range strings.Split(strings.TrimRight(c.Flags().FlagUsages(), "\n"), "\n") {
		if m := flagLine.FindStringSubmatch(l); m != nil {
			line[m[1]] = strings.TrimRight(l, " ")
			order = append(order, m[1])
		}
	}
	shown := map[string]bool{}
	section := func(title string, names []string) {
		var ls []string
		for _, n := range names {
			if l, ok := line[n]; ok && !shown[n] {
				ls = append(ls, l)
				shown[n] = true
			}
		}
		if len(ls) > 0 {
			fmt.Fprintf(w, "\n%s:\n%s\n", title, strings.Join(ls, "\n"))
		}
	}
	for _, g := range runGroups {
		section(g.title, g.flags)
	}
	section("Other flags", order)
	fmt.Fprintf(w, "\nEvery setting, with its long explanation: docs/settings.md.\n")
	return nil
}
