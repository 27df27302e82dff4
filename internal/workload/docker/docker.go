// Package docker classifies Docker containers from their labels (a watcher of
// the engine's containers and events) and reclaims them (stop or remove).
package docker

import (
	"context"
	"fmt"
	"log/slog"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"sync"
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

	imgMu     sync.Mutex
	imgLabels map[string]map[string]string // image id → its gpud.io/ labels
	dropped   map[string]bool              // containers whose image's gpud.io/ labels were dropped (logged once)
}

// maxImages bounds the image label cache (image ids are content hashes:
// an entry never goes stale, only unused).
const maxImages = 256

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
			d.created(c.ID, name, d.ownLabels(ctx, c.ID, c.ImageID, c.Labels))
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
				// Labels are the event's attributes (with name and image),
				// its image's labels merged in: createdLabels drops those
				// that would grant anything.
				d.created(m.Actor.ID, m.Actor.Attributes["name"], d.createdLabels(ctx, m.Actor.ID, m.Actor.Attributes))
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
				d.imgMu.Lock()
				delete(d.dropped, m.Actor.ID)
				d.imgMu.Unlock()
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
		TaskID:      labels[workload.LabelTaskID],
		PreemptMode: labels[workload.LabelPreemptMode],
	}
	w.Priority, w.Agent = d.Registry.ClassifyContainer(id, labels)
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
		labels = d.ownLabels(ctx, c.ID, c.Image, c.Config.Labels)
	}
	w := workload.Workload{
		ContainerID: c.ID,
		Name:        strings.TrimPrefix(c.Name, "/"),
		TaskID:      labels[workload.LabelTaskID],
		PreemptMode: labels[workload.LabelPreemptMode],
	}
	w.Priority, w.Agent = d.Registry.ClassifyContainer(c.ID, labels)
	if w.TaskID == "" {
		w.TaskID = w.Name
	}
	if c.State != nil && c.State.Pid > 0 {
		if info, err := cgroups.ReadProc(c.State.Pid); err == nil && info.V2Path != "" && info.V2Path != "/" {
			if cg, err := cgroups.ID(filepath.Join(d.CgroupRoot, info.V2Path)); err == nil {
				w.CgroupID = cg
			}
			// Where runc put it (--cgroup-parent included): its processes
			// are the container's wherever that is. Only a cgroup named as
			// runc names this container's: an init that moved itself (a
			// privileged container can) names no other cgroup so.
			if slices.Contains(cgroups.DockerLeafNames(c.ID), path.Base(info.V2Path)) {
				w.CgroupPath = info.V2Path
			}
		}
	}
	d.Registry.Put(w)
}

// ownLabels returns a container's labels less the gpud.io/ labels its
// image declared: Docker merges an image's LABELs into its containers',
// and an image pulled from anywhere must not choose a class, an agent mark
// or a preempt mode. A gpud.io/ label whose key and value are the image's
// is dropped (a container given the very value its image has cannot be
// told from one that inherited it: the operator labels with an image that
// declares none). imageID is the container's image id, "" when not known
// yet (a create event: then the container is inspected). Labels without
// any gpud.io/ key cost no round trip. Where the image cannot be read,
// every gpud.io/ label is dropped: a label of unknown provenance gets
// nothing, and the start event's inspect tries again.
func (d *Watcher) ownLabels(ctx context.Context, id, imageID string, labels map[string]string) map[string]string {
	has := false
	for k := range labels {
		if strings.HasPrefix(k, workload.LabelPrefix) {
			has = true
			break
		}
	}
	if !has {
		return labels
	}
	img, err := d.imageLabels(ctx, id, imageID)
	out := make(map[string]string, len(labels))
	var dropped []string
	for k, v := range labels {
		if strings.HasPrefix(k, workload.LabelPrefix) {
			if iv, ok := img[k]; err != nil || ok && iv == v {
				dropped = append(dropped, k)
				continue
			}
		}
		out[k] = v
	}
	if len(dropped) == 0 {
		return out
	}
	d.imgMu.Lock()
	if d.dropped == nil {
		d.dropped = map[string]bool{}
	}
	first := !d.dropped[id]
	d.dropped[id] = true
	d.imgMu.Unlock()
	// A container gone already (short-lived) is nothing to report.
	if first && !cerrdefs.IsNotFound(err) {
		d.Registry.ImageLabelsDropped.Add(1)
		slices.Sort(dropped)
		if err != nil {
			d.Log.Warn("container's image unreadable: its gpud.io/ labels are ignored until it is", "container_id", id,
				"labels", dropped, "error", err)
		} else {
			d.Log.Warn("ignoring gpud.io/ labels the container's image declares (only labels given to the container count)",
				"container_id", id, "image_id", imageID, "labels", dropped)
		}
	}
	return out
}

// createdLabels is ownLabels for a create event, on the event loop that
// must expect the container's cgroup before runc makes it: the round trips
// to learn the image (inspect the container, then its image) are paid only
// when a gpud.io/ label would grant something (priority high, the agent
// mark, a preempt mode other than kill). A label that grants nothing (low,
// a task id) is taken as it comes for the moment; the start event's
// refresh checks every label against the image and corrects the class
// within milliseconds. A burst of low containers thus costs the loop
// nothing, and their first opens are still refused in the kernel.
func (d *Watcher) createdLabels(ctx context.Context, id string, labels map[string]string) map[string]string {
	if !grants(labels) {
		return labels
	}
	return d.ownLabels(ctx, id, "", labels)
}

// grants reports whether labels ask for anything beyond the least a
// workload can be given: class high, the agent mark, a preempt mode other
// than kill.
func grants(labels map[string]string) bool {
	if labels[workload.LabelPriority] == "high" || labels[workload.LabelAgent] == "true" {
		return true
	}
	m, ok := labels[workload.LabelPreemptMode]
	return ok && m != "kill"
}

// imageLabels returns the gpud.io/ labels of a container's image.
func (d *Watcher) imageLabels(ctx context.Context, id, imageID string) (map[string]string, error) {
	if imageID == "" {
		c, err := d.Client.ContainerInspect(ctx, id)
		if err != nil {
			return nil, fmt.Errorf("inspecting container %s for its image: %w", id, err)
		}
		imageID = c.Image
	}
	d.imgMu.Lock()
	l, ok := d.imgLabels[imageID]
	d.imgMu.Unlock()
	if ok {
		return l, nil
	}
	img, err := d.Client.ImageInspect(ctx, imageID)
	if err != nil {
		return nil, fmt.Errorf("inspecting image %s: %w", imageID, err)
	}
	l = map[string]string{}
	if img.Config != nil {
		for k, v := range img.Config.Labels {
			if strings.HasPrefix(k, workload.LabelPrefix) {
				l[k] = v
			}
		}
	}
	d.imgMu.Lock()
	if d.imgLabels == nil || len(d.imgLabels) >= maxImages {
		d.imgLabels = map[string]map[string]string{}
	}
	d.imgLabels[imageID] = l
	d.imgMu.Unlock()
	return l, nil
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
