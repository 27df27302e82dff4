package cgroups

import (
	"errors"
	"fmt"
	"path"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"
)

// Trusted parents beyond the defaults: cgroups the operator says a runtime
// makes containers in (Docker's --cgroup-parent, nerdctl's namespace
// cgroup) or kubelet makes pods, or their QoS levels, in (below a kubelet
// --cgroup-root). The layout is the host's, not a caller's: every reader
// of a /proc/<pid>/cgroup file in gpud (the holders' classification, the
// kernel's expectations, the pod sources' cgroup ids) must judge alike, so
// it is set once, at start (SetParents), for the whole process.
var extraParents atomic.Pointer[[]string]

// DefaultParents are the places believed without any setting (fromPath):
// Docker's two drivers' and kubelet's default pod trees.
var DefaultParents = []string{"/docker", "/system.slice (docker-<id>.scope)", "/kubepods", "/kubepods.slice"}

// CheckParent accepts a trusted parent: an absolute, clean cgroup v2 path
// other than the root (under the root, any cgroup root made would be a
// workload's), with no element that is a workload's own name (a parent
// inside a container or pod names that workload's own cgroups).
func CheckParent(p string) error {
	switch {
	case !strings.HasPrefix(p, "/"):
		return fmt.Errorf("%q is not an absolute cgroup path (e.g. /mycontainers, /kubelet.slice/kubelet-kubepods.slice)", p)
	case p == "/":
		return errors.New("the root cgroup cannot be a runtime's parent (every cgroup root made in it would be a workload's)")
	case path.Clean(p) != p:
		return fmt.Errorf("%q is not a clean path (want %q)", p, path.Clean(p))
	}
	for _, el := range strings.Split(p[1:], "/") {
		if id, _ := containerName(el); id != "" || podDirRe.MatchString(el) || anyPodSliceRe.MatchString(el) {
			return fmt.Errorf("%q: %q is a container's or pod's own cgroup, not a runtime's parent", p, el)
		}
	}
	return nil
}

// SetParents sets the trusted parents beyond the defaults (each checked by
// CheckParent); nil or empty trusts the defaults alone. It returns the
// previous list (tests restore it).
func SetParents(ps []string) ([]string, error) {
	for _, p := range ps {
		if err := CheckParent(p); err != nil {
			return nil, fmt.Errorf("cgroups: trusted parent: %w", err)
		}
	}
	c := slices.Clone(ps)
	// The deepest first: a parent inside another names its own children.
	slices.SortFunc(c, func(a, b string) int {
		if len(a) != len(b) {
			return len(b) - len(a)
		}
		return strings.Compare(a, b)
	})
	c = slices.Compact(c)
	old := extraParents.Swap(&c)
	if old == nil {
		return nil, nil
	}
	return *old, nil
}

// Parents returns the trusted parents beyond the defaults (SetParents).
func Parents() []string {
	if p := extraParents.Load(); p != nil {
		return *p
	}
	return nil
}

// Under a trusted parent a container's cgroup is any runtime's scope
// (nerdctl-<id>.scope, ...) or a bare id.
var anyScopeRe = regexp.MustCompile(`^([a-z][a-z0-9]*(?:-[a-z][a-z0-9]*)*)-([0-9a-f]{64})\.scope$`)

// slicePrefix is what systemd begins a slice's child slices with: the
// parent's name less .slice (kubelet-kubepods.slice → kubelet-kubepods);
// "" for a parent that is no slice (cgroupfs driver).
func slicePrefix(parent string) string {
	b, ok := strings.CutSuffix(path.Base(parent), ".slice")
	if !ok {
		return ""
	}
	return b
}

// fromExtra reads a path below a trusted parent (els: the path's elements,
// from the root): a container's cgroup directly in it, or a pod's directly
// in it or in one of its QoS levels, the pod's container directly below
// the pod. Nothing is named for a path in no trusted parent, or elsewhere
// in one.
func fromExtra(els []string) (n named) {
	p := "/" + strings.Join(els, "/")
	prefix := func(i int) string { return "/" + strings.Join(els[:i+1], "/") }
	for _, parent := range Parents() {
		if !strings.HasPrefix(p, parent+"/") {
			continue
		}
		at := strings.Count(parent, "/")
		rest := els[at:]
		if id, rt := extraContainer(rest[0]); id != "" {
			n.container, n.runtime, n.containerDir = id, rt, prefix(at)
			return n
		}
		i, uid := extraPod(parent, rest)
		if uid == "" {
			return n
		}
		n.pod, n.podDir = uid, prefix(at+i)
		if at+i+1 < len(els) {
			if id, rt := containerName(els[at+i+1]); id != "" {
				n.container, n.runtime, n.containerDir = id, rt, prefix(at+i+1)
			}
		}
		return n
	}
	return n
}

