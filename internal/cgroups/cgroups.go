// Package cgroups finds the cgroup v2 hierarchy and reads what a process's
// cgroup path says about it: its container and, under kubelet, its pod.
package cgroups

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
)

// ErrNoV2 is returned when no cgroup v2 hierarchy is mounted.
var ErrNoV2 = errors.New("cgroups: no cgroup v2 hierarchy mounted")

// Mode says how cgroup v2 is mounted on this host.
type Mode string

const (
	Unified Mode = "unified" // pure v2, at /sys/fs/cgroup
	Hybrid  Mode = "hybrid"  // v1 controllers plus a v2 tree, e.g. /sys/fs/cgroup/unified
)

// V2Root returns the mount point of the cgroup v2 hierarchy and the host's mode.
func V2Root() (string, Mode, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return "", "", fmt.Errorf("cgroups: %w", err)
	}
	defer f.Close()
	return v2RootFrom(f)
}

func v2RootFrom(r io.Reader) (string, Mode, error) {
	var root string
	v1 := false
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		// 36 35 0:30 / /sys/fs/cgroup/unified rw,... shared:8 - cgroup2 cgroup2 rw
		line := sc.Text()
		sep := strings.Index(line, " - ")
		if sep < 0 {
			continue
		}
		fields := strings.Fields(line[:sep])
		fstype := strings.Fields(line[sep+3:])
		if len(fields) < 5 || len(fstype) < 1 {
			continue
		}
		switch fstype[0] {
		case "cgroup2":
			if root == "" {
				root = fields[4]
			}
		case "cgroup":
			v1 = true
		}
	}
	if err := sc.Err(); err != nil {
		return "", "", fmt.Errorf("cgroups: reading mountinfo: %w", err)
	}
	if root == "" {
		return "", "", ErrNoV2
	}
	if v1 {
		return root, Hybrid, nil
	}
	return root, Unified, nil
}

// ID returns the cgroup id of a v2 cgroup directory: its inode number, which
// is what bpf_get_current_cgroup_id() reports.
func ID(dir string) (uint64, error) {
	var st syscall.Stat_t
	if err := syscall.Stat(dir, &st); err != nil {
		return 0, fmt.Errorf("cgroups: stat %s: %w", dir, err)
	}
	return st.Ino, nil
}

// Info is what a process's /proc/<pid>/cgroup says about it. A container or
// pod is named only by an element where its runtime puts it (ContainerFromPath,
// PodFromPath): a cgroup that merely carries such a name elsewhere (a delegated
// subtree's owner can make any name there) names no workload.
type Info struct {
	V2Path      string // path in the v2 hierarchy ("0::" line), "/" for the root
	ContainerID string // runtime container id, "" when not in a container
	Runtime     string // docker, containerd, crio, or "" when unknown
	PodUID      string // kubelet pod uid, "" when not in a pod
	// The v2 cgroups whose names gave PodUID and ContainerID ("" when the id
	// came from a v1 line, or there is none): Owned checks they were made by root.
	PodDir, ContainerDir string
	// Lookalike: the path carries a container's or pod's name away from
	// where the runtime puts one, or one made by another user than root
	// (Owned); no id was taken from it.
	Lookalike bool
}

// ErrBadCgroupFile is returned for content that is not a /proc/<pid>/cgroup file.
var ErrBadCgroupFile = errors.New("cgroups: malformed cgroup file")

// ReadProc parses /proc/<pid>/cgroup.
func ReadProc(pid int) (Info, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return Info{}, fmt.Errorf("cgroups: %w", err)
	}
	return Parse(string(b))
}

