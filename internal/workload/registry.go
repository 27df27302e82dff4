// Package workload is the registry of workloads (Docker containers and pods)
// and their class, high or low priority from the label gpud.io/priority, or
// the default; its change hook keeps the kernel gate's view of classified
// cgroups current. The sources that fill it are its subpackages (docker,
// kube, cri), each with its reclaim action.
package workload

import (
	"errors"
	"fmt"
	"log/slog"
	"path"
	"strings"
	"sync"
	"sync/atomic"

	v1 "github.com/gpud/gpud/api/v1"
	"github.com/gpud/gpud/internal/occupancy"
)

// Labels workloads carry.
const (
	LabelPriority = "gpud.io/priority"
	LabelTaskID   = "gpud.io/task-id"
	// LabelPreemptMode chooses how the workload is preempted: kill or
	// freeze (preempt.ParseMode); absent or malformed, --preempt-mode.
	LabelPreemptMode = "gpud.io/preempt-mode"
	// LabelAgent, exactly "true" on a Docker container the operator
	// started, makes it a system agent (Agents); pods are agents by their
	// namespace instead (anyone who may create a pod can label it).
	LabelAgent = "gpud.io/agent"
	// LabelPrefix begins every label gpud reads.
	LabelPrefix = "gpud.io/"
)

// ErrBadLabel is returned for a priority label that is neither high nor low.
var ErrBadLabel = errors.New("priority: malformed gpud.io/priority label")

// ParseLabel reads a gpud.io/priority value: exactly high or low. Nothing
// is trimmed: " high" or "high\n" is malformed (docs/rules.md), so a
// value that only looks right never gets a class that kills or blocks.
func ParseLabel(v string) (occupancy.Priority, error) {
	switch v {
	case "high":
		return occupancy.High, nil
	case "low":
		return occupancy.Low, nil
	}
	if len(v) > 64 {
		v = v[:64] + "…"
	}
	return "", fmt.Errorf("%w: %q (want high or low)", ErrBadLabel, v)
}

// ParseDefault reads a --default-priority value.
func ParseDefault(v string) (occupancy.Priority, error) {
	switch occupancy.Priority(v) {
	case occupancy.High, occupancy.Low, occupancy.Unmanaged:
		return occupancy.Priority(v), nil
	}
	return "", fmt.Errorf("priority: default %q: want high, low or unmanaged", v)
}

// Workload is one classified container or pod.
type Workload struct {
	ContainerID string // a Docker container, or
	PodUID      string // a Kubernetes pod (its containers share its class)
	Namespace   string // pods only
	Name        string // container name, or pod name
	TaskID      string // gpud.io/task-id, else the container name or namespace/name
	PreemptMode string // gpud.io/preempt-mode as labelled (checked where it is used)
	// LivenessProbe: one of the pod's containers has a liveness probe
	// (known from the API server only): it is killed rather than frozen.
	LivenessProbe bool
	Priority      occupancy.Priority
	CgroupID      uint64 // cgroup v2 id of the container or pod, 0 until known
	// CgroupPath: a container's cgroup v2 path as its runtime reported it
	// (Docker: its init process's cgroup, wherever --cgroup-parent put
	// it); a process at or below it is the container's (ContainerAt).
	CgroupPath string
	// LiveLabels: the class and labels are the API server's current ones
	// (the kube source). A runtime source (NRI, CRI) carries a pod's
	// creation-time labels, never newer: it does not overrule them (Put).
	LiveLabels bool
	// Agent: a pod of system agents (Agents.Pod) or a container labelled
	// gpud.io/agent=true (ClassifyContainer); its Priority is Unmanaged,
	// so the gate never hears of its cgroup.
	Agent bool
}

// key names a workload in the registry.
func (w Workload) key() string {
	if w.ContainerID != "" {
		return w.ContainerID
	}
	if w.PodUID != "" {
		return PodKey(w.PodUID)
	}
	return ""
}

func PodKey(uid string) string { return "pod/" + uid }

