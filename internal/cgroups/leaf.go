package cgroups

import "path/filepath"

// Leaf names of cgroups before they exist, for the kernel to classify them
// as they are made (bpf.Monitor.ExpectCgroup). Both cgroup drivers' names
// are given: which one the runtime uses is its setting, not gpud's.

// DockerLeafNames returns the leaf names runc gives a Docker container's
// cgroup: docker-<id>.scope (systemd driver, under any slice, a
// --cgroup-parent one included) and <id> (cgroupfs driver, under /docker
// or --cgroup-parent). nil for anything but a full 64-hex container id.
func DockerLeafNames(id string) []string {
	if !bareIDRe.MatchString(id) {
		return nil
	}
	return []string{"docker-" + id + ".scope", id}
}

// PodLeafNames returns the leaf names of a pod's cgroup, for both kubelet
// cgroup drivers (PodPaths' last elements); nil for an invalid uid.
func PodLeafNames(uid, qos string) []string {
	var out []string
	seen := map[string]bool{}
	for _, p := range PodPaths(uid, qos) {
		if n := filepath.Base(p); !seen[n] {
			seen[n] = true
			out = append(out, n)
		}
	}
	return out
}

// ExpectedParents returns where, under the cgroup v2 root, a runtime makes
// a cgroup of this leaf name (DockerLeafNames, PodLeafNames): the cgroup
// is that workload's only when made there (fromPath's places, the default
// ones first, then the trusted parents'). nil for a name that is no
// workload's.
func ExpectedParents(leaf string) []string {
	return append(defaultExpectedParents(leaf), extraExpectedParents(leaf)...)
}

// defaultExpectedParents: ExpectedParents in the default places alone.
func defaultExpectedParents(leaf string) []string {
	if m := scopeRe.FindStringSubmatch(leaf); m != nil && m[1] == "docker" {
		return []string{"system.slice"}
	}
	if bareIDRe.MatchString(leaf) {
		return []string{"docker"}
	}
	if podDirRe.MatchString(leaf) {
		// The QoS class may be unknown yet: any of kubelet's three.
		return []string{"kubepods", "kubepods/burstable", "kubepods/besteffort"}
	}
	if m := podSliceRe.FindStringSubmatch(leaf); m != nil {
		if m[1] == "" {
			return []string{"kubepods.slice"}
		}
		return []string{"kubepods.slice/kubepods-" + m[1] + ".slice"}
	}
	return nil
}
