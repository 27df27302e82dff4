package workload

import (
	"fmt"
	"slices"
	"strings"
)

// PreemptModes is the operator's word on which preempt modes a workload
// may choose for itself with its gpud.io/preempt-mode label. A low
// workload that picks freeze keeps its GPU memory (and checkpoint its host
// memory) while high priority waits for it, so the choice is the
// operator's, not the label's: a label asking for a mode its workload may
// not choose is ignored (logged once, counted) and --preempt-mode applies.
// Kill may always be chosen: it gives everything up.
type PreemptModes struct {
	// Namespaces are namespace=mode entries: pods of namespace may choose
	// mode; the namespace * stands for every namespace.
	Namespaces []string
	// Containers are the modes Docker containers may choose: a Docker
	// host has no namespaces, and anyone who can start a container there
	// can label it.
	Containers []string
}

// preemptModes are preempt.Mode's values (preempt.ParseMode), named here
// because preempt decides how, and this only who may ask.
var preemptModes = []string{"kill", "freeze", "checkpoint"}

// CheckPreemptModeChoice checks a mode of --preempt-mode-containers.
func CheckPreemptModeChoice(m string) error {
	if !slices.Contains(preemptModes, m) {
		return fmt.Errorf("preempt mode %q: want kill, freeze or checkpoint", m)
	}
	return nil
}

// CheckPreemptModeNamespace checks a --preempt-mode-namespaces entry:
// namespace=mode, namespace a namespace name or *.
func CheckPreemptModeNamespace(e string) error {
	ns, m, ok := strings.Cut(e, "=")
	if !ok {
		return fmt.Errorf("%q: want namespace=mode (namespace may be *)", e)
	}
	if ns != "*" {
		if err := CheckNamespace(ns); err != nil {
			return fmt.Errorf("%q: %w", e, err)
		}
	}
	if err := CheckPreemptModeChoice(m); err != nil {
		return fmt.Errorf("%q: %w", e, err)
	}
	return nil
}

// Check checks every setting.
func (p PreemptModes) Check() error {
	for _, e := range p.Namespaces {
		if err := CheckPreemptModeNamespace(e); err != nil {
			return err
		}
	}
	for _, m := range p.Containers {
		if err := CheckPreemptModeChoice(m); err != nil {
			return err
		}
	}
	return nil
}

// Allows reports whether w may choose mode m with its label.
func (p PreemptModes) Allows(w Workload, m string) bool {
	if m == "kill" {
		return true
	}
	if w.PodUID == "" {
		return slices.Contains(p.Containers, m)
	}
	return w.Namespace != "" && (slices.Contains(p.Namespaces, w.Namespace+"="+m) || slices.Contains(p.Namespaces, "*="+m))
}

// PreemptMode returns the preempt mode w's label chose, "" where it chose
// none or one its workload may not choose (Modes; logged once per
// workload, counted in ModesRefused): --preempt-mode applies then. A value
// that is no mode at all is returned as it is, for the caller's own
// malformed-label warning.
func (r *Registry) PreemptMode(w Workload) string {
	m := w.PreemptMode
	if m == "" || !slices.Contains(preemptModes, m) || r.Modes.Allows(w, m) {
		return m
	}
	key := w.key() + "\x00" + m
	r.mu.Lock()
	if r.modeRefused == nil {
		r.modeRefused = map[string]bool{}
	}
	first := !r.modeRefused[key]
	if first {
		if len(r.modeRefused) >= maxRefusedModes {
			clear(r.modeRefused) // bounded: at worst a workload is logged again
		}
		r.modeRefused[key] = true
	}
	r.mu.Unlock()
	if first {
		r.ModesRefused.Add(1)
		if r.Log != nil {
			r.Log.Warn("ignoring a preempt-mode label its workload may not choose: --preempt-mode applies",
				"label", LabelPreemptMode, "mode", m, "namespace", w.Namespace, "workload", w.Name,
				"allowed_by", "--preempt-mode-namespaces / --preempt-mode-containers")
		}
	}
	return ""
}

// maxRefusedModes bounds the workloads remembered as logged.
const maxRefusedModes = 4096