// Registry is the set of known workloads. Sources (the Docker watcher,
// tests) put workloads in; the tracker classifies holders from it; the
// OnChange hook keeps the kernel's cgroup map in step.
type Registry struct {
	Default occupancy.Priority // for workloads without the label
	// Agents are the system agents (set before the sources start).
	Agents Agents
	// Modes says which preempt modes workloads may choose by label.
	Modes PreemptModes
	// PriorityClasses maps pods' priorities to classes
	// (--priority-classes; set before the sources start).
	PriorityClasses PriorityClasses
	Log             *slog.Logger
	// OnChange is called for each cgroup whose class changed: prio is
	// occupancy.High or occupancy.Low, occupancy.Unmanaged for a workload
	// of no enforced class (gateClass), or "" when it is no longer
	// classified (gone, or an agent).
	OnChange func(cgroupID uint64, prio occupancy.Priority)
	// OnExpect is called when the class of cgroups not made yet changes
	// (Expect): names are their leaf names, prio as OnChange's (High, Low,
	// Unmanaged for a workload of no enforced class), or "" to forget.
	OnExpect func(names []string, prio occupancy.Priority)

	MalformedSeen atomic.Uint64 // malformed labels seen (each container once)
	// ImageLabelsDropped counts containers whose image declared gpud.io/
	// labels, dropped by the Docker source (each container once).
	ImageLabelsDropped atomic.Uint64
	// ModesRefused counts workloads whose gpud.io/preempt-mode asked for a
	// mode their namespace may not choose (PreemptModes; each once).
	ModesRefused atomic.Uint64

	mu          sync.Mutex
	byContainer map[string]Workload
	byCgroup    map[uint64]Workload
	malformed   map[string]bool
	overrides   map[string]occupancy.Priority // pod uid → class forced by lending
	defaulted   map[string]bool               // keys Classify gave the default (no or malformed label)
	byPriority  map[string]occupancy.Priority // pod key → class its priority maps to (PriorityClasses)
	expected    map[string]*expectation       // key → cgroup names expected (expect.go)
	expMu       sync.Mutex                    // orders OnExpect calls
	modeRefused map[string]bool               // workload and mode whose refusal was logged (modes.go)
	byPath      map[string]string             // Workload.CgroupPath → its key
}

// effective applies a lending override to a workload's class.
func (r *Registry) effective(w Workload) Workload {
	if p, ok := r.overrides[w.PodUID]; ok && w.PodUID != "" {
		w.Priority = p
	}
	return w
}

// Override forces a pod's class whatever its label (lending: a borrower is
// low, a GPU's owner high); "" removes the override.
func (r *Registry) Override(podUID string, p occupancy.Priority) {
	r.mu.Lock()
	if r.overrides == nil {
		r.overrides = map[string]occupancy.Priority{}
	}
	if r.overrides[podUID] == p {
		r.mu.Unlock()
		return
	}
	if p == "" {
		delete(r.overrides, podUID)
	} else {
		r.overrides[podUID] = p
	}
	w, ok := r.byContainer[PodKey(podUID)]
	w = r.effective(w)
	r.mu.Unlock()
	if ok && w.CgroupID != 0 && r.OnChange != nil {
		r.OnChange(w.CgroupID, gateClass(w))
	}
	r.syncExpect(PodKey(podUID))
}

// PodByName returns a known pod by namespace and name.
func (r *Registry) PodByName(namespace, name string) (Workload, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, w := range r.byContainer {
		if w.PodUID != "" && w.Namespace == namespace && w.Name == name {
			return r.effective(w), true
		}
	}
	return Workload{}, false
}

