package cgroups

import (
	"errors"
	"fmt"
	"log/slog"
)

// ErrParents marks a --cgroup-parents setting that SetParents refused.
var ErrParents = errors.New("--cgroup-parents")

// Setup decides which cgroups gpud reads and believes, and says so: root
// when given (mode "given"), else the host's cgroup v2 mount; the places a
// workload is believed in, the defaults and parents. It runs before
// anything reads a cgroup path: the parse, the pod sources and the
// kernel's expectations all judge by these places.
func Setup(root string, parents []string, log *slog.Logger) (string, Mode, error) {
	mode := Mode("given")
	if root == "" {
		var err error
		if root, mode, err = V2Root(); err != nil {
			return "", "", err
		}
	}
	if _, err := SetParents(parents); err != nil {
		return "", "", fmt.Errorf("%w: %w", ErrParents, err)
	}
	log.Info("cgroups: workloads are believed only in their runtime's places; a workload's name elsewhere is a look-alike, its processes host processes",
		"default_parents", DefaultParents, "cgroup_parents", Parents(),
		"docker", "also where the engine reports a container's cgroup")
	return root, mode, nil
}
