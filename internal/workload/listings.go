package workload

import "sync"

// Listings follows the workload sources' first full listings: until each
// source has listed what exists, the registry may lack classes a previous
// gpud knew (a restarted gpud waits for them before replacing its gate).
type Listings struct {
	chs []chan struct{}
}

// Add registers a source; the returned hook (its Synced) marks its first
// full listing, and may be called any number of times.
func (l *Listings) Add() func() {
	ch := make(chan struct{})
	l.chs = append(l.chs, ch)
	var once sync.Once
	return func() { once.Do(func() { close(ch) }) }
}

// Done returns a channel per source, closed at its first full listing.
func (l *Listings) Done() []chan struct{} { return l.chs }
