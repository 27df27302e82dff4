// Package docker classifies Docker containers from their labels (a watcher of
// the engine's containers and events) and reclaims them (stop or remove).
package docker

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"time"

	"github.com/gpud/gpud/internal/workload"

	cerrdefs "github.com/containerd/errdefs"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/events"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/client"
	"github.com/gpud/gpud/internal/cgroups"
	"github.com/gpud/gpud/internal/occupancy"
)

// Watcher keeps the registry in step with a Docker engine: every container
// at start, then the events stream (create, start, die, destroy). On a lost
// connection it reconnects with backoff and lists again.
//
// A container's class is known at its create event (the event carries its
// labels), before runc makes its cgroup: the watcher puts it in the
// registry then and expects the cgroup's leaf names (Registry.Expect), so
// that the kernel classifies the cgroup as it is made and the gate judges
// the container's first open. The start event finds the cgroup's id, as
// for containers created before gpud ran.
type Watcher struct {
	Client     client.APIClient
	Registry   *workload.Registry
	CgroupRoot string // cgroup v2 mount, to find each container's cgroup id
	Log        *slog.Logger
	// Synced, when set, is called after every full listing.
	Synced func()
}

// Run watches until ctx ends.
func (d *Watcher) Run(ctx context.Context) {
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		err := d.watch(ctx)
		if ctx.Err() != nil {
			return
		}
		d.Log.Warn("docker watch interrupted; retrying", "error", err, "backoff", backoff)
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		if backoff < 10*time.Second {
			backoff *= 2
		}
	}
}

// startQueue bounds the start events waiting for their inspect; a full
// queue holds the event stream back.
const startQueue = 1024

func (d *Watcher) watch(ctx context.Context) error {
	f := filters.NewArgs(filters.Arg("type", "container"),
		filters.Arg("event", "create"), filters.Arg("event", "start"), filters.Arg("event", "die"), filters.Arg("event", "destroy"))
	// Subscribe before listing, so that nothing between the two is missed.
	msgs, errs := d.Client.Events(ctx, events.ListOptions{Filters: f})
	// Stopped containers too: `docker start` makes their cgroup again, and
	// it is classified as it is made only if it is expected.
	list, err := d.Client.ContainerList(ctx, container.ListOptions{All: true})
	if err != nil {
		return fmt.Errorf("listing containers: %w", err)
	}
	for _, c := range list {
		if c.State == container.StateRunning {
			d.refresh(ctx, c.ID)
		} else {
			var name string
			if len(c.Names) > 0 {
				name = c.Names[0]
			}
			d.created(c.ID, name, c.Labels)
		}
		d.Registry.Expect(c.ID, cgroups.DockerLeafNames(c.ID))
	}
	if d.Synced != nil {
		d.Synced()
	}
	// Start events need an inspect (the cgroup's id), a round trip to the
	// engine each; they are done apart, so that a burst of them never
	// delays a create event, which must reach the kernel before runc makes
	// the container's cgroup.
	starts := make(chan string, startQueue)
	wctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	defer func() { stop(); <-done }()
	go func() {
		defer close(done)
		for {
			select {
			case <-wctx.Done():
				return
			case id := <-starts:
				d.refresh(wctx, id)
			}
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-errs:
			return err
		case m := <-msgs:
			switch m.Action {
			case events.ActionCreate:
				// Labels are the event's attributes (with name and image).
				d.created(m.Actor.ID, m.Actor.Attributes["name"], m.Actor.Attributes)
				d.Registry.Expect(m.Actor.ID, cgroups.DockerLeafNames(m.Actor.ID))
			case events.ActionStart:
				select {
				case starts <- m.Actor.ID:
				case <-ctx.Done():
					return nil
				}
			case events.ActionDestroy:
				// A start queued before it finds the container gone (inspect:
				// not found) and removes it again.
				d.Registry.Remove(m.Actor.ID)
			case events.ActionDie:
				// Keep the workload until it is destroyed: its processes may
				// still be exiting, and a restart reuses the id.
			}
		}
	}
}

// created puts a container that has no cgroup yet (created, or stopped) in
// the registry, classified from its labels. A container gpud knows already
// is left alone: its cgroup id stays until its next start.
func (d *Watcher) created(id, name string, labels map[string]string) {
	if _, ok := d.Registry.Lookup(occupancy.ProcInfo{ContainerID: id}); ok {
		return
	}
	w := workload.Workload{
		ContainerID: id,
		Name:        strings.TrimPrefix(name, "/"),
		Priority:    d.Registry.Classify(id, labels),
		TaskID:      labels[workload.LabelTaskID],
		PreemptMode: labels[workload.LabelPreemptMode],
	}
	if w.TaskID == "" {
		w.TaskID = w.Name
	}
	d.Registry.Put(w)
}

// Refresh (re)classifies one container now, e.g. when a holder in an unknown
// container appears.
func (d *Watcher) Refresh(ctx context.Context, id string) { d.refresh(ctx, id) }

func (d *Watcher) refresh(ctx context.Context, id string) {
	c, err := d.Client.ContainerInspect(ctx, id)
	if err != nil {
		if cerrdefs.IsNotFound(err) {
			d.Registry.Remove(id)
			return
		}
		d.Log.Warn("inspecting container", "container_id", id, "error", err)
		return
	}
	var labels map[string]string
	if c.Config != nil {
		labels = c.Config.Labels
	}
	w := workload.Workload{
		ContainerID: c.ID,
		Name:        strings.TrimPrefix(c.Name, "/"),
		Priority:    d.Registry.Classify(c.ID, labels),
		TaskID:      labels[workload.LabelTaskID],
		PreemptMode: labels[workload.LabelPreemptMode],
	}
	if w.TaskID == "" {
		w.TaskID = w.Name
	}
	if c.State != nil && c.State.Pid > 0 {
		if info, err := cgroups.ReadProc(c.State.Pid); err == nil && info.V2Path != "" && info.V2Path != "/" {
			if cg, err := cgroups.ID(filepath.Join(d.CgroupRoot, info.V2Path)); err == nil {
				w.CgroupID = cg
			}
		}
	}
	d.Registry.Put(w)
}

// NewClient returns a client of the Docker engine at host ("" is
// $DOCKER_HOST, else the local socket).
func NewClient(host string) (*client.Client, error) {
	opts := []client.Opt{client.FromEnv, client.WithAPIVersionNegotiation()}
	if host != "" {
		opts = append(opts, client.WithHost(host))
	}
	return client.NewClientWithOpts(opts...)
}