// Classify returns the workload's class from its labels, reporting a
// malformed label once per container.
func (r *Registry) Classify(containerID string, labels map[string]string) occupancy.Priority {
	v, ok := labels[LabelPriority]
	p, err := ParseLabel(v)
	r.mu.Lock()
	if r.defaulted == nil {
		r.defaulted = map[string]bool{}
	}
	if !ok || err != nil {
		r.defaulted[containerID] = true
	} else {
		delete(r.defaulted, containerID)
	}
	r.mu.Unlock()
	if !ok {
		return r.def()
	}
	if err == nil {
		return p
	}
	r.mu.Lock()
	if r.malformed == nil {
		r.malformed = map[string]bool{}
	}
	first := !r.malformed[containerID]
	r.malformed[containerID] = true
	r.mu.Unlock()
	if first {
		r.MalformedSeen.Add(1)
		if r.Log != nil {
			r.Log.Warn("malformed priority label: using the default", "container_id", containerID,
				"error", err, "default", r.def())
		}
	}
	return r.def()
}

// ClassifyPod returns a pod's class and whether it is a system agent: a pod
// with a well-formed gpud.io/priority label has that class whatever its
// namespace; else a pod Agents.Pod names is an agent (Unmanaged); else the
// default (Classify).
//
// A pod whose priority the API server source mapped (ClassifyPodPriority)
// keeps that class: a source that does not see priorities (NRI, CRI)
// never undoes it.
func (r *Registry) ClassifyPod(uid, namespace string, labels map[string]string) (occupancy.Priority, bool) {
	key := PodKey(uid)
	if _, err := ParseLabel(labels[LabelPriority]); err != nil && r.Agents.Pod(namespace, labels) {
		r.mu.Lock()
		delete(r.defaulted, key) // not a default class: a reload's SetDefault leaves it
		r.mu.Unlock()
		return occupancy.Unmanaged, true
	}
	r.mu.Lock()
	p := r.byPriority[key]
	r.mu.Unlock()
	if p != "" {
		return p, false
	}
	return r.Classify(key, labels), false
}

// ClassifyPodPriority is ClassifyPod for a pod whose priority (its
// PriorityClass's value, spec.priority) is known, nil when it is not: an
// agent pod stays an agent; else a priority PriorityClasses maps decides,
// over the pod's label (the label is the tenant's, the PriorityClass the
// cluster admin's, and the scheduler preempts by it too); else as
// ClassifyPod.
func (r *Registry) ClassifyPodPriority(uid, namespace string, labels map[string]string, priority *int32) (occupancy.Priority, bool) {
	key := PodKey(uid)
	p, ok := r.PriorityClasses.Class(priority)
	if ok {
		if _, err := ParseLabel(labels[LabelPriority]); err != nil && r.Agents.Pod(namespace, labels) {
			ok = false // an agent pod: ClassifyPod says so
		}
	}
	r.mu.Lock()
	if r.byPriority == nil {
		r.byPriority = map[string]occupancy.Priority{}
	}
	if ok {
		r.byPriority[key] = p
		delete(r.defaulted, key) // not a default class: a reload's SetDefault leaves it
	} else {
		delete(r.byPriority, key)
	}
	r.mu.Unlock()
	if ok {
		return p, false
	}
	return r.ClassifyPod(uid, namespace, labels)
}

// ClassifyContainer returns a Docker container's class and whether it is a
// system agent: a container labelled gpud.io/agent=true (by the operator
// who started it: the source drops labels its image declared) is an agent,
// Unmanaged whatever its priority label and --default-priority, so that
// the kernel gate never hears of its cgroup; else Classify.
func (r *Registry) ClassifyContainer(id string, labels map[string]string) (occupancy.Priority, bool) {
	if labels[LabelAgent] == "true" {
		r.mu.Lock()
		delete(r.defaulted, id) // not a default class: a reload's SetDefault leaves it
		delete(r.malformed, id)
		r.mu.Unlock()
		return occupancy.Unmanaged, true
	}
	return r.Classify(id, labels), false
}

func (r *Registry) def() occupancy.Priority {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.defLocked()
}

func (r *Registry) defLocked() occupancy.Priority {
	if r.Default == "" {
		return occupancy.Unmanaged
	}
	return r.Default
}

// DefaultPriority returns the class of workloads without the label.
func (r *Registry) DefaultPriority() occupancy.Priority { return r.def() }

