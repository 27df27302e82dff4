package docker

import (
	"context"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/client"
	"github.com/gpud/gpud/internal/preempt"
)

// Runtime reclaims Docker containers (preempt.Runtime): a gentle mode
// stops the container, the other removes it.
type Runtime struct{ Client client.APIClient }

func (d Runtime) Reclaim(ctx context.Context, t preempt.Target, mode string) error {
	if t.ContainerID == "" {
		return preempt.ErrNotFound
	}
	var err error
	if preempt.Gentle(mode) {
		zero := 0 // the processes are already dead; nothing to wait for
		err = d.Client.ContainerStop(ctx, t.ContainerID, container.StopOptions{Timeout: &zero})
	} else {
		err = d.Client.ContainerRemove(ctx, t.ContainerID, container.RemoveOptions{Force: true})
	}
	if cerrdefs.IsNotFound(err) {
		return preempt.ErrNotFound
	}
	return err
}
