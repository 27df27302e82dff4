package workload

import (
	"errors"
	"fmt"
	"path"
	"slices"
	"strings"
)

// Agents says which processes and pods are system agents: NVIDIA's own
// daemons that keep GPUs open (the persistence daemon, DCGM, the device
// plugin, GPU Feature Discovery, ...). An agent is no workload: it never
// makes a GPU busy, never owns or borrows one, is never preempted and never
// makes the gate refuse anyone.
//
// Each mark counts only where forging it takes privileges a tenant does
// not have:
//   - a comm name (any process can set its own, prctl PR_SET_NAME, and a
//     container's root can exec any program under any name) makes an agent
//     only of a host process: real uid 0 and outside every workload (no
//     container or pod in its cgroup path, e.g. a systemd unit). A
//     workload's process is never an agent by name;
//   - a pod label (anyone who can create a pod can set it) counts only in
//     an agent namespace: creating pods there is the cluster admin's;
//   - a Docker container is an agent by the label gpud.io/agent=true given
//     to the container itself (an image's LABEL does not count: the Docker
//     source drops gpud.io/ labels its image declared).
type Agents struct {
	Comms      []string // process names (comm, at most 15 bytes), exact
	Namespaces []string // pod namespaces whose pods may be agents
	// Labels are key=value patterns (value a path.Match glob, e.g.
	// app=nvidia-*): a pod of an agent namespace with one of them is an
	// agent. Empty: every pod of an agent namespace is.
	Labels []string
}

// commLen is the kernel's TASK_COMM_LEN less its NUL: a longer name can
// never be a process's comm.
const commLen = 15

// ErrBadAgent is returned for an agent setting that can never match.
var ErrBadAgent = errors.New("workload: bad agent")

// CheckComm checks an agent comm name.
func CheckComm(c string) error {
	switch {
	case c == "":
		return fmt.Errorf("%w comm: empty", ErrBadAgent)
	case len(c) > commLen:
		return fmt.Errorf("%w comm %q: longer than %d bytes, the kernel keeps only the first %d (use %q)",
			ErrBadAgent, c, commLen, commLen, c[:commLen])
	}
	return nil
}

// CheckLabel checks an agent label pattern (key=glob).
func CheckLabel(l string) error {
	k, v, ok := strings.Cut(l, "=")
	if !ok || k == "" {
		return fmt.Errorf("%w label %q: want key=value (value may hold * and ?)", ErrBadAgent, l)
	}
	if _, err := path.Match(v, ""); err != nil {
		return fmt.Errorf("%w label %q: %w", ErrBadAgent, l, err)
	}
	return nil
}

// CheckNamespace checks an agent namespace: a Kubernetes namespace name
// (an RFC 1123 label).
func CheckNamespace(n string) error {
	ok := n != "" && len(n) <= 63 && n[0] != '-' && n[len(n)-1] != '-'
	for _, r := range n {
		ok = ok && (r == '-' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9')
	}
	if !ok {
		return fmt.Errorf("%w namespace %q: not a namespace name (lower-case letters, digits and '-', at most 63)", ErrBadAgent, n)
	}
	return nil
}

// Check checks every setting.
func (a Agents) Check() error {
	var errs []error
	for _, c := range a.Comms {
		errs = append(errs, CheckComm(c))
	}
	for _, l := range a.Labels {
		errs = append(errs, CheckLabel(l))
	}
	for _, n := range a.Namespaces {
		errs = append(errs, CheckNamespace(n))
	}
	return errors.Join(errs...)
}

// Comm reports whether c is an agent's name.
func (a Agents) Comm(c string) bool { return c != "" && slices.Contains(a.Comms, c) }

// Namespace reports whether ns is an agent namespace.
func (a Agents) Namespace(ns string) bool { return ns != "" && slices.Contains(a.Namespaces, ns) }

// Pod reports whether a pod is an agent by its namespace and labels (a
// label counts only in an agent namespace: see Agents).
func (a Agents) Pod(namespace string, labels map[string]string) bool {
	if !a.Namespace(namespace) {
		return false
	}
	if len(a.Labels) == 0 {
		return true
	}
	for _, l := range a.Labels {
		k, pat, _ := strings.Cut(l, "=")
		if v, ok := labels[k]; ok {
			if m, err := path.Match(pat, v); err == nil && m {
				return true
			}
		}
	}
	return false
}
