package executor

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gpud/gpud/internal/preempt"
)

type flakyRuntime struct {
	fails    atomic.Int32 // failures left
	calls    atomic.Int32
	inflight atomic.Int32
	overlap  atomic.Bool
	notFound bool
}

func (f *flakyRuntime) Reclaim(ctx context.Context, t preempt.Target, mode string) error {
	if f.inflight.Add(1) > 1 {
		f.overlap.Store(true)
	}
	defer f.inflight.Add(-1)
	f.calls.Add(1)
	time.Sleep(5 * time.Millisecond)
	if f.notFound {
		return preempt.ErrNotFound
	}
	if f.fails.Add(-1) >= 0 {
		return errors.New("Cannot connect to the Docker daemon")
	}
	return nil
}

func TestReclaimRetriesAndNeverTwiceAtOnce(t *testing.T) {
	rt := &flakyRuntime{}
	rt.fails.Store(3)
	var mu sync.Mutex
	var done []error
	r := &Reclaimer{Runtime: rt, Mode: preempt.ReclaimStop, Done: func(_ string, err error) { mu.Lock(); done = append(done, err); mu.Unlock() }}
	started := 0
	for i := 0; i < 10; i++ {
		if r.Reclaim(context.Background(), preempt.Target{ContainerID: "c1"}) {
			started++
		}
	}
	r.Wait()
	if started != 1 || len(done) != 1 || done[0] != nil {
		t.Fatalf("started %d reclaims, results %v: want one, successful", started, done)
	}
	if rt.calls.Load() != 4 || rt.overlap.Load() {
		t.Fatalf("%d runtime calls (want 3 failures + 1), overlap %v", rt.calls.Load(), rt.overlap.Load())
	}
}

func TestReclaimGoneIsDoneAndNoneDoesNothing(t *testing.T) {
	rt := &flakyRuntime{notFound: true}
	var got error = errors.New("unset")
	r := &Reclaimer{Runtime: rt, Mode: preempt.ReclaimRemove, Done: func(_ string, err error) { got = err }}
	r.Reclaim(context.Background(), preempt.Target{ContainerID: "gone"})
	r.Wait()
	if got != nil || rt.calls.Load() != 1 {
		t.Fatalf("a container already gone: %v after %d calls", got, rt.calls.Load())
	}
	r = &Reclaimer{Runtime: rt, Mode: preempt.ReclaimNone}
	if r.Reclaim(context.Background(), preempt.Target{ContainerID: "x"}) || rt.calls.Load() != 1 {
		t.Fatal("--reclaim=none reclaimed")
	}
}

func TestReclaimGivesUp(t *testing.T) {
	rt := &flakyRuntime{}
	rt.fails.Store(1000)
	var got error
	r := &Reclaimer{Runtime: rt, Mode: preempt.ReclaimStop, MaxElapsed: 300 * time.Millisecond, Done: func(_ string, err error) { got = err }}
	r.Reclaim(context.Background(), preempt.Target{ContainerID: "c"})
	r.Wait()
	if got == nil || rt.calls.Load() < 2 {
		t.Fatalf("gave up with %v after %d calls", got, rt.calls.Load())
	}
}