// SetDefault changes the class of workloads without the label (a reload):
// the known workloads that had the old default take the new one, and the
// gate hears of each.
func (r *Registry) SetDefault(p occupancy.Priority) {
	r.mu.Lock()
	r.Default = p
	p = r.defLocked()
	var changed []Workload
	var keys []string
	for key := range r.defaulted {
		w, ok := r.byContainer[key]
		if !ok || w.Priority == p {
			continue
		}
		keys = append(keys, key)
		w.Priority = p
		r.byContainer[key] = w
		if w.CgroupID != 0 {
			r.byCgroup[w.CgroupID] = w
		}
		changed = append(changed, r.effective(w))
	}
	r.mu.Unlock()
	for _, w := range changed {
		if w.CgroupID != 0 && r.OnChange != nil {
			r.OnChange(w.CgroupID, gateClass(w))
		}
	}
	r.syncExpect(keys...)
}

// Holds reports whether w is stored as it is (its own class, before any
// lending override): a source skips putting what has not changed.
func (r *Registry) Holds(w Workload) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	old, ok := r.byContainer[w.key()]
	return ok && w.key() != "" && old == w
}

// Put adds or updates a workload.
func (r *Registry) Put(w Workload) {
	r.mu.Lock()
	if r.byContainer == nil {
		r.byContainer, r.byCgroup = map[string]Workload{}, map[uint64]Workload{}
	}
	key := w.key()
	old, had := r.byContainer[key]
	if had && w.PodUID != "" && old.LivenessProbe {
		// A pod's probes cannot change; NRI and CRI do not see them.
		w.LivenessProbe = true
	}
	if had && w.PodUID != "" && old.LiveLabels && !w.LiveLabels {
		// NRI or CRI with the labels the pod had when it was made: the
		// API server's, stored, are at least as new (a label changed
		// since must not be undone at the pod's next CreateContainer).
		// Only a cgroup id the stored pod lacks is taken.
		cg := w.CgroupID
		w = old
		if w.CgroupID == 0 {
			w.CgroupID = cg
		}
	}
	if key != "" {
		r.byContainer[key] = w
	}
	if had && old.CgroupPath != "" && old.CgroupPath != w.CgroupPath && r.byPath[old.CgroupPath] == key {
		delete(r.byPath, old.CgroupPath)
	}
	if w.CgroupPath != "" && key != "" {
		if r.byPath == nil {
			r.byPath = map[string]string{}
		}
		r.byPath[w.CgroupPath] = key
	}
	if had && old.CgroupID != 0 && old.CgroupID != w.CgroupID {
		delete(r.byCgroup, old.CgroupID)
	}
	if w.CgroupID != 0 {
		r.byCgroup[w.CgroupID] = w
	}
	r.mu.Unlock()
	defer r.syncExpect(key)
	if r.OnChange == nil {
		return
	}
	if had && old.CgroupID != 0 && old.CgroupID != w.CgroupID {
		r.OnChange(old.CgroupID, "")
	}
	if w.CgroupID != 0 {
		r.mu.Lock()
		e := r.effective(w)
		r.mu.Unlock()
		r.OnChange(w.CgroupID, gateClass(e))
	}
}

// gateClass is what the kernel gate is told of a workload (its effective
// class): high and low are enforced by the rule table; any other workload
// is Unmanaged there ("a workload of no enforced class"), which the table
// ignores but a GPU shared by memory refuses unless the workload has a
// share of it. An agent is "": the kernel never hears of it, as of a host
// process.
func gateClass(w Workload) occupancy.Priority {
	switch {
	case w.Agent:
		return ""
	case w.Priority == occupancy.High || w.Priority == occupancy.Low:
		return w.Priority
	}
	return occupancy.Unmanaged
}

// RemovePod forgets a pod.
func (r *Registry) RemovePod(uid string) { r.Remove(PodKey(uid)) }

