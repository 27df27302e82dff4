package cgroups

import (
	"path/filepath"
	"strings"
)

// PodPaths returns where kubelet puts a pod's cgroup, under the cgroup
// v2 root, for the cgroupfs and the systemd drivers, in kubelet's default
// tree and in the trusted parents (SetParents); qos is the pod's
// status.qosClass ("" while unknown: every class is tried).
func PodPaths(uid, qos string) []string {
	if !ValidPodUID(uid) {
		return nil // a path built from "../x" would name another cgroup
	}
	q := strings.ToLower(qos)
	under := uid
	systemd := "kubepods-pod" + strings.ReplaceAll(uid, "-", "_") + ".slice"
	var out []string
	switch qos {
	case "Burstable", "BestEffort":
		out = append(out,
			filepath.Join("kubepods", q, "pod"+under),
			filepath.Join("kubepods.slice", "kubepods-"+q+".slice", "kubepods-"+q+"-pod"+strings.ReplaceAll(uid, "-", "_")+".slice"))
	default: // Guaranteed, or not yet known
		out = append(out, filepath.Join("kubepods", "pod"+under), filepath.Join("kubepods.slice", systemd))
		out = append(out, extraPodPaths(uid, qos)...)
		if qos == "" {
			for _, c := range []string{"Burstable", "BestEffort"} {
				out = append(out, PodPaths(uid, c)...)
			}
		}
		return out
	}
	return append(out, extraPodPaths(uid, qos)...)
}

// PodID returns the cgroup v2 id of a pod's cgroup, 0 while it does not exist.
func PodID(root, uid, qos string) uint64 {
	for _, p := range PodPaths(uid, qos) {
		if id, err := ID(filepath.Join(root, p)); err == nil {
			return id
		}
	}
	return 0
}