// Parse reads the content of a /proc/<pid>/cgroup file. The container and
// pod are taken from the v2 line when it names one, else from any v1 line
// (on hybrid hosts runtimes may place containers only in v1 hierarchies).
func Parse(content string) (Info, error) {
	var info Info
	var paths []string
	v2 := false
	for _, line := range strings.Split(content, "\n") {
		if line == "" {
			continue
		}
		// hierarchy-ID:controller-list:cgroup-path
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 || !strings.HasPrefix(parts[2], "/") {
			return Info{}, fmt.Errorf("%w: line %q", ErrBadCgroupFile, line)
		}
		if parts[0] == "0" && parts[1] == "" {
			if v2 {
				paths = paths[1:] // the last "0::" line is the v2 path
			}
			v2 = true
			info.V2Path = parts[2]
			paths = append([]string{parts[2]}, paths...)
		} else {
			paths = append(paths, parts[2])
		}
	}
	if len(paths) == 0 {
		return Info{}, fmt.Errorf("%w: empty", ErrBadCgroupFile)
	}
	for i, p := range paths {
		n := fromPath(p)
		if n.lookalike {
			info.Lookalike = true
		}
		fromV2 := v2 && i == 0
		if info.ContainerID == "" && n.container != "" {
			info.ContainerID, info.Runtime = n.container, n.runtime
			if fromV2 {
				info.ContainerDir = n.containerDir
			}
		}
		if info.PodUID == "" && n.pod != "" {
			info.PodUID = n.pod
			if fromV2 {
				info.PodDir = n.podDir
			}
		}
	}
	if info.ContainerID != "" || info.PodUID != "" {
		info.Lookalike = false // a workload's own nested cgroups are its own
	}
	return info, nil
}

// Owned checks, under the v2 root, that the cgroups that named info's
// workload were made by root (gpud's own uid: root, or the user running a
// test) — a delegated subtree belongs to its user, who may make any name
// in it: an
// id whose cgroup is not root's, or is gone, is dropped and the process
// counts as a look-alike. Ids read from v1 lines are kept (no v2 cgroup to
// check; v1 hierarchies are not delegated to users).
func Owned(root string, info Info) Info {
	for _, d := range []string{info.PodDir, info.ContainerDir} {
		if d == "" {
			continue
		}
		var st syscall.Stat_t
		if err := syscall.Stat(filepath.Join(root, d), &st); err != nil || st.Uid != uint32(os.Geteuid()) {
			return Info{V2Path: info.V2Path, Lookalike: true}
		}
	}
	return info
}

var (
	// docker-<id>.scope, cri-containerd-<id>.scope, crio-<id>.scope (systemd driver)
	scopeRe  = regexp.MustCompile(`^(docker|cri-containerd|crio)-([0-9a-f]{64})\.scope$`)
	bareIDRe = regexp.MustCompile(`^[0-9a-f]{64}$`)
	// kubepods-besteffort-pod<uid>.slice (uid with _), or pod<uid> (cgroupfs
	// driver); a static pod's uid is a 32-hex hash, not a dashed UUID. The
	// UUID's groups are matched exactly: "pod" and 36 dashes is no pod.
	podSliceRe = regexp.MustCompile(`^kubepods(?:-(burstable|besteffort))?-pod([0-9a-f]{8}_[0-9a-f]{4}_[0-9a-f]{4}_[0-9a-f]{4}_[0-9a-f]{12}|[0-9a-f]{32})\.slice$`)
	podDirRe   = regexp.MustCompile(`^pod([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|[0-9a-f]{32})$`)
	// Any element that looks like a workload's, wherever it is (look-alikes).
	anyPodSliceRe = regexp.MustCompile(`kubepods.*-pod[0-9a-f_]{32,36}\.slice$`)
)

// named is what a cgroup path says by position.
type named struct {
	container, runtime, pod string
	containerDir, podDir    string // the path up to the naming element
	lookalike               bool   // a workload's name away from a runtime's place
}