// Remove forgets a container (or, with a "pod/<uid>" key, a pod).
func (r *Registry) Remove(containerID string) {
	r.mu.Lock()
	w, ok := r.byContainer[containerID]
	delete(r.byContainer, containerID)
	delete(r.malformed, containerID)
	delete(r.defaulted, containerID)
	delete(r.byPriority, containerID)
	if ok && w.CgroupID != 0 {
		delete(r.byCgroup, w.CgroupID)
	}
	if ok && w.CgroupPath != "" && r.byPath[w.CgroupPath] == containerID {
		delete(r.byPath, w.CgroupPath)
	}
	r.mu.Unlock()
	if ok && w.CgroupID != 0 && r.OnChange != nil {
		r.OnChange(w.CgroupID, "")
	}
	r.dropExpect(containerID)
}

// ContainerAt returns the container whose cgroup, as its runtime reported
// it (Workload.CgroupPath), is v2Path or the nearest cgroup above it, and
// that cgroup's path: a runtime's own word on where it put a container,
// believed wherever the parent is (Docker's --cgroup-parent). The caller
// checks the cgroup is root's (cgroups.Owned).
func (r *Registry) ContainerAt(v2Path string) (id, dir string, ok bool) {
	if !strings.HasPrefix(v2Path, "/") {
		return "", "", false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for p := path.Clean(v2Path); p != "/"; p = path.Dir(p) {
		if key, found := r.byPath[p]; found {
			if w := r.byContainer[key]; w.ContainerID != "" {
				return w.ContainerID, p, true
			}
		}
	}
	return "", "", false
}

// Lookup returns the workload a process belongs to: by container id, else by
// cgroup id.
func (r *Registry) Lookup(info occupancy.ProcInfo) (Workload, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	w, ok := r.lookupLocked(info)
	return r.effective(w), ok
}

func (r *Registry) lookupLocked(info occupancy.ProcInfo) (Workload, bool) {
	if info.ContainerID != "" {
		if w, ok := r.byContainer[info.ContainerID]; ok {
			return w, true
		}
	}
	if info.PodUID != "" {
		if w, ok := r.byContainer[PodKey(info.PodUID)]; ok {
			return w, true
		}
	}
	if info.CgroupID != 0 {
		if w, ok := r.byCgroup[info.CgroupID]; ok {
			return w, true
		}
	}
	return Workload{}, false
}

// Why ClassifyProc gives a process its class.
const (
	ReasonLabel    = "label"    // its workload's gpud.io/priority label
	ReasonOverride = "override" // lending forced its pod's class (borrower low, owner high)
	ReasonDefault  = "default"  // no or a malformed label, or a workload gpud does not know
	ReasonHost     = "host"     // not in a container: never managed
	ReasonAgent    = "agent"    // a system agent (Agents): never managed, never a holder
	// ReasonPriorityClass: its pod's priority, mapped by --priority-classes.
	ReasonPriorityClass = "priority-class"
)

// Explain returns the workload a process belongs to (ok false when none is
// known), its class as ClassifyProc gives it, and why (a Reason constant).
func (r *Registry) Explain(info occupancy.ProcInfo) (w Workload, ok bool, class occupancy.Priority, reason string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	raw, ok := r.lookupLocked(info)
	if !ok {
		if p, forced := r.overrides[info.PodUID]; forced && info.PodUID != "" {
			return Workload{}, false, p, ReasonOverride
		}
		if info.ContainerID != "" || info.PodUID != "" {
			return Workload{}, false, r.defLocked(), ReasonDefault
		}
		return Workload{}, false, occupancy.Unmanaged, ReasonHost
	}
	w = r.effective(raw)
	switch {
	case w.Priority != raw.Priority || (raw.PodUID != "" && r.overrides[raw.PodUID] != ""):
		reason = ReasonOverride
	case raw.Agent:
		reason = ReasonAgent
	case r.byPriority[raw.key()] != "":
		reason = ReasonPriorityClass
	case r.defaulted[raw.key()]:
		reason = ReasonDefault
	default:
		reason = ReasonLabel
	}
	return w, true, w.Priority, reason
}

// ClassifyProc sets a holder's priority: its workload's class; a process
// in an unknown container gets the default; host processes (no container)
// are unmanaged. It also says whether the process is a system agent
// (AgentProc), which is then Unmanaged whatever its workload's default.
func (r *Registry) ClassifyProc(info *occupancy.ProcInfo) {
	info.Agent = r.AgentProc(*info)
	r.classifyProc(info)
	if info.Agent {
		info.Priority, info.Unknown = occupancy.Unmanaged, false
	}
}

// AgentProc reports whether a process is a system agent, by marks no
// workload can forge: its workload is an agent (a pod of an agent
// namespace, Agents.Pod; a container the operator started with the label
// gpud.io/agent=true, not from its image), or it is a host process outside
// every workload (no container or pod in its cgroup path) named as an
// agent (Agents.Comms) with real uid 0. A name never makes a workload's
// process an agent: any root in a container can exec a program of any
// name, and the kernel gate, which knows cgroups and not names, would
// judge it by its workload's class anyway. Lent workloads are never agents.
func (r *Registry) AgentProc(info occupancy.ProcInfo) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, forced := r.overrides[info.PodUID]; forced && info.PodUID != "" {
		return false // lending's owner or borrower: a holder by definition
	}
	raw, known := r.lookupLocked(info)
	if known && raw.PodUID != "" {
		if _, forced := r.overrides[raw.PodUID]; forced {
			return false
		}
	}
	if known && raw.Agent {
		return true
	}
	if known || info.ContainerID != "" || info.PodUID != "" {
		// A workload's process (known or not yet): only its workload's
		// mark counts. An unknown pod or container is judged again when
		// its source learns it (Reclassify).
		return false
	}
	return info.Root && r.Agents.Comm(info.Comm)
}

