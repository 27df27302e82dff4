package executor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/gpud/gpud/internal/preempt"
)

// Reclaimer reclaims containers asynchronously: retried with backoff while
// the runtime fails, never two reclaims of one container at once.
type Reclaimer struct {
	Runtime preempt.Runtime
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
func (r *Reclaimer) Reclaim(ctx context.Context, t preempt.Target) bool {
	containerID := t.Key()
	if containerID == "" || r.Mode == preempt.ReclaimNone || r.Runtime == nil {
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
		preempt.AfterReclaim(t, err)
		r.mu.Lock()
		delete(r.inflight, containerID)
		r.mu.Unlock()
		if r.Done != nil {
			r.Done(containerID, err)
		}
	}()
	return true
}

func (r *Reclaimer) run(ctx context.Context, t preempt.Target) error {
	id := t.Key()
	max := r.MaxElapsed
	if max == 0 {
		max = 5 * time.Minute
	}
	deadline := time.Now().Add(max)
	backoff := 100 * time.Millisecond
	preempt.BeforeReclaim(t)
	for attempt := 1; ; attempt++ {
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		err := r.Runtime.Reclaim(cctx, t, r.Mode)
		cancel()
		if err == nil || errors.Is(err, preempt.ErrNotFound) {
			return nil
		}
		if errors.Is(err, preempt.ErrNoRuntime) {
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
