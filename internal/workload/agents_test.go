package workload

import (
	"errors"
	"testing"

	"github.com/gpud/gpud/internal/config"
	"github.com/gpud/gpud/internal/occupancy"
)

func defaultAgents() Agents {
	d := config.Defaults()
	return Agents{Comms: d.AgentComms, Namespaces: d.AgentNamespaces, Labels: d.AgentLabels}
}

const (
	ctrLow     = "c0ffee0000000000000000000000000000000000000000000000000000000001"
	ctrPlain   = "c0ffee0000000000000000000000000000000000000000000000000000000002"
	ctrUnknown = "c0ffee0000000000000000000000000000000000000000000000000000000003"
	ctrAgent   = "c0ffee0000000000000000000000000000000000000000000000000000000004"
	podTenant  = "11111111-1111-1111-1111-111111111111"
	podDCGM    = "22222222-2222-2222-2222-222222222222"
	podGFD     = "33333333-3333-3333-3333-333333333333"
	podSpoof   = "44444444-4444-4444-4444-444444444444"
	podLabel   = "55555555-5555-5555-5555-555555555555"
	podUnknown = "66666666-6666-6666-6666-666666666666"
)

// agentRegistry is a node with a default of low: a labelled low container,
// an unlabelled one, a tenant's unlabelled pod, the GPU Operator's DCGM
// exporter pod (agent label) and GFD pod (no agent label), a tenant's pod
// carrying the agent label outside the agent namespaces, and a pod of the
// agent namespace labelled gpud.io/priority=low.
func agentRegistry(t *testing.T) *Registry {
	t.Helper()
	r := &Registry{Default: occupancy.Low, Agents: defaultAgents()}
	if err := r.Agents.Check(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	r.Put(Workload{ContainerID: ctrLow, Priority: r.Classify(ctrLow, map[string]string{LabelPriority: "low"}), CgroupID: 10})
	r.Put(Workload{ContainerID: ctrPlain, Priority: r.Classify(ctrPlain, nil), CgroupID: 11})
	agent := Workload{ContainerID: ctrAgent, CgroupID: 12}
	agent.Priority, agent.Agent = r.ClassifyContainer(ctrAgent, map[string]string{LabelAgent: "true", LabelPriority: "high"})
	r.Put(agent)
	pod := func(uid, ns string, cg uint64, labels map[string]string) {
		w := Workload{PodUID: uid, Namespace: ns, Name: uid[:4], CgroupID: cg}
		w.Priority, w.Agent = r.ClassifyPod(uid, ns, labels)
		r.Put(w)
	}
	pod(podTenant, "team-a", 20, nil)
	pod(podDCGM, "gpu-operator", 21, map[string]string{"app": "nvidia-dcgm-exporter"})
	pod(podGFD, "gpu-operator", 22, map[string]string{"app.kubernetes.io/name": "gfd-custom"})
	pod(podSpoof, "team-a", 23, map[string]string{"app": "nvidia-dcgm-exporter"})
	pod(podLabel, "nvidia-gpu-operator", 24, map[string]string{"app": "nvidia-device-plugin", LabelPriority: "low"})
	return r
}

func TestAgentPods(t *testing.T) {
	r := agentRegistry(t)
	for _, tc := range []struct {
		uid   string
		agent bool
		class occupancy.Priority
	}{
		{podDCGM, true, occupancy.Unmanaged},
		{podGFD, false, occupancy.Low},    // an agent namespace, but no agent label: the default
		{podSpoof, false, occupancy.Low},  // the agent label outside the agent namespaces counts for nothing
		{podLabel, false, occupancy.Low},  // its own gpud.io/priority label wins
		{podTenant, false, occupancy.Low}, // an ordinary pod
	} {
		info := occupancy.ProcInfo{PID: 100, Comm: "python", PodUID: tc.uid}
		r.ClassifyProc(&info)
		if info.Agent != tc.agent || info.Priority != tc.class {
			t.Errorf("pod %s: agent %v class %s, want %v %s", tc.uid[:4], info.Agent, info.Priority, tc.agent, tc.class)
		}
	}
	// An agent pod's cgroup is never given to the gate: its opens are
	// always allowed, whatever the default.
	var told []occupancy.Priority
	r.OnChange = func(cg uint64, p occupancy.Priority) {
		if cg == 21 {
			told = append(told, p)
		}
	}
	w, _ := r.Lookup(occupancy.ProcInfo{PodUID: podDCGM})
	agentStaysUnmanaged(t, r, w, occupancy.ProcInfo{PodUID: podDCGM}, "the agent pod", &told)
}

// agentStaysUnmanaged puts the agent workload w (found by pi) again: the
// gate is told only "" for it (told holds what it was told), and a reload's
// new default does not turn it into a workload (Lookup and Explain).
func agentStaysUnmanaged(t *testing.T, r *Registry, w Workload, pi occupancy.ProcInfo, what string, told *[]occupancy.Priority) {
	t.Helper()
	r.Put(w)
	if len(*told) != 1 || (*told)[0] != "" {
		t.Errorf("the gate was told %q for %s, want only \"\" (not classified)", *told, what)
	}
	r.SetDefault(occupancy.High)
	if w, _ := r.Lookup(pi); !w.Agent || w.Priority != occupancy.Unmanaged {
		t.Errorf("after SetDefault(high) %s is %+v", what, w)
	}
	if _, _, class, reason := r.Explain(pi); reason != ReasonAgent || class != occupancy.Unmanaged {
		t.Errorf("Explain: %s %s, want unmanaged agent", class, reason)
	}
}

// A comm name is anybody's to set (prctl PR_SET_NAME, or exec of a copy
// named so): only a root host process, outside every workload, becomes an
// agent by it; a workload's processes are agents by their workload's mark
// alone (an agent pod, a container labelled gpud.io/agent=true).
func TestAgentByCommTrust(t *testing.T) {
	r := agentRegistry(t)
	for _, tc := range []struct {
		what  string
		info  occupancy.ProcInfo
		agent bool
		class occupancy.Priority
	}{
		{"root host process", occupancy.ProcInfo{Comm: "nvidia-persiste", Root: true}, true, occupancy.Unmanaged},
		{"root nvidia-smi on the host", occupancy.ProcInfo{Comm: "nvidia-smi", Root: true}, true, occupancy.Unmanaged},
		{"any process of a container labelled gpud.io/agent=true", occupancy.ProcInfo{Comm: "python", ContainerID: ctrAgent}, true, occupancy.Unmanaged},
		{"root in an agent pod", occupancy.ProcInfo{Comm: "python", Root: true, PodUID: podDCGM}, true, occupancy.Unmanaged},

		// A name never makes a workload's process an agent (#32): a
		// container's root execs any program under any name.
		{"root spoofer in an unlabelled container", occupancy.ProcInfo{Comm: "dcgm-exporter", Root: true, ContainerID: ctrPlain}, false, occupancy.Low},
		{"root spoofer in a container gpud does not know", occupancy.ProcInfo{Comm: "nv-hostengine", Root: true, ContainerID: ctrUnknown}, false, occupancy.Low},
		{"root in an agent namespace's pod that is no agent pod", occupancy.ProcInfo{Comm: "gpu-feature-dis", Root: true, PodUID: podGFD}, false, occupancy.Low},

		{"non-root spoofer on the host", occupancy.ProcInfo{Comm: "nvidia-persiste", Root: false}, false, occupancy.Unmanaged},
		{"non-root spoofer in an unlabelled container", occupancy.ProcInfo{Comm: "nvidia-persiste", ContainerID: ctrPlain}, false, occupancy.Low},
		{"root spoofer in a low-labelled container", occupancy.ProcInfo{Comm: "nvidia-persiste", Root: true, ContainerID: ctrLow}, false, occupancy.Low},
		{"root spoofer in a tenant's pod", occupancy.ProcInfo{Comm: "nvidia-persiste", Root: true, PodUID: podTenant}, false, occupancy.Low},
		{"root spoofer in a pod with the agent label outside the namespaces", occupancy.ProcInfo{Comm: "nvidia-persiste", Root: true, PodUID: podSpoof}, false, occupancy.Low},
		{"root spoofer in an agent namespace's low-labelled pod", occupancy.ProcInfo{Comm: "nvidia-device-p", Root: true, PodUID: podLabel}, false, occupancy.Low},
		{"root spoofer in a pod gpud does not know yet", occupancy.ProcInfo{Comm: "nvidia-persiste", Root: true, PodUID: podUnknown}, false, occupancy.Low},
		{"root, a name that is not an agent's", occupancy.ProcInfo{Comm: "python", Root: true, ContainerID: ctrPlain}, false, occupancy.Low},
		{"root, the untruncated name (no comm is that long)", occupancy.ProcInfo{Comm: "nvidia-persistenced", Root: true}, false, occupancy.Unmanaged},
	} {
		info := tc.info
		info.PID = 1234
		r.ClassifyProc(&info)
		if info.Agent != tc.agent || info.Priority != tc.class {
			t.Errorf("%s: agent %v class %s, want %v %s", tc.what, info.Agent, info.Priority, tc.agent, tc.class)
		}
		if got := r.AgentProc(tc.info); got != tc.agent {
			t.Errorf("%s: AgentProc %v, want %v", tc.what, got, tc.agent)
		}
	}

	// Lending's roles are holders by definition: a lent pod's root process
	// named like an agent stays its class.
	r.Override(podGFD, occupancy.Low)
	info := occupancy.ProcInfo{PID: 7, Comm: "gpu-feature-dis", Root: true, PodUID: podGFD}
	r.ClassifyProc(&info)
	if info.Agent || info.Priority != occupancy.Low {
		t.Errorf("borrower pod's process: agent %v class %s, want a low holder", info.Agent, info.Priority)
	}
	r.Override(podGFD, "")

	// No agents configured: nothing is one.
	none := &Registry{Default: occupancy.Low}
	info = occupancy.ProcInfo{PID: 8, Comm: "nvidia-persiste", Root: true}
	none.ClassifyProc(&info)
	if info.Agent {
		t.Error("an agent with no agents configured")
	}
}

func TestAgentChecks(t *testing.T) {
	for _, c := range []string{"nvidia-persiste", "nvc:[driver]", "gpud"} {
		if err := CheckComm(c); err != nil {
			t.Errorf("CheckComm(%q): %v", c, err)
		}
	}
	for _, c := range []string{"", "nvidia-persistenced"} {
		if err := CheckComm(c); !errors.Is(err, ErrBadAgent) {
			t.Errorf("CheckComm(%q) = %v, want ErrBadAgent", c, err)
		}
	}
	for _, l := range []string{"app=nvidia-*", "app=", "k8s-app=x?y"} {
		if err := CheckLabel(l); err != nil {
			t.Errorf("CheckLabel(%q): %v", l, err)
		}
	}
	for _, l := range []string{"app", "=x", "app=[", ""} {
		if err := CheckLabel(l); !errors.Is(err, ErrBadAgent) {
			t.Errorf("CheckLabel(%q) = %v, want ErrBadAgent", l, err)
		}
	}
	for _, n := range []string{"", "GPU", "-a", "a_b", string(make([]byte, 64))} {
		if err := CheckNamespace(n); !errors.Is(err, ErrBadAgent) {
			t.Errorf("CheckNamespace(%q) = %v, want ErrBadAgent", n, err)
		}
	}
	a := Agents{Labels: []string{"app=nvidia-*"}, Namespaces: []string{"gpu-operator"}}
	if !a.Pod("gpu-operator", map[string]string{"app": "nvidia-mig-manager"}) ||
		a.Pod("gpu-operator", map[string]string{"app": "gpu-feature-discovery"}) ||
		a.Pod("default", map[string]string{"app": "nvidia-mig-manager"}) || a.Pod("", nil) {
		t.Error("Agents.Pod matches wrongly")
	}
	if !(Agents{Namespaces: []string{"gpu-operator"}}).Pod("gpu-operator", nil) {
		t.Error("no labels: every pod of an agent namespace is an agent")
	}
}

// A container labelled gpud.io/agent=true is an agent whatever its other
// labels and the default: Unmanaged, never given to the kernel gate (so
// the kernel never refuses it, as Explain says), and a reload's default
// leaves it so. Only "true" marks it.
func TestAgentContainer(t *testing.T) {
	r := agentRegistry(t)
	var told []occupancy.Priority
	r.OnChange = func(cg uint64, p occupancy.Priority) {
		if cg == 12 {
			told = append(told, p)
		}
	}
	w, ok := r.Lookup(occupancy.ProcInfo{ContainerID: ctrAgent})
	if !ok || !w.Agent || w.Priority != occupancy.Unmanaged {
		t.Fatalf("the agent container: %+v %v", w, ok)
	}
	agentStaysUnmanaged(t, r, w, occupancy.ProcInfo{ContainerID: ctrAgent}, "the agent container", &told)
	for _, v := range []string{"True", "1", "yes", " true", ""} {
		if p, agent := r.ClassifyContainer("c", map[string]string{LabelAgent: v}); agent || p != occupancy.High {
			t.Errorf("label %s=%q: class %s agent %v, want the default and no agent", LabelAgent, v, p, agent)
		}
	}
}
