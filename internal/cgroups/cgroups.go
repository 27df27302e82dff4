// Package cgroups finds the cgroup v2 hierarchy and reads what a process's
// cgroup path says about it: its container and, under kubelet, its pod.
package cgroups

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
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

// Info is what a process's /proc/<pid>/cgroup says about it.
type Info struct {
	V2Path      string // path in the v2 hierarchy ("0::" line), "/" for the root
	ContainerID string // runtime container id, "" when not in a container
	Runtime     string // docker, containerd, crio, or "" when unknown
	PodUID      string // kubelet pod uid, "" when not in a pod
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
			info.V2Path = parts[2]
			paths = append([]string{parts[2]}, paths...)
		} else {
			paths = append(paths, parts[2])
		}
	}
	if len(paths) == 0 {
		return Info{}, fmt.Errorf("%w: empty", ErrBadCgroupFile)
	}
	for _, p := range paths {
		if info.ContainerID == "" {
			info.ContainerID, info.Runtime = ContainerFromPath(p)
		}
		if info.PodUID == "" {
			info.PodUID = PodFromPath(p)
		}
	}
	return info, nil
}

var (
	// docker-<id>.scope, cri-containerd-<id>.scope, crio-<id>.scope (systemd driver)
	scopeRe  = regexp.MustCompile(`^(docker|cri-containerd|crio)-([0-9a-f]{64})\.scope$`)
	bareIDRe = regexp.MustCompile(`^[0-9a-f]{64}$`)
	// kubepods-besteffort-pod<uid>.slice (uid with _), or pod<uid> (cgroupfs
	// driver); a static pod's uid is a 32-hex hash, not a dashed UUID. The
	// UUID's groups are matched exactly: "pod" and 36 dashes is no pod.
	podSliceRe = regexp.MustCompile(`^kubepods(?:-[a-z]+)?-pod([0-9a-f]{8}_[0-9a-f]{4}_[0-9a-f]{4}_[0-9a-f]{4}_[0-9a-f]{12}|[0-9a-f]{32})\.slice$`)
	podDirRe   = regexp.MustCompile(`^pod([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|[0-9a-f]{32})$`)
)

// ContainerFromPath returns the container id a cgroup path names, and the
// runtime it names (docker, containerd, crio, or "" for a bare id).
func ContainerFromPath(p string) (id, runtime string) {
	els := strings.Split(p, "/")
	// The deepest element naming a container: a container may have
	// cgroups of its own below its id.
	for i := len(els) - 1; i >= 0; i-- {
		el := els[i]
		if m := scopeRe.FindStringSubmatch(el); m != nil {
			rt := m[1]
			if rt == "cri-containerd" {
				rt = "containerd"
			}
			return m[2], rt
		}
		if bareIDRe.MatchString(el) {
			// /docker/<id> (cgroupfs driver): the element right above the
			// id's, not the path's last parent (/docker/<id>/sub is Docker's too).
			if i > 0 && els[i-1] == "docker" {
				return el, "docker"
			}
			return el, ""
		}
	}
	return "", ""
}

var podUIDRe = regexp.MustCompile(`^(?:[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|[0-9a-f]{32})$`)

// ValidPodUID reports whether uid is a pod uid kubelet names cgroups after:
// a UUID, or a static pod's 32-hex hash. It is what PodFromPath returns.
func ValidPodUID(uid string) bool { return podUIDRe.MatchString(uid) }

// PodFromPath returns the kubelet pod uid a cgroup path names, or "".
func PodFromPath(p string) string {
	for _, el := range strings.Split(p, "/") {
		if m := podSliceRe.FindStringSubmatch(el); m != nil {
			return strings.ReplaceAll(m[1], "_", "-")
		}
		if m := podDirRe.FindStringSubmatch(el); m != nil {
			return m[1]
		}
	}
	return ""
}
