package occupancy

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	v1 "github.com/gpud/gpud/api/v1"
)

// Health is the state file's "health" section (a wire type: api/v1).
type Health = v1.Health

// retryFirst and retryMax bound the wait before a failed write is tried
// again: soon after space returns, the file is fresh, with no event needed.
const (
	retryFirst = 500 * time.Millisecond
	retryMax   = 5 * time.Second
)

// syncEvery is how often, at most, the state file is made durable (an
// fsync of it and of its directory), apart from the write after each
// change: that write is visible at once (a rename: readers see the old or
// the new file, never a part), and the fsyncs (milliseconds each on a
// loaded disk, more than the whole write) stay off the path from a change
// to the file. A crash of the host loses at most this much of the file's
// history; gpud rebuilds its ledger from /proc when it starts anyway.
const syncEvery = time.Second

// Writer keeps the state file in step with the ledger. Changes that arrive
// while a write is in progress are coalesced into the next write, so under
// load the file lags by at most one write and is never rewritten per event.
// Each write is made durable within syncEvery, by another goroutine.
type Writer struct {
	Path       string
	Node       string
	Ledger     *Ledger
	Monitoring func() bool
	// Preemptions, when set, supplies the state file's preemptions[].
	Preemptions func() []v1.RawPreemption
	// Decorate, when set, adds what the ledger does not know (loans).
	Decorate func(*v1.StateFile)
	// Health, when set, adds the journal's part of the health section.
	Health func(*Health)
	Log    *slog.Logger

	// Failures counts state file writes that failed.
	Failures atomic.Uint64
	failing  bool // the last write failed (Run's goroutine only)
	lastErr  string
	lastAt   time.Time

	kick    chan struct{}
	sync    func(path string) error // syncFile (tests replace it)
	once    sync.Once
	mu      sync.Mutex
	written uint64
	wrote   bool // written is meaningful once a write succeeded
	waiters []waiter
}

type waiter struct {
	version uint64
	ch      chan struct{}
}

func (w *Writer) init() { w.once.Do(func() { w.kick = make(chan struct{}, 1) }) }

// Kick asks for a write; it never blocks. A nil Writer ignores it (a
// part's hook may fire before the writer is built).
func (w *Writer) Kick() {
	if w == nil {
		return // not built yet: nothing to rewrite
	}
	w.init()
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

// Run writes the state file on every kick until ctx ends, then once more.
// A write that fails is tried again on a timer (backing off from
// retryFirst to retryMax) until one succeeds, so the file is fresh again
// soon after the disk has space, whether or not anything changes.
func (w *Writer) Run(ctx context.Context) {
	w.init()
	syncKick := make(chan struct{}, 1)
	synced := make(chan struct{})
	go func() {
		defer close(synced)
		w.syncLoop(ctx, syncKick)
	}()
	defer func() { <-synced }() // Run returns with nothing left running
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	defer retry.Stop()
	wait := retryFirst
	armed := false
	after := func(ok bool) {
		if ok {
			select {
			case syncKick <- struct{}{}:
			default:
			}
		}
		switch {
		case ok:
			wait = retryFirst
			if armed {
				retry.Stop()
				armed = false
			}
		case !armed:
			retry.Reset(wait)
			armed = true
			wait = min(2*wait, retryMax)
		}
	}
	after(w.write(false))
	for {
		select {
		case <-ctx.Done():
			w.write(true)
			return
		case <-w.kick:
			after(w.write(false))
		case <-retry.C:
			armed = false
			after(w.write(false))
		}
	}
}

// syncLoop makes the file durable after a write (kick), then waits
// syncEvery before the next, until ctx ends.
func (w *Writer) syncLoop(ctx context.Context, kick <-chan struct{}) {
	pause := time.NewTimer(time.Hour)
	pause.Stop()
	defer pause.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-kick:
		}
		durable := syncFile
		if w.sync != nil {
			durable = w.sync
		}
		if err := durable(w.Path); err != nil {
			w.Failures.Add(1)
			w.Failed(err)
			if w.Log != nil {
				w.Log.Warn("making the state file durable", "path", w.Path, "error", err)
			}
		}
		pause.Reset(syncEvery)
		select {
		case <-ctx.Done():
			return
		case <-pause.C:
		}
	}
}

// health returns the health section, nil while nothing failed.
func (w *Writer) health() *Health {
	h := Health{StateWriteFailures: w.Failures.Load()}
	w.mu.Lock()
	h.LastError = w.lastErr
	if !w.lastAt.IsZero() {
		t := w.lastAt.UTC()
		h.LastErrorAt = &t
	}
	w.mu.Unlock()
	if w.Health != nil {
		w.Health(&h)
	}
	if h.StateWriteFailures == 0 && h.JournalWriteFailures == 0 && h.JournalPending == 0 {
		return nil
	}
	return &h
}

// Failed records a write failure of another file (the journal) as the last
// error shown in the health section.
func (w *Writer) Failed(err error) {
	w.mu.Lock()
	w.lastErr, w.lastAt = err.Error(), time.Now()
	w.mu.Unlock()
}

// write writes the state file; durable waits for the disk (the final
// write), otherwise syncLoop does it later.
func (w *Writer) write(durable bool) bool {
	snap := w.Ledger.Snapshot(time.Now())
	f := Render(snap, w.Node, w.Monitoring == nil || w.Monitoring())
	if w.Preemptions != nil {
		f.Preemptions = w.Preemptions()
	}
	if w.Decorate != nil {
		w.Decorate(&f)
	}
	f.Health = w.health()
	if err := writeStateFile(w.Path, &f, durable); err != nil {
		w.Failures.Add(1)
		w.Failed(err)
		// Logged when writes start failing, not at every retry.
		if w.Log != nil && !w.failing {
			w.Log.Error("writing state file; retrying until it succeeds", "path", w.Path, "error", err)
		}
		w.failing = true
		return false
	}
	if w.failing && w.Log != nil {
		w.Log.Info("state file written again", "path", w.Path, "failures", w.Failures.Load())
	}
	w.failing = false
	w.mu.Lock()
	w.written, w.wrote = snap.Version, true
	keep := w.waiters[:0]
	for _, wt := range w.waiters {
		if wt.version <= snap.Version {
			close(wt.ch)
		} else {
			keep = append(keep, wt)
		}
	}
	w.waiters = keep
	w.mu.Unlock()
	return true
}

// Written returns a channel closed once a state file reflecting ledger
// version v (or later) is on disk.
func (w *Writer) Written(v uint64) <-chan struct{} {
	ch := make(chan struct{})
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.wrote && w.written >= v {
		close(ch)
		return ch
	}
	w.waiters = append(w.waiters, waiter{v, ch})
	return ch
}
