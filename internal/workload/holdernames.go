package workload

import (
	v1 "github.com/gpud/gpud/api/v1"
	"github.com/gpud/gpud/internal/occupancy"
)

// HolderNames names a state-file holder's workload (Names, by its cgroup,
// container and pod), for the state file's holders (NameHolders) and the
// metrics' labels; containerName as in Names.
func (r *Registry) HolderNames(containerName func(namespace, name, containerID string) string) func(v1.StateHolder) (namespace, pod, container string) {
	return func(h v1.StateHolder) (string, string, string) {
		return r.Names(occupancy.ProcInfo{CgroupID: h.CgroupID, ContainerID: h.ContainerID, PodUID: h.PodUID}, containerName)
	}
}
