package kube

import (
	"testing"

	"github.com/gpud/gpud/internal/preempt"
)

// Without an API server the daemon's Pods and Events are nil: names and
// Events are asked of them all the same, and answer nothing.
func TestNilPodsAndEvents(t *testing.T) {
	var p *Pods
	if n := p.ContainerName("ml", "train", "abc"); n != "" {
		t.Fatalf("a nil Pods named a container %q", n)
	}
	var e *Events
	e.Record(preempt.Record{Victim: preempt.Party{PodUID: "u1"}})
	e.Warn("u1", "GPUMemoryOverShare", "over")
}