func (r *Registry) classifyProc(info *occupancy.ProcInfo) {
	info.Unknown = false
	if w, ok := r.Lookup(*info); ok {
		info.Priority = w.Priority
		return
	}
	if info.PodUID != "" {
		// A pod lending forced before gpud's informer saw it: the
		// override is known from kubelet's PodResources alone.
		r.mu.Lock()
		p, ok := r.overrides[info.PodUID]
		r.mu.Unlock()
		if ok {
			info.Priority = p
			return
		}
	}
	if info.ContainerID != "" || info.PodUID != "" {
		info.Priority = r.def()
		info.Unknown = true
		return
	}
	info.Priority = occupancy.Unmanaged
}

// Workloads returns every known workload.
func (r *Registry) Workloads() []Workload {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]Workload, 0, len(r.byContainer))
	for _, w := range r.byContainer {
		out = append(out, w)
	}
	for id, w := range r.byCgroup {
		if w.key() == "" {
			w.CgroupID = id
			out = append(out, w)
		}
	}
	return out
}

// Names names a process's workload as metrics label it: a pod's namespace
// and name, and its container's name when containerName (the API server's
// view, nil without one) knows it; a container's name; "" where unknown.
func (r *Registry) Names(info occupancy.ProcInfo, containerName func(namespace, name, containerID string) string) (namespace, pod, container string) {
	w, ok := r.Lookup(info)
	switch {
	case !ok:
	case w.PodUID == "":
		container = w.Name
	case containerName != nil:
		namespace, pod, container = w.Namespace, w.Name, containerName(w.Namespace, w.Name, info.ContainerID)
	default:
		namespace, pod = w.Namespace, w.Name
	}
	return namespace, pod, container
}

// NameHolders sets each holder's namespace, pod and container in a state
// document from names (Registry.Names, with the pod source's container
// names): `gpud status` and the file's readers see namespace/name rather
// than a pod's UID.
func NameHolders(f *v1.StateFile, names func(v1.StateHolder) (namespace, pod, container string)) {
	for i := range f.GPUs {
		for j := range f.GPUs[i].Holders {
			h := &f.GPUs[i].Holders[j]
			h.Namespace, h.Pod, h.Container = names(*h)
		}
		for j := range f.GPUs[i].Agents {
			h := &f.GPUs[i].Agents[j]
			h.Namespace, h.Pod, h.Container = names(*h)
		}
	}
}