// extraContainer reads a trusted parent's child as a container's cgroup.
func extraContainer(el string) (id, runtime string) {
	if id, rt := containerName(el); id != "" {
		return id, rt
	}
	if m := anyScopeRe.FindStringSubmatch(el); m != nil {
		return m[2], "" // a runtime gpud does not know by name
	}
	return "", ""
}

// extraPod returns the index in rest (the path below a trusted parent) of
// the element naming a pod, and its uid ("" when none): kubelet's names
// for the cgroupfs driver (pod<uid>, <qos>/pod<uid>) or, in a slice, the
// systemd driver's (<prefix>-pod<uid>.slice,
// <prefix>-<qos>.slice/<prefix>-<qos>-pod<uid>.slice).
func extraPod(parent string, rest []string) (int, string) {
	uidOf := func(el, pre string) string {
		s, ok := strings.CutPrefix(el, pre)
		if !ok {
			return ""
		}
		s, ok = strings.CutSuffix(s, ".slice")
		if !ok {
			return ""
		}
		if uid := strings.ReplaceAll(s, "_", "-"); ValidPodUID(uid) && (len(s) == 32 || strings.Count(s, "_") == 4) {
			return uid
		}
		return ""
	}
	if x := slicePrefix(parent); x != "" {
		if uid := uidOf(rest[0], x+"-pod"); uid != "" {
			return 0, uid
		}
		for _, q := range []string{"burstable", "besteffort"} {
			if rest[0] == x+"-"+q+".slice" && len(rest) > 1 {
				if uid := uidOf(rest[1], x+"-"+q+"-pod"); uid != "" {
					return 1, uid
				}
			}
		}
		return 0, ""
	}
	if m := podDirRe.FindStringSubmatch(rest[0]); m != nil {
		return 0, m[1]
	}
	if (rest[0] == "burstable" || rest[0] == "besteffort") && len(rest) > 1 {
		if m := podDirRe.FindStringSubmatch(rest[1]); m != nil {
			return 1, m[1]
		}
	}
	return 0, ""
}

// extraPodPaths returns where, under the trusted parents, kubelet puts a
// pod's cgroup of this QoS class (Guaranteed, or any other: directly in
// the parent), relative to the v2 root.
func extraPodPaths(uid, qos string) []string {
	var out []string
	classes := []string{""}
	switch qos {
	case "Burstable", "BestEffort":
		classes = []string{strings.ToLower(qos)}
	}
	for _, parent := range Parents() {
		rel := strings.TrimPrefix(parent, "/")
		x := slicePrefix(parent)
		for _, q := range classes {
			switch {
			case x == "" && q == "":
				out = append(out, path.Join(rel, "pod"+uid))
			case x == "":
				out = append(out, path.Join(rel, q, "pod"+uid))
			case q == "":
				out = append(out, path.Join(rel, x+"-pod"+strings.ReplaceAll(uid, "-", "_")+".slice"))
			default:
				out = append(out, path.Join(rel, x+"-"+q+".slice", x+"-"+q+"-pod"+strings.ReplaceAll(uid, "-", "_")+".slice"))
			}
		}
	}
	return out
}

// extraExpectedParents returns the trusted parents' cgroups a cgroup of
// this leaf name is made in (ExpectedParents' rule), relative to the root.
func extraExpectedParents(leaf string) []string {
	var out []string
	container := bareIDRe.MatchString(leaf) || anyScopeRe.MatchString(leaf)
	for _, parent := range Parents() {
		rel := strings.TrimPrefix(parent, "/")
		if container {
			out = append(out, rel)
			continue
		}
		x := slicePrefix(parent)
		if x == "" {
			if podDirRe.MatchString(leaf) {
				out = append(out, rel, path.Join(rel, "burstable"), path.Join(rel, "besteffort"))
			}
			continue
		}
		if i, uid := extraPod(parent, []string{leaf}); uid != "" && i == 0 {
			out = append(out, rel)
			continue
		}
		for _, q := range []string{"burstable", "besteffort"} {
			if i, uid := extraPod(parent, []string{x + "-" + q + ".slice", leaf}); uid != "" && i == 1 {
				out = append(out, path.Join(rel, x+"-"+q+".slice"))
			}
		}
	}
	return out
}
