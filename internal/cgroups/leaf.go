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
