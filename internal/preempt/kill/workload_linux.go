package kill

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"

	"github.com/gpud/gpud/internal/cgroups"
	"github.com/gpud/gpud/internal/preempt"
)

// ErrMovedOut: the victim left the cgroup it was judged in; it is no longer
// the low-priority workload's process.
var ErrMovedOut = errors.New("preempt: moved out of its workload's cgroup")

var v2Root = sync.OnceValues(func() (string, error) {
	root, _, err := cgroups.V2Root()
	return root, err
})

// V2Root is the cgroup v2 mount point, found once.
func V2Root() (string, error) { return v2Root() }

// InWorkload returns a check that pid is still in the cgroup v was judged in
// (v.CgroupID, its own cgroup when the decision was taken) or below it. A
// process moved since (echo pid > cgroup.procs) into a high-priority
// container, or into a cgroup gpud does not classify, is not the low
// workload's process any more; one moved into a child cgroup of its own
// container still is. Without a cgroup id it falls back on the container
// and pod named by /proc/<pid>/cgroup. A move after this check and before
// the signal is not seen: that window is the time of one pidfd_send_signal.
func InWorkload(procRoot string, v preempt.Victim) func(pid int) error {
	return func(pid int) error {
		b, err := os.ReadFile(filepath.Join(procRoot, strconv.Itoa(pid), "cgroup"))
		if err != nil {
			return fmt.Errorf("reading its cgroup: %w", err)
		}
		ci, err := cgroups.Parse(string(b))
		if err != nil {
			return err
		}
		if root, err := v2Root(); err == nil && v.CgroupID != 0 && ci.V2Path != "" {
			for dir := filepath.Join(root, ci.V2Path); ; dir = filepath.Dir(dir) {
				if id, err := cgroups.ID(dir); err == nil && id == v.CgroupID {
					return nil
				}
				if len(dir) <= len(root) {
					return fmt.Errorf("%w: now in %s", ErrMovedOut, ci.V2Path)
				}
			}
		}
		if v.ContainerID == "" && v.PodUID == "" {
			return fmt.Errorf("%w: cannot tell (no cgroup id, container or pod)", ErrMovedOut)
		}
		if ci.ContainerID != v.ContainerID || ci.PodUID != v.PodUID {
			return fmt.Errorf("%w: now container %q pod %q", ErrMovedOut, ci.ContainerID, ci.PodUID)
		}
		return nil
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