// fromPath reads a cgroup path from its root: a pod is named only at
// kubelet's place (PodPaths: /kubepods[/<qos>]/pod<uid>, or
// /kubepods.slice[/kubepods-<qos>.slice]/kubepods[-<qos>]-pod<uid>.slice),
// its container only directly below it; a Docker container only at
// /docker/<id> (cgroupfs driver) or /system.slice/docker-<id>.scope (systemd
// driver); else, in a parent the operator trusts (SetParents, fromExtra).
// Anything below a workload's cgroup is that workload's, whatever
// its name: a container's root making docker-<other>.scope inside its own
// cgroup is still itself.
func fromPath(p string) (n named) {
	els := strings.Split(strings.TrimPrefix(p, "/"), "/")
	prefix := func(i int) string { return "/" + strings.Join(els[:i+1], "/") }
	if i, uid := podAt(els); uid != "" {
		n.pod, n.podDir = uid, prefix(i)
		if i+1 < len(els) {
			if id, rt := containerName(els[i+1]); id != "" {
				n.container, n.runtime, n.containerDir = id, rt, prefix(i+1)
			}
		}
		return n
	}
	if len(els) >= 2 {
		switch {
		case els[0] == "docker" && bareIDRe.MatchString(els[1]):
			n.container, n.runtime, n.containerDir = els[1], "docker", prefix(1)
			return n
		case els[0] == "system.slice":
			if m := scopeRe.FindStringSubmatch(els[1]); m != nil && m[1] == "docker" {
				n.container, n.runtime, n.containerDir = m[2], "docker", prefix(1)
				return n
			}
		}
	}
	if x := fromExtra(els); x.container != "" || x.pod != "" {
		return x
	}
	for _, el := range els {
		if id, _ := containerName(el); id != "" || podDirRe.MatchString(el) || anyPodSliceRe.MatchString(el) {
			n.lookalike = true
		}
	}
	return n
}

// podAt returns the index of the element naming a pod where kubelet puts
// one, and the pod's uid ("" when the path is no pod's).
func podAt(els []string) (int, string) {
	if len(els) < 2 {
		return 0, ""
	}
	switch els[0] {
	case "kubepods": // cgroupfs driver
		if m := podDirRe.FindStringSubmatch(els[1]); m != nil {
			return 1, m[1]
		}
		if (els[1] == "burstable" || els[1] == "besteffort") && len(els) >= 3 {
			if m := podDirRe.FindStringSubmatch(els[2]); m != nil {
				return 2, m[1]
			}
		}
	case "kubepods.slice": // systemd driver
		if m := podSliceRe.FindStringSubmatch(els[1]); m != nil && m[1] == "" {
			return 1, strings.ReplaceAll(m[2], "_", "-")
		}
		if len(els) >= 3 {
			if m := podSliceRe.FindStringSubmatch(els[2]); m != nil && m[1] != "" && els[1] == "kubepods-"+m[1]+".slice" {
				return 2, strings.ReplaceAll(m[2], "_", "-")
			}
		}
	}
	return 0, ""
}

// containerName reads one element as a container's cgroup name: a runtime's
// scope (runtime named), or a bare id (runtime "").
func containerName(el string) (id, runtime string) {
	if m := scopeRe.FindStringSubmatch(el); m != nil {
		rt := m[1]
		if rt == "cri-containerd" {
			rt = "containerd"
		}
		return m[2], rt
	}
	if bareIDRe.MatchString(el) {
		return el, ""
	}
	return "", ""
}

// ContainerFromPath returns the container id a cgroup path names where a
// runtime puts containers (fromPath), and the runtime it names (docker,
// containerd, crio, or "" for a bare id under a pod).
func ContainerFromPath(p string) (id, runtime string) {
	n := fromPath(p)
	return n.container, n.runtime
}

var podUIDRe = regexp.MustCompile(`^(?:[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|[0-9a-f]{32})$`)

// ValidPodUID reports whether uid is a pod uid kubelet names cgroups after:
// a UUID, or a static pod's 32-hex hash. It is what PodFromPath returns.
func ValidPodUID(uid string) bool { return podUIDRe.MatchString(uid) }

// PodFromPath returns the kubelet pod uid a cgroup path names at kubelet's
// place (fromPath), or "".
func PodFromPath(p string) string { return fromPath(p).pod }
