package preempt

import (
	"context"
	"errors"
	"fmt"
	cerrdefs "github.com/containerd/errdefs"
	"log/slog"
	"sync"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/client"
)

// Reclaim modes (--reclaim).
const (
	ReclaimStop   = "stop"
	ReclaimRemove = "remove"
	ReclaimNone   = "none"
)

// ParseReclaim checks a --reclaim value.
func ParseReclaim(v string) (string, error) {
	switch v {
	case ReclaimStop, ReclaimRemove, ReclaimNone:
		return v, nil
	}
	return "", fmt.Errorf("preempt: reclaim %q: want stop, remove or none", v)
}

// ErrNotFound is returned by a Runtime for a container that no longer exists:
// a reclaim of it is done, not failed.
var ErrNotFound = errors.New("preempt: container not found")

// Runtime is the container runtime as reclaim sees it.
type Runtime interface {
	Stop(ctx context.Context, containerID string) error
	Remove(ctx context.Context, containerID string) error
}

// DockerRuntime reclaims Docker containers.
type DockerRuntime struct{ Client client.APIClient }

func (d DockerRuntime) Stop(ctx context.Context, id string) error {
	zero := 0 // the processes are already dead; nothing to wait for
	err := d.Client.ContainerStop(ctx, id, container.StopOptions{Timeout: &zero})
	if cerrdefs.IsNotFound(err) {
		return ErrNotFound
	}
	return err
}

func (d DockerRuntime) Remove(ctx context.Context, id string) error {
	err := d.Client.ContainerRemove(ctx, id, container.RemoveOptions{Force: true})
	if cerrdefs.IsNotFound(err) {
		return ErrNotFound
	}
	return err
}

// Reclaimer reclaims containers asynchronously: retried with backoff while
// the runtime fails, never two reclaims of one container at once.
type Reclaimer struct {
	Runtime Runtime
	Mode    string
	Log     *slog.Logger
	// MaxElapsed bounds the retries of one reclaim (default 5 minutes).
	MaxElapsed time.Duration
	// Done, when set, is called when a reclaim ends (err nil: reclaimed or already gone).
	Done func(containerID string, err error)

	mu       sync.Mutex
	inflight map[string]bool
	wg       sync.WaitGroup
}

// Reclaim starts reclaiming a container unless one is under way; it reports
// whether it started one.
func (r *Reclaimer) Reclaim(ctx context.Context, containerID string) bool {
	if containerID == "" || r.Mode == ReclaimNone || r.Runtime == nil {
		return false
	}
	r.mu.Lock()
	if r.inflight == nil {
		r.inflight = map[string]bool{}
	}
	if r.inflight[containerID] {
		r.mu.Unlock()
		return false
	}
	r.inflight[containerID] = true
	r.mu.Unlock()
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		err := r.run(ctx, containerID)
		r.mu.Lock()
		delete(r.inflight, containerID)
		r.mu.Unlock()
		if r.Done != nil {
			r.Done(containerID, err)
		}
	}()
	return true
}

func (r *Reclaimer) run(ctx context.Context, id string) error {
	max := r.MaxElapsed
	if max == 0 {
		max = 5 * time.Minute
	}
	deadline := time.Now().Add(max)
	backoff := 100 * time.Millisecond
	for attempt := 1; ; attempt++ {
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		var err error
		if r.Mode == ReclaimRemove {
			err = r.Runtime.Remove(cctx, id)
		} else {
			err = r.Runtime.Stop(cctx, id)
		}
		cancel()
		if err == nil || errors.Is(err, ErrNotFound) {
			return nil
		}
		if ctx.Err() != nil || time.Now().After(deadline) {
			return fmt.Errorf("preempt: reclaiming %s: giving up after %d attempts: %w", id, attempt, err)
		}
		if r.Log != nil {
			r.Log.Warn("reclaim failed; retrying", "container_id", id, "attempt", attempt, "backoff", backoff, "error", err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(backoff):
		}
		if backoff < 10*time.Second {
			backoff *= 2
		}
	}
}

// Wait waits for every reclaim under way.
func (r *Reclaimer) Wait() { r.wg.Wait() }
