package preempt

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"
)

// Reclaim modes (--reclaim). For Docker containers stop and evict both
// stop, remove and delete both remove; for pods stop and evict both use the
// Eviction API, remove and delete both delete the pod.
const (
	ReclaimStop   = "stop"
	ReclaimRemove = "remove"
	ReclaimEvict  = "evict"
	ReclaimDelete = "delete"
	ReclaimNone   = "none"
)

// ParseReclaim checks a --reclaim value.
func ParseReclaim(v string) (string, error) {
	switch v {
	case ReclaimStop, ReclaimRemove, ReclaimEvict, ReclaimDelete, ReclaimNone:
		return v, nil
	}
	return "", fmt.Errorf("preempt: reclaim %q: want stop, remove, evict, delete or none", v)
}

// Gentle reports whether mode stops/evicts (true) or removes/deletes (false).
func Gentle(mode string) bool { return mode == ReclaimStop || mode == ReclaimEvict }

// Target is what gets reclaimed: a pod when PodUID is set, else a container.
type Target struct {
	ContainerID string
	PodUID      string
	Namespace   string
	Name        string // pod name
	Reason      string // for the pod's DisruptionTarget condition and events
}

// Key names the target: one reclaim per key at a time.
func (t Target) Key() string {
	if t.PodUID != "" {
		return "pod/" + t.PodUID
	}
	return t.ContainerID
}

// ErrNotFound is returned by a Runtime for a container that no longer exists:
// a reclaim of it is done, not failed.
var ErrNotFound = errors.New("preempt: container not found")

// Runtime reclaims targets of one kind (mode is never ReclaimNone).
type Runtime interface {
	Reclaim(ctx context.Context, t Target, mode string) error
}

// Runtimes picks the runtime by target: pods to Pods, containers to Containers.
type Runtimes struct {
	Containers Runtime // nil: containers are not reclaimed
	Pods       Runtime // nil: pods are not reclaimed
}

func (r Runtimes) Reclaim(ctx context.Context, t Target, mode string) error {
	rt := r.Containers
	if t.PodUID != "" {
		rt = r.Pods
	}
	if rt == nil {
		return ErrNoRuntime
	}
	return rt.Reclaim(ctx, t, mode)
}

// ErrNoRuntime is returned for a target no configured runtime can reclaim.
var ErrNoRuntime = errors.New("preempt: no runtime for this target")

// Reclaimer reclaims containers asynchronously: retried with backoff while
// the runtime fails, never two reclaims of one container at once.
type Reclaimer struct {
	Runtime Runtime
	Mode    string
	Log     *slog.Logger
	// MaxElapsed bounds the retries of one reclaim (default 5 minutes).
	MaxElapsed time.Duration
	// Done, when set, is called when a reclaim ends (err nil: reclaimed or
	// already gone), with the target's Key.
	Done func(key string, err error)

	mu       sync.Mutex
	inflight map[string]bool
	wg       sync.WaitGroup
}

// Reclaim starts reclaiming a target unless one is under way; it reports
// whether it started one.
func (r *Reclaimer) Reclaim(ctx context.Context, t Target) bool {
	containerID := t.Key()
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
		err := r.run(ctx, t)
		afterReclaim(t, err)
		r.mu.Lock()
		delete(r.inflight, containerID)
		r.mu.Unlock()
		if r.Done != nil {
			r.Done(containerID, err)
		}
	}()
	return true
}

func (r *Reclaimer) run(ctx context.Context, t Target) error {
	id := t.Key()
	max := r.MaxElapsed
	if max == 0 {
		max = 5 * time.Minute
	}
	deadline := time.Now().Add(max)
	backoff := 100 * time.Millisecond
	beforeReclaim(t)
	for attempt := 1; ; attempt++ {
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		err := r.Runtime.Reclaim(cctx, t, r.Mode)
		cancel()
		if err == nil || errors.Is(err, ErrNotFound) {
			return nil
		}
		if errors.Is(err, ErrNoRuntime) {
			return err
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
