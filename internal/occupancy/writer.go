package occupancy

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// Writer keeps the state file in step with the ledger. Changes that arrive
// while a write is in progress are coalesced into the next write, so under
// load the file lags by at most one write and is never rewritten per event.
type Writer struct {
	Path       string
	Node       string
	Ledger     *Ledger
	Monitoring func() bool
	// Preemptions, when set, supplies the state file's preemptions[].
	Preemptions func() []Preemption
	// Decorate, when set, adds what the ledger does not know (loans).
	Decorate func(*StateFile)
	// Enforced, when set, tells whether the gate protects a GPU (by index).
	Enforced func(gpu int) bool
	Log      *slog.Logger

	kick    chan struct{}
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

// Kick asks for a write; it never blocks.
func (w *Writer) Kick() {
	w.init()
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

// Run writes the state file on every kick until ctx ends, then once more.
func (w *Writer) Run(ctx context.Context) {
	w.init()
	w.write()
	for {
		select {
		case <-ctx.Done():
			w.write()
			return
		case <-w.kick:
			w.write()
		}
	}
}

func (w *Writer) write() {
	snap := w.Ledger.Snapshot(time.Now())
	f := Render(snap, w.Node, w.Monitoring == nil || w.Monitoring())
	if w.Preemptions != nil {
		f.Preemptions = w.Preemptions()
	}
	if w.Enforced != nil {
		MarkEnforced(&f, w.Enforced)
	}
	if w.Decorate != nil {
		w.Decorate(&f)
	}
	if err := WriteStateFile(w.Path, &f); err != nil {
		if w.Log != nil {
			w.Log.Error("writing state file", "path", w.Path, "error", err)
		}
		return
	}
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
